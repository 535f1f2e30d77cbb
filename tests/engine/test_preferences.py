"""Preference pairs and the DPO / ORPO objectives: the shapes pairs are written in, problems by line,
the losses' backward against finite differences (the scalar parts and the whole model, float64), the
reference policy being the model itself with the adapter off, 30 DPO steps that raise the held-out
accuracy and margin, the durable append of a choice, and the device path on the kernel emulator."""

from __future__ import annotations

import dataclasses
import json
import os
import random

import numpy as np
import pytest

from engine.errors import ConfigError, DatasetError
from engine.model.model import Model
from engine.model.targets import TargetSpec, lora_candidates
from engine.testing import SynthSpec, write_model
from engine.text.chat_template import ChatTemplate
from engine.text.tokenizer import Tokenizer
from engine.train import events as ev
from engine.train.data import load_jsonl, parse_sample, save_jsonl
from engine.train.pref_data import PairBatches, append_preference, blind_pair, encode_pairs
from engine.train.preferences import (
    PreferenceObjective,
    dpo_loss_backward,
    dpo_loss_forward,
    orpo_loss_backward,
    orpo_loss_forward,
)
from engine.train.train_model import Trainable
from engine.train.trainer import TrainConfig, Trainer
from tests.gradcheck import assert_grads_close, check_grads

TINY = dict(C=16, L=2, NH=2, NKV=1, HS=8, F=16, V=270)
WORDS = "the of and to in is you that it he was for on are as with his they at be this have from".split()


def _lines(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def test_pairs_in_every_common_shape_load_and_bad_lines_are_problems_by_line(tmp_path):
    user = {"role": "user", "content": "q"}
    rows = [
        {"prompt": "hi", "chosen": "good", "rejected": "bad"},  # 1 TRL standard
        {"messages": [{"role": "system", "content": "s"}, user], "chosen": "a", "rejected": "b"},  # 2
        {"prompt": [user], "chosen": [{"role": "assistant", "content": "a"}],
         "rejected": [{"role": "assistant", "content": "b"}]},  # 3 TRL conversational
        {"chosen": [user, {"role": "assistant", "content": "a"}],
         "rejected": [user, {"role": "assistant", "content": "b"}]},  # 4 implicit prompt
        {"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "a"},
         "rejected": {"from": "gpt", "value": "b"}},  # 5 LLaMA-Factory ShareGPT
        {"instruction": "do", "input": "x", "chosen": "a", "rejected": "b"},  # 6 Alpaca
        {"prompt": "hi", "chosen": "only one"},  # 7 error: no rejected
        {"prompt": [user, {"role": "assistant", "content": "z"}], "chosen": "a", "rejected": "b"},  # 8 error
        {"prompt": "hi", "chosen": "same", "rejected": "same"},  # 9 warning
        {"prompt": "hi", "chosen": ["a", "b"], "rejected": "c"},  # 10 error: two answers
        {"chosen": "a", "rejected": "b"},  # 11 error: no prompt
        {"messages": [user, {"role": "assistant", "content": "ok"}]},  # 12 an SFT line beside them
    ]  # fmt: skip
    samples, problems = load_jsonl(_lines(tmp_path / "p.jsonl", rows))
    assert [s.line for s in samples] == [1, 2, 3, 4, 5, 6, 9, 12]
    prefs = [s for s in samples if s.kind == "preference"]
    assert len(prefs) == 7 and samples[-1].kind == "messages"
    assert all(s.messages[-1]["role"] == "assistant" for s in prefs)
    assert (prefs[0].messages[-1]["content"], prefs[0].rejected) == ("good", "bad")
    assert [m["role"] for m in prefs[1].messages] == ["system", "user", "assistant"]
    assert prefs[5].messages[0]["content"] == "do\n\nx"
    by_line = {p.line: p for p in problems}
    assert set(by_line) == {7, 8, 9, 10, 11}
    assert by_line[9].severity == "warning" and "same answer" in by_line[9].message
    assert 'needs "rejected"' in by_line[7].message
    assert "ends with an assistant turn" in by_line[8].message
    assert "one answer" in by_line[10].message
    assert all(by_line[n].severity == "error" for n in (7, 8, 10, 11))
    # saved and read again: the same pairs (a string prompt stays a string)
    save_jsonl(tmp_path / "again.jsonl", samples)
    again, _ = load_jsonl(tmp_path / "again.jsonl")
    assert [(s.kind, s.messages, s.rejected, s.prompt) for s in again] == [
        (s.kind, s.messages, s.rejected, s.prompt) for s in samples
    ]
    assert json.loads((tmp_path / "again.jsonl").read_text().splitlines()[0]) == rows[0]


def test_dpo_and_orpo_backward_match_finite_differences():
    rng = np.random.default_rng(0)
    P = 5
    pc, pr = -rng.uniform(1, 30, P), -rng.uniform(1, 30, P)
    rc, rr = -rng.uniform(1, 30, P), -rng.uniform(1, 30, P)
    nc, nr = rng.integers(1, 12, P).astype(float), rng.integers(1, 12, P).astype(float)
    dpo = lambda: dpo_loss_forward(pc, pr, rc, rr, 0.3)[0]  # noqa: E731
    dpc, dpr = dpo_loss_backward(dpo_loss_forward(pc, pr, rc, rr, 0.3)[1])
    assert_grads_close(check_grads(dpo, {"pc": pc, "pr": pr}, {"pc": dpc, "pr": dpr}), 1e-7)
    orpo = lambda: orpo_loss_forward(pc, pr, nc, nr, 0.7)[0]  # noqa: E731
    dpc, dpr = orpo_loss_backward(orpo_loss_forward(pc, pr, nc, nr, 0.7)[1])
    assert_grads_close(check_grads(orpo, {"pc": pc, "pr": pr}, {"pc": dpc, "pr": dpr}), 1e-7)
    # the definitions, written out once
    z = 0.3 * ((pc - rc) - (pr - rr))
    assert dpo() == pytest.approx(np.mean(np.log1p(np.exp(-z))))
    lc, lr = pc / nc, pr / nr
    odds = (lc - np.log1p(-np.exp(lc))) - (lr - np.log1p(-np.exp(lr)))
    assert orpo() == pytest.approx(np.mean(-lc + 0.7 * np.log1p(np.exp(-odds))))


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    spec = SynthSpec.for_arch("llama", seed=3, **TINY)
    path = write_model(tmp_path_factory.mktemp("pref") / "m.gguf", spec)
    return Model.load(path, dtype=np.float64)


def _batch(model, rows, n_ctx=64):
    tok, tpl = Tokenizer.from_metadata(model.metadata), ChatTemplate.from_metadata(model.metadata)
    samples = [parse_sample(r)[0] for r in rows]
    pairs, problems = encode_pairs(samples, tok, tpl, n_ctx)
    assert not problems
    return PairBatches(pairs, n_ctx, len(pairs))[0]


ROWS = [
    {"prompt": "hello", "chosen": "the fox", "rejected": "a dog is lazy"},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "who"}],
     "chosen": "yes", "rejected": "no way"},
]  # fmt: skip


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_whole_model_gradients_of_dpo_and_orpo_match_finite_differences(tiny64, objective):
    batch = _batch(tiny64, ROWS)
    targets = [c.name for c in lora_candidates(tiny64.tensors) if c.lora_ok]  # output and embedding too
    tr = Trainable.init(tiny64, targets, rank=2, seed=1)
    rng = np.random.default_rng(0)
    for _, B in tr.pairs.values():
        B[...] = rng.standard_normal(B.shape) * 0.05  # off the reference: every factor has a gradient
    po = PreferenceObjective(tiny64, objective, beta=0.5, lam=0.7)
    res = po.loss_and_grads(tr, batch)
    assert res.extra.n_pairs == 2 and np.isfinite(res.loss)
    errors = check_grads(lambda: po.loss_and_grads(tr, batch, backward=False).loss, tr.params(), res.grads,
                         max_entries=6)  # fmt: skip
    assert_grads_close(errors, 1e-6)


def test_the_reference_is_the_model_with_the_adapter_off(tiny64):
    batch = _batch(tiny64, ROWS)
    targets = [c.name for c in lora_candidates(tiny64.tensors) if c.lora_ok]
    fresh = Trainable.init(tiny64, targets, rank=2, seed=1)  # B = 0: the model unchanged
    po = PreferenceObjective(tiny64, "dpo", beta=0.1)
    f = po.loss_and_grads(fresh, batch, backward=False).extra
    assert f.loss == pytest.approx(np.log(2.0)) and f.margin == 0.0 and f.accuracy == 0.5
    # ... the log-probabilities it keeps are the base model's, from the same weights in memory
    rc, rr = po.reference(batch)
    assert f.chosen_logp * 0 == 0 and np.all(rc < 0) and np.all(rr < 0)
    tied = Trainable.init(tiny64, targets, rank=2, seed=1)
    for _, B in tied.pairs.values():
        B[...] = 0.1
    assert np.allclose(po.reference(batch), (rc, rr))  # the adapter being trained never enters it


def _preference_file(path, n=24, seed=0) -> str:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        q = " ".join(rng.choice(WORDS, 3))
        first = q.split()[0]
        rows.append({"prompt": q, "chosen": f"yes {first}", "rejected": f"no {first}"})
    return _lines(path, rows)


def test_thirty_dpo_steps_raise_the_held_out_accuracy_and_margin(tmp_path, monkeypatch):
    model = Model.load(write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", seed=11)))
    data = _preference_file(tmp_path / "prefs.jsonl")
    cfg = TrainConfig(targets=TargetSpec(preset="all"), rank=4, alpha=8, lr=2e-2, steps=30,
                      schedule="constant", batch_size=4, n_ctx=64, val_split=0.25, eval_every=10,
                      objective="dpo", dpo_beta=0.1, seed=1, out=str(tmp_path / "dpo.gguf"))  # fmt: skip

    def no_second_copy(*a, **k):
        raise AssertionError("the reference policy must not load the model again")

    monkeypatch.setattr(Model, "load", no_second_copy)
    trainer = Trainer(model, data, cfg)
    got: list = []
    assert isinstance(trainer.start(got.append), ev.Started)
    plan = got[0].plan
    assert plan.objective == "dpo" and plan.n_train == 18 and plan.n_val == 6
    start = trainer.evaluate()
    assert isinstance(start, ev.PreferenceEval) and start.n_pairs == 6
    assert start.accuracy == 0.5 and start.margin == 0.0  # the untrained adapter is the reference
    result = trainer.run(got.append)
    assert isinstance(result, ev.Finished) and result.step == 30
    held = [e for e in got if isinstance(e, ev.PreferenceEval)]
    assert [e.step for e in held] == [10, 20, 30]
    end = held[-1]
    assert end.accuracy >= 0.9 and end.accuracy > start.accuracy
    assert end.margin > 1.0 and end.margin > start.margin
    assert end.chosen_logp > start.chosen_logp and end.rejected_logp < start.rejected_logp
    # each held-out pair is scored against its own reference: no pair number is shared with a
    # training pair (the reference cache is by pair), and a fresh objective finds the same figures
    train_batches = trainer.batches_for_epoch(0)
    train_ids = {int(i) for k in range(len(train_batches)) for i in train_batches[k].pair_ids}
    val_ids = {int(i) for b in trainer.val_batches for i in b.pair_ids}
    assert len(train_ids) == 18 and len(val_ids) == 6 and not train_ids & val_ids
    fresh = PreferenceObjective(model, "dpo", beta=0.1).evaluate(trainer.trainable, trainer.val_batches)
    assert (fresh.accuracy, fresh.margin) == pytest.approx((end.accuracy, end.margin))
    steps = [e for e in got if isinstance(e, ev.PreferenceStep)]
    assert len(steps) == 30 and steps[-1].loss < steps[0].loss
    losses = [e.mean_ce for e in got if isinstance(e, ev.Step)]
    assert losses == pytest.approx([e.loss for e in steps])  # the curve a person watches is the objective
    assert os.path.isfile(tmp_path / "dpo.gguf")


def test_orpo_trains_without_a_reference(tmp_path):
    model = Model.load(write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", seed=11)))
    data = _preference_file(tmp_path / "prefs.jsonl", n=8)
    cfg = TrainConfig(targets=TargetSpec(preset="all"), rank=4, alpha=8, lr=2e-2, steps=12,
                      schedule="constant", batch_size=4, n_ctx=64, objective="orpo",
                      orpo_lambda=0.5)  # fmt: skip
    trainer = Trainer(model, data, cfg)
    got: list = []
    trainer.run(got.append)
    steps = [e for e in got if isinstance(e, ev.PreferenceStep)]
    assert len(steps) == 12 and steps[-1].loss < steps[0].loss
    assert steps[-1].margin > steps[0].margin and steps[-1].chosen_logp > steps[0].chosen_logp
    assert trainer.preference._ref == {}  # ORPO never asks for the reference


def test_a_preference_objective_needs_pairs_and_no_rewards(tmp_path):
    with pytest.raises(ConfigError, match="reward_mode"):
        TrainConfig(objective="dpo", reward_mode="group")
    with pytest.raises(ConfigError, match="objective"):
        TrainConfig(objective="ppo")
    model = Model.load(write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", seed=11)))
    sft = _lines(tmp_path / "sft.jsonl", [{"prompt": "a", "response": "b"}])
    got: list = []
    result = Trainer(model, sft, TrainConfig(objective="dpo", steps=1, n_ctx=64)).run(got.append)
    assert isinstance(result, ev.Failed) and "no preference pair" in result.message


def test_a_choice_is_appended_durably_and_reads_back_as_a_pair(tmp_path, monkeypatch):
    path = str(tmp_path / "prefs.jsonl")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    pair = blind_pair("base answer", "adapter answer", ("base model", "adapter"), random.Random(1))
    assert {pair.a, pair.b} == {"base answer", "adapter answer"}
    chosen, rejected = pair.choose("B")
    assert (chosen, rejected) == (pair.b, pair.a) and pair.chosen_source("B") == pair.b_source
    assert pair.choose("tie") is None and pair.choose("skip") is None
    append_preference(path, chosen, rejected, messages=[{"role": "user", "content": "hi"}],
                      extra={"chosen_from": pair.chosen_source("B")})  # fmt: skip
    append_preference(path, "x", "y", prompt="q")
    assert len(synced) == 2  # each choice is on the disk before the call returns
    samples, problems = load_jsonl(path)
    assert not problems and [s.kind for s in samples] == ["preference", "preference"]
    assert samples[0].messages[-1]["content"] == chosen and samples[0].rejected == rejected
    with pytest.raises(DatasetError):
        append_preference(path, "a", "b", prompt="q", messages=[{"role": "user", "content": "q"}])
    with pytest.raises(DatasetError, match="cannot be saved"):
        append_preference(path, "a", "b", messages=[{"role": "assistant", "content": "q"}])
    assert len(load_jsonl(path)[0]) == 2  # nothing half-written
    swaps = {blind_pair("1", "2", rng=random.Random(s)).swapped for s in range(20)}
    assert swaps == {True, False}  # sides are shuffled


def test_pairs_are_prepared_cached_and_batched_as_in_memory(tiny64, tmp_path):
    """prepare_data(pairs=True): each pair as two rows of the memory-mapped files, with the tokens and
    masks `encode_pairs` makes in memory; a cache entry of its own (not the SFT one), reused; other
    samples left out with a warning; batches made on demand equal to the in-memory pairs' batches."""
    from engine.train.encode import EncodeOptions
    from engine.train.pref_data import PreparedPairs
    from engine.train.prepared import prepare_data

    tok, tpl = Tokenizer.from_metadata(tiny64.metadata), ChatTemplate.from_metadata(tiny64.metadata)
    long = " ".join(WORDS * 4)
    rows = [
        *ROWS,
        {"prompt": "not", "response": "a pair"},
        {"prompt": "why", "chosen": "ok", "rejected": long},
    ]
    path = _lines(tmp_path / "prefs.jsonl", rows)
    cache = tmp_path / "cache"
    data = prepare_data(path, tok, tpl, EncodeOptions(64), cache=cache, pairs=True)
    assert len(data) == 6 and not data.reused  # three pairs, two rows each
    samples, _ = load_jsonl(path)
    ref, ref_problems = encode_pairs(samples, tok, tpl, 64)
    prepared = PreparedPairs(data, np.arange(3))
    assert [p.index for p in prepared] == [0, 1, 2] and [p.index for p in ref] == [0, 1, 3]
    for a, b in zip(prepared, ref, strict=True):
        for x, y in ((a.chosen, b.chosen), (a.rejected, b.rejected)):
            np.testing.assert_array_equal(x.tokens, y.tokens)
            np.testing.assert_array_equal(x.trained, y.trained)
            assert x.truncated == y.truncated
    assert prepared[2].rejected.truncated and len(prepared[2].rejected.tokens) == 64
    found = [p for _, _, p in data.problems()]
    assert any(p.line == 3 and "not a preference pair" in p.message for p in found)
    assert {p.message for p in ref_problems} <= {p.message for p in found}
    lengths, labels = prepared.sizes()
    assert lengths.tolist() == [[len(p.chosen.tokens), len(p.rejected.tokens)] for p in ref]
    assert labels.tolist() == [[p.chosen.n_targets, p.rejected.n_targets] for p in ref]
    on_demand, in_memory = (
        PairBatches(prepared, 64, 2, shuffle_seed=4),
        PairBatches(ref, 64, 2, shuffle_seed=4),
    )
    assert len(on_demand) == len(in_memory) == 2
    assert (on_demand.n_windows, on_demand.n_tokens, on_demand.n_label_tokens) == (
        in_memory.n_windows, in_memory.n_tokens, in_memory.n_label_tokens)  # fmt: skip
    assert on_demand.n_windows == sum(b.tokens.shape[0] for b in on_demand)
    for a, b in zip(on_demand, in_memory, strict=True):
        for name in ("tokens", "targets", "weights", "positions", "sample_ids"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # the cache: the pairs' entry is reused; the same file prepared for SFT is an entry of its own
    again = prepare_data(path, tok, tpl, EncodeOptions(64), cache=cache, pairs=True)
    assert again.reused and again.folder == data.folder
    sft = prepare_data(path, tok, tpl, EncodeOptions(64), cache=cache)
    assert not sft.reused and sft.folder != data.folder and len(sft) == 4  # one row per sample
    assert len(list(cache.iterdir())) == 2
    # samples in memory: a sample that is not a pair is named by its position
    made = [dataclasses.replace(s, line=0) for s in samples]
    in_memory_data = prepare_data(made, tok, tpl, EncodeOptions(64), pairs=True)
    assert len(in_memory_data) == 6
    assert any("sample 2: not a preference pair" in p.message for _, _, p in in_memory_data.problems())


def test_training_and_held_out_pairs_keep_their_own_reference(tmp_path):
    """DPO's reference log-probabilities are kept per pair: a held-out pair and a training pair never
    share an entry (each is known by its pair number in the dataset)."""
    model = Model.load(write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", seed=11)))
    data = _preference_file(tmp_path / "prefs.jsonl", n=12, seed=2)
    cfg = TrainConfig(targets=TargetSpec(preset="attention"), rank=4, alpha=8, lr=1e-2, steps=3, batch_size=2,
                      n_ctx=64, val_split=0.25, objective="dpo", seed=1)  # fmt: skip
    trainer = Trainer(model, data, cfg)
    assert isinstance(trainer.start(), ev.Started)
    trainer.evaluate()  # the held-out pairs' references first
    for _ in range(3):
        assert isinstance(trainer.train_step(), ev.Step)
    batches = [*trainer.val_batches, *trainer.batches_for_epoch(0)]
    ids = [int(i) for b in batches for i in b.pair_ids]
    assert sorted(ids) == list(range(12))  # every pair once, by its number
    fresh = PreferenceObjective(model, "dpo")
    for b in batches:
        np.testing.assert_allclose(trainer.preference.reference(b), fresh.reference(b), rtol=1e-12)


def test_a_dpo_run_resumes_with_its_own_objective_and_asks_before_another(tmp_path, capsys):
    """`--resume` with no options continues a DPO run as DPO with its beta (the adapter equals the
    uninterrupted run's); another objective or beta is a change of trajectory, refused unless accepted;
    ORPO's lambda does not change a DPO run."""
    from engine.cli.main import main
    from engine.model.lora import LoraAdapter

    model = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", seed=11))
    data = _preference_file(tmp_path / "prefs.jsonl", n=8)
    first = tmp_path / "a.gguf"
    args = ["train", model, data, "--out", str(first), "--preset", "attention", "--rank", "4", "--steps", "4",
            "--ctx", "64", "--batch", "2", "--lr", "1e-2", "--objective", "dpo", "--beta", "0.2",
            "--checkpoint-every", "2"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    resumed = tmp_path / "b.gguf"
    ckpt = str(tmp_path / "a.checkpoints" / "ckpt-000002")
    argv = ["train", model, data, "--out", str(resumed), "--resume", ckpt]
    assert main(argv) == 0
    assert "DPO (beta 0.2)" in capsys.readouterr().err
    m = Model.load(model)
    a, b = LoraAdapter.load(str(first), m), LoraAdapter.load(str(resumed), m)
    for name, (A, B) in a.pairs.items():
        np.testing.assert_array_equal(b.pairs[name][0], A)
        np.testing.assert_array_equal(b.pairs[name][1], B)
    assert main([*argv, "--beta", "0.5"]) == 2
    assert "DPO beta 0.2 -> 0.5" in capsys.readouterr().err
    assert main([*argv, "--objective", "orpo"]) == 2
    assert "objective DPO -> ORPO" in capsys.readouterr().err
    assert main([*argv, "--orpo-lambda", "0.3"]) == 0
    assert main([*argv, "--objective", "sft", "--accept-changes"]) == 0
