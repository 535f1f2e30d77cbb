"""The engine session: one model shared by training, generation, rewards and export; pause in memory."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine import (
    EngineError,
    EngineSession,
    ExportRequest,
    Failed,
    Finished,
    Paused,
    SamplingConfig,
    Started,
    Step,
    TargetSpec,
    TrainConfig,
)
from engine.session import RUN
from engine.testing import SynthSpec, random_adapter, write_adapter, write_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    spec = SynthSpec.for_arch("qwen3moe", C=64, F_exp=64, V=300, qtype="Q8_0", seed=2)
    return write_model(tmp_path_factory.mktemp("session") / "m.gguf", spec)


def _config(tmp_path, **kw) -> TrainConfig:
    base = dict(targets=TargetSpec(preset="all"), rank=4, n_ctx=64, steps=6, lr=3e-3, seed=1,
                checkpoint_dir=str(tmp_path / "ckpt"), out=str(tmp_path / "a.gguf"))  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def _losses(events) -> list[float]:
    return [e.loss for e in events if isinstance(e, Step)]


def test_pause_and_resume_in_memory_equal_an_uninterrupted_run(model_path, chats, tmp_path):
    straight = EngineSession(model_path)
    straight.new_run(chats, _config(tmp_path / "a"))
    events: list = []
    assert isinstance(straight.train(events.append), Finished)
    reference = _losses(events)
    assert len(reference) == 6

    session = EngineSession(model_path)
    run = session.new_run(chats, _config(tmp_path / "b"))
    events = []
    paused = session.train(events.append, should_pause=lambda: run.step == 2)
    assert isinstance(paused, Paused) and paused.step == 2 and session.paused
    assert isinstance(events[0], Started) and len(_losses(events)) == 2
    # while paused: the live adapter answers, on the same model (nothing reloaded)
    misses = session.model.weights.stats.misses
    reply = session.generate("hello", adapter=RUN, sampling=SamplingConfig(temperature=0, max_new_tokens=3))
    assert len(reply) == 1 and session.run is run and run.model is session.model
    assert session.model.weights.stats.misses >= misses
    paused_again = session.train(events.append, should_pause=lambda: run.step == 4)
    assert isinstance(paused_again, Paused) and paused_again.step == 4
    done = session.train(events.append)
    assert isinstance(done, Finished) and not done.stopped and done.step == 6
    assert _losses(events) == reference  # bit for bit
    assert [e.plan.start_step for e in events if isinstance(e, Started)] == [0]  # one start, not three
    assert not session.paused
    with pytest.raises(EngineError, match="already ended"):
        session.train()


def test_stopping_a_paused_run_writes_its_checkpoint_and_adapter(model_path, chats, tmp_path):
    session = EngineSession(model_path)
    run = session.new_run(chats, _config(tmp_path))
    session.train(should_pause=lambda: run.step == 3)
    result = session.stop_run()
    assert isinstance(result, Finished) and result.stopped and result.step == 3
    assert os.path.isfile(result.adapter_path) and result.checkpoint_path.endswith("ckpt-000003")
    with pytest.raises(EngineError, match="no paused run"):
        session.stop_run()


def test_elapsed_counts_training_time_once(model_path, chats, tmp_path):
    session = EngineSession(model_path)
    run = session.new_run(chats, _config(tmp_path, steps=4))
    steps: list[Step] = []
    on_event = lambda e: steps.append(e) if isinstance(e, Step) else None  # noqa: E731
    session.train(on_event, should_pause=lambda: run.step == 2)
    session.train(on_event)
    elapsed = [s.elapsed_s for s in steps]
    assert elapsed == sorted(elapsed) and elapsed[-1] == pytest.approx(run.train_seconds)
    assert all(np.isfinite(s.eta_s) for s in steps) and steps[-1].eta_s == 0


def test_one_model_serves_every_job(model_path, chats, tmp_path):
    session = EngineSession(model_path)
    run = session.new_run(chats, _config(tmp_path, steps=1))
    session.train()
    rewards = session.open_rewards(ratings_path=str(tmp_path / "ratings.jsonl"))
    assert rewards.model is session.model and run.model is session.model
    pairs = random_adapter(session.model, ["blk.0.attn_q.weight"], rank=2, seed=3, std=0.1)
    adapter_path = write_adapter(tmp_path / "x.gguf", "qwen3moe", pairs, alpha=4.0)
    a1 = session.adapter(adapter_path)
    assert session.adapter(adapter_path) is a1  # unchanged file: not read again
    os.utime(adapter_path, ns=(1, 1))
    assert session.adapter(adapter_path) is not a1
    base = session.logits([1, 5, 9])
    adapted = session.logits([1, 5, 9], adapter=adapter_path)
    assert base.shape == (3, 300) and np.abs(adapted - base).max() > 0
    report = session.norms(adapter_path)
    assert report.tensors[0].norm_w is not None
    out = str(tmp_path / "x.f16.gguf")
    request = ExportRequest(source=str(adapter_path), out=out, base=model_path, qtype="F16")
    check = session.check_export(request)
    assert check.ok, check.summary()
    path = session.export(request, check.adapter)
    verified = session.verify_export(request, check.adapter, path)
    assert verified.ok, verified.verdict()


def test_jobs_do_not_overlap(model_path):
    session = EngineSession(model_path)
    with session.job("a long job"), pytest.raises(EngineError, match="busy"):
        session.generate("hi", sampling=SamplingConfig(temperature=0, max_new_tokens=2))


def test_generation_streams_whole_characters_and_a_failed_start_ends_the_run(model_path, tmp_path):
    session = EngineSession(model_path)
    pieces: list[tuple[int, str]] = []
    replies = session.generate(
        [{"role": "user", "content": "tell me"}],
        SamplingConfig(temperature=0.9, seed=3, max_new_tokens=6),
        n=2,
        on_token=lambda i, text: pieces.append((i, text)),
    )
    for i, r in enumerate(replies):
        assert "".join(t for j, t in pieces if j == i) == r.text
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    session.new_run(str(empty), TrainConfig(steps=1))
    assert isinstance(session.train(), Failed) and not session.paused


def test_a_run_killed_by_the_system_resumes_from_its_last_checkpoint(model_path, chats, tmp_path):
    """SIGKILL in the middle of step 3 (as the out-of-memory killer would): the checkpoint of step 2
    is whole and the next start continues from it to the end."""
    import signal
    import subprocess
    import sys
    import textwrap

    ckpt = tmp_path / "ckpt"
    code = textwrap.dedent(f"""
        import os, signal
        import engine.train.trainer as t
        from engine import EngineSession, TargetSpec, TrainConfig
        real = t.loss_and_grads
        calls = []
        def dying(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        t.loss_and_grads = dying
        s = EngineSession({model_path!r})
        s.new_run({chats!r}, TrainConfig(targets=TargetSpec(preset="all"), rank=4, n_ctx=64, steps=6,
                                         checkpoint_every=1, checkpoint_dir={str(ckpt)!r}))
        s.train()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("ckpt-")) == [
        "ckpt-000001",
        "ckpt-000002",
    ]
    session = EngineSession(model_path)
    session.new_run(chats, _config(tmp_path, checkpoint_every=1), resume=str(ckpt / "ckpt-000002"))
    events: list = []
    result = session.train(events.append)
    assert isinstance(result, Finished) and result.step == 6
    assert [e.step for e in events if isinstance(e, Step)] == [3, 4, 5, 6]


def test_the_session_keeps_only_the_adapters_read_last(model_path, tmp_path):
    """A long app session chats with the adapter of every new run: the session keeps the last few
    read, not all of them (bench/soak.py app grew ~0.3 MiB a round before)."""
    from engine.session import ADAPTERS_KEPT

    session = EngineSession(model_path)
    pairs = random_adapter(session.model, ["blk.0.attn_q.weight"], rank=2, seed=4)
    paths = [write_adapter(tmp_path / f"a{i}.gguf", session.model.config.arch, pairs, 4.0) for i in range(6)]
    first = session.adapter(paths[0])
    for p in paths[1:]:
        session.adapter(p)
        session.adapter(paths[0])  # used again: kept
    assert len(session._adapters) == ADAPTERS_KEPT and session.adapter(paths[0]) is first
    assert list(session._adapters) == [*paths[6 - ADAPTERS_KEPT + 1 :], paths[0]]
