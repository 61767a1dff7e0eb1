"""`lengthwise serve` for the tests, forked from a warm interpreter instead of started cold.

A daemon's start on this 2-core machine is ~16 CPU-s, ~10 of them importing torch and vLLM
(enginefork.py), and the suite starts a few dozen daemons. Each pytest worker starts one
warm process (`python -m tests.warmstart`, the zygote) that imports what `lengthwise serve`
imports, then forks a daemon per request: the child sets itself up as a fresh process of
`lengthwise serve --config PATH` would be (its own process group, the working directory,
the environment, stdout and stderr to its log, nothing else open) and runs the console
script's own entry, daemon.cli.main, to its exit, which ends the child as the script would
end (SystemExit up the stack, the interpreter's normal shutdown). From there on it is the
daemon as users run it: it forks its engines' forkserver from itself (fork_now), and its
engines from that. What this skips is the import itself: tests that are about the process
as a whole (the console script, a SIGKILL) start it cold (DaemonProcess(..., warm=False)).

The zygote reports each child's pid, and its exit status when it has reaped it, one line
each on its stdout ("pid N", "exit N CODE"); WarmProcess answers as subprocess.Popen does
(pid, poll, wait, send_signal, returncode). The zygote ends at EOF on its stdin: when its
worker closes it (close(), at the session's end) or dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from pathlib import Path

from daemon.executors import enginefork

LENGTHWISE = Path(sys.executable).parent / "lengthwise"


# -- the zygote (a process of its own) ---------------------------------------------------

def _preload() -> None:
    """What `lengthwise serve` imports before it serves a CPU engine (cli._preflight's
    fork_now imports enginefork's preload)."""
    from daemon import cli, lifecycle  # noqa: F401

    enginefork.preload()


def _become(request: dict[str, object]) -> list[str]:
    """In the forked child: the process `lengthwise serve` would be; its argv."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setpgid(0, 0)  # as Popen(process_group=0): a kill of the group takes the engines along
    os.chdir(str(request["cwd"]))
    enginefork.install_environment(request["env"])  # type: ignore[arg-type]
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    argv = [str(arg) for arg in request["argv"]]  # type: ignore[attr-defined]
    sys.argv = [str(LENGTHWISE), *argv]
    return argv


def _serve_forever() -> list[str]:
    """Fork a daemon per request line until EOF; returns in a child only (its argv)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the run is for its workers
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)  # requests, on stdin
    selector.register(wake_r, selectors.EVENT_READ)
    lines = b""
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _report_exits()
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                sys.exit(0)
            lines += chunk
            while b"\n" in lines:
                line, lines = lines.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    return _become(json.loads(line))
                _say(f"pid {pid}")


def _report_exits() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


_channel = sys.stdout  # the worker reads this; main() gives it a descriptor of its own


def _say(line: str) -> None:
    _channel.write(line + "\n")
    _channel.flush()


def main() -> None:
    global _channel
    # Lines for the worker on a descriptor of their own; whatever else this process (an
    # import, a warning) prints goes where its stderr goes.
    # (closefd=False: a forked daemon closes the descriptor, never the object, so that its
    # finalizer cannot close a descriptor the daemon has opened under that number since.)
    _channel = os.fdopen(os.dup(1), "w", closefd=False)
    os.dup2(2, 1)
    _preload()
    argv = _serve_forever()
    from daemon import cli

    sys.exit(cli.main(argv))  # the child: as the console script ends


# -- the test side ------------------------------------------------------------------------

class _Zygote:
    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[1]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.warmstart"], cwd=root, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self._lock = threading.Lock()  # one start at a time: its "pid" line is the next
        self._changed = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True, name="warmstart")
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            match raw.decode(errors="replace").split():
                case ["pid", pid]:
                    with self._changed:
                        self._pids.append(int(pid))
                        self._changed.notify_all()
                case ["exit", pid, code]:
                    with self._changed:
                        self._exits[int(pid)] = int(code)
                        self._changed.notify_all()
        with self._changed:  # the zygote is gone: so are the answers it owed
            self._pids.append(-1)
            self._changed.notify_all()

    def start(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> int:
        request = {"argv": argv, "env": env, "log": str(log), "cwd": str(cwd)}
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
            with self._changed:
                self._changed.wait_for(lambda: self._pids, timeout=300)
                if not self._pids or self._pids[0] < 0:
                    raise RuntimeError(f"warm start failed (zygote exit {self._proc.poll()})")
                return self._pids.pop(0)

    def wait(self, pid: int, timeout_s: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._proc.poll() is not None,
                                   timeout=timeout_s)
            return self._exits.get(pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(10)  # it reads to the EOF the zygote's end gives
        assert self._proc.stdout is not None
        self._proc.stdout.close()


_zygote: _Zygote | None = None


class WarmProcess:
    """`lengthwise serve ARGV` forked from this worker's zygote, as subprocess.Popen has it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        global _zygote
        if _zygote is None:
            _zygote = _Zygote()
        self._zygote = _zygote
        self.args = [str(LENGTHWISE), *argv]
        self.returncode: int | None = None
        self.pid = _zygote.start(argv, env, log, cwd)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid the system may have given another process
            os.kill(self.pid, sig)


def close() -> None:
    """End this worker's zygote, if it started one (the daemons it forked live on)."""
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


if __name__ == "__main__":
    main()
