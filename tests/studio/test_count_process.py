"""Token counting in a child process (studio.count_process, issue 38): the counts equal the
engine's in-process reference, cancelling kills and reaps the child, and a child that fails or
dies is reported with what and where. The datasets are tiny: a spawned child costs about a second."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from engine import EncodeOptions, Sample, encode_samples
from studio.count_process import CountJob
from studio.project import ModelInfo
from studio.resources import DEMO_MODEL


@pytest.fixture(scope="module")
def info() -> ModelInfo:
    return ModelInfo.read(str(DEMO_MODEL))


def chats(n: int, *, long: bool = False) -> list[Sample]:
    out = []
    for i in range(n):
        answer = "" if i % 7 == 3 else " ".join(["word"] * (300 if long and i % 2 else 1 + i % 9))
        messages = ({"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": answer})
        out.append(Sample(i + 1, "messages", messages, None, None, None, None, None))
    return out


def run(job: CountJob, samples, tokenizer, template, options, timeout: float = 60):
    rows: list = []
    errors: list = []
    done = threading.Event()
    job.start(samples, tokenizer, template, options, rows.extend, lambda e: (errors.append(e), done.set()))
    assert done.wait(timeout), "the counting never finished"
    return rows, errors[0]


def test_counts_in_the_child_equal_the_in_process_reference(info):
    samples = chats(40, long=True)
    options = EncodeOptions(n_ctx=64)  # some samples truncated, empty replies reported
    rows, error = run(CountJob(), samples, info.tokenizer, info.template, options)
    assert error is None
    assert [r[0] for r in rows] == samples
    for k, (sample, n_tokens, n_trained, truncated, problems, n_targets) in enumerate(rows):
        encoded, found = encode_samples([sample], info.tokenizer, info.template, options)
        if encoded:
            e = encoded[0]
            got = (n_tokens, n_trained, truncated, n_targets)
            assert got == (len(e.tokens), int(e.trained.sum()), e.truncated, e.n_targets), k
        else:
            assert (n_tokens, n_targets) == (-1, 0), k
        assert [p.message for p in problems] == [p.message.removeprefix("sample 0: ") for p in found], k
    assert any(r[3] for r in rows) and any(r[4] for r in rows)  # truncation and problems were exercised


def test_cancel_kills_and_reaps_the_child(info):
    job = CountJob()
    rows: list = []
    job.start(
        chats(200_000), info.tokenizer, info.template, EncodeOptions(n_ctx=512), rows.extend, rows.append
    )
    for _ in range(600):
        if job.pid is not None:
            break
        threading.Event().wait(0.05)
    pid = job.pid
    assert pid is not None
    job.cancel()
    assert not mp.active_children()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already: no zombie left behind


def wait_forever(conn) -> None:
    """A child that only waits to be killed (a module-level function: the spawned child imports it)."""
    time.sleep(600)


def test_cancels_at_once_from_two_threads_reap_the_child_every_time():
    """The UI's cancel and the reader's own end stop the child at the same moment. Both used to reap it
    at once: one `waitpid` took the child, the other got ECHILD, which multiprocessing reads as "still
    running", so `cancel` returned with the child listed (8 of 40 tries before the fix, once in CI)."""
    listed = 0
    for _ in range(12):
        job = CountJob(target=wait_forever)
        job.start([], None, None, None, lambda rows: None, lambda error: None)
        for _ in range(600):
            if job.pid is not None:
                break
            time.sleep(0.01)
        assert job.pid is not None
        both = threading.Barrier(2)
        other = threading.Thread(target=lambda b=both, j=job: (b.wait(), j.cancel()))
        other.start()
        both.wait()
        job.cancel()
        listed += bool(mp.active_children())
        other.join()
    assert listed == 0
    assert not mp.active_children()


def test_a_failure_in_the_child_is_reported_with_where(info):
    rows, error = run(CountJob(), chats(5), None, info.template, EncodeOptions(n_ctx=512))
    assert rows == []
    assert error is not None and "Error" in error and "(at " in error and ".py:" in error
    assert not mp.active_children()


def test_a_child_that_dies_is_reported(info):
    rows, error = run(
        CountJob(target=os.abort), chats(5), info.tokenizer, info.template, EncodeOptions(n_ctx=512)
    )
    assert error is not None and "ended unexpectedly" in error
    assert not mp.active_children()


def test_a_child_that_cannot_start_is_reported(info):
    """Spawn cannot pickle a lambda: starting the child fails, and that is said (the rows are then
    counted on the UI thread), not a thread that dies leaving the counting waiting forever."""
    rows, error = run(
        CountJob(target=lambda conn: None), chats(5), info.tokenizer, info.template, EncodeOptions(n_ctx=512)
    )
    assert rows == [] and error is not None and "could not start" in error
    assert not mp.active_children()
