"""The training loop end to end on tiny models: it learns, resumes exactly, reports and stops cleanly."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from engine.model.generate import GREEDY, generate
from engine.model.lora import LoraAdapter
from engine.model.model import Model
from engine.model.targets import TargetSpec
from engine.testing import SynthSpec, write_model
from engine.text.chat_template import ChatTemplate
from engine.text.tokenizer import Tokenizer
from engine.train import events as ev
from engine.train.data import load_jsonl
from engine.train.trainer import TrainConfig, Trainer
from tests.conftest import question_ids, write_chats

CHATS = [
    ("hello", "the quick brown fox"),
    ("what is water", "water is one of the people"),
    ("who are you", "my name is lazy dog"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    return {
        "llama": write_model(d / "llama.gguf", SynthSpec.for_arch("llama", seed=11)),
        "qwen3moe": write_model(d / "moe.gguf", SynthSpec.for_arch("qwen3moe", seed=12)),
    }


def answer(model: Model, adapter_terms, question: str) -> str:
    tok, prompt = question_ids(model, question, add_special=True)
    [g] = generate(model, prompt, sampling=GREEDY, stop_ids=tok.eot_ids, lora=adapter_terms)
    return tok.decode(list(g.tokens))


def run(trainer: Trainer, stop_after: int | None = None):
    got = []

    def should_stop():
        return stop_after is not None and sum(isinstance(e, ev.Step) for e in got) >= stop_after

    result = trainer.run(got.append, should_stop)
    return got, result


@pytest.mark.parametrize("arch,preset,steps", [("llama", "all", 60), ("qwen3moe", "experts", 150)])
def test_overfits_and_generation_reproduces_the_answers(models, tmp_path, arch, preset, steps):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    out = tmp_path / "adapter.gguf"
    cfg = TrainConfig(
        targets=TargetSpec(preset=preset),
        rank=8,
        alpha=16,
        lr=1e-2,
        steps=steps,
        schedule="constant",
        n_ctx=64,
        batch_size=3,
        out=str(out),
        seed=1,
    )
    got, result = run(Trainer(models[arch], data, cfg))
    steps_n = steps
    steps = [e for e in got if isinstance(e, ev.Step)]
    assert isinstance(got[0], ev.Started) and isinstance(result, ev.Finished) and got[-1] is result
    assert [s.step for s in steps] == list(range(1, steps_n + 1))
    assert steps[-1].mean_ce < 0.05 * steps[0].mean_ce, (steps[0].mean_ce, steps[-1].mean_ce)
    if arch == "qwen3moe":
        assert all(n.endswith("_exps.weight") for n in got[0].plan.lora_targets)
        usage = [e for e in got if isinstance(e, ev.ExpertUsage)]
        assert len(usage) == steps_n and usage[0].counts.shape == (2, 4)
    norms = [e for e in got if isinstance(e, ev.LoraNorms)]
    assert norms and norms[-1].per_tensor and max(norms[-1].per_tensor.values()) > 0
    model = Model.load(models[arch])
    adapter = LoraAdapter.load(result.adapter_path, model)
    for q, a in CHATS:
        assert answer(model, adapter.terms(), q) == a
    assert answer(model, None, "hello") != "the quick brown fox"


def test_resume_continues_the_same_trajectory(models, tmp_path):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    base = dict(
        targets=TargetSpec(preset="attention"),
        rank=4,
        lr=5e-3,
        steps=6,
        n_ctx=32,
        batch_size=1,
        grad_accum=2,
        seed=3,
        schedule="cosine",
        warmup_steps=2,
    )
    full_run, _ = run(Trainer(models["llama"], data, TrainConfig(**base)))
    ckpt = tmp_path / "ckpt"
    first, _ = run(
        Trainer(models["llama"], data, TrainConfig(**base, checkpoint_dir=str(ckpt), checkpoint_every=3)),
        stop_after=3,
    )
    saved = sorted(os.listdir(ckpt))
    assert saved == ["ckpt-000003", "run.json"]  # the checkpoint and the run's record
    second, result = run(
        Trainer(models["llama"], data, TrainConfig(**base), resume=str(ckpt / "ckpt-000003"))
    )
    assert second[0].plan.start_step == 3
    losses = [e.loss for e in full_run if isinstance(e, ev.Step)]
    resumed = [e.loss for e in first if isinstance(e, ev.Step)] + [
        e.loss for e in second if isinstance(e, ev.Step)
    ]
    assert resumed == losses  # bit for bit
    assert result.step == 6


def test_a_checkpoint_carries_its_runs_plan_settings_data_and_counters(models, tmp_path):
    """Samples trained from memory (the app's editor) are copied beside the checkpoints; the checkpoint
    names the settings, the planned total, the tokens and the time, and resuming on its own data with
    its own settings continues the counters and the trajectory; too few planned steps fail clearly."""
    from engine.train.resume import read_checkpoint_info, trajectory_changes

    samples, _ = load_jsonl(write_chats(tmp_path / "d.jsonl", CHATS))
    cfg = TrainConfig(targets=TargetSpec(preset="attention"), rank=4, lr=5e-3, steps=6, n_ctx=32, seed=3)
    full_run, _ = run(Trainer(models["llama"], samples, cfg))
    ckpt = tmp_path / "run-checkpoints"
    first, stopped = run(
        Trainer(models["llama"], samples, replace(cfg, checkpoint_dir=str(ckpt))), stop_after=2
    )
    assert stopped.stopped and (ckpt / "data.jsonl").exists()
    info = read_checkpoint_info(str(ckpt))
    steps1 = [e for e in first if isinstance(e, ev.Step)]
    assert (info.step, info.total_steps, info.config) == (2, 6, replace(cfg, checkpoint_dir=str(ckpt)))
    assert info.tokens == sum(e.tokens for e in steps1) and info.seconds == steps1[-1].elapsed_s > 0
    assert info.dataset is None and info.data() == str(ckpt / "data.jsonl")
    assert trajectory_changes(info.config, replace(info.config, n_ctx=64, lr=1e-3)) == [
        "context 32 -> 64",
        "learning rate 0.005 -> 0.001",
    ]
    second, result = run(Trainer(models["llama"], info.data(), info.config, resume=info.path))
    plan = second[0].plan
    assert (plan.start_step, plan.start_tokens, plan.start_seconds) == (2, info.tokens, info.seconds)
    assert [e.loss for e in steps1 + [e for e in second if isinstance(e, ev.Step)]] == [
        e.loss for e in full_run if isinstance(e, ev.Step)
    ]
    assert result.step == 6
    _, failed = run(Trainer(models["llama"], samples, replace(cfg, steps=1), resume=info.path))
    assert isinstance(failed, ev.Failed) and "nothing is left to train" in failed.message
    assert "it planned 6 steps" in failed.message


def test_stop_is_graceful_and_leaves_a_consistent_checkpoint(models, tmp_path):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    cfg = TrainConfig(
        rank=4, steps=50, n_ctx=32, checkpoint_dir=str(tmp_path / "c"), out=str(tmp_path / "a.gguf")
    )
    got, result = run(Trainer(models["llama"], data, cfg), stop_after=2)
    assert isinstance(result, ev.Finished) and result.stopped and result.step == 2
    assert result.checkpoint_path.endswith("ckpt-000002")
    model = Model.load(models["llama"])
    # the checkpoint's adapter equals the adapter written at the end
    a = LoraAdapter.load(os.path.join(result.checkpoint_path, "adapter.gguf"), model)
    b = LoraAdapter.load(result.adapter_path, model)
    for name in a.pairs:
        np.testing.assert_array_equal(a.pairs[name][1], b.pairs[name][1])


def test_non_finite_loss_fails_with_the_step_and_keeps_the_last_checkpoint(models, tmp_path):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    ckpt = tmp_path / "c"
    cfg = TrainConfig(
        rank=4, steps=10, n_ctx=32, checkpoint_dir=str(ckpt), checkpoint_every=1, keep_checkpoints=5
    )
    trainer = Trainer(models["llama"], data, cfg)
    got = []

    def on_event(e):
        got.append(e)
        if isinstance(e, ev.Checkpoint) and e.step == 2:
            next(iter(trainer.trainable.pairs.values()))[0][...] = np.nan  # poison the adapter after step 2

    result = trainer.run(on_event)
    assert isinstance(result, ev.Failed) and result.step == 3
    assert "nan" in result.message and "step 3" in result.message
    assert result.checkpoint_path.endswith("ckpt-000002")
    state = np.load(os.path.join(result.checkpoint_path, "state.npz"))
    assert all(np.isfinite(state[k]).all() for k in state.files if k.startswith("param."))
    assert sorted(os.listdir(ckpt)) == ["ckpt-000001", "ckpt-000002", "run.json"]


def test_bad_dataset_is_a_failed_event_with_the_reason(models, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"foo": 1}\nnot json\n', encoding="utf-8")
    got, result = run(Trainer(models["llama"], str(p), TrainConfig(steps=2)))
    assert isinstance(result, ev.Failed) and result.step == 0
    assert "no usable sample" in result.message


def test_problems_are_reported_in_the_plan(models, tmp_path):
    p = tmp_path / "mixed.jsonl"
    write_chats(p, CHATS)
    with open(p, "a", encoding="utf-8") as f:
        f.write("{broken\n")
    got, result = run(Trainer(models["llama"], str(p), TrainConfig(steps=1, n_ctx=32)))
    assert isinstance(result, ev.Finished)
    assert any(s.startswith("line 4") for s in got[0].plan.problems)
    assert got[0].plan.n_train == 3


@pytest.mark.parametrize("mode,kl", [("weighted", 0.0), ("group", 0.0), ("group", 0.1)])
def test_reward_modes_train(models, tmp_path, mode, kl):
    chats = [("hello", "the quick brown fox"), ("hello", "my name is lazy dog"), ("hello", "water is one")]
    data = write_chats(tmp_path / "d.jsonl", chats, rewards=[1.0, -1.0, 0.0])
    cfg = TrainConfig(
        rank=4,
        lr=5e-3,
        steps=15,
        n_ctx=32,
        batch_size=3,
        reward_mode=mode,
        kl_coef=kl,
        schedule="constant",
        out=str(tmp_path / "a.gguf"),
    )
    got, result = run(Trainer(models["llama"], data, cfg))
    assert isinstance(result, ev.Finished)
    model = Model.load(models["llama"])
    adapter = LoraAdapter.load(result.adapter_path, model).terms()
    tok = Tokenizer.from_metadata(model.metadata)
    tpl = ChatTemplate.from_metadata(model.metadata)

    def logp(answer_text, terms):
        msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": answer_text}]
        text, spans = tpl.render_with_spans(msgs)
        ids, offs = tok.encode_with_offsets(text)
        ids = [tok.bos_id] + ids
        lp = model.forward(np.array(ids), lora=terms)
        lp = (
            lp
            - np.log(np.exp(lp - lp.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - lp.max(-1, keepdims=True)
        )
        start = next(i for i, (a, b) in enumerate(offs) if a >= spans[0][0]) + 1
        return float(sum(lp[t - 1, ids[t]] for t in range(start, len(ids))))

    good, bad = "the quick brown fox", "my name is lazy dog"
    assert logp(good, adapter) - logp(good, None) > logp(bad, adapter) - logp(bad, None)
    if mode == "group":
        assert logp(bad, adapter) < logp(bad, None)  # the bad answer is pushed down, not only the good one up


def test_full_weight_training_of_norms_and_router(models, tmp_path):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    cfg = TrainConfig(
        targets=TargetSpec(preset="none"),
        full=("attn_norm", "ffn_norm", "ffn_gate_inp"),
        lr=3e-2,
        steps=20,
        n_ctx=32,
        batch_size=3,
        schedule="constant",
        out=str(tmp_path / "m.gguf"),
    )
    got, result = run(Trainer(models["qwen3moe"], data, cfg))
    steps = [e for e in got if isinstance(e, ev.Step)]
    assert isinstance(result, ev.Finished) and result.adapter_path is None
    assert steps[-1].mean_ce < 0.7 * steps[0].mean_ce
    assert set(got[0].plan.full_tensors) >= {"blk.0.attn_norm.weight", "blk.1.ffn_gate_inp.weight"}
    merged = Model.load(result.merged_path)
    base = Model.load(models["qwen3moe"])
    assert not np.array_equal(
        merged.weights["blk.0.attn_norm.weight"], base.weights["blk.0.attn_norm.weight"]
    )


def test_training_continues_from_an_adapter_file(models, tmp_path):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    first = tmp_path / "a.gguf"
    _, r1 = run(
        Trainer(
            models["llama"],
            data,
            TrainConfig(
                rank=4, lr=1e-2, steps=10, n_ctx=32, batch_size=3, out=str(first), schedule="constant"
            ),
        )
    )
    got, r2 = run(
        Trainer(
            models["llama"],
            data,
            TrainConfig(steps=3, n_ctx=32, batch_size=3, lr=1e-2),
            init_adapter=str(first),
        )
    )
    first_steps = [e for e in got if isinstance(e, ev.Step)]
    assert first_steps[0].mean_ce == pytest.approx(r1.final_loss, rel=0.5)  # continues, not from scratch
    assert first_steps[0].mean_ce < 0.5 * 5.6  # a fresh adapter starts near ln(V) = 5.7


def test_validation_split_and_eval_events(models, tmp_path):
    samples, _ = load_jsonl(write_chats(tmp_path / "d.jsonl", CHATS * 3))
    got, result = run(
        Trainer(models["llama"], samples, TrainConfig(steps=4, n_ctx=64, val_split=0.3, eval_every=2))
    )
    evals = [e for e in got if isinstance(e, ev.Eval)]
    assert got[0].plan.n_val >= 1 and [e.step for e in evals] == [2, 4]
    assert all(e.n_tokens > 0 and np.isfinite(e.mean_ce) for e in evals)


def test_events_serialise_as_json_lines(models, tmp_path):
    got, _ = run(
        Trainer(models["qwen3moe"], write_chats(tmp_path / "d.jsonl", CHATS), TrainConfig(steps=1, n_ctx=32))
    )
    for e in got:
        row = json.loads(ev.event_to_json(e))
        assert row["event"] == type(e).__name__


@pytest.mark.parametrize("out_type,atol", [("F32", 0.0), ("F16", 2e-3), ("Q8_0", 2e-2)])
def test_exported_adapter_reloads_with_the_trainers_logits(models, tmp_path, out_type, atol):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    out = tmp_path / "a.gguf"
    cfg = TrainConfig(targets=TargetSpec(preset="all", patterns=("output", "token_embd")), rank=8, lr=1e-2,
                      steps=5, n_ctx=64, batch_size=3, out=str(out), out_type=out_type)  # fmt: skip
    trainer = Trainer(models["qwen3moe"], data, cfg)
    result = trainer.run()
    assert isinstance(result, ev.Finished)
    tokens = np.array([1, 270, 280, 290, 299, 262])
    in_memory = trainer.model.forward(tokens, lora=trainer.trainable.terms())
    reloaded = LoraAdapter.load(result.adapter_path, trainer.model)
    assert reloaded.alpha == trainer.trainable.alpha and set(reloaded.pairs) == set(trainer.trainable.pairs)
    got = trainer.model.forward(tokens, lora=reloaded.terms())
    if atol == 0.0:
        np.testing.assert_array_equal(got, in_memory)
    else:
        np.testing.assert_allclose(got, in_memory, atol=atol)


def test_every_run_keeps_a_record_the_history_reads(models, tmp_path):
    from engine.train.runs import find_runs, latest_finished

    data = write_chats(tmp_path / "d.jsonl", CHATS)
    out = tmp_path / "out"
    base = dict(
        targets=TargetSpec(preset="attention"), rank=4, lr=5e-3, n_ctx=64, val_split=0.34, eval_every=2
    )
    done_cfg = TrainConfig(
        **base, steps=4, out=str(out / "a.gguf"), checkpoint_dir=str(out / "a-checkpoints")
    )
    _, done = run(Trainer(models["llama"], data, done_cfg))
    stop_cfg = TrainConfig(
        **base, steps=9, out=str(out / "b.gguf"), checkpoint_dir=str(out / "b-checkpoints")
    )
    _, stopped = run(Trainer(models["llama"], data, stop_cfg), stop_after=2)
    runs = find_runs([str(out)])
    assert [r.name for r in runs] == ["b", "a"]  # newest first
    b, a = runs
    assert a.status == "finished" and a.steps_done == a.steps_planned == 4 and a.adapter == done.adapter_path
    assert [x[0] for x in a.losses] == [1, 2, 3, 4] and a.best_loss == min(x[1] for x in a.losses)
    assert a.final_loss == pytest.approx(done.final_loss) and [x[0] for x in a.val_losses] == [2, 4]
    assert a.targets == ["attn_k", "attn_output", "attn_q", "attn_v"] and a.rank == 4
    assert a.model == models["llama"] and a.dataset == data and a.last_checkpoint == done.checkpoint_path
    assert b.status == "stopped" and b.steps_done == 2 and b.steps_planned == 9 and "step 2" in b.label
    assert latest_finished(runs).name == "a"  # a stopped two-step run does not replace a finished one
