"""Rewards: reward-weighted SFT weights (llama.cpp's rule) and group-relative advantages."""

from __future__ import annotations

import numpy as np
import pytest

from engine.train.rewards import group_advantages, reward_weights


def test_reward_weights_clip_then_min_max_scale():
    # clipped: [1, -1, 0, 0.5] -> (r + 1) / 2
    assert reward_weights([2.0, -3.0, 0.0, 0.5]).tolist() == [1.0, 0.0, 0.5, 0.75]
    # the golden reward file's values: min 0.2, max 1.0
    w = reward_weights([0.9, 0.2, 1.0, 0.3])
    np.testing.assert_allclose(w, [0.875, 0.0, 1.0, 0.125])
    assert w.dtype == np.float64


def test_reward_weights_without_signal_are_ones():
    assert reward_weights([0.4, 0.4, 0.4]).tolist() == [1.0, 1.0, 1.0]
    assert reward_weights([0.3, 0.3 + 5e-7]).tolist() == [1.0, 1.0]  # llama.cpp: range <= 1e-6
    assert reward_weights([-7.0]).tolist() == [1.0]
    assert reward_weights([5.0, 2.0]).tolist() == [1.0, 1.0]  # equal after clipping
    assert reward_weights([]).tolist() == []


def test_samples_without_reward_get_one_and_stay_out_of_the_scaling():
    assert reward_weights([None, 0.0, 0.5, None]).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert reward_weights([None, 0.3]).tolist() == [1.0, 1.0]
    assert reward_weights([None, None]).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.5", True])
def test_reward_weights_reject_non_numbers(bad):
    with pytest.raises(ValueError, match="reward 1"):
        reward_weights([0.0, bad])


def test_group_advantages_hand_computed():
    rewards = [1.0, 3.0, 5.0, 2.0, 2.0, 2.0, 0.0, 1.0, 5.0]
    groups = ["a", "a", "b", "c", "c", "c", "d", "d", "d"]
    eps = 1e-6
    adv = group_advantages(rewards, groups, eps=eps)
    # a: mean 2, std 1; b: alone; c: all equal; d: mean 2, std sqrt(14/3)
    std_d = np.sqrt(((0 - 2) ** 2 + (1 - 2) ** 2 + (5 - 2) ** 2) / 3)
    expected = [
        -1 / (1 + eps),
        1 / (1 + eps),
        0.0,
        0.0,
        0.0,
        0.0,
        -2 / (std_d + eps),
        -1 / (std_d + eps),
        3 / (std_d + eps),
    ]
    np.testing.assert_allclose(adv, expected, rtol=1e-12)


def test_group_advantages_are_zero_mean_unit_std_per_group(rng):
    groups = rng.integers(0, 5, size=40).tolist()
    rewards = rng.normal(size=40).tolist()
    adv = group_advantages(rewards, groups, eps=0.0)
    for g in set(groups):
        a = adv[np.asarray(groups) == g]
        if len(a) > 1:
            assert abs(a.mean()) < 1e-12
            assert a.std() == pytest.approx(1.0, rel=1e-12)
    with_eps = group_advantages(rewards, groups)
    np.testing.assert_allclose(with_eps, adv, rtol=1e-5)


def test_unrated_answers_have_no_advantage_and_do_not_count():
    adv = group_advantages([1.0, None, 3.0], ["g", "g", "g"], eps=0.0)
    assert adv.tolist() == [-1.0, 0.0, 1.0]


def test_group_advantages_validate_inputs():
    with pytest.raises(ValueError, match="groups"):
        group_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="reward 0"):
        group_advantages([float("nan")], ["a"])
    with pytest.raises(ValueError, match="eps"):
        group_advantages([1.0], ["a"], eps=-1.0)
