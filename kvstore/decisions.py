"""Offload decisions from the daemon to the connector's scheduler half, per request.

A request's `kv_transfer_params` are fixed when it is submitted, but the daemon decides
KEEP / OFFLOAD / DROP only when it preempts it. So every request of a kvstore engine is
submitted with `{"kvstore": "ask", "kvstore_id": <the daemon's request id>}` (vLLM adds a
suffix to the id the connector sees), and just before the daemon aborts a request it
wants offloaded it creates an empty file named by that id in the engine's decisions
folder. The connector's `request_finished` (in EngineCore) removes the file; it saves the
request's blocks if the file was there.

Why this is safe: the file exists before the abort is sent (a synchronous write in the
daemon, then vLLM's abort message over its input socket), and EngineCore calls
`request_finished` only when it handles that abort, on the same host. A request that
finished by itself before the abort arrived leaves its file behind (ids are never
reused); the folder goes with its engine.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

PARAM = "kvstore"  # kv_transfer_params key: "offload" (always save) or "ask" (a decision)
ASK = "ask"
ID = "kvstore_id"  # kv_transfer_params key: the daemon's request id (the file name)


def params(request_id: str) -> dict[str, str]:
    """kv_transfer_params for a request whose offload is decided when it is aborted."""
    return {PARAM: ASK, ID: request_id}


def _path(folder: str, request_id: str) -> Path:
    if not request_id or "/" in request_id or request_id.startswith("."):
        raise ValueError(f"not a usable request id: {request_id!r}")
    return Path(folder) / request_id


def mark_offload(folder: str, request_id: str) -> bool:
    """Daemon side, before the abort: save this request's blocks. False if it cannot be
    told (the request then is dropped, never failed)."""
    try:
        _path(folder, request_id).touch()
        return True
    except (OSError, ValueError) as exc:
        log.warning("kvstore: cannot mark %s for offload (%s); it will recompute", request_id,
                    exc)
        return False


def take_offload(folder: str | None, request_id: object) -> bool:
    """Connector side, in request_finished: whether the daemon asked for a save (and
    forget the ask)."""
    if not folder or not isinstance(request_id, str):
        return False
    try:
        os.unlink(_path(folder, request_id))
        return True
    except (OSError, ValueError):
        return False
