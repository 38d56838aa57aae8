"""The demo's artefact cache: another key's artefact is removed only once it is old."""

import os

from coinfer.demo.artifacts import STALE_AFTER_S, _drop_stale


def test_only_old_artefacts_of_other_keys_are_removed(tmp_path):
    keep, young, old = (tmp_path / f"draft-onnx-fp32-{k}" for k in ("a", "b", "c"))
    for d in (keep, young, old):
        d.mkdir()
    now = old.stat().st_mtime
    os.utime(old, (now - STALE_AFTER_S - 1, now - STALE_AFTER_S - 1))
    os.utime(keep, (now - 10 * STALE_AFTER_S, now - 10 * STALE_AFTER_S))
    _drop_stale(tmp_path, "draft-onnx-fp32", keep, now=now)
    assert keep.is_dir() and young.is_dir() and not old.exists()
