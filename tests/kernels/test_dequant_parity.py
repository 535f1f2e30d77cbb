"""`dequant` on a GPU against `dequant_ref`: float32 bit for bit, bfloat16 exactly the rounded reference.

Every GPU type, both output dtypes: a layer, an expert stack, expert gathers by host and by device
ids, slices off 16-byte boundaries, one large layer. Inputs are fresh random blocks on every run
(never zeros), and each output buffer is poisoned with NaN before each launch, so a value the
kernel never wrote fails the comparison. Skipped where no usable CUDA GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.dequant import GPU_TYPES, OUT_DTYPES, dequant, dequant_ref
from tests.kernels.dequant_cases import cases, check_bf16, check_f32, random_raw

pytestmark = pytest.mark.gpu

NAN_BF16 = 0xFFFF  # a NaN bit pattern for bf16 outputs


def poisoned(cp, shape, dtype: str):
    if dtype == "float32":
        return cp.full(shape, cp.nan, dtype=cp.float32)
    return cp.full(shape, NAN_BF16, dtype=cp.uint16)


def check(out_host: np.ndarray, ref: np.ndarray, dtype: str, what: str) -> None:
    if dtype == "float32":
        check_f32(out_host, ref, what)
    else:
        check_bf16(out_host, ref, what)


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("qtype", GPU_TYPES)
def test_dequant_matches_reference(gpu, qtype, dtype, fresh_rng):
    cp = gpu
    for i, case in enumerate(cases(qtype, large=True)):
        raw = random_raw(qtype, case.shape, fresh_rng)
        ref = dequant_ref(raw, qtype, rows=case.rows)
        raw_dev = cp.asarray(raw)  # uint8 blocks, or float16/float32 values for F16/F32, as GGUFFile.raw
        rows = case.rows
        if rows is not None and i % 2:
            rows = cp.asarray(rows, dtype=cp.int32)  # ids already on the device: no host round trip
        out = poisoned(cp, ref.shape, dtype)
        got = dequant(raw_dev, qtype, out=out, dtype=dtype, rows=rows)
        assert got is out
        check(cp.asnumpy(out), ref, dtype, f"{qtype} -> {dtype}, {case.name} {case.shape} rows={case.rows}")


@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_reused_buffer_is_rewritten(gpu, dtype, fresh_rng):
    """One `out` buffer serves layer after layer: each call rewrites all of it."""
    cp = gpu
    out = poisoned(cp, (4, 64, 512), dtype)
    for qtype in ("Q4_K", "Q8_0", "MXFP4"):
        raw = random_raw(qtype, (4, 64, 512), fresh_rng)
        out.fill(cp.nan if dtype == "float32" else NAN_BF16)
        dequant(cp.asarray(raw), qtype, out=out, dtype=dtype)
        check(cp.asnumpy(out), dequant_ref(raw, qtype), dtype, f"{qtype} into a reused buffer")


def test_allocates_when_no_out(gpu, fresh_rng):
    cp = gpu
    raw = random_raw("Q6_K", (3, 8, 256), fresh_rng)
    got = dequant(cp.asarray(raw), "Q6_K", rows=[2, 0])
    assert got.dtype == cp.float32 and got.shape == (2, 8, 256)
    check_f32(cp.asnumpy(got), dequant_ref(raw, "Q6_K", rows=[2, 0]), "allocated output")
    bf = dequant(cp.asarray(raw), "Q6_K", dtype="bfloat16")
    assert bf.dtype == cp.uint16 and bf.shape == (3, 8, 256)
    check_bf16(cp.asnumpy(bf), dequant_ref(raw, "Q6_K"), "allocated bf16 output")


def test_bad_expert_ids(gpu, fresh_rng):
    cp = gpu
    raw = random_raw("Q4_0", (3, 4, 64), fresh_rng)
    with pytest.raises(IndexError, match="row id 3 is out of range"):
        dequant(cp.asarray(raw), "Q4_0", rows=[0, 3])
    out = poisoned(cp, (3, 4, 64), "float32")
    out.fill(0)
    dequant(cp.asarray(raw), "Q4_0", out=out, rows=cp.asarray([1, 9, 2], dtype=cp.int32))
    host = cp.asnumpy(out)
    assert np.isnan(host[1]).all(), "an out-of-range device id must fill its slice with NaN"
    check_f32(host[[0, 2]], dequant_ref(raw, "Q4_0", rows=[1, 2]), "good ids beside a bad one")


def test_wrong_out_is_refused(gpu):
    cp = gpu
    raw = cp.zeros((2, 36), dtype=cp.uint8)
    with pytest.raises(ValueError, match="shape"):
        dequant(raw, "Q4_0", out=cp.empty((2, 32), cp.float32))
    with pytest.raises(ValueError, match="float32"):
        dequant(raw, "Q4_0", out=cp.empty((2, 64), cp.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        dequant(raw, "Q4_0", out=cp.empty((64, 2), cp.float32).T)
