"""A large dataset file read in a child process (studio.pages.dataset.reading.ReadJob): the same
samples, problems, lookups and rows as reading it here (`read_dataset`), a file that cannot be read
reported as such, a child that dies replaced by reading here, and a cancel that leaves no process.
The window's own journey through a large file is tests/studio/test_dataset_large.py."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import threading

import numpy as np
import pytest

from engine import DatasetError
from studio.pages.dataset import loader as loader_module
from studio.pages.dataset.loader import DatasetLoader
from studio.pages.dataset.reading import ReadFailed, ReadJob, read_dataset
from tests.conftest import parsing_threads
from tests.studio.test_dataset_large import write_big


def mixed(path):
    """Every shape, rewards, warnings (an empty reply) and unreadable lines."""
    lines = [
        {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]},
        {"prompt": "Add 2 and 3.", "response": "5", "reward": 0.5},
        {"text": "Plain text, every token trained."},
        {"prompt": "Pick one", "chosen": "this", "rejected": "that"},
        {"messages": [{"role": "user", "content": "empty reply"}, {"role": "assistant", "content": ""}]},
    ]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(300):
            if i % 97 == 13:
                f.write("{not json\n")
            elif i % 89 == 5:
                f.write("\n")
            else:
                f.write(json.dumps(lines[i % len(lines)]) + "\n")
    return str(path)


def assert_same(got, want):
    assert got.path == want.path
    assert got.samples == want.samples
    assert got.problems == want.problems
    gi, wi = got.index, want.index
    assert (gi.n_samples, gi.n_problems, gi.skipped) == (wi.n_samples, wi.n_problems, wi.skipped)
    assert gi.problems_by_line == wi.problems_by_line
    assert gi.loaded == wi.loaded
    gr, wr = got.rows, want.rows
    assert gr.samples == wr.samples and gr.read == wr.read
    assert np.array_equal(gr.word_ranks, wr.word_ranks)
    fields = ("sample", "problems", "text", "words", "key", "n_tokens", "count_gen")
    assert [[getattr(r, f) for f in fields] for r in gr.rows] == [
        [getattr(r, f) for f in fields] for r in wr.rows
    ]
    # the lookups hold this process's objects: the rows' samples are the samples listed
    assert all(r.sample is s for r, s in zip(gr.rows, got.samples, strict=True))
    assert all(gr.by_sample[id(s)] is r for r, s in zip(gr.rows, got.samples, strict=True))
    assert all(gi.loaded[s.line] is s for s in got.samples)


@pytest.mark.parametrize(
    "make", [mixed, lambda p: str(write_big(p, 1200, bad_lines=(3, 700)))], ids=["mixed", "chats"]
)
def test_the_child_reads_what_reading_here_reads(tmp_path, make):
    path = make(tmp_path / "data.jsonl")
    progress: list[tuple[int, int]] = []
    got = ReadJob().read(path, lambda done, total: progress.append((done, total)))
    want = read_dataset(path)
    assert got is not None and want is not None
    assert_same(got, want)
    assert want.problems and want.index.skipped  # the files have both kinds of problems
    size = os.path.getsize(path)
    assert progress and progress[-1] == (size, size)
    assert not mp.active_children()


def test_a_file_that_cannot_be_read_is_a_dataset_error(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(DatasetError) as caught:
        read_dataset(str(path))
    with pytest.raises(DatasetError, match=re.escape(str(caught.value))):
        ReadJob().read(str(path))
    with pytest.raises(DatasetError):
        ReadJob().read(str(tmp_path / "missing.jsonl"))
    assert not mp.active_children()


@pytest.mark.parametrize(
    ("target", "said"),
    [(os.abort, "ended unexpectedly"), (lambda conn: None, "could not start")],
    ids=["dies", "cannot start"],
)
def test_a_child_that_fails_is_reported_and_the_loader_reads_here_instead(
    qtbot, tmp_path, monkeypatch, target, said
):
    path = mixed(tmp_path / "data.jsonl")
    with pytest.raises(ReadFailed, match=said):
        ReadJob(target=target).read(path)
    assert not mp.active_children()

    monkeypatch.setattr(loader_module, "ReadJob", lambda: ReadJob(target=target))
    loader = DatasetLoader()
    loaded: list = []
    loader.sig_loaded.connect(lambda job, result: loaded.append(result))
    loader.load(path)
    qtbot.waitUntil(lambda: bool(loaded), timeout=60_000)
    assert_same(loaded[0], read_dataset(path))


def test_the_window_process_does_not_parse_a_file_the_loader_reads(qtbot, tmp_path):
    """The parsing (seconds of Python for a large file) happens in the child: no thread of this
    process calls the reader, so none holds the interpreter from the UI thread for it."""
    path = str(write_big(tmp_path / "big.jsonl", 2000))
    loader = DatasetLoader()
    loaded: list = []
    loader.sig_loaded.connect(lambda job, result: loaded.append(result))
    with parsing_threads() as parsed_here:
        loader.load(path)
        qtbot.waitUntil(lambda: bool(loaded), timeout=60_000)
    assert len(loaded[0].samples) == 2000
    assert parsed_here == []


def test_cancelling_a_read_kills_its_child_and_reports_nothing(qtbot, tmp_path):
    path = str(write_big(tmp_path / "big.jsonl", 20_000))
    loader = DatasetLoader()
    loaded: list = []
    loader.sig_loaded.connect(lambda job, result: loaded.append(result))
    job = loader.load(path)
    qtbot.waitUntil(lambda: loader._read_job is not None and loader._read_job.pid is not None, timeout=30_000)
    loader.cancel_load()
    assert not loader.loading(job)
    qtbot.waitUntil(lambda: not mp.active_children(), timeout=10_000)
    qtbot.wait(200)
    assert loaded == []
    assert not [t for t in threading.enumerate() if t.name.startswith("dataset-read")]
