"""The pages share run records: a record file read once while it is unchanged."""

from __future__ import annotations

import os

from engine import RunRecord
from studio.widgets.runs import RecordCache


def write(folder, name: str, steps: int) -> str:
    rec = RunRecord(name=name, steps_planned=steps, steps_done=steps, status="finished")
    for s in range(steps):
        rec.add_loss(s + 1, 2.0 - s / steps)
    path = os.path.join(folder, f"{name}.run.json")
    rec.write(path)
    return path


def test_an_unchanged_record_is_read_once_and_shared_a_changed_one_again(tmp_path):
    cache = RecordCache()
    path = write(tmp_path, "a", 150)
    first = cache.read(path)
    assert first is not None and len(first.losses) == 150
    assert cache.read(path) is first  # every page that lists it holds this one object
    write(tmp_path, "a", 160)  # the run went on: its file changed
    again = cache.read(path)
    assert again is not first and len(again.losses) == 160
    os.remove(path)
    assert cache.read(path) is None


def test_the_cache_is_bounded(tmp_path):
    cache = RecordCache(limit=3)
    paths = [write(tmp_path, f"r{i}", 2) for i in range(5)]
    for p in paths:
        assert cache.read(p) is not None
    assert len(cache._records) <= 3
