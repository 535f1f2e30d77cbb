"""Events read back from a file another process writes: every event type round-trips, a line still
being written is read only once whole, and a run's record is rebuilt from its events (the Runs page
following a run on other machines)."""

from __future__ import annotations

import math

import numpy as np

from engine.train import events as ev
from engine.train.runs import run_from_events

PLAN = ev.Plan(
    n_train=9, n_val=3, n_windows=5, tokens_per_epoch=500, label_tokens_per_epoch=400, batches_per_epoch=5,
    total_steps=4, trainable_params=1000, lora_targets=("blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight"),
    full_tensors=(), memory_bytes={"total": 10}, problems=("line 3: empty",), start_step=0, ranks=2,
    hosts=("a", "b"), model="/m.gguf", lora_rank=8, lora_alpha=16.0, dataset="/d.jsonl",
)  # fmt: skip


def step(n: int, ce: float) -> ev.Step:
    return ev.Step(n, 4, n / 5, ce, ce, 1e-3, 0.5, 100, 1000.0, n * 0.1, 0.3)


def test_every_event_reads_back_as_it_was_written():
    events = [
        ev.Started(PLAN), step(1, 2.5), ev.Eval(1, 2.4, 30),
        ev.LoraNorms(1, {"attn_q": 0.1}, {0: 0.1}, {"x": 0.1}),
        ev.ExpertUsage(1, np.arange(6).reshape(2, 3)), ev.Checkpoint(1, "/c/ckpt-000001"),
        ev.RunWarning(1, "careful"), ev.Paused(1),
        ev.Finished(1, True, 2.5, "/a.gguf", None, "/c/ckpt-000001"), ev.Failed(2, "went wrong", None),
        ev.Step(2, 4, 0.4, float("nan"), float("inf"), 0, 0, 0, 0, 0, float("nan")),
        ev.Started(ev.Plan(**{**PLAN.__dict__, "objective": "dpo"})),
        ev.PreferenceStep(1, "dpo", 0.69, -1.5, -1.7, 0.02, -0.01, 0.03, 0.75, 4),
        ev.PreferenceEval(1, "orpo", 0.8, -1.2, -1.9, -0.12, -0.19, 0.07, 1.0, 2),
    ]  # fmt: skip
    for e in events:
        back = ev.event_from_json(ev.event_to_json(e))
        assert type(back) is type(e)
        if isinstance(e, ev.ExpertUsage):
            np.testing.assert_array_equal(back.counts, e.counts)
        elif isinstance(e, ev.Step) and math.isnan(e.loss):
            assert math.isnan(back.loss) and math.isinf(back.mean_ce)
        else:
            assert back == e
    assert ev.event_from_json('{"event": "Step", "step": 1') is None  # cut short
    assert ev.event_from_json('{"event": "Unknown"}') is None and ev.event_from_json("") is None


def test_follow_reads_whole_lines_only_and_starts_over_on_a_new_file(tmp_path):
    path = tmp_path / "events.jsonl"
    assert ev.follow_events(str(path)) == ([], 0)  # not there yet
    lines = [ev.event_to_json(e) for e in (ev.Started(PLAN), step(1, 2.0), step(2, 1.5))]
    with open(path, "w", encoding="utf-8") as f:
        f.write(lines[0] + "\n" + lines[1][:20])  # the second line is still being written
    got, offset = ev.follow_events(str(path))
    assert [type(e) for e in got] == [ev.Started] and offset == len(lines[0]) + 1
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines[1][20:] + "\n" + lines[2] + "\n")
    got, offset = ev.follow_events(str(path), offset)
    assert [e.step for e in got] == [1, 2] and offset == path.stat().st_size
    path.write_text(lines[0] + "\n")  # a new run replaced the file: read from its start
    got, _ = ev.follow_events(str(path), offset)
    assert [type(e) for e in got] == [ev.Started]


def test_a_runs_record_is_rebuilt_from_its_events_resume_included(tmp_path):
    path = tmp_path / "run-events.jsonl"
    resumed = ev.Started(ev.Plan(**{**PLAN.__dict__, "start_step": 2}))
    events = [ev.Started(PLAN), step(1, 3.0), step(2, 2.0),
              ev.SampleAnswers(2, ["hi", "who?"], ["hey", "me"]),
              ev.Checkpoint(2, "/c/ckpt-000002"), step(3, 1.0), ev.Eval(3, 1.9, 30),
              ev.SampleAnswers(3, ["hi", "who?"], ["lost", "lost"]),
              ev.Failed(4, "rank 1 stopped answering", "/c/ckpt-000002"), resumed, step(3, 1.5), step(4, 1.2),
              ev.SampleAnswers(4, ["hi", "who?"], ["hello", "a model"]),
              ev.Eval(4, 1.3, 30), ev.Finished(4, False, 1.2, "/a.gguf", None, "/c/ckpt-000004")]  # fmt: skip
    path.write_text("".join(ev.event_to_json(e) + "\n" for e in events[:9]))
    rec = run_from_events(str(path))
    assert rec.status == "failed" and "stopped answering" in rec.message and rec.steps_done == 3
    assert (
        rec.name == "run"
        and rec.model == "/m.gguf"
        and rec.rank == 8
        and rec.targets == ["attn_q", "ffn_up_exps"]
    )
    path.write_text("".join(ev.event_to_json(e) + "\n" for e in events))
    rec = run_from_events(str(path))
    assert rec.status == "finished" and rec.adapter == "/a.gguf" and rec.last_checkpoint == "/c/ckpt-000004"
    assert rec.losses == [
        [1, 3.0],
        [2, 2.0],
        [3, 1.5],
        [4, 1.2],
    ]  # the resumed run's step 3, not the lost one
    assert rec.val_losses == [[4, 1.3]] and rec.checkpoints == "/c" and rec.path == str(path)
    # the sample answers come back (the Runs page shows them), those of the lost step 3 not
    assert rec.sample_answers == [
        [2, "hi", "hey"], [2, "who?", "me"], [4, "hi", "hello"], [4, "who?", "a model"],
    ]  # fmt: skip
    assert run_from_events(str(tmp_path / "none.jsonl")) is None
