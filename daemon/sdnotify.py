"""sd_notify(3) over the datagram socket systemd passes in $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import time


def notify(*assignments: str) -> bool:
    """Send e.g. notify("READY=1"); False when not sent (no systemd, or its queue is full).

    Called from the event loop, so it never blocks: a full socket queue drops the message
    (systemd reads promptly; a missed WATCHDOG=1 is repeated at the next interval).
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.send("\n".join(assignments).encode(), socket.MSG_DONTWAIT)
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def reloading() -> bool:
    # Type=notify-reload wants the monotonic time (µs) with RELOADING=1.
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")


def watchdog_interval_s() -> float | None:
    """Half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises; None when disabled."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2 / 1_000_000
