"""manifest.json: written atomically, read back, refused in an unknown format."""

from __future__ import annotations

import msgspec
import pytest

from predictor.manifest import MANIFEST, Manifest, NetConfig, read_manifest, write_manifest


def test_round_trip(tmp_path) -> None:
    folder = tmp_path / "model"
    manifest = Manifest(kind="proxy", net=NetConfig(table_size=10, num_numeric=2,
                                                    quantiles=(0.1, 0.9), members=3),
                        quintiles=[1.0, 2.0, 3.0, 4.0], dev_metrics={"mae": 1.5})
    write_manifest(folder, manifest)  # creates the folder
    assert read_manifest(folder) == manifest
    assert [p.name for p in folder.iterdir()] == [MANIFEST]  # no temp file left


def test_unknown_format_is_refused(tmp_path) -> None:
    write_manifest(tmp_path, Manifest(kind="proxy", format_version=2))
    with pytest.raises(ValueError, match="manifest format 2 not supported"):
        read_manifest(tmp_path)


def test_defaults_fill_what_an_older_manifest_lacks(tmp_path) -> None:
    (tmp_path / MANIFEST).write_text('{"kind": "iterative"}')
    manifest = read_manifest(tmp_path)
    assert (manifest.net, manifest.window, manifest.quantile_offsets) == (None, 50, [])
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"kind": "proxy", "top_k": "many"}', type=Manifest)


def test_an_undefined_dev_metric_is_left_out_not_written_as_null(tmp_path) -> None:
    """r2 is NaN when every dev length is equal (a small request log's split): written as
    JSON null it made the model unloadable, and a SIGHUP reload refused it."""
    write_manifest(tmp_path, Manifest(kind="proxy", dev_metrics={"mae": 1.5,
                                                                 "r2": float("nan")}))
    assert read_manifest(tmp_path).dev_metrics == {"mae": 1.5}
