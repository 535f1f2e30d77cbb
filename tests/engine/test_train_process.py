"""Training in a child process (engine.TrainProcess): the same run as in this process, events
streamed back in order, graceful stop on request, and every way a child can fail reported with
what happened (the trainer's exception with its traceback, a killed process, a bad trainer name)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from engine import (
    Checkpoint,
    ChildDied,
    ChildRaised,
    Failed,
    Finished,
    Started,
    Step,
    TrainConfig,
    Trainer,
    TrainJob,
    TrainProcess,
)
from engine.train.train_process import DEFAULT_NICE, describe_exit
from tests import child_trainers


def cfg(tmp_path, name: str, **kw) -> TrainConfig:
    base = dict(
        steps=4, n_ctx=64, checkpoint_dir=str(tmp_path / f"{name}-ckpt"), out=str(tmp_path / f"{name}.gguf")
    )
    return TrainConfig(**{**base, **kw})


def gated_job(tmp_path, model: str, chats: str, step: int) -> TrainJob:
    """A 500-step run that waits after Step `step` until child_trainers.release(str(tmp_path))."""
    return TrainJob(
        model=model,
        data=chats,
        config=cfg(tmp_path, "run", steps=500),
        trainer="tests.child_trainers:gated",
        trainer_kwargs={"gate": str(tmp_path), "step": step},
    )


def test_a_child_run_equals_the_same_run_here(tmp_path, synth_model, chats):
    model = synth_model("qwen3moe")
    here: list = []
    expected = Trainer(model, chats, cfg(tmp_path, "here")).run(here.append)
    seen: list = []
    proc = TrainProcess(TrainJob(model=model, data=chats, config=cfg(tmp_path, "child")))
    result = proc.run(seen.append)
    assert proc.pid != os.getpid() and proc.exitcode == 0
    assert isinstance(result, Finished) and result.step == expected.step == 4 and not result.stopped
    assert [type(e) for e in seen] == [type(e) for e in here]
    assert isinstance(seen[0], Started) and isinstance(seen[-1], Finished)
    # the same arithmetic in another interpreter: identical losses, and an identical adapter file
    assert [e.loss for e in seen if isinstance(e, Step)] == [e.loss for e in here if isinstance(e, Step)]
    assert result.final_loss == expected.final_loss
    assert (tmp_path / "child.gguf").read_bytes() == (tmp_path / "here.gguf").read_bytes()


def test_stop_is_graceful_and_writes_a_checkpoint(tmp_path, synth_model, chats):
    gate = str(tmp_path)
    proc = TrainProcess(gated_job(tmp_path, synth_model("llama"), chats, 3))
    steps: list[int] = []
    nices: list[int] = []

    def on_event(e) -> None:
        if isinstance(e, Step):
            steps.append(e.step)
            if e.step == 3:  # the child waits at the gate: ask it to stop, then let it go
                if os.path.isdir(f"/proc/{proc.pid}/task"):  # Linux: every thread of it runs niced
                    tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
                    nices.extend(os.getpriority(os.PRIO_PROCESS, t) for t in tids)
                proc.request_stop()
                child_trainers.release(gate, stopping=True)

    result = proc.run(on_event)
    assert isinstance(result, Finished) and result.stopped and result.step == 3
    assert steps == [1, 2, 3]
    if nices:  # the main thread, NumPy's BLAS threads and the control thread, all below normal
        assert len(nices) >= 2 and min(nices) >= os.getpriority(os.PRIO_PROCESS, 0) + DEFAULT_NICE
    assert result.checkpoint_path.endswith("ckpt-000003") and os.path.isdir(result.checkpoint_path)
    assert proc.exitcode == 0


def test_stop_requested_before_the_child_starts_ends_it_at_once(tmp_path, synth_model, chats):
    proc = TrainProcess(
        TrainJob(model=synth_model("llama"), data=chats, config=cfg(tmp_path, "run", steps=500))
    )
    proc.request_stop()
    result = proc.run()
    assert isinstance(result, Finished) and result.stopped and result.step <= 1


def test_an_engine_error_in_the_child_arrives_as_itself(tmp_path, chats):
    missing = str(tmp_path / "missing.gguf")
    proc = TrainProcess(TrainJob(model=missing, data=chats, config=cfg(tmp_path, "run")))
    with pytest.raises(ChildRaised) as info:
        proc.run()
    exc = info.value
    assert exc.type_name == "ModelError" and "missing.gguf" in exc.message
    assert type(exc.original).__name__ == "ModelError" and str(exc.original) == exc.message
    assert "Traceback" in exc.child_traceback and "Model.load" in exc.child_traceback


def test_bad_data_ends_with_the_trainers_own_failed_event(tmp_path, synth_model):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    seen: list = []
    result = TrainProcess(
        TrainJob(model=synth_model("llama"), data=str(bad), config=cfg(tmp_path, "run"))
    ).run(seen.append)
    assert isinstance(result, Failed) and result.step == 0 and "no usable sample" in result.message
    assert seen == [result]


def test_an_exception_in_a_step_carries_the_childs_traceback(tmp_path, synth_model, chats):
    job = TrainJob(
        model=synth_model("llama"),
        data=chats,
        config=cfg(tmp_path, "run"),
        trainer="tests.child_trainers:failing_at",
        trainer_kwargs={"step": 2, "error": "KeyError", "message": "attn_q"},
    )
    seen: list = []
    with pytest.raises(ChildRaised) as info:
        TrainProcess(job).run(seen.append)
    assert info.value.type_name == "KeyError" and isinstance(info.value.original, KeyError)
    assert "child_trainers.py" in info.value.child_traceback
    assert [e.step for e in seen if isinstance(e, Step)] == [1]


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL is POSIX")
def test_a_killed_child_is_reported_with_the_signal(tmp_path, synth_model, chats):
    job = TrainJob(
        model=synth_model("llama"),
        data=chats,
        config=cfg(tmp_path, "run", steps=5, checkpoint_every=1),
        trainer="tests.child_trainers:dying_at",
        trainer_kwargs={"step": 3},
    )
    seen: list = []
    proc = TrainProcess(job)
    with pytest.raises(ChildDied) as info:
        proc.run(seen.append)
    assert info.value.exitcode == -signal.SIGKILL and proc.exitcode == -signal.SIGKILL
    assert "killed (SIGKILL)" in str(info.value) and "memory runs out" in str(info.value)
    # what it sent before it died arrived: two steps and their checkpoints
    assert [e.step for e in seen if isinstance(e, Step)] == [1, 2]
    assert [e.step for e in seen if isinstance(e, Checkpoint)] == [1, 2]


def test_kill_ends_a_run_that_is_held(tmp_path, synth_model, chats):
    proc = TrainProcess(gated_job(tmp_path, synth_model("llama"), chats, 1))

    def on_event(e) -> None:
        if isinstance(e, Step):
            threading.Timer(0.05, proc.kill).start()

    with pytest.raises(ChildDied) as info:
        proc.run(on_event)
    assert info.value.exitcode == -signal.SIGKILL


def test_a_trainer_name_that_does_not_resolve(tmp_path, synth_model, chats):
    job = TrainJob(model=synth_model("llama"), data=chats, config=cfg(tmp_path, "run"), trainer="engine")
    with pytest.raises(ChildRaised) as info:
        TrainProcess(job).run()
    assert info.value.type_name == "ValueError" and "module:attribute" in info.value.message


def test_exit_descriptions():
    assert describe_exit(None) == "the training process stopped answering"
    assert describe_exit(3) == "the training process ended unexpectedly (exit status 3)"
    assert describe_exit(-15) == "the training process was killed (SIGTERM)"
    assert "memory runs out" in describe_exit(-9)
