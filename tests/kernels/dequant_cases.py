"""Inputs and checks shared by the dequantization tests: random GGUF blocks and bit-exact comparisons.

Blocks are random bytes with every float field (f16 scales and mins; F16/BF16/F32 values) redrawn
as a finite, non-zero number over the type's whole exponent range, subnormals included, so that no
block is zero and no reference value is NaN: a NaN in a kernel's output means it never wrote there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.kernels.dequant import block_geometry
from engine.testing import F16_FIELDS


def finite_bits(rng: np.random.Generator, n: int, exp_bits: int, man_bits: int) -> np.ndarray:
    """n random bit patterns of a float format, finite and non-zero, exponents uniform (uint64)."""
    sign = rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(exp_bits + man_bits)
    exp = rng.integers(0, 2**exp_bits - 1, n, dtype=np.uint64) << np.uint64(man_bits)
    man = rng.integers(0, 2**man_bits, n, dtype=np.uint64)
    man[(exp == 0) & (man == 0)] = 1  # never zero
    return sign | exp | man


def random_raw(qtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random data of `shape` values (NumPy order) in the layout GGUFFile.raw() gives."""
    qk, ts = block_geometry(qtype)
    *lead, n_cols = shape
    assert n_cols % qk == 0, (qtype, shape)
    if qtype == "F32":
        return finite_bits(rng, int(np.prod(shape)), 8, 23).astype(np.uint32).view(np.float32).reshape(shape)
    if qtype == "F16":
        return finite_bits(rng, int(np.prod(shape)), 5, 10).astype(np.uint16).view(np.float16).reshape(shape)
    if qtype == "BF16":
        bits = finite_bits(rng, int(np.prod(shape)), 8, 7).astype("<u2")
        return bits.view(np.uint8).reshape(*lead, n_cols * 2)
    n_blocks = int(np.prod(shape)) // qk
    blocks = rng.integers(0, 256, (n_blocks, ts), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        blocks[:, off : off + 2] = (
            finite_bits(rng, n_blocks, 5, 10).astype("<u2").view(np.uint8).reshape(-1, 2)
        )
    if qtype == "MXFP4":
        # e8m0 scale 2^(e-128); 0 and 1 give subnormals; above 252, 12 * 2^(e-128) overflows to inf
        blocks[:, 0] = rng.integers(0, 253, n_blocks)
    return blocks.reshape(*lead, n_cols // qk * ts)


def raw_bytes(raw: np.ndarray) -> np.ndarray:
    """The same data as contiguous uint8 (..., row_bytes)."""
    return np.ascontiguousarray(raw).view(np.uint8)


@dataclass(frozen=True)
class Case:
    """One call: values of `shape` (NumPy order) dequantized whole, or gathered by `rows`."""

    name: str
    shape: tuple[int, ...]
    rows: tuple[int, ...] | None = None


def cases(qtype: str, large: bool = False) -> list[Case]:
    """Shapes that cover several tiles, a partial last tile, expert stacks, gathers with repeated
    and unordered ids, and slices that start off 16-byte boundaries in the input and the output."""
    qk, ts = block_geometry(qtype)
    if qk == 1:
        layer, odd = (24, 136), (9, 7)  # 7 values a row: rows of 14 or 28 bytes, outputs of 28 or 14
    elif qk == 32:
        layer, odd = (72, 96), (9, 96)  # 3 blocks a row: rows of 3 * ts bytes
    else:
        layer, odd = (12, 512), (9, 256)  # one K block a row: rows of ts bytes
    out = [
        Case("layer", layer),
        Case("stack", (4, *layer)),
        Case("gather", (4, *layer), rows=(2, 0, 2, 3)),
        Case("odd-rows", odd, rows=(8, 1, 3, 3, 0, 7)),
    ]
    if large:
        out.append(Case("large", (1024, 4096)))
    return out


def bf16_rne(ref: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest-even), as bit patterns (uint16). Finite or inf."""
    u = np.ascontiguousarray(ref, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _rel_error(out: np.ndarray, ref: np.ndarray) -> str:
    o = np.asarray(out, dtype=np.float64).ravel()
    r = np.asarray(ref, dtype=np.float64).ravel()
    fin = np.isfinite(o) & np.isfinite(r)
    num = np.linalg.norm(o[fin] - r[fin])
    den = np.linalg.norm(r[fin]) or 1.0
    return f"relative error {num / den:.3e} over {int(fin.sum())} finite values, {int(np.isnan(o).sum())} NaN"


def _check_bits(
    what: str, o: np.ndarray, r: np.ndarray, values: str, error: Callable[[], str], show: Callable[[int], str]
) -> None:
    """o equals r (flat bit patterns); else the message says how many `values` differ, the relative
    error (`error()`) and the first five differences (`show(i)`)."""
    bad = np.flatnonzero(o != r)
    if bad.size:
        first = ", ".join(show(i) for i in bad[:5])
        raise AssertionError(f"{what}: {bad.size} of {o.size} {values} ({error()}); first: {first}")


def check_f32(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    """out equals ref bit for bit (float32); the message says where and by how much not."""
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
    assert out.dtype == np.float32, f"{what}: dtype {out.dtype}, expected float32"
    o = np.ascontiguousarray(out).view(np.uint32).ravel()
    r = np.ascontiguousarray(ref, dtype=np.float32).view(np.uint32).ravel()
    _check_bits(
        what, o, r, "float32 values differ from the reference",
        lambda: _rel_error(out, ref),
        lambda i: f"[{i}] {o[i].view(np.float32)!r} vs {r[i].view(np.float32)!r}",
    )  # fmt: skip


def check_bf16(out_bits: np.ndarray, ref: np.ndarray, what: str) -> None:
    """out (bf16 bit patterns) equals ref rounded to nearest-even; the message gives the error."""
    assert out_bits.shape == ref.shape, f"{what}: shape {out_bits.shape}, expected {ref.shape}"
    o = np.ascontiguousarray(out_bits).view(np.uint16).ravel()
    r = bf16_rne(ref).ravel()
    _check_bits(
        what, o, r, "bfloat16 values are not the reference rounded to nearest-even",
        lambda: f"{_rel_error(bf16_to_f32(o), ref)} against float32",
        lambda i: f"[{i}] 0x{o[i]:04x} vs 0x{r[i]:04x} (f32 {ref.ravel()[i]!r})",
    )  # fmt: skip
