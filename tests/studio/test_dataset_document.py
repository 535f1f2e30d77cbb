"""The dataset document without Qt: undo/redo, the dirty flag, merged edits, observers, problems,
and files that open, save and fail to save without losing anything."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from engine import DatasetError, load_jsonl, sample_to_json
from studio.dataset_document import DatasetChange, DatasetDocument
from studio.pages.dataset.samples import new_sample, rebuild_sample
from tests.conftest import modules_loaded_by

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DATA = ROOT / "tests" / "data" / "datasets" / "sample_data.jsonl"


def write_lines(path: Path, objects: list) -> Path:
    lines = [o if isinstance(o, str) else json.dumps(o) for o in objects]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def chat(user: str, reply: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]}


@pytest.fixture
def doc(tmp_path) -> DatasetDocument:
    d = DatasetDocument()
    d.open(write_lines(tmp_path / "d.jsonl", [chat(f"q{i}", f"a{i}") for i in range(5)]))
    return d


def replies(doc: DatasetDocument) -> list[str]:
    return [s.messages[-1]["content"] for s in doc.samples()]


def with_reply(doc: DatasetDocument, row: int, text: str):
    sample = doc.sample(row)
    messages = (*sample.messages[:-1], {**sample.messages[-1], "content": text})
    return rebuild_sample(sample, messages=messages)[0]


def test_the_document_module_does_not_import_qt():
    assert modules_loaded_by("studio.dataset_document", ("PySide6", "pyqtgraph")) == []


def test_undo_and_redo_walk_every_step_back_and_forth(doc):
    states = [doc.samples()]
    doc.insert(2, [new_sample("text")], "Add a text sample")
    states.append(doc.samples())
    doc.remove([0, 3, 4], "Delete 3 samples")
    states.append(doc.samples())
    doc.move(0, 2, "Move sample down")
    states.append(doc.samples())
    doc.edit(1, with_reply(doc, 1, "changed"), "Edit turn 2")
    states.append(doc.samples())
    assert doc.sample(1).messages[-1]["content"] == "changed" and len(doc) == 3
    assert doc.undo_count() == 4 and doc.undo_text() == "Edit turn 2" and not doc.can_redo()
    for expected in reversed(states[:-1]):
        doc.undo()
        assert doc.samples() == expected
    assert not doc.can_undo() and doc.undo() == [] and doc.redo_text() == "Add a text sample"
    for expected in states[1:]:
        doc.redo()
        assert doc.samples() == expected
    assert doc.redo() == []


def test_a_new_step_drops_the_steps_that_were_undone(doc):
    doc.remove([0])
    doc.remove([0])
    doc.undo()
    assert doc.redo_count() == 1
    doc.move(0, 1)
    assert doc.redo_count() == 0 and doc.undo_count() == 2


def test_the_dirty_flag_follows_the_saved_state(doc, tmp_path):
    heard = []
    doc.subscribe(lambda c: heard.append(c.kind) if c.kind == "dirty" else None)
    assert not doc.dirty
    doc.remove([0])
    assert doc.dirty
    doc.undo()
    assert not doc.dirty  # back to the file's state: clean again
    doc.redo()
    assert doc.dirty
    doc.save()
    assert not doc.dirty
    doc.undo()
    assert doc.dirty  # the file now lacks that sample
    doc.redo()
    assert not doc.dirty
    doc.undo()
    doc.move(0, 1)  # the saved state was in the redo steps just dropped: dirty until saved
    doc.undo()
    assert doc.dirty
    assert heard == ["dirty"] * 7
    doc.clear_history()
    assert doc.dirty and not doc.can_undo()
    doc.save(tmp_path / "other.jsonl")
    assert not doc.dirty and doc.path == str(tmp_path / "other.jsonl")


def test_a_new_document_is_clean_until_something_is_added():
    doc = DatasetDocument()
    assert not doc.dirty and doc.path is None and doc.samples() == []
    doc.insert(0, [new_sample()])
    assert doc.dirty
    with pytest.raises(DatasetError, match="no file name"):
        doc.save()


def test_consecutive_edits_with_one_key_merge_into_one_step(doc):
    original = doc.sample(1)
    for text in ("a", "ab", "abc"):
        doc.edit(1, with_reply(doc, 1, text), "Edit turn 2", key=("turn", 1, "session 1"))
    assert doc.undo_count() == 1 and replies(doc)[1] == "abc"
    doc.edit(1, with_reply(doc, 1, "abcd"), "Edit turn 2", key=("turn", 1, "session 2"))
    doc.edit(2, with_reply(doc, 2, "x"), "Edit turn 2", key=("turn", 1, "session 2"))  # another sample
    doc.edit(2, with_reply(doc, 2, "xy"), "Edit turn 2")  # no key: never merges
    assert doc.undo_count() == 4
    for _ in range(3):
        doc.undo()
    assert replies(doc)[1] == "abc"
    doc.undo()
    assert doc.sample(1) == original and not doc.dirty


def test_an_edit_merged_back_to_the_original_leaves_no_step(doc):
    doc.edit(0, with_reply(doc, 0, "typed"), "Edit", key="k")
    doc.edit(0, with_reply(doc, 0, "a0"), "Edit", key="k")  # typed, then deleted again
    assert doc.undo_count() == 0 and not doc.dirty and replies(doc)[0] == "a0"
    assert doc.edit(0, doc.sample(0), "Edit", key="k") == []  # no change, no step


def test_edits_do_not_merge_across_the_saved_state(doc):
    doc.edit(0, with_reply(doc, 0, "one"), "Edit", key="k")
    doc.save()
    doc.edit(0, with_reply(doc, 0, "one two"), "Edit", key="k")
    assert doc.undo_count() == 2 and doc.dirty
    doc.undo()
    assert replies(doc)[0] == "one" and not doc.dirty


def test_an_edit_keeps_the_sample_line_in_the_file(doc):
    new = replace(with_reply(doc, 3, "z"), line=0)
    doc.edit(3, new)
    assert doc.sample(3).line == 4


def test_observers_hear_each_change_with_its_rows(doc):
    heard: list[DatasetChange] = []
    doc.subscribe(heard.append)
    doc.insert(1, [new_sample(), new_sample("prompt")], "Add")
    assert heard == [
        DatasetChange("inserted", row=1, count=2),
        DatasetChange("history", rows=(1, 2)),
        DatasetChange("dirty"),
    ]
    heard.clear()
    doc.remove([0, 1, 4], "Delete")  # two runs, removed from the last one back
    assert heard == [
        DatasetChange("removed", row=4, count=1),
        DatasetChange("removed", row=0, count=2),
        DatasetChange("history", rows=(0,)),
    ]
    heard.clear()
    doc.undo()
    assert heard == [
        DatasetChange("inserted", row=0, count=2),
        DatasetChange("inserted", row=4, count=1),
        DatasetChange("history", rows=(0, 1, 4)),
    ]
    heard.clear()
    doc.move(4, 0)
    doc.edit(2, with_reply(doc, 2, "new"))
    assert heard == [
        DatasetChange("moved", row=4, dest=0),
        DatasetChange("history", rows=(0,)),
        DatasetChange("changed", row=2, count=1),
        DatasetChange("history", rows=(2,)),
    ]
    heard.clear()
    listener = heard.append
    doc.unsubscribe(heard.append)  # the same bound method compares equal
    doc.undo()
    assert heard == []
    doc.subscribe(listener)
    doc.open(SAMPLE_DATA)
    assert [c.kind for c in heard] == ["reset", "path", "history", "dirty"]


def test_samples_is_a_copy(doc):
    samples = doc.samples()
    samples.clear()
    assert len(doc) == 5 and len(doc.samples()) == 5


def test_save_writes_what_open_reads_back_and_renumbers_lines(doc, tmp_path):
    doc.insert(0, [rebuild_sample(new_sample("text"), text="first")[0]])
    doc.remove([3])
    doc.edit(1, with_reply(doc, 1, "edited"))
    heard: list[DatasetChange] = []
    doc.subscribe(heard.append)
    out = tmp_path / "out.jsonl"
    assert doc.save(out) == str(out)
    assert [s.line for s in doc.samples()] == [1, 2, 3, 4, 5]
    assert [c.kind for c in heard] == ["changed", "path", "dirty"]
    assert heard[0] == DatasetChange("changed", row=0, count=3)  # the 4th and 5th kept their lines
    samples, problems = load_jsonl(out)
    assert problems == [] and samples == doc.samples()
    other = DatasetDocument()
    assert other.open(out) == []
    assert other.samples() == doc.samples() and other.path == str(out) and not other.dirty
    assert [sample_to_json(s) for s in other] == [sample_to_json(s) for s in doc]


def test_open_keeps_what_reading_found_and_problems_follow_edits(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl",
        [chat("q", "a"), '{"broken', chat("q", "a"), {"messages": [{"role": "user", "content": "x"}]}],
    )
    doc = DatasetDocument()
    problems = doc.open(path)
    assert [s.line for s in doc] == [1, 3] and doc.path == str(path) and not doc.dirty
    assert {p.line for p in problems} == {2, 3, 4} and doc.problems == problems
    assert [p.line for p in doc.skipped] == [2, 4]
    duplicate = doc.problems_for(doc.sample(1))
    assert [p.message for p in duplicate] == ["duplicate of line 1 (the same sample twice)"]
    emptied = rebuild_sample(doc.sample(1), messages=({"role": "user", "content": "q"},))[0]
    doc.edit(1, emptied)
    assert [p.severity for p in doc.problems_for(doc.sample(1))] == ["error"]  # validated now
    doc.undo()
    assert doc.problems_for(doc.sample(1)) == duplicate  # as read again
    doc.save()
    assert doc.skipped == [] and [s.line for s in doc] == [1, 2]
    assert [p.line for p in doc.problems_for(doc.sample(1))] == [2]


def test_a_save_that_fails_leaves_the_file_and_the_dirty_flag_as_they_were(doc, tmp_path, monkeypatch):
    path = Path(doc.path)
    before = path.read_bytes()
    doc.remove([0])
    samples = doc.samples()
    heard = []
    doc.subscribe(heard.append)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(DatasetError, match="No space left on device"):
        doc.save()
    with pytest.raises(DatasetError):
        doc.save(tmp_path / "elsewhere.jsonl")
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]
    assert doc.dirty and doc.path == str(path) and doc.samples() == samples and heard == []
    assert doc.can_undo()
    with pytest.raises(DatasetError, match="is a folder"):
        doc.save(tmp_path)
    assert doc.path == str(path) and doc.dirty


def test_opening_an_unreadable_file_changes_nothing(doc, tmp_path):
    samples, path = doc.samples(), doc.path
    doc.remove([1])
    with pytest.raises(DatasetError):
        doc.open(tmp_path / "missing.jsonl")
    assert doc.samples() == [s for i, s in enumerate(samples) if i != 1]
    assert doc.path == path and doc.dirty and doc.can_undo()


def test_reset_as_unsaved_is_dirty_until_saved(tmp_path):
    doc = DatasetDocument()
    samples = [rebuild_sample(new_sample("text"), text=t)[0] for t in ("a", "b")]
    doc.reset(samples, tmp_path / "x.jsonl", saved=False)
    assert doc.dirty and not doc.can_undo() and doc.path == str(tmp_path / "x.jsonl")
    doc.insert(0, [new_sample()])
    doc.undo()
    assert doc.dirty  # undo cannot reach a saved state: there is none
    doc.save()
    assert not doc.dirty and load_jsonl(tmp_path / "x.jsonl")[0] == doc.samples()


def test_positions_out_of_range_are_refused(doc):
    with pytest.raises(IndexError, match="the dataset has 5 samples"):
        doc.remove([5])
    with pytest.raises(IndexError):
        doc.insert(7, [new_sample()])
    with pytest.raises(IndexError):
        doc.move(0, 5)
    assert doc.undo_count() == 0 and len(doc) == 5
