"""The MoE CUDA source run on the CPU (tests/kernels/emulate_moe.py) against the NumPy references.

Needs g++, no GPU. The whole MoE path runs through the same `*_on` bodies as the CuPy twins
(argument lists, grid sizes, buffer shapes and all): routing (softmax, top-k with its tie rule,
renormalisation, the counting sort), the grouped matmuls on both the bf16 tensor-core path (the
mma.sync fragments emulated lane by lane) and the float32 path, the SwiGLU and LoRA epilogues,
OUT_PROD_ID (dW, dA, dB), the scatter and the per-token reductions, and the router backward. Every
buffer starts as NaN (or -7), inputs are fresh random numbers, and every output is compared with the
reference in float64 on the kernels' own routing.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import moe, moe_cuda
from engine.kernels.runtime import Runtime
from tests.kernels import moe_cases as mc
from tests.kernels.emulate import compiler
from tests.kernels.emulate_moe import EmulationError, FiberKernels

pytestmark = pytest.mark.skipif(compiler() is None, reason="the host emulation needs g++")


@pytest.fixture(autouse=True)
def v1_route(monkeypatch):
    """These tests hold the v1 kernels (moe.cu) to the reference; the v2 routes have their own file."""
    monkeypatch.setenv("TUNE_MOE_GEMM", "v1")


@pytest.fixture(scope="module")
def host() -> FiberKernels:
    """moe.cu built by g++ once per session: the same build the engine's MoE step tests run on."""
    from tests.kernels.emu_runtime import built

    kernels = built(moe_cuda.SOURCE).kernels
    assert isinstance(kernels, FiberKernels) and kernels.kernels == tuple(moe_cuda.KERNELS)
    return kernels


class HostRuntime(Runtime):
    """NumPy arrays, and the MoE kernels run by `host` (moe.cu built by g++)."""

    xp = np

    def __init__(self, host: FiberKernels) -> None:
        self.host = host

    def launch(self, source, kernel, grid, block, args, shared_mem=0) -> None:
        self.host.launch(kernel, tuple(grid), int(block[0]), tuple(args))


@pytest.mark.parametrize("case", mc.cases(), ids=str)
def test_emulated_moe_matches_reference(host, case, fresh_rng):
    inp = mc.make_inputs(case, fresh_rng)
    got = mc.run_case(case, inp, HostRuntime(host))
    errors = mc.check_case(case, inp, got)
    assert errors["y"] > 0.0, "a float output equal to the float64 reference to the last bit is suspicious"
    counts = np.diff(got["offsets"])
    if case.starve:
        assert (counts[-case.starve :] == 0).all(), "the case meant some experts to get no tokens"
    if case.skew:
        assert counts.max() > moe_cuda.GEMM_BM, "the case meant one expert to span several row tiles"


def test_launch_plan_depends_on_shapes_only(host, fresh_rng):
    """No grid size or buffer depends on where tokens go: nothing needs a value from the device."""
    case = mc.MoeCase("plan", N=20, C=24, F=16, E=8, K=2, lora=("gate", "down"))
    plans = []
    for skew in (0.0, 9.0):
        inp = mc.make_inputs(case, fresh_rng)
        inp["logits"][:, 3] += skew
        host.launches.clear()
        mc.check_case(case, inp, mc.run_case(case, inp, HostRuntime(host)))
        plans.append(list(host.launches))
    assert plans[0] == plans[1]
    names = [n for n, _ in plans[0]]
    assert names.count("moe_outer_f32") == 3 + 4 and "moe_gate_up_f32" in names and "moe_dx_f32" in names


def test_bf16_and_f32_stacks_agree(host, fresh_rng):
    """The tensor-core path against the float32 path on the same bf16-valued weights."""
    case = mc.MoeCase("paths", N=30, C=40, F=24, E=4, K=2, lora=("up",))
    inp = mc.make_inputs(case, fresh_rng)
    bits = {n: mc.bf16_bits(inp[f"w_{n}"]) for n in mc.NAMES}
    f32 = dict(inp, **{f"w_{n}": mc.bf16_values(bits[n]) for n in mc.NAMES})
    bf16 = dict(f32, **{f"w_{n}_bits": bits[n] for n in mc.NAMES})
    a = mc.run_case(case, f32, HostRuntime(host))
    b = mc.run_case(mc.MoeCase(**{**case.__dict__, "dtype": "bfloat16"}), bf16, HostRuntime(host))
    for k in ("y", "dx", "dW_gate", "dW_down", "dA_up", "dB_up"):
        assert mc.rel_err(b[k], a[k]) < 1e-2, k
        assert mc.rel_err(b[k], a[k]) > 0, f"{k}: the bf16 path should round its activations"


def test_wrong_inputs_are_refused(host):
    rt = HostRuntime(host)
    logits = np.zeros((4, 6), np.float32) + np.arange(6, dtype=np.float32)
    with pytest.raises(ValueError, match="K <= E"):
        moe_cuda.route_forward_on(rt, logits, 7, True)
    with pytest.raises(TypeError, match="float32"):
        moe_cuda.route_forward_on(rt, logits.astype(np.float64), 2, True)
    routing, _ = moe_cuda.route_forward_on(rt, logits, 2, True)
    x = np.ones((4, 12), np.float32)
    w = np.ones((6, 8, 12), np.float32)
    with pytest.raises(ValueError, match="multiples of 8"):
        moe_cuda.experts_forward_on(rt, x, routing, w, w, np.ones((6, 12, 8), np.float32))
    x = np.ones((4, 16), np.float32)
    wg = np.ones((6, 8, 16), np.float32)
    with pytest.raises(TypeError, match="all be float32 or all bf16"):
        moe_cuda.experts_forward_on(rt, x, routing, wg, wg, np.ones((6, 16, 8), np.uint16))
    with pytest.raises(TypeError, match="on the device"):
        moe_cuda.experts_forward_on(rt, x, routing, [wg[0]] * 6, wg, wg)


# ---- the emulator itself ----------------------------------------------------------------------------

_MMA_TEST = r"""
typedef unsigned int u32;
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    emu_mma_bf16_16816(d, a, b);
}
// element-wise transcription of the PTX ISA's "Matrix Fragments for mma.m16n8k16" (bf16 A, B; f32 D)
extern "C" __global__ void mma_one(const unsigned short* A, const unsigned short* B, float* D) {
    const int lane = threadIdx.x, groupID = lane >> 2, tig = lane % 4;
    u32 a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    for (int i = 0; i < 8; ++i) {
        const int row = (i < 2 || (i >= 4 && i < 6)) ? groupID : groupID + 8;
        const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
        a[i / 2] |= (u32)A[row * 16 + col] << (16 * (i % 2));
    }
    for (int i = 0; i < 4; ++i) {
        const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = groupID;
        b[i / 2] |= (u32)B[row * 8 + col] << (16 * (i % 2));
    }
    float d[4] = {0, 0, 0, 0};
    mma_bf16_16816(d, a, b);
    for (int i = 0; i < 4; ++i) D[(groupID + (i >= 2 ? 8 : 0)) * 8 + tig * 2 + (i & 1)] = d[i];
}
extern "C" __global__ void misaligned(const float* p, float* out) {
    const float4 v = __ldg((const float4*)(p + 1));
    out[threadIdx.x] = v.x;
}
extern "C" __global__ void diverge(float* out) {
    if (threadIdx.x == 3) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> FiberKernels:
    return FiberKernels(
        _MMA_TEST, ("mma_one", "diverge", "misaligned"), tmp_path_factory.mktemp("emulate_tiny")
    )


def test_emulated_mma_follows_the_ptx_fragment_layout(tiny, fresh_rng):
    A = mc.bf16_bits(fresh_rng.standard_normal((16, 16)).astype(np.float32))
    B = mc.bf16_bits(fresh_rng.standard_normal((16, 8)).astype(np.float32))
    D = np.full((16, 8), np.nan, np.float32)
    tiny.launch("mma_one", (1, 1), 32, (A, B, D))
    ref = mc.bf16_values(A).astype(np.float64) @ mc.bf16_values(B).astype(np.float64)
    assert mc.rel_err(D, ref) < 1e-6


def test_emulator_reports_a_divergent_barrier(tiny):
    with pytest.raises(EmulationError, match="can never be met"):
        tiny.launch("diverge", (2, 1), 64, (np.zeros(64, np.float32),))


def test_emulator_reports_a_misaligned_vector_load(tiny):
    with pytest.raises(EmulationError, match="misaligned 16-byte load"):
        tiny.launch("misaligned", (1, 1), 32, (np.zeros(64, np.float32), np.zeros(32, np.float32)))


def test_emulator_checks_argument_types(tiny):
    A = np.zeros((16, 16), np.uint16)
    with pytest.raises(TypeError, match="pointer"):
        tiny.launch("mma_one", (1, 1), 32, (A, A, np.int32(3)))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        tiny.launch("mma_one", (1, 1), 32, (A, A))


def test_packed_cache_unpacks_to_the_reference_layout(host, fresh_rng):
    case = mc.MoeCase("packed", N=24, C=16, F=16, E=6, K=2, lora=("up", "down"), starve=2)
    inp = mc.make_inputs(case, fresh_rng)
    rt = HostRuntime(host)
    routing, _ = moe_cuda.route_forward_on(rt, inp["logits"], case.K, case.renorm)
    loras = [
        moe.LoraTerm(inp[f"A_{n}"], inp[f"B_{n}"], inp[f"s_{n}"]) if n in case.lora else None
        for n in mc.NAMES
    ]
    W = [inp[f"w_{n}"] for n in mc.NAMES]
    _, cache = moe_cuda.experts_forward_on(rt, inp["x"], routing, *W, *loras)
    assert isinstance(cache.per_expert, moe_cuda.PackedActs) and cache.per_expert.xa_gate is None
    got = moe_cuda.unpack_acts(cache.per_expert, routing)
    _, ref_cache = moe.experts_forward_ref(inp["x"], routing, *W, *loras)
    assert [a.e for a in got] == [a.e for a in ref_cache.per_expert] and len(got) == case.E - case.starve
    for a, b in zip(got, ref_cache.per_expert, strict=True):
        assert np.array_equal(a.pairs, b.pairs)
        for field in ("g", "u", "a", "h", "xa_up", "ha_down"):
            assert mc.rel_err(getattr(a, field), getattr(b, field)) < 1e-5, (a.e, field)
