"""Atomic, durable file replacement with one previous generation kept as a fallback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def atomic_write(path: Path, data: bytes) -> None:
    """tmp + fsync + rename: a crash leaves either the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".prev"))
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the renames themselves durable
    finally:
        os.close(dir_fd)


def load_newest_valid(path: Path, parse: Callable[[bytes], T]) -> T | None:
    """The current file if it parses, else the previous generation, else None."""
    for candidate in (path, path.with_name(path.name + ".prev")):
        try:
            return parse(candidate.read_bytes())
        except FileNotFoundError:
            continue
        except ValueError:  # CorruptIndex and friends: try the older generation
            continue
    return None
