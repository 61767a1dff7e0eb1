"""Imported by the engines' forkserver only, as the last of its preload modules
(enginefork.PRELOAD): from then on the forkserver ends with the daemon that started it, its
parent (lifeline.py). Left to itself it exits once its last engine has, after finalizing
an interpreter that imported torch and vLLM: measured 10 s after its engines on a busy
host. Nothing else imports this module."""

from __future__ import annotations

import os

from daemon.executors import lifeline

lifeline.hold(os.getppid())
