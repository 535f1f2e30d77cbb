"""Matrices kept as small integer codes with a float32 scale and offset per group of 32 (or 16)
values, and the product by one: the reference, `xwt_ref`; its compiled CPU twin is
engine.kernels.blockq_cpu.

Most GGUF types store a weight as w = scale * code - offset, one scale and offset per group of g
values of a row: g = 32 for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, MXFP4, g = 16 for Q2_K, Q3_K,
Q6_K; and the 4-bit codebook types, whose codebook is small integers, as w = scale * kvalues[index],
the code being the codebook's value (IQ4_NL, IQ4_XS, g = 32); engine.io.quants.int_codes gives
them. A `BlockQ` holds such a matrix (n_out, n_in) as int8 codes and its float32 scales and
offsets, 1.25 (g 32) or 1.5 (g 16) bytes a value against float32's 4, in one of two layouts:

- "in": groups run along a row (the file's own layout): w[i, k] = q[i, k] s[i, k // g] - m[i, k // g],
  s and m (n_out, n_in // g);
- "out": groups run down a column: w[i, k] = q[i, k] s[i // g, k] - m[i // g, k], s and m
  (n_out // g, n_in), the transpose of an "in" matrix (`transposed`), exactly the same values.

`xwt_ref(x, w)` is x @ w^T for x (n, n_in): what a linear map applies to rows, and, with the
transpose, what its backward applies (dx = dy W = dy (W^T)^T). The CPU twin multiplies straight
from the codes: for the few rows an MoE expert gets (~32), a float32 copy of the weights costs more
to read than the products cost to compute (bench/CPU_NOTES.md).

Not here: reading codes out of GGUF blocks (engine.io.quants), choosing when to use them (the
weight store, engine.kernels.moe_cpu).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

GROUPS = (16, 32)  # values per scale and offset


class BlockQ(NamedTuple):
    """A matrix (n_out, n_in) as int8 codes with a float32 scale and offset per group of g values."""

    q: np.ndarray  # (n_out, n_in) int8
    s: np.ndarray  # scales: (n_out, n_in // g) for "in", (n_out // g, n_in) for "out"
    m: np.ndarray  # offsets, subtracted after scaling; the shape of s
    along: str  # "in" or "out": where the groups run (see the module docstring)
    group: int = 32  # g, values per scale and offset: 16 or 32

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.s.nbytes + self.m.nbytes

    def dense(self) -> np.ndarray:
        """The float32 values, scale * code - offset rounded as two float32 operations."""
        n_out, n_in = self.q.shape
        g = self.group
        if self.along == "in":
            w = self.q.reshape(n_out, n_in // g, g).astype(np.float32)
            w *= self.s[:, :, None]
            w -= self.m[:, :, None]
        else:
            w = self.q.reshape(n_out // g, g, n_in).astype(np.float32)
            w *= self.s[:, None, :]
            w -= self.m[:, None, :]
        return w.reshape(n_out, n_in)

    def transposed(self) -> BlockQ:
        """The transpose, the same values, its groups running the other way (a copy)."""
        flip = {"in": "out", "out": "in"}[self.along]
        t = np.ascontiguousarray
        return BlockQ(t(self.q.T), t(self.s.T), t(self.m.T), flip, self.group)


def make_blockq(q: np.ndarray, s: np.ndarray, m: np.ndarray, along: str = "in", group: int = 32) -> BlockQ:
    """A checked BlockQ: int8 codes, float32 scales and offsets of the shapes its layout needs."""
    if along not in ("in", "out"):
        raise ValueError(f"along must be 'in' or 'out', not {along!r}")
    if group not in GROUPS:
        raise ValueError(f"groups of {group} values: only {GROUPS}")
    if q.dtype != np.int8 or q.ndim != 2:
        raise ValueError(f"codes must be a 2-D int8 array, not {q.dtype} {q.shape}")
    n_out, n_in = q.shape
    groups = (n_out, n_in // group) if along == "in" else (n_out // group, n_in)
    if (n_in if along == "in" else n_out) % group:
        raise ValueError(f"{q.shape}: groups of {group} do not divide the {along}put side")
    for name, a in (("scales", s), ("offsets", m)):
        if a.dtype != np.float32 or a.shape != groups:
            raise ValueError(f"{name} must be float32 {groups}, not {a.dtype} {a.shape}")
    return BlockQ(q, s, m, along, group)


def xwt_ref(x: np.ndarray, w: BlockQ) -> np.ndarray:
    """x (n, n_in) @ w^T: (n, n_out), in x's float type, through w's dense values."""
    return x @ w.dense().T.astype(x.dtype, copy=False)


__all__ = ["GROUPS", "BlockQ", "make_blockq", "xwt_ref"]
