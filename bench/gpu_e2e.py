"""Whole training steps on a GPU, ours beside transformers + PEFT: the end-to-end part of bench/gpu.py.

What it measures, per model shape (each run in its own process, one after the other, so that each
one's device memory is its own):

- the engine: `Model.load(path, backend=select_backend("cuda:0"))` of a generated GGUF file (Q4_K;
  gpt-oss: MXFP4 experts, the rest Q8_0),
  then `engine.Trainer` driven step by step (`start`, `train_step`) on text windows of exactly
  `ctx` tokens, `batch` windows a step, rank-16 LoRA (alpha 32, AdamW, global-norm clip 1.0, no
  layer checkpointing), once per weight-cache budget (`off`: every matrix dequantized from Q4_K
  at each use, QLoRA at rest; `auto`: dequantized bf16 copies kept while device memory allows);
- the peer: the transformers model of the same shape (bf16 weights, random init, SDPA attention,
  MoE experts through `torch._grouped_mm` where the installed transformers has the `grouped_mm`
  experts implementation, else its eager loop, said in the note), PEFT LoRA r16 alpha 32 on the
  same tensors (experts through `target_parameters` where PEFT has it, else none, said), fused
  AdamW, the same clip, random token ids, the same batch, context and number of steps.

Targets: dense, every linear tensor of every layer (q, k, v, o, gate, up, down); MoE, attention and
every routed expert stack (the router is left out on both sides: transformers v5's router is no
Linear module for PEFT's target_modules). PEFT adapts transformers' fused `gate_up_proj` with one
A per expert for gate and up together, the engine gate and up separately, so on the MoE the engine
trains about 30% more LoRA parameters at this shape (the table's "trainable" says how many).
gpt-oss (`gptoss`): the same, attention q, k, v, o and the expert stacks; transformers' GptOss takes
no SDPA (its sinks), so the peer runs eager attention. DeepSeek-V2 (`deepseek2`): of attention only
the output projection (llama.cpp multiplies the MLA projections without adapters, so the engine
adapts none of them), and the routed expert stacks; the shared experts on neither side (see
MLA_TARGETS).

Figures: step time (host clock around one optimizer step, the device synchronised; median of the
measured steps after `warmup` steps), tokens/s = tokens a step / step time, TFLOP/s = FLOPs a step
(`step_flops`) / step time, MFU = TFLOP/s over the measured bf16 matmul ceiling. FLOPs a step, the
same formula for both sides: with frozen base weights a token costs 2·N in the forward and 2·N in
the backward (input gradients only: no weight gradients), so 4·N per token, N the matmul weights a
token meets (attention q, k, v, o; the dense FFN, or the K routed experts and the router; the
output head); plus attention, 4·L·NH·HS per visible (query, key) pair forward and twice that
backward, 12·L·NH·HS·B·T(T+1)/2 in all. LoRA's own products (rank 16: about 1-2% more) and any
recomputation are not counted.

Memory, three ways: peak allocated (the engine: CuPy's pool bytes in use, tracked by a memory hook
from before `Trainer.start` through the warm-up steps; the peer: `torch.cuda.max_memory_allocated`),
reserved (CuPy's pool total, torch's `max_memory_reserved`), and device (free device memory at the
process's start, after its CUDA context, less free memory after its last step: what the process
took from the card). Weights, LoRA factors, optimizer moments and activations are in all three.

The model files are generated here with random Q4_K blocks: a few thousand blocks quantized once,
drawn at random into one tensor per shape, and those bytes reused by every layer (the router, norms
and biases stay F32, as llama-quantize leaves them), so a 4.5 GB file takes seconds.

`python bench/gpu_e2e.py --child engine|peer ...` is how the runs are started (by `run_end_to_end`);
with `--emulate` the engine runs on the g++ kernel emulator (tests/kernels/emu_runtime.py) at tiny
shapes. Prints figures; never passes or fails on speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import QWEN3_30B_A3B  # noqa: E402
from engine.testing import SynthSpec  # noqa: E402

GIB = 2**30
RANK, ALPHA, LR, CLIP = 16, 32.0, 1e-4, 1.0

# Real models' shapes at Q4_K. The MoE model is cut to `--moe-layers` layers (all 48 would be a 17 GB
# file and 61 GB of bf16 weights for the peer: neither fits the 10-minute call, nor the peer an H100).
SHAPES = {
    # Qwen2.5-1.5B: 28 layers, 1536 wide, 12 query / 2 KV heads of 128, FFN 8960, vocab 151936, tied
    "dense": SynthSpec.for_arch(
        "qwen2", V=151936, C=1536, L=28, NH=12, NKV=2, HS=128, F=8960, tied=True, qtype="Q4_K",
        n_ctx=32768, name="qwen2.5-1.5b-shaped",
    ),
    # Qwen3-1.7B: 28 layers, 2048 wide, 16 query / 8 KV heads of 128, FFN 6144, vocab 151936, tied; the
    # "1.7B Q4_K_M at ubatch 128" of llama.cpp's QLoRA work (run it with --batch 1 --ctx 128)
    "dense17": SynthSpec.for_arch(
        "qwen3", V=151936, C=2048, L=28, NH=16, NKV=8, HS=128, F=6144, tied=True, qtype="Q4_K",
        n_ctx=32768, name="qwen3-1.7b-shaped",
    ),
    "moe": QWEN3_30B_A3B,
    # gpt-oss-20b: 24 layers, 2880 wide, 64 query / 8 KV heads of 64 with sinks, a 128-token window on
    # every other layer, 32 experts (4 used) of 2880 in MXFP4, biases, vocab 201088; the rest Q8_0 (the
    # router and vectors F32), as ggml-org's MXFP4 file stores it
    "gptoss": SynthSpec.for_arch(
        "gpt-oss", V=201088, C=2880, L=24, NH=64, NKV=8, HS=64, E=32, K=4, F_exp=2880, qtype="Q8_0",
        expert_qtype="MXFP4", swa_window=128, n_ctx=131072, name="gpt-oss-20b-shaped",
    ),
    # DeepSeek-V2-Lite: 27 layers, 2048 wide, 16 MLA heads (keys 128 + 64 RoPE dims, values 128, KV
    # compressed to 512, no q compression), the first layer dense (10944), then 64 routed experts (6
    # used) of 1408 and 2 shared ones, vocab 102400; Q4_K, Q8_0 where rows are not whole 256-value
    # blocks (as llama-quantize falls back)
    "deepseek2": SynthSpec.for_arch(
        "deepseek2", V=102400, C=2048, L=27, NH=16, NKV=16, HS=192, n_rot=64, HS_v=128, kv_lora_rank=512,
        E=64, K=6, F_exp=1408, n_shexp=2, F=10944, n_dense_lead=1, gating=1, moe_scale=1.0, qtype="Q4_K",
        n_ctx=32768, name="deepseek-v2-lite-shaped",
    ),
}  # fmt: skip
# The same kinds at sizes the g++ emulator gets through in seconds (--emulate).
TINY = {
    "dense": SynthSpec.for_arch(
        "qwen2", V=512, C=256, L=2, NH=2, NKV=1, HS=128, F=512, tied=True, qtype="Q4_K", n_ctx=256,
        name="tiny-dense",
    ),
    "moe": SynthSpec.for_arch(
        "qwen3moe", V=512, C=256, L=2, NH=2, NKV=1, HS=128, E=4, K=2, F_exp=256, qtype="Q4_K", n_ctx=256,
        name="tiny-moe",
    ),
    "dense17": SynthSpec.for_arch(
        "qwen3", V=512, C=256, L=2, NH=2, NKV=1, HS=128, F=512, tied=True, qtype="Q4_K", n_ctx=256,
        name="tiny-qwen3",
    ),
    "gptoss": SynthSpec.for_arch(
        "gpt-oss", V=512, C=256, L=2, NH=4, NKV=2, HS=64, E=4, K=2, F_exp=256, qtype="Q8_0",
        expert_qtype="MXFP4", swa_window=16, n_ctx=256, name="tiny-gpt-oss",
    ),
    "deepseek2": SynthSpec.for_arch(
        "deepseek2", V=512, C=256, L=2, NH=2, NKV=2, HS=96, n_rot=32, HS_v=64, kv_lora_rank=64, E=4,
        K=2, F_exp=256, n_shexp=1, F=512, n_dense_lead=1, gating=1, moe_scale=1.0, qtype="Q4_K",
        n_ctx=256, name="tiny-deepseek2",
    ),
}  # fmt: skip
DENSE_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
MOE_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# DeepSeek-V2: llama.cpp multiplies the MLA projections without their adapters, so of attention only
# attn_output takes LoRA (ArchSpec.no_lora); the routed experts do. The shared experts do not, on
# either side: PEFT 0.21 maps every `*.gate_proj` / `up_proj` / `down_proj` target of a DeepseekV2 onto
# the routed experts' fused stacks (its transformers v4 -> v5 conversion), so it cannot name them.
MLA_TARGETS = ("attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
CAPS = {
    "engine:dense": 130.0, "peer:dense": 80.0, "engine:moe": 170.0, "peer:moe": 120.0,
    "engine:gptoss": 120.0, "peer:gptoss": 90.0, "engine:deepseek2": 120.0, "peer:deepseek2": 90.0,
}  # fmt: skip
WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had "
    "by word but not what all were we when your can said there use an each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two more "
    "quick brown fox jumps over lazy dog answer question yes"
).split()


@dataclass(frozen=True)
class E2EOptions:
    """What `run_end_to_end` runs."""

    shapes: tuple[str, ...] = ("dense", "moe")  # keys of SHAPES, in the order they run
    moe_layers: int = 12  # layers of the MoE model (the real one has 48)
    batch: int = 4  # windows per step (B)
    ctx: int = 1024  # tokens per window (T)
    warmup: int = 2  # steps before the measured ones (compilation, first dequantization, allocations)
    measure: int = 5  # measured steps (fewer when a run's time is up)
    budgets: tuple[str, ...] = ("off", "auto")  # the engine's weight-cache budgets, one run each
    # the engine's training steps (TrainConfig.gpu_step), one run each per budget: "graph" (the fused
    # step captured as a CUDA graph where the model takes it), "eager", "generic" (op by op)
    gpu_steps: tuple[str, ...] = ("graph",)
    peer: bool = True  # run transformers + PEFT too
    emulate: bool = False  # the engine on the g++ emulator at tiny shapes, no peer
    workdir: str | None = None  # where the model files go (default: a temporary folder, removed)
    deadline: float = math.inf  # time.monotonic() by which everything must be done
    # seconds each child may take at most ("who:shape"); its measured steps stop early to stay inside
    caps: dict[str, float] = field(default_factory=lambda: dict(CAPS))


# --- shapes and FLOPs --------------------------------------------------------------------------------


def spec_for(shape: str, opts: E2EOptions) -> SynthSpec:
    """The model of `shape` as this run builds it (tiny under --emulate; the MoE cut to moe_layers)."""
    if opts.emulate:
        return TINY[shape]
    spec = SHAPES[shape]
    if spec.E and opts.moe_layers:
        spec = replace(spec, L=min(spec.L, opts.moe_layers))
    return spec


def engine_targets(spec: SynthSpec) -> tuple[str, ...]:
    """The tensor kinds the engine adapts on this shape (the module docstring says why)."""
    if not spec.E:
        return DENSE_TARGETS
    return MLA_TARGETS if spec.kv_lora_rank else MOE_TARGETS


def active_matmul_params(spec: SynthSpec) -> int:
    """N: the matmul weights one token meets (attention, the FFN or K experts + router + shared experts,
    the head); multi-head latent attention counted in the expanded form the engine computes (the
    queries, the compressed KV, its per-head decompression, the output)."""
    from engine.model.archs import ARCHS

    C, HS, NH = spec.C, spec.HS, spec.NH
    if spec.kv_lora_rank:
        R, HSV = spec.kv_lora_rank, spec.HS_v
        q = C * spec.q_lora_rank + spec.q_lora_rank * NH * HS if spec.q_lora_rank else C * NH * HS
        attn = q + C * (R + spec.n_rot) + NH * (HS - spec.n_rot) * R + NH * HSV * R + NH * HSV * C
    else:
        attn = 2 * C * NH * HS + 2 * C * spec.NKV * HS
    dense = 3 * C * spec.F
    if not spec.E:
        return spec.L * (attn + dense) + spec.V * C
    shared = spec.n_shexp * spec.F_exp if ARCHS[spec.arch].shared_ungated else spec.F_shexp
    moe = spec.K * 3 * C * spec.F_exp + spec.E * C + 3 * C * shared
    n_dense = min(spec.n_dense_lead, spec.L)
    return spec.L * attn + n_dense * dense + (spec.L - n_dense) * moe + spec.V * C


def attention_pairs(spec: SynthSpec, B: int, T: int) -> float:
    """Visible (query, key) pairs of one window summed over the layers: T(T+1)/2 a layer, and on
    sliding-window layers (llama.cpp's pattern: layer i of period p when i % p < p - 1) at most the
    window per query."""
    from engine.model.archs import ARCHS

    full = T * (T + 1) / 2
    period = spec.swa_pattern or ARCHS[spec.arch].swa_period
    W = spec.swa_window
    windowed = float(sum(min(t + 1, W) for t in range(T))) if W else full
    swa = sum(1 for i in range(spec.L) if W and period and i % period < period - 1)
    return B * ((spec.L - swa) * full + swa * windowed)


def step_flops(spec: SynthSpec, B: int, T: int) -> float:
    """FLOPs of one LoRA training step over B windows of T tokens with frozen base weights:
    4·N per token (forward 2·N, input-gradient backward 2·N) + attention 6·NH·(HS + HS_v) per visible
    pair and layer (12·NH·HS when the value head size is the key's)."""
    HSV = spec.HS_v or spec.HS
    return 4.0 * active_matmul_params(spec) * B * T + 6.0 * spec.NH * (spec.HS + HSV) * attention_pairs(
        spec, B, T
    )


# --- a shaped GGUF file, fast ------------------------------------------------------------------------


def _block_pool(qtype: str, rng: np.random.Generator, n_rows: int = 512) -> np.ndarray:
    """(blocks, block bytes): valid `qtype` blocks quantized once from N(0, 0.02) values (MXFP4 by
    gguf-py, which engine.io.quantize does not write)."""
    from engine.io.quantize import quantizable_types, quantize

    values = (rng.standard_normal((n_rows, 2048)) * 0.02).astype(np.float32)
    if qtype in quantizable_types():
        raw = quantize(values, qtype)  # (n_rows, bytes per row)
    else:
        from gguf import GGMLQuantizationType
        from gguf import quants as gguf_quants

        raw = gguf_quants.quantize(values, GGMLQuantizationType[qtype])
    per_row = 2048 // _block_size(qtype)
    return raw.reshape(n_rows * per_row, raw.shape[-1] // per_row)


def _block_size(qtype: str) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]


def tensor_type(spec: SynthSpec, name: str, shape: tuple[int, ...]) -> str:
    """The type a tensor of the shaped file is stored in: F32 for vectors, biases and the router (as
    llama-quantize leaves them), `expert_qtype` for expert stacks when set, else `qtype`; Q8_0 where the
    rows are not whole blocks of it (llama-quantize's fallback for K-quants)."""
    kind = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if len(shape) == 1 or kind.endswith(".bias") or kind == "ffn_gate_inp.weight":
        return "F32"
    qtype = spec.expert_qtype if spec.expert_qtype and kind.endswith("_exps.weight") else spec.qtype
    return qtype if shape[-1] % _block_size(qtype) == 0 else "Q8_0"


def write_shaped(spec: SynthSpec, path: str, seed: int = 0) -> str:
    """Write `spec` as a GGUF file of random quantized matrices, fast (see the module docstring).

    Every tensor of one shape and type gets the same bytes (layer 0's), drawn at random from a pool of
    quantized blocks; types as `tensor_type` says."""
    from engine.io.gguf_write import LazyTensor, write_gguf
    from engine.testing import model_metadata, tensor_shapes

    rng = np.random.default_rng(seed)
    pools: dict[str, np.ndarray] = {}
    made: dict[tuple, np.ndarray] = {}

    def blocks(shape: tuple[int, ...], qtype: str) -> np.ndarray:
        if (shape, qtype) not in made:
            if qtype not in pools:
                pools[qtype] = _block_pool(qtype, rng)
            pool = pools[qtype]
            per_row = shape[-1] // _block_size(qtype)
            idx = rng.integers(0, pool.shape[0], math.prod(shape[:-1]) * per_row)
            made[shape, qtype] = pool[idx].reshape(*shape[:-1], per_row * pool.shape[1])
        return made[shape, qtype]

    tensors: dict[str, tuple[object, str]] = {}
    for name, shape in tensor_shapes(spec).items():
        kind = name.split(".", 2)[-1] if name.startswith("blk.") else name
        qtype = tensor_type(spec, name, shape)
        if qtype != "F32":
            tensors[name] = (LazyTensor(shape, lambda s=shape, q=qtype: blocks(s, q)), qtype)
        elif kind.endswith("norm.weight"):
            tensors[name] = ((1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32), "F32")
        elif kind == "ffn_gate_inp.weight":  # the router
            tensors[name] = ((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32), "F32")
        else:  # biases, sinks, the shared expert's gate
            tensors[name] = ((0.02 * rng.standard_normal(shape)).astype(np.float32), "F32")
    return write_gguf(path, spec.arch, model_metadata(spec), tensors)


def text_samples(n: int, words_per_sample: int, seed: int = 0) -> list:
    """`n` text samples of random common words, each longer than a window once tokenized."""
    from engine.train.data import Sample

    rng = np.random.default_rng(seed)
    return [
        Sample(0, "text", (), None, None, " ".join(rng.choice(WORDS, words_per_sample)), None, "")
        for _ in range(n)
    ]


# --- device memory -----------------------------------------------------------------------------------


def _pool_tracker(cp):
    """A CuPy memory hook that follows the pool's bytes in use and their peak (O(1) per call)."""
    from cupy.cuda import memory_hook

    class PoolPeak(memory_hook.MemoryHook):
        name = "PoolPeak"

        def __init__(self) -> None:
            self.used = self.peak = 0

        def reset(self) -> None:
            self.used = self.peak = int(cp.get_default_memory_pool().used_bytes())

        def malloc_postprocess(self, **kw) -> None:
            self.used += int(kw["mem_size"])
            self.peak = max(self.peak, self.used)

        def free_postprocess(self, **kw) -> None:
            self.used -= int(kw["mem_size"])

    return PoolPeak()


# --- the engine's run (a child process) ----------------------------------------------------------------


def _save(path: str, res: dict) -> None:
    """Write a child's result whole or not at all (the parent may kill the child at any moment)."""
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(res, f)
    os.replace(path + ".part", path)


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1500:]


def _record_failure(res: dict, where: dict, exc: BaseException) -> None:
    """Record a failure being handled: its message as where["error"] (the run's or a phase's), its
    traceback's end among the run's notes."""
    where["error"] = _error(exc)
    res["notes"].append(traceback.format_exc()[-3000:])


# --- one step under the profiler ----------------------------------------------------------------------

PROFILE_TOP = 18  # kernels listed per profiled step
_PEER_KINDS = (  # (category, name fragments) for kernels that are not the engine's own
    ("GEMM (cuBLAS / CUTLASS)", ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "cublas", "gemv")),
    ("attention (torch SDPA)", ("flash", "fmha", "attention", "efficient")),
    ("memcpy / memset", ("memcpy", "memset")),
    ("CuPy elementwise / reductions (cupy_, cub::)", ("cupy_", "cub::")),
    ("torch optimizer", ("multi_tensor", "adam")),
    ("torch elementwise / reductions", ("at::native", "elementwise", "vectorized")),
)


def _kernel_categories() -> dict[str, str]:
    """Kernel name -> "ours: <KernelSource name>" for every engine kernel (empty when the engine is
    not importable, as in a peer without it)."""
    try:
        from engine.kernels.nvrtc import all_sources

        return {k: f"ours: {src.name}" for src in all_sources() for k in src.kernels}
    except Exception:  # noqa: BLE001
        return {}


def _category(name: str, ours: dict[str, str]) -> str:
    if name in ours:
        return ours[name]
    low = name.lower()
    for cat, keys in _PEER_KINDS:
        if any(k in low for k in keys):
            return cat
    return "other"


def profile_step(step, sync, device: str = "cuda") -> dict:
    """Run `step()` once under torch's profiler (CUPTI: every kernel on the device, whoever launched
    it, CuPy's and cuBLAS's too): wall time of the step, the device time of its kernels (summed),
    launches, per category and the PROFILE_TOP kernels by time. {"error": ...} when torch's profiler
    is not there."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except Exception as exc:  # noqa: BLE001
        return {"error": f"no torch profiler: {exc}"}
    ours = _kernel_categories()
    sync()
    try:
        with profile(activities=[getattr(ProfilerActivity, device.upper())]) as prof:
            t = time.perf_counter()
            step()
            sync()
            wall = time.perf_counter() - t
    except Exception as exc:  # noqa: BLE001 - a profile that fails is a note, not a failed run
        return {"error": _error(exc)}
    per: dict[str, list] = {}
    for e in prof.events():
        if device not in str(e.device_type).lower():
            continue
        row = per.setdefault(e.name, [0, 0.0])
        row[0] += 1
        row[1] += e.time_range.elapsed_us() / 1e3
    cats: dict[str, list] = {}
    for name, (n, ms) in per.items():
        row = cats.setdefault(_category(name, ours), [0, 0.0])
        row[0] += n
        row[1] += ms
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:PROFILE_TOP]
    return {
        "wall_ms": wall * 1e3,
        "kernel_ms": sum(ms for _, ms in per.values()),
        "launches": sum(n for n, _ in per.values()),
        "categories": sorted(([c, n, ms] for c, (n, ms) in cats.items()), key=lambda r: -r[2]),
        "top": [[name[:90], n, ms] for name, (n, ms) in top],
    }


def profile_text(records: list[dict]) -> str:
    """Each profiled run's step: wall time against the device's kernel time, then where that went."""
    out = []
    for r in records:
        prof = r.get("profile")
        if not prof:
            continue
        head = f"profile: {r['model']} {r['who']} {r['setting']}"
        if "error" in prof:
            out.append(f"{head}: {prof['error']}")
            continue
        busy = prof["kernel_ms"] / prof["wall_ms"] if prof["wall_ms"] else float("nan")
        out.append(
            f"{head}: step {prof['wall_ms']:.1f} ms wall, kernels {prof['kernel_ms']:.1f} ms "
            f"({busy:.0%} busy), {prof['launches']} launches"
        )
        out += [f"    {c:<40} {n:>7} {ms:9.2f} ms" for c, n, ms in prof["categories"]]
        out.append("    top kernels:")
        out += [f"      {ms:9.2f} ms {n:>6}x  {name}" for name, n, ms in prof["top"]]
    return "\n".join(out)


def engine_child(a: argparse.Namespace) -> None:
    """Load the model on the device once; per cache budget, train warmup + measure steps. Writes JSON
    to `a.result` after every step, so a run killed at its time limit still reports what it did."""
    t_start = time.perf_counter()
    stop_at = t_start + a.time_limit
    spec = SynthSpec(**json.loads(a.spec))
    res: dict = {"who": "engine", "phases": [], "error": "", "notes": []}

    def save() -> None:
        _save(a.result, res)

    try:
        from engine.backend import Backend, select_backend
        from engine.model.model import Model

        cp = None
        if a.emulate:
            from tests.kernels.emu_runtime import EmuRuntime

            rt = EmuRuntime()
            backend = Backend("emulated", rt.xp, "", rt)
        else:
            backend = select_backend("cuda:0")
            import cupy as cp

            cp.cuda.runtime.memGetInfo()  # the context first: it is not the run's memory
            res["cupy"] = cp.__version__
        free0 = cp.cuda.runtime.memGetInfo()[0] if cp is not None else 0
        t = time.perf_counter()
        model = Model.load(a.model, backend=backend, cache_budget="off")
        res["load_s"] = time.perf_counter() - t
        res["stored_bytes"] = int(getattr(model.weights, "stored_bytes", 0))
        samples = text_samples(a.batch * (a.warmup + a.measure), int(1.3 * a.ctx) + 16)
        save()
        for budget, gpu_step in [(b, g) for b in a.budgets.split(",") for g in a.gpu_steps.split(",")]:
            phase: dict = {"budget": budget, "gpu_step": gpu_step, "steps_s": [], "loss": [], "grad_norm": [],
                           "tokens": []}  # fmt: skip
            res["phases"].append(phase)
            try:
                _engine_phase(a, spec, model, backend, cp, samples, budget, phase, free0, stop_at, save)
            except Exception as exc:  # noqa: BLE001 - a failed phase is reported, the next one runs
                _record_failure(res, phase, exc)
            gc.collect()
            save()
    except Exception as exc:  # noqa: BLE001
        _record_failure(res, res, exc)
    res["wall_s"] = time.perf_counter() - t_start
    save()


def _engine_phase(a, spec, model, backend, cp, samples, budget, phase, free0, stop_at, save) -> None:
    from engine.model.targets import TargetSpec
    from engine.train import events as ev
    from engine.train.trainer import TrainConfig, Trainer

    model.weights.clear()  # the last phase's dequantized copies go
    gc.collect()
    if cp is not None:  # the pool gives back what the last phase held: each phase's reserve is its own
        cp.get_default_memory_pool().free_all_blocks()
    tracker = _pool_tracker(cp) if cp is not None else None
    targets = engine_targets(spec)
    config = TrainConfig(
        targets=TargetSpec(preset="none", patterns=targets), rank=RANK, alpha=ALPHA, n_ctx=a.ctx,
        batch_size=a.batch, steps=a.warmup + a.measure + 1, lr=LR, schedule="constant", max_grad_norm=CLIP,
        cache_budget=budget, checkpoint_layers="off", norms_every=0, seed=0, gpu_step=phase["gpu_step"],
    )  # fmt: skip
    trainer = Trainer(model, samples, config)
    if tracker is not None:
        tracker.reset()
        tracker.__enter__()
    try:
        t = time.perf_counter()
        started = trainer.start()
        phase["start_s"] = time.perf_counter() - t
        if isinstance(started, ev.Failed):
            raise RuntimeError(f"Trainer.start failed: {started.message}")
        plan = started.plan
        phase["trainable"] = int(plan.trainable_params)
        phase["estimate_total"] = int(plan.memory_bytes.get("total", 0))
        phase["checkpoint_layers"] = bool(getattr(trainer.memory, "checkpoint", False))
        phase["cache_budget_bytes"] = int(getattr(model.weights, "budget", 0))
        for i in range(a.warmup + a.measure):
            if i > a.warmup and time.perf_counter() > stop_at:  # at least one measured step
                phase["note"] = f"time limit: {i - a.warmup} measured steps"
                break
            t = time.perf_counter()
            step = trainer.train_step()
            backend.synchronize()
            dt = time.perf_counter() - t
            if isinstance(step, ev.Failed):
                raise RuntimeError(f"step {i + 1} failed: {step.message}")
            phase["steps_s"].append(dt)
            phase["loss"].append(step.mean_ce)
            phase["grad_norm"].append(step.grad_norm)
            phase["tokens"].append(step.tokens)
            if tracker is not None and i == a.warmup - 1:
                tracker.__exit__(None, None, None)
                phase["peak_alloc"] = tracker.peak
                tracker = None
            save()
        # which step ran: the captured fused step, the fused step launched eagerly, or the generic path
        if trainer._graph is not None:
            phase["step_path"] = "step: fused, captured graph"
        elif trainer._fused is not None:
            phase["step_path"] = "step: fused, eager"
        else:
            phase["step_path"] = f"step: generic ({trainer._fused_why})"
        if cp is not None:  # one more step, under the profiler (not among the measured ones)
            phase["profile"] = profile_step(trainer.train_step, backend.synchronize)
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
            phase["peak_alloc"] = tracker.peak
    if cp is not None:
        phase["reserved"] = int(cp.get_default_memory_pool().total_bytes())
        phase["device"] = int(free0 - cp.cuda.runtime.memGetInfo()[0])
    phase["cache_peak"] = int(getattr(model.weights, "peak_cache_bytes", 0))
    trainer.release_step()  # as a run's end does: the step's buffers and its graph's pool go back
    del trainer
    if cp is not None:  # what the next phase finds: the device's free memory once this run is gone
        gc.collect()
        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        phase["device_free_after"] = int(cp.cuda.runtime.memGetInfo()[0])
        phase["held_after"] = _held_arrays(cp, model)


def _held_arrays(cp, model, top: int = 8) -> dict:
    """What still holds device memory once a run is gone: the default pool's bytes in use and in
    total, and the largest live CuPy allocations besides the model's stored weights, each with its
    shape, dtype and the types of what refers to it (a memory that outlives its run shows here)."""
    pool = cp.get_default_memory_pool()
    out: dict = {"pool_used": int(pool.used_bytes()), "pool_total": int(pool.total_bytes())}
    try:
        stored = {id(a.data.mem) for a in getattr(model.weights, "_raw", {}).values()}
        by_mem: dict = {}
        for obj in gc.get_objects():
            if isinstance(obj, cp.ndarray) and obj.data.mem is not None and id(obj.data.mem) not in stored:
                key = id(obj.data.mem)
                if key not in by_mem or obj.nbytes > by_mem[key].nbytes:
                    by_mem[key] = obj
        arrays = sorted(by_mem.values(), key=lambda x: -x.data.mem.size)
        out["live_besides_weights"] = int(sum(x.data.mem.size for x in arrays))
        del by_mem
        rows = []
        largest = arrays[:top]
        for arr in largest:
            refs = [r for r in gc.get_referrers(arr) if r is not arrays and r is not largest]
            owners = ", ".join(type(r).__name__ for r in refs[:4])
            rows.append(f"{arr.data.mem.size / GIB:.2f} GiB {tuple(arr.shape)} {arr.dtype} <- {owners}")
        out["largest"] = rows
    except Exception as exc:  # noqa: BLE001 - a diagnostic that fails says why
        out["error"] = _error(exc)
    return out


# --- the peer's run (a child process) ------------------------------------------------------------------


def _experts_implementation(transformers) -> tuple[str, str]:
    """("grouped_mm", "") when this transformers has it, else ("eager", why)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        if "grouped_mm" in ALL_EXPERTS_FUNCTIONS:
            return "grouped_mm", ""
        return "eager", f"transformers {transformers.__version__} has no grouped_mm experts: eager loop"
    except ImportError as exc:
        return "eager", f"transformers {transformers.__version__}: no experts interface ({exc}); eager loop"


# transformers' GptOss takes no SDPA (its sinks): eager attention, the one left without the hub's kernels
PEER_ATTENTION = {"GptOssForCausalLM": "eager"}


def peer_targets(spec: SynthSpec) -> tuple[list[str], list[str]]:
    """PEFT's (target_modules, target_parameters) for the tensors the engine adapts (`engine_targets`):
    the linear layers by module name, the fused expert stacks (transformers' `experts.gate_up_proj` /
    `experts.down_proj` parameters, one A per expert for gate and up together) by parameter name."""
    if not spec.E:
        return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], []
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    if spec.kv_lora_rank:  # DeepseekV2: of attention the output projection (see MLA_TARGETS)
        return ["o_proj"], experts
    return ["q_proj", "k_proj", "v_proj", "o_proj"], experts


def peer_child(a: argparse.Namespace) -> None:
    """transformers + PEFT on the same shape, bf16, random init; JSON to `a.result` after every step."""
    t_start = time.perf_counter()
    stop_at = t_start + a.time_limit
    spec = SynthSpec(**json.loads(a.spec))
    res: dict = {"who": "peft", "phases": [], "error": "", "notes": []}
    phase: dict = {"budget": "bf16", "steps_s": [], "loss": [], "grad_norm": [], "tokens": []}
    res["phases"].append(phase)

    def save() -> None:
        _save(a.result, res)

    try:
        import torch
        import transformers

        from bench.hf_peer import HF_CLASS, hf_config

        res["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
        try:
            import peft

            res["versions"]["peft"] = peft.__version__
        except ImportError as exc:
            raise RuntimeError(f"PEFT is not importable: {exc}") from exc
        dev = torch.device(a.device)
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.init()
            free0 = torch.cuda.mem_get_info()[0]
            res["bf16_matmul_tflops"] = _torch_matmul_rate(torch)
        hf_class = HF_CLASS[(spec.arch, bool(spec.E))]
        cfg = hf_config(hf_class, spec)
        cfg._attn_implementation = PEER_ATTENTION.get(hf_class, "sdpa")
        experts = "none"
        if spec.E:
            experts, why = _experts_implementation(transformers)
            cfg._experts_implementation = experts
            if why:
                res["notes"].append(why)
            if experts == "grouped_mm":
                has = [n for n in ("_grouped_mm",) if hasattr(torch, n)]
                has += ["nn.functional.grouped_mm"] if hasattr(torch.nn.functional, "grouped_mm") else []
                res["notes"].append(f"torch grouped mm: {', '.join(has) or 'none (transformers fallback)'}")
        phase["budget"] = f"bf16 {cfg._attn_implementation}{' ' + experts if spec.E else ''}"
        torch.manual_seed(0)
        t = time.perf_counter()
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # parameters are born bf16: no fp32 copy of 15 GB
        try:
            with dev:
                model = getattr(transformers, hf_class)(cfg)
        finally:
            torch.set_default_dtype(previous)
        model.config.use_cache = False
        res["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
        got = [getattr(model.config, k, "?") for k in ("_attn_implementation", "_experts_implementation")]
        res["notes"].append(f"attention {got[0]}" + (f", experts {got[1]}" if spec.E else ""))
        modules, parameters = peer_targets(spec)
        res["notes"].append(f"PEFT targets {', '.join(modules + parameters)}")
        from peft import LoraConfig, get_peft_model

        kw: dict = dict(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=modules)
        if parameters:
            kw["target_parameters"] = parameters
        try:
            lcfg = LoraConfig(**kw)
        except TypeError as exc:
            kw.pop("target_parameters", None)
            res["notes"].append(f"PEFT {peft.__version__} has no target_parameters ({exc}): no expert LoRA")
            lcfg = LoraConfig(**kw)
        model = get_peft_model(model, lcfg)
        model.train()
        res["build_s"] = time.perf_counter() - t
        params = [p for p in model.parameters() if p.requires_grad]
        phase["trainable"] = int(sum(p.numel() for p in params))
        res["lora_dtypes"] = sorted({str(p.dtype) for p in params})
        try:
            opt = torch.optim.AdamW(params, lr=LR, fused=cuda)
        except (TypeError, RuntimeError) as exc:
            res["notes"].append(f"fused AdamW unavailable ({exc}); default AdamW")
            opt = torch.optim.AdamW(params, lr=LR)
        gen = torch.Generator(device="cpu").manual_seed(0)
        n_steps = a.warmup + a.measure
        batches = [torch.randint(3, spec.V, (a.batch, a.ctx), generator=gen).to(dev) for _ in range(n_steps)]
        save()

        def train_step(ids):
            out = model(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(out.loss.detach()), norm  # a host read: the step is done

        for i in range(n_steps):
            if i > a.warmup and time.perf_counter() > stop_at:
                phase["note"] = f"time limit: {i - a.warmup} measured steps"
                break
            ids = batches[i]
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            loss, norm = train_step(ids)
            if cuda:
                torch.cuda.synchronize()
            phase["steps_s"].append(time.perf_counter() - t)
            phase["loss"].append(loss)
            phase["grad_norm"].append(float(norm))
            phase["tokens"].append(int(ids.numel()))
            if cuda:
                phase["peak_alloc"] = int(torch.cuda.max_memory_allocated())
                phase["reserved"] = int(torch.cuda.max_memory_reserved())
                phase["device"] = int(free0 - torch.cuda.mem_get_info()[0])
            save()
        if cuda:  # one more step, under the profiler (not among the measured ones)
            phase["profile"] = profile_step(lambda: train_step(batches[-1]), torch.cuda.synchronize)
            save()
    except Exception as exc:  # noqa: BLE001
        _record_failure(res, res, exc)
    res["wall_s"] = time.perf_counter() - t_start
    save()


def _torch_matmul_rate(torch) -> float:
    """TFLOP/s of an 8192^3 bf16 torch.matmul on random data (median of 10, after 3 warm-ups): a
    cross-check of the ceiling bench/gpu.py measures through the engine's cuBLAS call."""
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(x, y)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(x, y)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del x, y
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()  # the run's peak is the model's, not this test's
    return 2 * n**3 / float(np.median(times)) / 1e12


# --- the parent: files, children, records ------------------------------------------------------------


def _run_child(who: str, spec: SynthSpec, path: str, opts: E2EOptions, budget_s: float, log) -> dict:
    """One child process; its result file (possibly partial), with an error when it failed."""
    fd, result = tempfile.mkstemp(prefix=f"e2e-{who}-", suffix=".json")
    os.close(fd)
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", who, "--model", path,
        "--spec", json.dumps(asdict(spec)), "--result", result, "--batch", str(opts.batch),
        "--ctx", str(opts.ctx), "--warmup", str(opts.warmup), "--measure", str(opts.measure),
        "--budgets", ",".join(opts.budgets), "--time-limit", str(max(5.0, budget_s - 25.0)),
    ] + (["--emulate"] if opts.emulate else [])  # fmt: skip
    if who == "engine":
        cmd += ["--gpu-steps", ",".join(opts.gpu_steps)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    t = time.perf_counter()
    error = ""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=budget_s)
        text = out.stdout + out.stderr
        if out.returncode != 0:
            error = f"exit {out.returncode}: " + (text.strip().splitlines() or [""])[-1][-300:]
    except subprocess.TimeoutExpired as exc:
        text = "".join(
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (exc.stdout, exc.stderr)
        )
        error = f"killed after {budget_s:.0f} s (time limit)"
    log(f"--- {who} {spec.name}: {time.perf_counter() - t:.0f} s{'; ' + error if error else ''}")
    if text.strip():
        log(text.strip()[-4000:])
    try:
        with open(result, encoding="utf-8") as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"who": "peft" if who == "peer" else who, "phases": [], "error": "", "notes": []}
    finally:
        for leftover in (result, result + ".part"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    if error and not res.get("error"):
        res["error"] = error
    for note in res.get("notes", []):
        log(note)
    return res


def _records(
    shape: str, spec: SynthSpec, res: dict, flops: float, bf16_tflops: float, warmup: int
) -> list[dict]:
    """One record per phase (cache budget) of a child's result; the first `warmup` steps are not measured."""
    out = []
    who = res.get("who", "?")
    for ph in res.get("phases") or [{"budget": "-"}]:
        steps = ph.get("steps_s", [])
        measured = steps[warmup:]
        ok = bool(measured) and not ph.get("error")
        err = ph.get("error") or res.get("error", "") or ("" if measured else "no measured step")
        if steps and not measured:
            err += f"; the {len(steps)} steps done took {', '.join(f'{x:.1f}' for x in steps)} s"
        rec = {
            "model": shape, "layers": spec.L, "who": who,
            "setting": _setting(who, spec, ph.get("budget", "-"), ph.get("gpu_step", "graph")),
            "ok": ok, "error": err, "steps_s": steps, "loss": ph.get("loss", []),
            "grad_norm": ph.get("grad_norm", []),
            "trainable": ph.get("trainable"), "peak_alloc": ph.get("peak_alloc"),
            "reserved": ph.get("reserved"), "device": ph.get("device"), "flops_per_step": flops,
            "note": "; ".join(
                x for x in (ph.get("step_path", ""), ph.get("note", ""), err if ok else "") if x
            ),
        }  # fmt: skip
        if measured:
            s = float(np.median(measured))
            tokens = float(np.median(ph["tokens"][warmup:]))
            rec.update(step_s=s, tokens_per_step=tokens, tokens_per_s=tokens / s, tflops=flops / s / 1e12)
            rec["mfu"] = rec["tflops"] / bf16_tflops if bf16_tflops and math.isfinite(bf16_tflops) else None
            rec["measured_steps"] = len(measured)
            rec["first_step_s"] = steps[0]
        for key in ("load_s", "build_s", "stored_bytes", "versions", "bf16_matmul_tflops", "cupy"):
            if key in res:
                rec[key] = res[key]
        for key in (
            "start_s",
            "estimate_total",
            "checkpoint_layers",
            "cache_budget_bytes",
            "cache_peak",
            "device_free_after",
            "held_after",
            "profile",
        ):
            if key in ph:
                rec[key] = ph[key]
        out.append(rec)
    return out


def _setting(who: str, spec: SynthSpec, budget: str, gpu_step: str = "graph") -> str:
    """The engine's weight types and cache budget (and its training step where not the default graph)."""
    types = f"{spec.expert_qtype}+{spec.qtype}" if spec.expert_qtype else spec.qtype
    step = "" if gpu_step == "graph" else f", {gpu_step}"
    return f"{types}, cache {budget}{step}" if who == "engine" else budget


def run_end_to_end(opts: E2EOptions, bf16_tflops: float, log=print) -> list[dict]:
    """Generate each model, run the engine (and the peer), return one record per run (see `e2e_table`).

    Never raises for a failed run: its record carries the error."""
    records: list[dict] = []
    folder = opts.workdir or tempfile.mkdtemp(prefix="gpu-e2e-")
    os.makedirs(folder, exist_ok=True)
    try:
        for shape in opts.shapes:
            spec = spec_for(shape, opts)
            flops = step_flops(spec, opts.batch, opts.ctx)
            path = os.path.join(folder, f"{spec.name}-L{spec.L}.gguf")
            try:
                if not os.path.exists(path):
                    need = _file_bytes(spec)
                    free = shutil.disk_usage(folder).free
                    if free < 1.1 * need:
                        raise OSError(
                            f"{folder}: {free / GIB:.1f} GiB free, the file needs {need / GIB:.1f} GiB"
                        )
                    t = time.perf_counter()
                    write_shaped(spec, path)
                    size, dt = os.path.getsize(path) / GIB, time.perf_counter() - t
                    log(f"wrote {path}: {size:.2f} GiB in {dt:.1f} s")
            except Exception as exc:  # noqa: BLE001
                records.append(
                    _failed(shape, spec, "engine", f"model file not written: {_error(exc)}", flops)
                )
                continue
            whos = ["engine"] + (["peer"] if opts.peer and not opts.emulate else [])
            for who in whos:
                left = opts.deadline - time.monotonic() - 10.0
                # the caps are for the default 12 MoE layers: a deeper cut gets proportionally longer
                scale = max(1.0, spec.L / 12) if spec.E else 1.0
                cap = min(scale * opts.caps.get(f"{who}:{shape}", 150.0), left)
                if cap < 30.0:
                    records.append(_failed(shape, spec, who, f"skipped: {max(left, 0):.0f} s left", flops))
                    continue
                res = _run_child(who, spec, path, opts, cap, log)
                records += _records(shape, spec, res, flops, bf16_tflops, opts.warmup)
            if not opts.workdir:
                os.unlink(path)
    finally:
        if not opts.workdir:
            shutil.rmtree(folder, ignore_errors=True)
    _ratios(records)
    return records


def _file_bytes(spec: SynthSpec) -> int:
    from engine.io.gguf_write import tensor_bytes
    from engine.testing import tensor_shapes

    return sum(tensor_bytes(s, tensor_type(spec, n, s)) for n, s in tensor_shapes(spec).items())


def _failed(shape: str, spec: SynthSpec, who: str, error: str, flops: float) -> dict:
    return {"model": shape, "layers": spec.L, "who": "peft" if who == "peer" else who, "setting": "-",
            "ok": False, "error": error, "flops_per_step": flops}  # fmt: skip


def _ratios(records: list[dict]) -> None:
    """engine / peer tokens/s and peak memory, on each engine record of a model the peer ran."""
    for rec in records:
        if rec["who"] != "engine" or not rec.get("ok"):
            continue
        peer = next(
            (p for p in records if p["model"] == rec["model"] and p["who"] == "peft" and p.get("ok")), None
        )
        if peer is None:
            continue
        rec["vs_peer_tokens"] = rec["tokens_per_s"] / peer["tokens_per_s"]
        for key in ("peak_alloc", "reserved", "device"):
            if rec.get(key) and peer.get(key):
                rec[f"vs_peer_{key}"] = rec[key] / peer[key]


def _gib(x) -> str:
    return f"{x / GIB:6.2f}" if isinstance(x, (int, float)) and x else f"{'-':>6}"


def e2e_table(records: list[dict], bf16_tflops: float, opts: E2EOptions) -> str:
    """The end-to-end table: one line per run, the engine/peer ratios on the engine's lines, errors in
    full below. Memory in GiB: peak allocated, reserved, taken from the device (module docstring)."""
    head = (
        f"{'model':<12} {'who':<6} {'setting':<24} {'tok/s':>8} {'step ms':>8} {'TFLOP/s':>7} {'MFU':>6} "
        f"{'peak':>6} {'rsv':>6} {'dev':>6} {'x tok/s':>7} {'x peak':>6} {'x dev':>6}  note"
    )
    lines = [
        f"end to end: B={opts.batch} windows x T={opts.ctx} tokens a step, rank-{RANK} LoRA, {opts.warmup} "
        f"warm-up + up to {opts.measure} measured steps (median); MFU against the bf16 ceiling "
        f"{bf16_tflops:.0f} TFLOP/s; FLOPs/step = 4*N_active*B*T + 6*NH*(HS+HS_v)*visible pairs; "
        "memory in GiB; "
        "x: engine / peer",
        head,
        "-" * len(head),
    ]
    errors = []
    for r in records:
        model = f"{r['model']} {r['layers']}L"
        if not r.get("ok"):
            lines.append(f"{model:<12} {r['who']:<6} {r['setting'][:24]:<24} {'FAILED':>8}  (below)")
            errors.append(f"{model} {r['who']} {r['setting']}: {r.get('error') or 'no measured step'}")
            continue
        mfu = f"{100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else f"{'-':>6}"
        ratios = [
            f"{r[k]:{w}.2f}" if k in r else f"{'-':>{w}}"
            for k, w in (("vs_peer_tokens", 7), ("vs_peer_peak_alloc", 6), ("vs_peer_device", 6))
        ]
        notes = []
        if r.get("trainable"):
            notes.append(f"{r['trainable'] / 1e6:.1f}M trainable")
        if r.get("estimate_total"):
            notes.append(f"plan {r['estimate_total'] / GIB:.1f} GiB")
        if r.get("loss"):
            notes.append(f"loss {r['loss'][0]:.3f}->{r['loss'][-1]:.3f}")
        if r.get("checkpoint_layers"):
            notes.append("layer checkpointing on")
        if r.get("note"):
            notes.append(r["note"])
        lines.append(
            f"{model:<12} {r['who']:<6} {r['setting'][:24]:<24} {r['tokens_per_s']:8.0f} "
            f"{1e3 * r['step_s']:8.1f} {r['tflops']:7.1f} {mfu} {_gib(r.get('peak_alloc'))} "
            f"{_gib(r.get('reserved'))} {_gib(r.get('device'))} {' '.join(ratios)}  {'; '.join(notes)}"
        )
    if errors:
        lines.append("errors:")
        lines += [f"  {e}" for e in errors]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", choices=("engine", "peer"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--spec", required=True, help="SynthSpec as JSON")
    ap.add_argument("--result", required=True, help="JSON file the child writes")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--measure", type=int, default=5)
    ap.add_argument("--budgets", default="off,auto")
    ap.add_argument(
        "--gpu-steps", default="graph", help="the engine's TrainConfig.gpu_step values, one run each"
    )
    ap.add_argument("--time-limit", type=float, default=120.0, help="no measured step starts after this")
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--device", default="cuda", help="the peer's torch device (cpu: a code check only)")
    a = ap.parse_args()
    a.warmup = max(1, a.warmup)
    if a.child == "engine":
        engine_child(a)
    else:
        peer_child(a)


if __name__ == "__main__":
    main()
