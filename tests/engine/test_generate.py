"""Generation: the KV-cached loop against plain forward passes, sampling filters, stop conditions."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelError
from engine.model.generate import GREEDY, SamplingConfig, generate, sample_next
from engine.model.model import Model
from engine.testing import SynthSpec, write_model


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("gen") / "m.gguf", SynthSpec.for_arch("qwen3moe", n_ctx=40))
    return Model.load(path, dtype=np.float64)


def _greedy_without_cache(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model.forward(np.array(seq))[-1].argmax()))
    return seq[len(prompt) :]


def test_greedy_with_cache_equals_recomputing_everything(moe_model):
    prompt = [1, 270, 280, 290]
    [g] = generate(moe_model, prompt, sampling=SamplingConfig(**{**GREEDY.__dict__, "max_new_tokens": 12}))
    assert list(g.tokens) == _greedy_without_cache(moe_model, prompt, 12)
    assert g.stop_reason == "length"


def test_samples_run_as_one_batch_and_are_reproducible_by_seed(moe_model):
    cfg = SamplingConfig(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=3, max_new_tokens=10)
    a = generate(moe_model, [1, 270], n_samples=4, sampling=cfg)
    b = generate(moe_model, [1, 270], n_samples=4, sampling=cfg)
    c = generate(moe_model, [1, 270], n_samples=4, sampling=SamplingConfig(**{**cfg.__dict__, "seed": 4}))
    assert [g.tokens for g in a] == [g.tokens for g in b]
    assert [g.tokens for g in a] != [g.tokens for g in c]
    assert len({g.tokens for g in a}) > 1, "four hot samples of one prompt should not all agree"


def test_stops_at_end_of_generation_token_without_emitting_it(moe_model):
    prompt = [1, 270, 280]
    first = _greedy_without_cache(moe_model, prompt, 3)
    [g] = generate(moe_model, prompt, sampling=GREEDY, stop_ids={first[2]})
    assert list(g.tokens) == first[:2] and g.stop_reason == "eos"


def test_context_limit_ends_generation(moe_model):
    prompt = [1] + [270] * 35  # n_ctx is 40
    [g] = generate(moe_model, prompt, sampling=GREEDY)
    assert len(g.tokens) == 4 and g.stop_reason == "context"
    with pytest.raises(ModelError, match="does not fit"):
        generate(moe_model, [1] * 40)


def test_should_stop_interrupts(moe_model):
    [g] = generate(moe_model, [1, 270], sampling=GREEDY, should_stop=lambda: True)
    assert g.stop_reason == "stopped" and len(g.tokens) == 1


def test_streams_every_token(moe_model):
    seen = []
    out = generate(
        moe_model,
        [1, 270],
        n_samples=2,
        sampling=SamplingConfig(seed=0, max_new_tokens=6),
        on_token=lambda b, t: seen.append((b, t)),
    )
    for b, g in enumerate(out):
        assert [t for s, t in seen if s == b] == list(g.tokens)


def test_sampling_filters():
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)[None]

    def draws(cfg, n=4000):
        return np.bincount([int(sample_next(logits, cfg, rng)[0]) for _ in range(n)], minlength=4) / n

    # top-k = 2 keeps the two best tokens, renormalised
    f = draws(SamplingConfig(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert f[2] == f[3] == 0 and f[0] == pytest.approx(0.5 / 0.8, abs=0.03)
    # top-p = 0.75 keeps {0.5, 0.3}: the smallest set reaching 0.75
    f = draws(SamplingConfig(temperature=1.0, top_k=0, top_p=0.75, min_p=0.0))
    assert f[2] == f[3] == 0
    # min-p = 0.2 drops tokens below 0.2 * 0.5 = 0.1
    f = draws(SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2))
    assert f[3] == 0 and f[2] > 0.1
    # temperature sharpens
    f = draws(SamplingConfig(temperature=0.25, top_k=0, top_p=1.0, min_p=0.0))
    assert f[0] > 0.85
    assert sample_next(logits, GREEDY, rng)[0] == 0
