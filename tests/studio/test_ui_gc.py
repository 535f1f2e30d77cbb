"""The app's garbage collection (studio.ui_gc): on the UI thread from a timer, none while a dataset is
read (one walking 100,000 samples held the interpreter 40-240 ms); the samples read are frozen."""

from __future__ import annotations

import gc
import json
import threading

import pytest

from studio.pages.dataset.loader import DatasetLoader
from studio.ui_gc import UiCollector, collections_held


@pytest.fixture
def collector(qapp):
    earlier = UiCollector.for_app(qapp)  # e.g. one the app's main() installed in an earlier test
    if earlier is not None:
        earlier.stop()
    c = UiCollector.install(qapp, interval_s=0.005)
    assert c is not earlier
    c.threshold = (0, 0, 0)  # every look collects every generation it may
    generations: list[tuple[int, int]] = []  # (generation, holds) of each collection started

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and threading.current_thread() is threading.main_thread():
            generations.append((info["generation"], c._holds))

    gc.callbacks.append(seen)
    c.generations = generations
    yield c
    gc.callbacks.remove(seen)
    c.stop()
    assert UiCollector.for_app(qapp) is None


def test_no_collection_while_held_and_every_generation_after(collector, qtbot):
    with collections_held():
        collector.generations.clear()
        for _ in range(3):
            for _ in range(1000):  # cyclic garbage: only a collection frees it, so the counts stay up
                cycle: list = []
                cycle.append(cycle)
            del cycle
            qtbot.wait(20)
        assert collector.skipped > 0 and collector.generations == []
    collector.generations.clear()
    qtbot.waitUntil(lambda: any(g == 2 for g, _ in collector.generations), timeout=2000)
    assert not gc.isenabled()  # automatic collection stays off while the collector runs


def test_reading_a_dataset_holds_off_full_collections(collector, qtbot, tmp_path):
    path = tmp_path / "chats.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(20_000):
            messages = [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": f"a {i}"}]
            f.write(json.dumps({"messages": messages}) + "\n")
    loader = DatasetLoader()
    loaded: list = []
    loader.sig_loaded.connect(lambda job, result: loaded.append(result))
    collector.generations.clear()
    frozen = gc.get_freeze_count()
    loader.load(str(path))
    qtbot.waitUntil(lambda: bool(loaded), timeout=60_000)
    assert len(loaded[0].samples) == 20_000
    assert collector.skipped > 0  # the collector would have collected during the read
    assert all(holds == 0 for _, holds in collector.generations)
    assert gc.get_freeze_count() - frozen >= 2 * 20_000  # the samples read: out of the collector's reach
