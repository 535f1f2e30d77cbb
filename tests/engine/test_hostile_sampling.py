"""Sampling from NaN and infinite logits, and sampling settings out of range: never a crash, a NaN
never drawn, a one-line EngineError naming the setting and what it accepts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.errors import EngineError, ModelError
from engine.model.generate import GREEDY, SamplingConfig, sample_next

SAMPLED = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
CONFIGS = [
    GREEDY,
    SAMPLED,
    SamplingConfig(),
    SamplingConfig(temperature=1e-300),
    SamplingConfig(temperature=100.0),  # the highest accepted (engine.ranges)
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["greedy", "sampled", "default", "tiny-temp", "huge-temp"])
def test_nan_logits_are_never_drawn(cfg):
    rng = np.random.default_rng(0)
    logits = np.array([[np.nan, 1.0, np.nan, 0.5, np.nan]] * 4)
    for _ in range(50):
        assert set(sample_next(logits, cfg, rng).tolist()) <= {1, 3}


@pytest.mark.parametrize("cfg", CONFIGS, ids=["greedy", "sampled", "default", "tiny-temp", "huge-temp"])
def test_infinite_logits_are_certain(cfg):
    rng = np.random.default_rng(0)
    logits = np.array([[1.0, np.inf, -np.inf, np.nan, np.inf, 3.0]], dtype=np.float32)
    seen = {int(sample_next(logits, cfg, rng)[0]) for _ in range(200)}
    assert seen <= {1, 4} and (cfg.greedy or seen == {1, 4})


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["greedy", "sampled"])
@pytest.mark.parametrize("fill", [np.nan, -np.inf])
def test_a_row_with_nothing_to_draw_is_a_model_error(cfg, fill):
    logits = np.array([[0.0, 1.0], [fill, fill]])
    with pytest.raises(ModelError) as err:
        sample_next(logits, cfg, np.random.default_rng(0))
    assert str(err.value) == (
        "the model's logits for sample 1 are all NaN or -inf (2 tokens): the model or adapter weights hold "
        "non-finite values; nothing can be sampled"
    )


def test_finite_logits_sample_as_before():
    # the same draws as the formula before NaN handling: q = exp(z/t - max(z/t))
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    logits = np.random.default_rng(1).standard_normal((3, 50))
    cfg = SamplingConfig(temperature=0.7, top_k=10, top_p=0.9, min_p=0.02)
    ours = [sample_next(logits, cfg, rng_a).tolist() for _ in range(200)]
    theirs = []
    for _ in range(200):
        row = []
        for z in logits:
            cand = np.argsort(-z, kind="stable")[:10]
            zc = z[cand]
            p = np.exp(zc - zc[0])
            p /= p.sum()
            keep = min(10, int(np.searchsorted(np.cumsum(p), 0.9) + 1))
            keep = min(keep, max(1, int(np.count_nonzero(p >= 0.02 * p[0]))))
            q = np.exp(zc[:keep] / 0.7 - (zc[:keep] / 0.7).max())
            row.append(int(cand[rng_b.choice(keep, p=q / q.sum())]))
        theirs.append(row)
    assert ours == theirs


BAD_SETTINGS = [
    ("temperature", -0.5, "in [0, 100] (0: greedy)"),
    ("temperature", math.nan, "a finite number in [0, 100] (0: greedy)"),
    ("temperature", math.inf, "a finite number in [0, 100] (0: greedy)"),
    ("temperature", 1e300, "in [0, 100] (0: greedy)"),
    ("temperature", "0.8", "a finite number in [0, 100] (0: greedy)"),
    ("top_k", -1, "in 0..2147483647 (0: off)"),
    ("top_k", 2.5, "a whole number in 0..2147483647 (0: off)"),
    ("top_k", True, "a whole number in 0..2147483647 (0: off)"),
    ("top_p", 0.0, "in (0, 1] (1: off)"),
    ("top_p", 1.5, "in (0, 1] (1: off)"),
    ("top_p", math.nan, "a finite number in (0, 1] (1: off)"),
    ("min_p", -0.1, "in [0, 1] (0: off)"),
    ("min_p", 1.01, "in [0, 1] (0: off)"),
    ("max_new_tokens", 0, "in 1..1048576"),
    ("max_new_tokens", 2.0, "a whole number in 1..1048576"),
    ("seed", -1, "in 0..9223372036854775807"),
    ("seed", 1.5, "a whole number in 0..9223372036854775807"),
]


@pytest.mark.parametrize(
    ("name", "value", "accepted"), BAD_SETTINGS, ids=[f"{b[0]}={b[1]}" for b in BAD_SETTINGS]
)
def test_sampling_settings_validate_themselves(name, value, accepted):
    with pytest.raises(EngineError) as err:
        SamplingConfig(**{name: value})
    assert str(err.value) == f"sampling setting {name} must be {accepted}, got {value!r}"


def test_settings_in_range_are_accepted():
    SamplingConfig(temperature=0, top_k=0, top_p=1, min_p=0, seed=None, max_new_tokens=1)
    SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(5), seed=np.int64(2**40), max_new_tokens=10**6)
    assert SamplingConfig(temperature=0.0).greedy and not SamplingConfig(temperature=1e-9).greedy
