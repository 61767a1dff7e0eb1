"""Engine processes end with their daemon, however it ends (SIGKILL included).

A daemon that exits in order stops its engines; one that is killed cannot, and outside
systemd's control group (`make run`, a container whose PID 1 is not lengthwise, a test)
its engine processes would run on, holding their memory, until someone found them. So each
engine process the daemon starts (EngineCore, its Worker: enginefork) watches the daemon's
pid from a thread of its own and, once the daemon is gone, terminates itself: SIGTERM
first, so that vLLM shuts down as it does on a stop (its shared memory released), SIGKILL
after GRACE_S. The forkserver needs no watch: it exits once the last process that holds its
alive-pipe (the daemon and its children) is gone.

The watch is a pidfd (Linux 5.3+), readable once the process has exited: no polling and no
confusion with a later process given the same pid; where there is none, a poll every
POLL_S. Not PR_SET_PDEATHSIG: it fires when the *thread* that started the child ends, and
engines are started from short-lived worker threads (spawn.build_with_env).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

GRACE_S = 3.0  # from SIGTERM to SIGKILL, once the daemon is gone
POLL_S = 0.5  # without pidfd_open: how often the daemon's pid is looked at

_daemon: int | None = None  # in an engine process: the daemon it serves
_watching: int | None = None  # the pid of the process whose thread watches (not a fork's)


def daemon_pid() -> int:
    """The daemon's pid: this process's own, or, in an engine process, the one it watches
    (so that the processes an engine starts watch the daemon, not the engine)."""
    return _daemon if _daemon is not None else os.getpid()


def hold(daemon: int) -> None:
    """From now on this process ends when process `daemon` does (at once if it is gone)."""
    global _daemon, _watching
    _daemon = daemon
    if _watching == os.getpid():
        return
    _watching = os.getpid()  # a forked child inherits the value, not the thread
    try:
        fd: int | None = os.pidfd_open(daemon)
    except ProcessLookupError:
        _end()
        return
    except OSError:  # no pidfd on this kernel
        fd = None
    threading.Thread(target=_watch, args=(daemon, fd), name="lengthwise-lifeline",
                     daemon=True).start()


def _watch(daemon: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])
    else:
        while _alive(daemon):
            time.sleep(POLL_S)
    _end()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: ours is gone
        return False
    return True


def _end() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)
