"""The pages share run records: a record file read once while it is unchanged."""

from __future__ import annotations

import os

from engine import RunRecord
from engine.train.runs import Curve
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


def test_a_record_read_back_keeps_its_curves_in_arrays_and_reads_as_before(tmp_path):
    """The curves of a record (`Curve`) are two arrays, not a list of lists per point: the app keeps
    the records of every run listed, and a 150-step run's losses were ~14 KB of Python objects."""
    import json
    import pickle
    import tracemalloc

    path = write(tmp_path, "long", 2000)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    tracemalloc.start()
    rec = RunRecord.from_json(data, path)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held < 2000 * 24  # 16 bytes a point and the arrays' slack (lists of lists: ~100 a point)
    assert isinstance(rec.losses, Curve) and len(rec.losses) == 2000
    assert rec.losses == data["losses"] and rec.losses[0] == (1, 2.0) and rec.losses[-1][0] == 2000
    assert [s for s, _ in rec.losses[:3]] == [1, 2, 3]
    assert rec.to_json()["losses"] == data["losses"]  # written back as [[step, value], ...]
    assert pickle.loads(pickle.dumps(rec)) == rec
    rec.cut_at(10)
    assert list(rec.losses) == [(s, 2.0 - (s - 1) / 2000) for s in range(1, 11)]
    rec.add_val_loss(10, 1.5)
    assert rec.val_losses == [[10, 1.5]]
