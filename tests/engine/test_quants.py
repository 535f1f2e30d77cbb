"""engine.io.quants: the fast dequantizer, bit for bit against gguf-py's `gguf.quants.dequantize`.

Data is random blocks: random bytes with finite, non-zero float16 scales (the "clean" case), or
random bytes throughout (garbage scales: NaN, Inf, subnormals), compared by bit pattern. Shapes are
one row, several rows, and an expert stack (E, rows, row_bytes), contiguous or sliced. Every test
runs twice: with the compiled kernels (engine.kernels.dequant_cpu, where numba is installed) and
with the NumPy passes they replace (the fallback without numba).
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.errors import ModelError
from engine.io import quants
from engine.io.quants import dequantize, fast_types
from engine.kernels import jit
from engine.testing import F16_FIELDS


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def kernels(request, monkeypatch):
    """The compiled dequantization kernels where numba is, then the NumPy passes."""
    if request.param == "numpy":
        monkeypatch.setenv(jit.OFF_VARIABLE, "1")
    jit.reset()
    yield request.param
    monkeypatch.delenv(jit.OFF_VARIABLE, raising=False)
    jit.reset()


REQUIRED_FAST = {
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4",
}  # fmt: skip
FAST = sorted(REQUIRED_FAST)
ROW = 512  # values per row: whole blocks of every type


# float16 scales that garbage must include: qNaN, sNaN, -qNaN with payload, +-Inf, subnormal, -0
SPECIAL_F16 = np.array([0x7E00, 0x7C01, 0xFE55, 0x7C00, 0xFC00, 0x0001, 0x8000], dtype=np.uint16)


def random_raw(
    qtype: str, lead: tuple[int, ...], rng: np.random.Generator, garbage: bool = False
) -> np.ndarray:
    """Raw data of a tensor (*lead, ROW) as GGUFFile.raw gives it: finite values, or garbage."""
    n = int(np.prod(lead, dtype=np.int64))
    if qtype in ("F32", "F16", "BF16"):
        if garbage:  # every bit pattern, special ones included
            bits = rng.integers(0, 1 << 32, size=n * ROW, dtype=np.uint32)
            bits[: SPECIAL_F16.size] = SPECIAL_F16.astype(np.uint32) << 16
        else:
            bits = rng.standard_normal(n * ROW).astype(np.float32).view(np.uint32)
        if qtype == "F32":
            return bits.view(np.float32).reshape(*lead, ROW)
        if qtype == "BF16":
            return (bits >> 16).astype(np.uint16).view(np.uint8).reshape(*lead, 2 * ROW)
        if garbage:
            return (bits >> 16).astype(np.uint16).view(np.float16).reshape(*lead, ROW)
        return bits.view(np.float32).astype(np.float16).reshape(*lead, ROW)
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    nb = ROW // block_size
    raw = rng.integers(0, 256, size=(n * nb, type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, ()):
        if garbage:
            k = min(SPECIAL_F16.size, n * nb)
            raw[:k, off : off + 2] = SPECIAL_F16[:k, None].view(np.uint8)
        else:
            mag = rng.uniform(1e-3, 0.1, size=n * nb) * rng.choice([-1.0, 1.0], size=n * nb)
            raw[:, off : off + 2] = mag.astype(np.float16)[:, None].view(np.uint8)
    if qtype == "MXFP4" and not garbage:  # e8m0 scales near 1 (large ones overflow to Inf)
        raw[:, 0] = rng.integers(120, 135, size=n * nb, dtype=np.uint8)
    return raw.reshape(*lead, nb * type_size)


def reference(raw: np.ndarray, qtype: str) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(gguf_quants.dequantize(raw, GGMLQuantizationType[qtype]), dtype=np.float32)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_fast_types_cover_the_required_types():
    assert REQUIRED_FAST <= fast_types()


@pytest.mark.parametrize("qtype", FAST)
@pytest.mark.parametrize("lead", [(), (1,), (5,), (3, 4)], ids=["row", "1-row", "rows", "experts"])
def test_bit_exact_with_gguf(qtype, lead):
    raw = random_raw(qtype, lead, np.random.default_rng(hash((qtype, lead)) % 2**32))
    want = reference(raw, qtype)
    assert want.shape == (*lead, ROW)
    assert np.isfinite(want).all()
    assert_bits_equal(dequantize(raw, qtype), want)


@pytest.mark.parametrize("qtype", FAST)
def test_garbage_scales_give_the_same_bits(qtype):
    """Random bytes throughout: NaN / Inf / subnormal scales come out as gguf-py's exact bits."""
    raw = random_raw(qtype, (6,), np.random.default_rng(7), garbage=True)
    want = reference(raw, qtype)
    if qtype not in ("BF16", "MXFP4"):  # (e8m0 scales are never NaN; BF16 has no scale)
        assert np.isnan(want).any() or np.isinf(want).any()
    assert_bits_equal(dequantize(raw, qtype), want)


@pytest.mark.parametrize("qtype", FAST)
def test_sliced_raw(qtype):
    """Views that are not contiguous: every other row, and a row range of each expert."""
    raw = random_raw(qtype, (4, 6), np.random.default_rng(3))
    for view in (raw[:, 1:4], raw[1, ::2]):
        assert not view.flags.c_contiguous
        assert_bits_equal(dequantize(view, qtype), reference(np.ascontiguousarray(view), qtype))


@pytest.mark.parametrize("qtype", FAST)
def test_out_is_filled_and_returned(qtype):
    rng = np.random.default_rng(11)
    out = np.full((3, ROW), np.nan, dtype=np.float32)
    for _ in range(2):  # the same buffer, reused
        raw = random_raw(qtype, (3,), rng)
        assert dequantize(raw, qtype, out) is out
        assert_bits_equal(out, reference(raw, qtype))


def test_out_of_the_wrong_kind_is_refused():
    raw = random_raw("Q4_K", (2,), np.random.default_rng(0))
    wrong_dtype, wrong_shape = np.empty((2, ROW), np.float64), np.empty((2, ROW + 1), np.float32)
    for bad in (wrong_dtype, wrong_shape, np.empty((ROW, 2), np.float32).T):
        with pytest.raises(ValueError, match="out must be"):
            dequantize(raw, "Q4_K", bad)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "F16", "IQ4_XS", "MXFP4"])
def test_two_threads_and_small_chunks_give_the_same_bits(qtype, monkeypatch):
    """Spans and chunks shrunk so that a small tensor is split into many pieces over 2 threads."""
    monkeypatch.setattr(quants, "SPAN_VALUES", 3 * 256)
    monkeypatch.setattr(quants, "CHUNK_VALUES", 256)
    monkeypatch.setattr(quants, "MIN_SPLIT_VALUES", 0)
    workers = set()
    run_pieces = quants._run_pieces

    def spy(codec, pieces, *compiled):
        workers.add(threading.get_ident())
        run_pieces(codec, pieces, *compiled)

    monkeypatch.setattr(quants, "_run_pieces", spy)
    raw = random_raw(qtype, (2, 7), np.random.default_rng(5))
    one = dequantize(raw, qtype, threads=1)
    assert len(workers) == 1
    two = dequantize(raw, qtype, threads=2)
    assert len(workers) == 2  # the calling thread and a pool thread
    assert_bits_equal(two, one)
    assert_bits_equal(one, reference(raw, qtype))


def test_a_type_without_fast_path_goes_through_gguf():
    qtype = "TQ2_0"
    assert qtype not in fast_types()
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    raw = np.random.default_rng(2).integers(0, 256, size=(3, 2 * type_size), dtype=np.uint8)
    want = reference(raw, qtype)
    assert_bits_equal(dequantize(raw, qtype), want)
    out = np.empty((3, 2 * block_size), np.float32)
    assert dequantize(raw, qtype, out) is out
    assert_bits_equal(out, want)


@pytest.mark.parametrize("qtype", ["NOT_A_TYPE", "I32"])
def test_a_type_that_cannot_be_dequantized_is_a_model_error(qtype):
    with pytest.raises(ModelError, match=rf"{qtype}.*supported types: .*Q4_K"):
        dequantize(np.zeros((1, 4), np.uint8), qtype)


def test_rows_of_partial_blocks_are_a_model_error():
    with pytest.raises(ModelError, match="whole blocks of 144 bytes"):
        dequantize(np.zeros((2, 150), np.uint8), "Q4_K")
