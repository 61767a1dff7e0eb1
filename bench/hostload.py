"""Who used the CPU during a measured run: the server under test, the load client (this
process) and everything else on the machine.

On a small shared machine "everything else" is the noise a benchmark cannot see in its own
figures: another job burning a core slows the engine and the client alike, and the run
measures that job too. `bench compare` records the split for every run and warns when the
rest of the machine was busy, so a contaminated table is flagged instead of published.
"""

from __future__ import annotations

import sys
import time

import msgspec
import psutil

BUSY_OTHER_CORES = 0.1  # above this, a run is flagged: something else shared the machine


class CpuShare(msgspec.Struct, frozen=True, kw_only=True):
    """Mean number of cores busy during the run, by whom."""

    wall_s: float
    server_cores: float  # the server's process and its children (vLLM engine processes)
    client_cores: float  # this process: the load client
    other_cores: float  # the rest of the machine
    cores: int  # logical CPUs on the machine
    # Of server_cores, the server's own process (the root of its tree: lengthwise's daemon,
    # vLLM's API server): the front that shares the engine's cores.
    front_cores: float = 0.0

    @property
    def contaminated(self) -> bool:
        return self.other_cores > BUSY_OTHER_CORES

    def describe(self) -> str:
        return (f"CPU: server {self.server_cores:.2f} (front {self.front_cores:.2f}), "
                f"client {self.client_cores:.2f}, "
                f"other {self.other_cores:.2f} of {self.cores} cores")

    def warn_if_contaminated(self, during: str) -> None:
        if self.contaminated:
            print(f"warning: other processes kept {self.other_cores:.2f} cores busy {during}; "
                  "its figures measure them too", file=sys.stderr, flush=True)


def _busy_s() -> float:
    t = psutil.cpu_times()
    # Linux counts guest time inside user/nice as well: leave it out once.
    not_busy = ("idle", "iowait", "guest", "guest_nice")
    return float(sum(t) - sum(getattr(t, name, 0.0) for name in not_busy))


def _own_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _tree_s(root: psutil.Process) -> dict[int, float]:
    """CPU seconds of root and every live descendant, by pid."""
    out: dict[int, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            out[proc.pid] = _own_s(proc)
        except psutil.Error:  # exited between listing and reading
            continue
    return out


class CpuMeter:
    """Start before a run, `stop()` after it. `server_pid`: the root of the server's
    process tree (None: no server on this machine, everything else counts as other; this
    process's pid: the engine runs in-process, as in `lengthwise profile`)."""

    def __init__(self, server_pid: int | None) -> None:
        self._server = psutil.Process(server_pid) if server_pid is not None else None
        self._client = psutil.Process()
        self._t0 = time.monotonic()
        self._busy0 = _busy_s()
        self._client0 = _own_s(self._client)
        self._server0 = _tree_s(self._server) if self._server else {}

    def stop(self) -> CpuShare:
        wall = max(time.monotonic() - self._t0, 1e-9)
        busy = _busy_s() - self._busy0
        client = _own_s(self._client) - self._client0
        server = front = 0.0
        if self._server is not None:
            now = _tree_s(self._server)
            front = now.get(self._server.pid, 0.0) - self._server0.get(self._server.pid, 0.0)
            # A process born during the run counts from zero; one that died is lost (its
            # time then shows up as "other", erring towards flagging the run).
            server = sum(t - self._server0.get(pid, 0.0) for pid, t in now.items())
            if self._server.pid == self._client.pid:
                client = 0.0  # the server is this process (and its children): counted once
        return CpuShare(wall_s=wall, server_cores=server / wall, client_cores=client / wall,
                        other_cores=max(busy - server - client, 0.0) / wall,
                        cores=psutil.cpu_count() or 1, front_cores=front / wall)
