"""The engine's compute kernels: one module per op, each a NumPy reference and its CUDA twin.

`engine/kernels/<op>.py` holds `<op>_ref`, written with NumPy: readable, and the specification of
what the op computes (for dequantization, gguf-py's own `gguf.quants`). Beside it is the CUDA
twin's host code, `<op>_on(rt, ...)` on a `Runtime` (`runtime.py`), with the same arguments and
dtype contract, and `<op>(...)`, the same on CuPy arrays. The twin launches CUDA C++ kernels that
the module declares in a `SOURCES` tuple of `KernelSource` (`nvrtc.py`). Parity tests (tests/kernels,
on a GPU) hold each pair together, and a test that needs no GPU compiles every declared source with
NVRTC for sm_80 and sm_90 on every machine.

`nvrtc` finds NVRTC and the CUDA headers, compiles (`compile_ptx_or_cubin`), keeps the registry
(`all_sources`) and the per-device kernel cache (`get_kernel`); `runtime` is where a twin runs
(`Runtime`, the GPU's `CudaRuntime`, the runtime current in this thread). Nothing here imports CuPy,
NVRTC or a GPU driver at import time; the engine imports fine on a machine with none of them, and
only a GPU backend ever calls a CUDA twin. This package's own module imports nothing: import the
op module you need.

Ops: `dequant` (raw GGUF blocks to float32/bfloat16), `embedding`, `norm` (RMSNorm), `linear`
(with LoRA), `rope`, `attention` (sinks and a value head size of its own included; with
`attention_gemm`, its tensor-core path), `mla` (multi-head latent attention's keys and values),
`glu` (SwiGLU, GEGLU, clamped SwiGLU), `moe` (routing, experts, their backward; `moe_cpu`, the CPU
twin of the experts), `cross_entropy` (the output head fused with the loss, soft-cap included),
`adamw` (the multi-tensor optimizer step), `blockq` (a product by weights kept as int8 codes with a
scale and offset per group of 32: the CPU's MoE experts). One reference per op: an architecture's
variant is an argument of it. Compiled CPU twins (numba, `jit`) sit beside their references as
`<op>_cpu` modules. `cpu_workers` runs pieces of the CPU path side by side. `engine.model.ops` gives
model code one name per op.
"""
