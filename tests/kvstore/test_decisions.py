"""The daemon -> connector offload channel (kvstore.decisions), without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore import decisions
from kvstore.plan import wants_offload


def test_a_marked_request_is_saved_once(tmp_path: Path) -> None:
    folder = str(tmp_path)
    params = decisions.params("job-7.2")
    assert params == {"kvstore": "ask", "kvstore_id": "job-7.2"}
    assert not wants_offload(params, folder)  # not marked: the abort drops it
    assert decisions.mark_offload(folder, "job-7.2")
    assert wants_offload(params, folder)
    assert not wants_offload(params, folder)  # the mark is taken with the decision
    assert list(tmp_path.iterdir()) == []


def test_ask_without_a_folder_or_id_is_no_offload(tmp_path: Path) -> None:
    decisions.mark_offload(str(tmp_path), "x.1")
    assert not wants_offload({"kvstore": "ask", "kvstore_id": "x.1"}, None)
    assert not wants_offload({"kvstore": "ask"}, str(tmp_path))
    assert not wants_offload({"kvstore": "ask", "kvstore_id": 5}, str(tmp_path))
    assert wants_offload({"kvstore": "offload"}, None)  # the unconditional flag


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", ".hidden"])
def test_ids_that_are_not_plain_names_are_refused(tmp_path: Path, bad: str) -> None:
    folder = tmp_path / "decisions"
    folder.mkdir()
    assert not decisions.mark_offload(str(folder), bad)
    assert not decisions.take_offload(str(folder), bad)
    assert list(tmp_path.iterdir()) == [folder] and list(folder.iterdir()) == []


def test_a_missing_folder_means_drop_not_an_error(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")
    assert not decisions.mark_offload(gone, "a.1")
    assert not decisions.take_offload(gone, "a.1")
