"""The MoE CUDA twins on a GPU against the NumPy references; skipped where no usable CUDA GPU is present.

Per case (tests/kernels/moe_cases.py: E up to 128, K = 1..8, renormalisation on and off, LoRA on
and off per weight, experts without tokens, an expert spanning several row tiles, exact ties, float32
and bf16 stacks, need_dw on and off): fresh random inputs (never zeros), every output buffer poisoned
(NaN, or -7 for integers) before the kernels write it, every output compared with the float64
reference with its relative error in the message, and the whole path run twice: the results must be
the same bits (no float atomics anywhere). Then: the public twins through `engine.model.ops`, a
lazy stack given by `__cuda_array_interface__`, a layer captured once as a CUDA graph and replayed on
new inputs (both v2 routes), and no host synchronisation on the MoE path (the host must get through
a whole layer's forward and backward while a long kernel still runs ahead of it on the stream).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.kernels import moe_cuda
from engine.kernels.runtime import cuda_runtime
from engine.model import ops
from tests.kernels import moe_cases as mc

pytestmark = pytest.mark.gpu


def routed_cases():
    """Every GPU case on the route its stacks take: float32 stacks on v1, bf16 stacks on each of the
    three routes (v1 kernels, v2 tensor-core kernels "tc", v2 cuBLAS tiles "cublas")."""
    out = []
    for case in mc.cases(gpu=True):
        for route in ("v1", "tc", "cublas") if case.dtype == "bfloat16" else ("v1",):
            out.append(pytest.param(case, route, id=f"{case.name}-{case.dtype}-{route}"))
    return out


@pytest.mark.parametrize("case, route", routed_cases())
def test_moe_matches_reference_and_repeats_bitwise(gpu, case, route, fresh_rng, monkeypatch):
    monkeypatch.setenv("TUNE_MOE_GEMM", route)
    inp = mc.make_inputs(case, fresh_rng)
    first = mc.run_case(case, inp, cuda_runtime())
    mc.check_case(case, inp, first, route)
    second = mc.run_case(case, inp, cuda_runtime())
    differ = [k for k in first if not np.array_equal(first[k], second[k], equal_nan=False)]
    assert not differ, f"{case} on {route}: a second run gave different bits in {differ}"


def test_twins_dispatch_through_ops(gpu, fresh_rng):
    """engine.model.ops runs the CUDA twins for CuPy arrays, with the same results as the `*_on` bodies."""
    cp = gpu
    case = mc.MoeCase("ops", N=64, C=128, F=64, E=8, K=2, lora=("gate", "down"), dtype="bfloat16")
    inp = mc.make_inputs(case, fresh_rng)
    W = [cp.asarray(inp[f"w_{n}_bits"]) for n in mc.NAMES]
    loras = [
        ops.LoraTerm(cp.asarray(inp[f"A_{n}"]), cp.asarray(inp[f"B_{n}"]), inp[f"s_{n}"])
        if n in case.lora
        else None
        for n in mc.NAMES
    ]
    routing, rcache = ops.route_forward(cp.asarray(inp["logits"]), case.K, case.renorm)
    assert isinstance(routing.order, cp.ndarray) and routing.order.dtype == cp.int32
    y, cache = ops.experts_forward(cp.asarray(inp["x"]), routing, *W, *loras)
    assert isinstance(cache.per_expert, moe_cuda.PackedActs)
    dx, dweights, dW, dlora, _ = ops.experts_backward(cp.asarray(inp["dy"]), cache, *W, need_dw=False)
    assert dW is None and set(dlora) == {"gate", "down"}
    dlogits = ops.route_backward(dweights, rcache)
    got = mc.run_case(case, inp, cuda_runtime())
    assert np.array_equal(cp.asnumpy(y), got["y"]) and np.array_equal(cp.asnumpy(dx), got["dx"])
    assert dlogits.shape == (case.N, case.E) and bool(cp.isfinite(dlogits).all())
    acts = moe_cuda.unpack_acts(cache.per_expert, routing)
    assert sum(len(a.pairs) for a in acts) == case.N * case.K


def test_lazy_stack_through_cuda_array_interface(gpu, fresh_rng):
    cp = gpu
    case = mc.MoeCase("lazy", N=32, C=64, F=32, E=4, K=2)
    inp = mc.make_inputs(case, fresh_rng)

    class DeviceStack:  # what a GPU weight store may hand over: no ndarray, a device buffer behind it
        def __init__(self, a):
            self._a = cp.asarray(a)
            self.shape, self.dtype = self._a.shape, self._a.dtype

        @property
        def __cuda_array_interface__(self):
            return self._a.__cuda_array_interface__

    routing, _ = moe_cuda.route_forward(cp.asarray(inp["logits"]), case.K, case.renorm)
    x = cp.asarray(inp["x"])
    y_lazy, _ = moe_cuda.experts_forward(x, routing, *(DeviceStack(inp[f"w_{n}"]) for n in mc.NAMES))
    y, _ = moe_cuda.experts_forward(x, routing, *(cp.asarray(inp[f"w_{n}"]) for n in mc.NAMES))
    assert np.array_equal(cp.asnumpy(y_lazy), cp.asnumpy(y))
    with pytest.raises(TypeError, match="never copies a stack from the host"):
        moe_cuda.experts_forward(x, routing, inp["w_gate"], inp["w_up"], inp["w_down"])


def test_numpy_arrays_are_refused(gpu):
    with pytest.raises(TypeError, match="route_forward_ref"):
        moe_cuda.route_forward(np.zeros((2, 4), np.float32), 2, True)


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
"""


def spin_kernel(cp):
    return cp.RawKernel(_SPIN, "spin")


def spin_cycles(cp, spin, seconds: float) -> int:
    """clock64 cycles for the spin kernel to run about `seconds` (measured, not from device properties)."""
    spin((1,), (1,), (np.int64(1000),))  # compile and load
    start, end = cp.cuda.Event(), cp.cuda.Event()
    n = 20_000_000
    start.record()
    spin((1,), (1,), (np.int64(n),))
    end.record()
    end.synchronize()
    return int(n * seconds / (cp.cuda.get_elapsed_time(start, end) * 1e-3))


@pytest.mark.parametrize("route", ["tc", "cublas"])
def test_layer_replays_as_a_cuda_graph(gpu, route, fresh_rng, monkeypatch):
    """A MoE layer's forward and backward captured once as a CUDA graph through the runtime's own
    capture (`CudaRuntime.capture`: a private stream and pool, cuBLAS's workspace set; what the
    trainer's captured step uses), then replayed on new routing logits and activations uploaded into
    the same input buffers: the replay's outputs are the eager run's on those inputs, bit for bit."""
    cp = gpu
    monkeypatch.setenv("TUNE_MOE_GEMM", route)
    rt = cuda_runtime()
    case = mc.MoeCase("graph", N=256, C=256, F=128, E=16, K=4, lora=("gate", "up", "down"), dtype="bfloat16")
    inp = mc.make_inputs(case, fresh_rng)
    dev = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in inp.items()}
    W = [dev[f"w_{n}_bits"] for n in mc.NAMES]
    loras = [ops.LoraTerm(dev[f"A_{n}"], dev[f"B_{n}"], dev[f"s_{n}"]) for n in mc.NAMES]
    bufs = {k: dev[k].copy() for k in ("logits", "x", "dy")}

    def layer():
        routing, rcache = moe_cuda.route_forward_on(rt, bufs["logits"], case.K, case.renorm)
        y, cache = moe_cuda.experts_forward_on(rt, bufs["x"], routing, *W, *loras)
        dx, dweights, _, dlora, _ = moe_cuda.experts_backward_on(rt, bufs["dy"], cache, *W, need_dw=False)
        return [y, dx, dweights, moe_cuda.route_backward_on(rt, dweights, rcache), *dlora["up"]]

    layer()  # compile and load every kernel outside the capture
    with rt.capture() as graph:
        captured = layer()
    fresh = mc.make_inputs(case, fresh_rng)
    for k, buf in bufs.items():
        rt.upload(buf, fresh[k])
    graph.replay()
    cp.cuda.get_current_stream().synchronize()
    eager = layer()
    for name, a, b in zip(("y", "dx", "dweights", "dlogits", "dA_up", "dB_up"), captured, eager, strict=True):
        assert np.array_equal(cp.asnumpy(a), cp.asnumpy(b)), f"{route}: {name} differs after the replay"


def test_no_host_synchronisation(gpu, fresh_rng):
    """Enqueue a ~0.5 s kernel, then a whole MoE layer forward and backward: if anything on that path
    waited for the device (a .get(), an int() of a device scalar, a synchronize, a blocking copy),
    the host would be stuck behind the spin kernel."""
    cp = gpu
    case = mc.MoeCase("sync", N=256, C=256, F=128, E=32, K=4, lora=("gate", "up", "down"), dtype="bfloat16")
    inp = mc.make_inputs(case, fresh_rng)
    dev = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in inp.items()}
    W = [dev[f"w_{n}_bits"] for n in mc.NAMES]
    loras = [ops.LoraTerm(dev[f"A_{n}"], dev[f"B_{n}"], dev[f"s_{n}"]) for n in mc.NAMES]

    def layer():
        routing, rcache = moe_cuda.route_forward(dev["logits"], case.K, case.renorm)
        y, cache = moe_cuda.experts_forward(dev["x"], routing, *W, *loras)
        dx, dweights, _, dlora, _ = moe_cuda.experts_backward(dev["dy"], cache, *W, need_dw=True)
        return moe_cuda.route_backward(dweights, rcache), dx, y

    spin = spin_kernel(cp)
    cycles = spin_cycles(cp, spin, 0.5)
    layer()  # compile, load the modules, fill the memory pool
    cp.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    spin((1,), (1,), (np.int64(cycles),))
    for _ in range(3):
        layer()
    host = time.perf_counter() - t0
    cp.cuda.get_current_stream().synchronize()
    total = time.perf_counter() - t0
    assert total > 0.3, f"the spin kernel ran only {total:.3f} s: the check would prove nothing"
    assert host < 0.5 * total, f"the host waited for the device: {host:.3f} s of {total:.3f} s"
