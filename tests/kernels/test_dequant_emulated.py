"""The dequantization CUDA source run on the CPU (tests/kernels/emulate.py) against `dequant_ref`.

Needs g++, no GPU: every type, both output dtypes, whole tensors, expert stacks, gathers and
slices off 16-byte boundaries, bit-exact. The same launch plan and kernel arguments as `dequant`.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import dequant as dq
from tests.kernels.dequant_cases import cases, check_bf16, check_f32, random_raw, raw_bytes
from tests.kernels.emulate import HostKernels, compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="the host emulation needs g++")


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> HostKernels:
    params = ("ptr", "i64", "ptr", "i32", "i64", "i32", "ptr")  # the order of dequant.kernel_args
    return HostKernels(dq.SOURCE.code, params, tmp_path_factory.mktemp("emulate"), dq.SOURCE.options)


def run_host(host: HostKernels, raw: np.ndarray, qtype: str, dtype: str, rows) -> np.ndarray:
    src = raw_bytes(raw)
    ids = None if rows is None else np.asarray(rows, dtype=np.int32)
    plan = dq.dequant_plan(src.shape, qtype, None if ids is None else ids.size)
    out = (
        np.full(plan.shape, np.nan, np.float32)
        if dtype == "float32"
        else np.full(plan.shape, 0xFFFF, np.uint16)
    )
    args = dq.kernel_args(plan, src, ids, out)
    ptr = [a.ctypes.data if isinstance(a, np.ndarray) else (None if a is None else int(a)) for a in args]
    host.launch(dq.kernel_name(qtype, dtype), plan.grid, dq.THREADS, *ptr)
    return out


@pytest.mark.parametrize("dtype", dq.OUT_DTYPES)
@pytest.mark.parametrize("qtype", dq.GPU_TYPES)
def test_emulated_kernel_matches_reference(host, qtype, dtype, fresh_rng):
    for case in cases(qtype):
        raw = random_raw(qtype, case.shape, fresh_rng)
        ref = dq.dequant_ref(raw, qtype, rows=case.rows)
        out = run_host(host, raw, qtype, dtype, case.rows)
        what = f"{qtype} -> {dtype}, {case.name} {case.shape} rows={case.rows}"
        if dtype == "float32":
            check_f32(out, ref, what)
        else:
            check_bf16(out, ref, what)


def test_emulated_bad_expert_id_writes_nan(host, fresh_rng):
    raw = random_raw("Q4_K", (3, 4, 256), fresh_rng)
    out = run_host(host, raw, "Q4_K", "float32", rows=(1, 7, -1, 2))
    ref = dq.dequant_ref(raw, "Q4_K", rows=(1, 2))
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all()
    check_f32(out[[0, 3]], ref, "the good ids beside bad ones")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K", "F16"])
def test_dequant_on_a_runtime_runs_the_twins_host_path(qtype, fresh_rng):
    """`dequant_on` (what the device weight store calls) on the emulated runtime: a whole matrix to
    bf16, and experts gathered by id to float32."""
    from tests.kernels.emu_runtime import EmuRuntime

    rt = EmuRuntime()
    qk, _ = dq.block_geometry(qtype)
    raw = raw_bytes(random_raw(qtype, (3, 4, 2 * qk), fresh_rng))
    check_bf16(dq.dequant_on(rt, raw[1], qtype, dtype="bfloat16"), dq.dequant_ref(raw[1], qtype), qtype)
    out = np.full((2, 4, 2 * qk), np.nan, np.float32)
    got = dq.dequant_on(rt, raw, qtype, out=out, rows=np.array([2, 0]))
    assert got is out
    check_f32(out, dq.dequant_ref(raw, qtype, rows=(2, 0)), f"{qtype} gathered")
