"""Process lifecycle: one uvloop loop, signals, drain, reload, sd_notify. No HTTP here
beyond binding the socket and starting the configured HTTP server (daemon/httpserver.py)
with the app."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from pathlib import Path

import msgspec
import uvloop

from daemon import apikeys, httpserver, sdnotify
from daemon import config as config_mod
from daemon.config import Config, ConfigError
from daemon.http.app import build_app
from daemon.service import Service

log = logging.getLogger("lengthwise")


class Daemon:
    def __init__(self, config_path: Path, config: Config) -> None:
        self.config_path = config_path
        self.config = config
        self.service: Service | None = None
        self._stop = asyncio.Event()
        self._http_stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: object, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        server = self.config.server
        try:  # first: a port in use is the commonest start failure, and costs nothing here
            sock = httpserver.listen(server)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", server.host, server.port, exc)
            return 1
        try:
            self.service = await Service.create(self.config)
        except ConfigError as exc:  # found only with the model's tokenizer (a tool parser)
            sock.close()
            log.error("config error: %s", exc)
            return 2
        http = self._spawn(self._serve_http(sock), "http")
        if (interval := sdnotify.watchdog_interval_s()) is not None:
            self._spawn(self._watchdog(interval), "watchdog")
        started = loop.time()
        try:
            await self._start_engines()
        except Exception:
            log.exception("engine start-up failed")
            await self._shutdown(drain=False)
            return 1
        # What start-up built stays for good: later full collections need not walk it again
        # (with vLLM and torch imported, one took hundreds of ms of the event loop).
        gc.collect()
        gc.freeze()
        log.info("ready in %.1f s on http://%s:%d (%s, policy %s)", loop.time() - started,
                 server.host, server.port, server.http, self.config.scheduler.policy)
        sdnotify.notify("READY=1", "STATUS=serving")
        failed = self._spawn(self.service.failed.wait(), "engines-failed")  # type: ignore[arg-type]
        await asyncio.wait([http, self._spawn(self._stop.wait(), "stop"), failed],  # type: ignore[arg-type]
                           return_when=asyncio.FIRST_COMPLETED)
        await self._shutdown(drain=True)
        if self.service.failed.is_set():
            log.critical("exiting with status 1: no engine could be restarted")
            return 1
        if http.done() and not http.cancelled() and http.exception() is not None:
            log.critical("exiting with status 1: the HTTP server (%s) failed",
                         server.http, exc_info=http.exception())
            return 1
        return 0

    async def _start_engines(self) -> None:
        assert self.service is not None
        start = self._spawn(self.service.start(), "engines")
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([start, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not start.done():
            start.cancel()
            raise RuntimeError("stopped during start-up")
        start.result()

    async def _serve_http(self, sock: socket.socket) -> None:
        assert self.service is not None
        try:
            await httpserver.serve(build_app(self.service), sock, self.config.server,
                                   self._http_stop)
        finally:
            sock.close()

    async def _watchdog(self, interval_s: float) -> None:
        # Sent from the loop itself: a stuck loop stops the pings and systemd restarts us;
        # so do engines that cannot be restarted, should the exit itself hang.
        assert self.service is not None
        while not self.service.failed.is_set():
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval_s)

    async def _shutdown(self, drain: bool) -> None:
        """Stop accepting, drain (bounded), abort the rest, stop HTTP and engines."""
        sdnotify.notify("STOPPING=1", "STATUS=draining")
        assert self.service is not None
        scheduler = self.service.scheduler
        timeout = self.config.limits.drain_timeout_s if drain else 0.0
        log.info("shutting down: draining %d jobs for up to %.0f s", scheduler.num_jobs, timeout)
        if not await scheduler.drain(timeout):
            log.warning("drain timed out; aborting %d jobs", scheduler.num_jobs)
            await scheduler.abort_all()
        self._http_stop.set()
        await self.service.shutdown()
        pending = [t for t in self._tasks if not t.done()]
        for task in pending:
            if task.get_name() != "http":
                task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self.config.server.graceful_timeout_s + 5)
        log.info("stopped")

    def reload(self) -> None:
        """SIGHUP: adopt live-changeable settings from the file; keep the rest until restart."""
        sdnotify.reloading()
        try:
            new = config_mod.load(self.config_path)
            changed = config_mod.restart_only_changes(self.config, new)
            if changed:
                log.warning("reload: changes to [%s] need a restart; keeping the running values",
                            ", ".join(changed))
                new = msgspec.structs.replace(new, server=self.config.server,
                                              model=self.config.model, engine=self.config.engine)
                config_mod.validate(new, str(self.config_path))
            assert self.service is not None
            self.service.apply(new)
            self.config = new
            _set_log_level(new)
            log.info("reloaded %s (policy %s, max_running %s)", self.config_path,
                     new.scheduler.policy, new.scheduler.max_running)
        except (ConfigError, apikeys.KeyFileError) as exc:
            log.error("reload rejected, keeping the old config: %s", exc)
        finally:
            sdnotify.notify("READY=1", "STATUS=serving")
        if self.service is not None:  # a retrained model put in the predictor's folder
            self._spawn(self.service.predictions.reload(), "predictor-reload")


def _set_log_level(config: Config) -> None:
    logging.getLogger().setLevel(config.log.level.upper())


def run(config_path: Path) -> int:
    # Models load from local folders only: a mistyped path must fail, not start a download.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        config = config_mod.load(config_path)
        if not (Path(config.model.path) / "config.json").is_file():
            raise ConfigError(f"{config_path}: model.path {config.model.path!r} is not a model "
                              "folder (no config.json); `make models` builds the default one")
    except ConfigError as exc:
        print(f"lengthwise: config error: {exc}", flush=True)
        return 2
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _set_log_level(config)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(Daemon(config_path, config).serve())
