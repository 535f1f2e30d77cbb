"""The MoE GEMM v2 kernels (engine/kernels/cuda/moe_gemm.cu, moe_cublas.cu) on the CPU against references.

Needs g++, no GPU. The emulator (tests/kernels/emulate_moe.py) runs what the kernels use: cp.async
copies that land only at their thread's wait_group, ldmatrix (plain and transposed) with the PTX
ISA's fragment layout, mma.sync, dynamic shared memory that starts as NaN. Checked here:

- the emulated primitives against element-wise transcriptions of the PTX ISA (so that a kernel
  passing here loads its fragments as the GPU does);
- `grouped_mm_on` and `grouped_outer_on` against their NumPy references on ragged groupings: experts
  with no rows, an expert with one row, every row in one expert (several 128-row tiles), NT and NN
  weights, gathered and sorted rows, with and without the LoRA segment of K;
- the whole MoE layer (routing, both v2 routes: our tensor-core kernels "tc" and the cuBLAS tiles
  "cublas" with the emulator's cuBLAS) against the float64 reference on ragged routings: experts that
  get no tokens, one token, every token to one expert, exact top-k ties; LoRA on every weight, dW;
  gpt-oss's experts (biases on every projection and their gradients, the clamped SwiGLU) and a bias
  on one projection alone;
- the launch plan depends on shapes only (no host read of the routing);
- ptxas spills no register of any v2 kernel (`-Xptxas -v` through NVRTC, sm_80 and sm_90).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import moe_gemm, nvrtc
from engine.kernels.nvrtc import CudaToolkitError
from tests.kernels import moe_cases as mc
from tests.kernels.emu_runtime import EmuRuntime
from tests.kernels.emulate import compiler
from tests.kernels.emulate_moe import FiberKernels

needs_gxx = pytest.mark.skipif(compiler() is None, reason="the host emulation needs g++")


def host_runtime() -> EmuRuntime:
    """The emulator's runtime with plain NumPy buffers (moe_cases poisons and guards its own)."""
    rt = EmuRuntime()
    rt.xp = np
    return rt


def bf16(rng, *shape) -> np.ndarray:
    return mc.bf16_bits(rng.standard_normal(shape).astype(np.float32))


# ---- the emulated primitives -------------------------------------------------------------------------

_PRIMS = r"""
typedef unsigned int u32;
typedef unsigned short u16;
// element-wise transcription of the PTX ISA's ldmatrix (.x4, .b16): thread l's register j holds the
// elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j (with .trans: of its transpose),
// matrix j's row r at the address lane 8 j + r gives
extern "C" __global__ void ldsm(const u16* M, u32* out, int trans) {
    __shared__ __align__(16) u16 s[4 * 8 * 16];  // 4 matrices, rows 32 bytes apart (8 used + 8 pad)
    const int l = threadIdx.x;
    for (int i = l; i < 4 * 64; i += 32) s[(i / 64) * 128 + ((i % 64) / 8) * 16 + i % 8] = M[i];
    __syncthreads();
    u32 r[4];
    const u16* row = s + (l / 8) * 128 + (l % 8) * 16;
    if (trans) emu_ldmatrix_x4(r, row, true); else emu_ldmatrix_x4(r, row, false);
    for (int j = 0; j < 4; ++j) out[l * 4 + j] = r[j];
}
// cp.async: copy 16 bytes (bytes_in of them, the rest zeros) into shared memory; read it before and
// after the wait
extern "C" __global__ void cpasync(const u16* src, int bytes_in, u16* before, u16* after) {
    extern __shared__ __align__(16) unsigned char dyn[];
    u16* s = (u16*)dyn + threadIdx.x * 8;
    emu_cp_async16(s, src + threadIdx.x * 8, bytes_in);
    emu_cp_async_commit();
    for (int i = 0; i < 8; ++i) before[threadIdx.x * 8 + i] = s[i];
    emu_cp_async16(s, src, 16);  // a second group, still in flight after wait(1)
    emu_cp_async_commit();
    emu_cp_async_wait(1);
    for (int i = 0; i < 8; ++i) after[threadIdx.x * 8 + i] = s[i];
    emu_cp_async_wait(0);
}
"""


@pytest.fixture(scope="module")
def prims(tmp_path_factory) -> FiberKernels:
    if compiler() is None:
        pytest.skip("the host emulation needs g++")
    return FiberKernels(_PRIMS, ("ldsm", "cpasync"), tmp_path_factory.mktemp("emulate_prims"))


@pytest.mark.parametrize("trans", [False, True])
def test_emulated_ldmatrix_follows_the_ptx_layout(prims, trans, fresh_rng):
    M = fresh_rng.integers(0, 2**16, (4, 8, 8)).astype(np.uint16)
    out = np.zeros((32, 4), np.uint32)
    prims.launch("ldsm", (1, 1), 32, (M, out, np.int32(trans)))
    for lane in range(32):
        r, c = lane // 4, 2 * (lane % 4)
        for j in range(4):
            m = M[j].T if trans else M[j]
            assert out[lane, j] == int(m[r, c]) | (int(m[r, c + 1]) << 16), (lane, j)


def test_emulated_cp_async_lands_at_the_wait(prims, fresh_rng):
    src = fresh_rng.integers(1, 2**15, 32 * 8).astype(np.uint16)
    before = np.zeros(32 * 8, np.uint16)
    after = np.zeros(32 * 8, np.uint16)
    prims.launch("cpasync", (1, 1), 32, (src, np.int32(10), before, after), shared_mem=32 * 16)
    assert (before == 0xFFFF).all(), "a copy was visible before its wait_group"
    got = after.reshape(32, 8)
    assert np.array_equal(got[:, :5], src.reshape(32, 8)[:, :5]) and (got[:, 5:] == 0).all()


# ---- the grouped GEMM and OUT_PROD_ID ops --------------------------------------------------------------

GROUPINGS = {
    "ragged": [0, 200, 1, 99, 0],  # empty experts, one row, one expert over a tile boundary
    "one-expert": [0, 0, 300, 0],  # every row in one expert: three row tiles
    "one-row": [0, 1, 0],
}


def grouping(counts, K, rng):
    offsets = np.zeros(len(counts) + 1, np.int32)
    offsets[1:] = np.cumsum(counts)
    order = rng.permutation(int(offsets[-1])).astype(np.int32)
    # pairs p -> token p // K: make P a multiple of K
    return order, offsets


@needs_gxx
@pytest.mark.parametrize("name", list(GROUPINGS))
@pytest.mark.parametrize("w_nt", [True, False])
def test_grouped_mm_matches_reference(name, w_nt, fresh_rng):
    counts = GROUPINGS[name]
    K = 1 if sum(counts) % 2 else 2
    order, offsets = grouping(counts, K, fresh_rng)
    P, E = len(order), len(counts)
    K0, N, KX = 72, 40, 32
    a = bf16(fresh_rng, P // K, K0)
    w = bf16(fresh_rng, *((E, N, K0) if w_nt else (E, K0, N)))
    ax = bf16(fresh_rng, P, KX)
    wx = bf16(fresh_rng, *((E, N, KX) if w_nt else (E, KX, N)))
    rt = host_runtime()
    for gather, ext in ((True, True), (False, False)):
        kw = dict(K=K, gather=gather, w_nt=w_nt, a_ext=ax if ext else None, w_ext=wx if ext else None)
        src = a if gather else bf16(fresh_rng, P, K0)
        got = moe_gemm.grouped_mm_on(rt, src, order, offsets, w, **kw)
        ref = moe_gemm.grouped_mm_ref(src, order, offsets, w, **kw)
        assert mc.rel_err(got, ref) < 1e-6, (gather, ext)  # bf16 products are exact; fp32 sums


@needs_gxx
@pytest.mark.parametrize("I", [24, 136])  # the skinny (LoRA) tiles and the 128 x 128 ones
def test_grouped_outer_matches_reference(I, fresh_rng):
    counts = GROUPINGS["ragged"]
    K = 2
    order, offsets = grouping(counts, K, fresh_rng)
    P = len(order)
    rt = host_runtime()
    rw = fresh_rng.standard_normal(P).astype(np.float32)
    lb = bf16(fresh_rng, P, I)
    rb = bf16(fresh_rng, P // K, 40)
    for transpose in (False, True):
        L, R = moe_gemm.OuterOperand(lb), moe_gemm.OuterOperand(rb, token=True)
        kw = dict(K=K, rw=rw, scale=0.5, transpose=transpose)
        got = moe_gemm.grouped_outer_on(rt, L, R, order, offsets, **kw)
        ref = moe_gemm.grouped_outer_ref(L, R, order, offsets, **kw)
        assert mc.rel_err(got, ref) < 1e-6
        assert (got[[0, 4]] == 0).all(), "experts without rows get zeros"
    # float32 operands, weighted rows: rounded to bf16 as they are staged
    lf = fresh_rng.standard_normal((P, I)).astype(np.float32)
    L, R = moe_gemm.OuterOperand(lf, weighted=True), moe_gemm.OuterOperand(rb, token=True)
    got = moe_gemm.grouped_outer_on(rt, L, R, order, offsets, K=K, rw=rw)
    ref = moe_gemm.grouped_outer_ref(L, R, order, offsets, K=K, rw=rw)
    assert 0 < mc.rel_err(got, ref) < 1e-2


@needs_gxx
def test_grouped_mm_refuses_float_operands(fresh_rng):
    order, offsets = grouping([2, 2], 1, fresh_rng)
    with pytest.raises(TypeError, match="bf16"):
        moe_gemm.grouped_mm_on(host_runtime(), np.ones((4, 8), np.float32), order, offsets,
                               np.ones((2, 8, 8), np.uint16))  # fmt: skip


# ---- the MoE layer on both v2 routes -------------------------------------------------------------------

ALL = ("gate", "up", "down")
RAGGED = [
    mc.MoeCase(
        "starved-lora", N=40, C=72, F=40, E=8, K=2, lora=ALL, ranks={"up": 3}, starve=3, dtype="bfloat16"
    ),  # fmt: skip
    # one token, its 8 slots in 8 of 16 experts (K = 8 keeps dweights more than a couple of numbers)
    mc.MoeCase("one-token", N=1, C=64, F=32, E=16, K=8, lora=ALL, dtype="bfloat16"),
    mc.MoeCase("all-to-one", N=300, C=24, F=16, E=4, K=1, lora=("gate", "down"), skew=60.0, dtype="bfloat16"),
    mc.MoeCase("ties", N=16, C=16, F=8, E=8, K=3, ties=True, lora=("up",), dtype="bfloat16"),
    # gpt-oss: biases on gate, up and down (and their gradients), the clamped SwiGLU, starved experts
    mc.MoeCase("oss", N=30, C=48, F=32, E=8, K=2, lora=ALL, starve=2, dtype="bfloat16", **mc.OSS),
    # SwiGLU with a bias on one projection only (the others' pointers null)
    mc.MoeCase("silu-bias", N=24, C=32, F=16, E=4, K=2, lora=("gate",), biases=("up",), dtype="bfloat16"),
]


@needs_gxx
@pytest.mark.parametrize("route", ["tc", "cublas"])
@pytest.mark.parametrize("case", RAGGED, ids=str)
def test_moe_layer_v2_matches_reference(route, case, fresh_rng, monkeypatch):
    monkeypatch.setenv("TUNE_MOE_GEMM", route)
    inp = mc.make_inputs(case, fresh_rng)
    got = mc.run_case(case, inp, host_runtime())
    mc.check_case(case, inp, got, route)
    counts = np.diff(got["offsets"])
    if case.starve:
        assert (counts[-case.starve :] == 0).all()
    if case.skew:
        assert counts[0] == case.N * case.K > 2 * moe_gemm.MG_BM, "every pair meant for expert 0, 3 tiles"
    again = mc.run_case(case, inp, host_runtime())
    assert all(np.array_equal(got[k], again[k]) for k in got)


@needs_gxx
@pytest.mark.parametrize("route", ["tc", "cublas"])
def test_v2_launch_plan_depends_on_shapes_only(route, fresh_rng, monkeypatch):
    monkeypatch.setenv("TUNE_MOE_GEMM", route)
    case = mc.MoeCase("plan", N=20, C=24, F=16, E=8, K=2, lora=("gate", "down"), dtype="bfloat16")
    plans = []
    for skew in (0.0, 40.0):
        inp = mc.make_inputs(case, fresh_rng)
        inp["logits"][:, 3] += skew
        rt = host_runtime()
        mc.check_case(case, inp, mc.run_case(case, inp, rt), route)
        plans.append(list(rt.launches))
    assert plans[0] == plans[1]
    names = {n for n, _, _ in plans[0]}
    if route == "tc":
        assert {"mg_gate_up", "mg_scatter_nt", "mg_down_back", "mg_scatter_nn", "mg_outer_skinny"} <= names
    else:
        assert {"mc_plan", "mc_gather", "mc_glu", "mc_glu_back", "mc_scatter"} <= names


@needs_gxx
@pytest.mark.parametrize("route", ["tc", "cublas"])
def test_v2_layer_replays_as_a_captured_graph(route, fresh_rng, monkeypatch):
    """A MoE layer's forward and backward (routing, experts with LoRA on every weight and dW, router
    backward) captured once on the emulator's RecordingRuntime, which refuses a host read or an upload
    inside a capture as CUDA does, then replayed on new logits, x and dy uploaded into the same
    buffers: the replay's outputs are the eager run's on those inputs, bit for bit."""
    from engine.kernels import moe_cuda
    from engine.kernels.linear import LoraTerm
    from tests.kernels.emu_runtime import RecordingRuntime

    monkeypatch.setenv("TUNE_MOE_GEMM", route)
    case = mc.MoeCase("graph", N=24, C=32, F=16, E=6, K=2, lora=ALL, ranks={"up": 3}, dtype="bfloat16")
    inp = mc.make_inputs(case, fresh_rng)
    rt = RecordingRuntime()
    xp = rt.xp
    W = [xp.asarray(inp[f"w_{n}_bits"]) for n in mc.NAMES]
    loras = [LoraTerm(xp.asarray(inp[f"A_{n}"]), xp.asarray(inp[f"B_{n}"]), inp[f"s_{n}"]) for n in mc.NAMES]
    bufs = {k: xp.asarray(inp[k]) for k in ("logits", "x", "dy")}

    def layer():
        routing, rcache = moe_cuda.route_forward_on(rt, bufs["logits"], case.K, case.renorm)
        y, cache = moe_cuda.experts_forward_on(rt, bufs["x"], routing, *W, *loras)
        dx, dweights, dW, dlora, _ = moe_cuda.experts_backward_on(rt, bufs["dy"], cache, *W, need_dw=True)
        dlogits = moe_cuda.route_backward_on(rt, dweights, rcache)
        return [y, dx, dweights, dlogits, *dlora["up"], *dlora["down"], dW["gate"], dW["down"]]

    layer()
    with rt.capture() as graph:  # a host read, an upload or unrecordable glue inside would raise
        captured = layer()
    fresh = mc.make_inputs(case, fresh_rng)
    for k, buf in bufs.items():
        rt.upload(buf, fresh[k])
    graph.replay()
    eager = layer()
    for i, (a, b) in enumerate(zip(captured, eager, strict=True)):
        assert np.array_equal(a.view(np.ndarray), b.view(np.ndarray)), f"output {i} differs after the replay"
    assert not np.array_equal(captured[0].view(np.ndarray), mc.run_case(case, inp, host_runtime())["y"])


def test_route_names(monkeypatch):
    monkeypatch.delenv("TUNE_MOE_GEMM", raising=False)
    assert moe_gemm.route() == moe_gemm.DEFAULT_ROUTE
    monkeypatch.setenv("TUNE_MOE_GEMM", "nope")
    with pytest.raises(ValueError, match="tc, cublas, v1"):
        moe_gemm.route()


# ---- registers -------------------------------------------------------------------------------------------


def test_v2_kernels_spill_no_registers():
    """Every kernel of moe_gemm.cu, for sm_90 (the devices the route is for: H100, H200; test_compile
    builds sm_80 too). (Not moe_cublas.cu's elementwise epilogues: no register pressure there, and an
    IEEE division's slow-path call may give them a small stack frame, an ABI save, not a spill.) The
    kernels ask for two blocks an SM (`__launch_bounds__(MG_THREADS, 2)`: at most 128 registers), so
    what a ptxas version could do instead of using more registers is spill: checked here (NVRTC 13.5
    here: 126-128 registers, no spill, with the fused biases and both activations of glu.cuh)."""
    arch = "sm_90"
    source = moe_gemm.SOURCE
    try:
        report = nvrtc.ptxas_report(source, arch)
    except CudaToolkitError as exc:
        if not nvrtc.platform_has_nvrtc_wheels():
            pytest.skip(f"no NVRTC for this platform: {exc}")
        raise
    assert set(report) == set(source.kernels), f"ptxas reported {sorted(report)}"
    spills = {k: (v["spill_stores"], v["spill_loads"], v["stack"]) for k, v in report.items()}
    assert all(s == (0, 0, 0) for s in spills.values()), spills
    # 2 blocks of 256 threads per SM need <= 128 registers a thread
    assert all(v["registers"] <= 128 for v in report.values()), report
