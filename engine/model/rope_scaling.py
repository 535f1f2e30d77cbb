"""RoPE angle tables for YaRN-scaled contexts (gpt-oss, DeepSeek-V2/V3), as ggml's rope_yarn computes them.

The plain and linearly scaled tables are `engine.kernels.rope.rope_angles`; this module adds YaRN:
per rotary pair i, theta_extrap = pos * base^(-2i/n_rot) (/ frequency factor), theta_interp =
theta_extrap / factor, mixed by a ramp over the pairs between the correction dimensions of
beta_fast and beta_slow rotations (ext_factor 1), and cos/sin multiplied by `mscale` (ggml's
attn_factor * (1 + 0.1 ln factor), worked out from the file's metadata in engine.model.archs).
Host code: the tables are built once per batch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float):
    """ggml_rope_yarn_corr_dims: the first and last pair index of the ramp between extrapolation and
    interpolation."""

    def dim(n_rotations: float) -> float:
        return n_rot * math.log(n_ctx_orig / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    start = math.floor(dim(beta_fast))
    end = math.ceil(dim(beta_slow))
    return max(0.0, start), min(n_rot - 1.0, end)


def yarn_angles(
    positions: np.ndarray,
    n_rot: int,
    base: float,
    factor: float,
    n_ctx_orig: int,
    beta_fast: float,
    beta_slow: float,
    mscale: float,
    freq_factors: np.ndarray | None = None,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (*positions.shape, n_rot/2) of YaRN's angles, each times `mscale`."""
    pairs = np.arange(0, n_rot, 2, dtype=np.float64)
    inv_freq = base ** (-pairs / n_rot)  # (n_rot/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta_extrap = positions.astype(np.float64)[..., None] * inv_freq
    low, high = yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow)
    y = (pairs / 2 - low) / max(0.001, high - low)
    ramp = 1.0 - np.clip(y, 0.0, 1.0)  # 1: extrapolate (high frequencies), 0: interpolate
    theta = (theta_extrap / factor) * (1.0 - ramp) + theta_extrap * ramp
    return (np.cos(theta) * mscale).astype(dtype), (np.sin(theta) * mscale).astype(dtype)
