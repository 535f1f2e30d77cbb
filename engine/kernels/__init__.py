"""The engine's compute kernels: one module per op, each a NumPy reference and its CUDA twin.

`engine/kernels/<op>.py` holds `<op>_ref`, written with NumPy: readable, and the specification of
what the op computes (for dequantization, gguf-py's own `gguf.quants`). Beside it is the CuPy
version, `<op>`, with the same signature and dtype contract, running CUDA C++ kernels that the
module declares in a `SOURCES` tuple of `KernelSource`. Parity tests (tests/kernels, on a GPU)
hold each pair together, and a test that needs no GPU compiles every declared source with NVRTC
for sm_80 and sm_90 on every machine.

`cuda` holds what the op modules share: finding NVRTC and the CUDA headers, compiling
(`compile_ptx_or_cubin`), the registry (`all_sources`) and the per-device kernel cache
(`get_kernel`). Nothing here imports CuPy, NVRTC or a GPU driver at import time; the engine
imports fine on a machine with none of them, and only a GPU backend ever calls a CUDA twin.

Ops: `dequant` (raw GGUF blocks to float32/bfloat16), `embedding`, `norm` (RMSNorm), `linear`
(with LoRA), `rope`, `attention`, `swiglu`, `moe` (routing, experts, their backward),
`cross_entropy` (the output head fused with the loss), `adamw` (the multi-tensor optimizer step).
`engine.model.ops` gives model code one name per op.
"""

from .cuda import (
    CudaToolkitError,
    KernelCompileError,
    KernelSource,
    all_sources,
    compile_ptx_or_cubin,
    get_kernel,
)

__all__ = [
    "CudaToolkitError",
    "KernelCompileError",
    "KernelSource",
    "all_sources",
    "compile_ptx_or_cubin",
    "get_kernel",
]
