"""The CPU meter tells the server's tree, the client and the rest of the machine apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bench.hostload import CpuMeter

# A spinner burns one core for at most 30 s: a test run killed before its cleanup (Ctrl-C
# twice, a CI timeout) must not leave it burning the machine (one did, for 20 min).
_SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
# A parent that sleeps and a child that spins: the "server" tree burns one core in a child.
_TREE = f"import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', {_SPIN!r}]); c.wait()"


def test_meter_splits_server_client_and_other() -> None:
    server = subprocess.Popen([sys.executable, "-c", _TREE], process_group=0)
    other = subprocess.Popen([sys.executable, "-c", _SPIN])
    try:
        time.sleep(0.5)  # let both start spinning
        meter = CpuMeter(server.pid)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # the client spins too
            pass
        share = meter.stop()
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the spinning child too, not just its parent
        other.kill()
        for proc in (server, other):
            proc.wait()
    # Each spinner wants a full core; on a loaded 2-core machine (CI, other jobs) three
    # spinners may get a fifth of a core each, so ask only that each is seen, in its place.
    assert share.server_cores > 0.1, share
    assert share.front_cores < 0.05, share  # the tree's root sleeps; its child spins
    assert share.client_cores > 0.1, share
    assert share.other_cores > 0.1, share
    assert share.contaminated
    assert "other" in share.describe()


def test_idle_machine_is_not_flagged() -> None:
    meter = CpuMeter(None)
    time.sleep(0.5)
    share = meter.stop()
    assert share.client_cores < 0.1
    assert share.server_cores == 0.0
