"""How much memory a training run takes, from tensor shapes alone, before any weight is read.

`estimate_memory` counts what a run on the CPU holds at its peak:

- stored: the base tensors as the file stores them, memory-mapped; they live in the page cache,
  not in the process: `mapped` counts what stays resident (F32 tensors are used where they are
  mapped; the others are let go once dequantized), and only `mapped` is in the total;
- cache: dequantized weights kept between uses, within the cache budget;
- buffers: what dequantization needs beyond the cache (one layer's tensors, blocks of the
  output head when it is streamed);
- trainable: LoRA factors and full-weight copies with Adam's two moments (and the running sum
  of gradient accumulation); gradients: one more copy;
- activations: what the backward pass keeps (every block's, or with layer checkpointing each
  block's input plus one block's); transient: the largest temporaries of one block. Gradients
  are made as the backward pass frees the activations, so the peak holds the larger of the two;
- head: the logits blocks of the fused output projection and cross-entropy;
- runtime: the interpreter, NumPy, the tokenizer.

`plan_memory` resolves the two automatic choices against what is free: layer checkpointing
("auto": on when the activations would not fit) and the cache budget ("auto": what is left after
everything else and a headroom), and says what to change when the run cannot fit
(`MemoryEstimate.advice`). Figures are for float32 weights; the estimate knows no GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from ..io.gguf_file import TensorInfo
from ..io.weights import AUTO, ROW_CHUNK_BYTES, auto_headroom, memory_available, parse_budget
from ..kernels.cross_entropy import LOGITS_BYTES, MIN_ROWS
from ..model.archs import ModelConfig
from ..model.summary import human_bytes

RUNTIME_BASE = 64 << 20  # interpreter, NumPy, the engine's modules (measured: about 45-60 MiB)
RUNTIME_PER_TOKEN = 640  # tokenizer bytes per vocabulary entry (measured: 49k entries, 30 MiB)
TRAINABLE_COPIES = 3  # parameter and two Adam moments (the gradient is counted on its own)
ACCUMULATION_COPIES = 2  # with gradient accumulation: the running sum and its mean
_LAYER = re.compile(r"^blk\.(\d+)\.")
ROW_WISE = ("token_embd.weight", "output.weight")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of a run at its peak, by what holds them (see the module docstring)."""

    stored: int
    mapped: int
    cache: int
    buffers: int
    trainable: int
    gradients: int
    activations: int
    transient: int
    head: int
    runtime: int
    checkpoint: bool  # layer checkpointing assumed
    budget: int  # the cache budget in bytes this estimate assumes
    dequantized: int  # bytes of every weight dequantized (what a float copy of the model takes)
    available: int = 0  # free memory when planned (0: not asked)

    @property
    def total(self) -> int:
        return (
            self.mapped
            + self.cache
            + self.buffers
            + self.trainable
            + max(self.gradients, self.activations)
            + self.transient
            + self.head
            + self.runtime
        )

    @property
    def required(self) -> int:
        """What must be allocated: everything but the page cache of the file and the weight cache."""
        return (
            self.buffers
            + self.trainable
            + max(self.gradients, self.activations)
            + self.transient
            + self.head
            + self.runtime
        )

    def to_dict(self) -> dict[str, int]:
        d = {k: v for k, v in asdict(self).items() if isinstance(v, int) and not isinstance(v, bool)}
        d["weights"] = self.mapped + self.cache + self.buffers  # the figure earlier versions showed
        d["total"] = self.total
        d["checkpoint"] = int(self.checkpoint)
        return d

    def describe(self, config) -> str:
        """One line for people: the peak and what holds it."""
        h = human_bytes
        cache = f"weight cache {h(self.cache)}" if self.cache else "no weight cache"
        if self.buffers:
            cache += f" + {h(self.buffers)} of dequantization buffers"
        return (
            f"≈ {h(self.total)} at peak (the model file's {h(self.stored)} stays quantized, in the page "
            f"cache): {cache}, "
            f"trainable state {h(self.trainable + self.gradients)}, activations {h(self.activations)} at "
            f"{config.batch_size} × {config.n_ctx} tokens"
            + (" with layer checkpointing" if self.checkpoint else "")
            + f", output head {h(self.head)}, runtime {h(self.runtime)}"
        )

    def fits(self, available: int | None = None) -> bool:
        available = self.available if available is None else available
        return self.required + auto_headroom_for(available) <= available

    def advice(self, config, available: int | None = None) -> str:
        """One message: what the run needs, what is free, and what to change."""
        available = self.available if available is None else available
        gib = 2**30
        parts = []
        if self.activations + self.transient > self.required / 3:
            parts.append(f"a shorter context (now {config.n_ctx} tokens)")
            if config.batch_size > 1:
                parts.append(f"a smaller batch (now {config.batch_size}; accumulate gradients instead)")
            if not self.checkpoint:
                parts.append("layer checkpointing")
        if self.trainable > self.required / 4:
            parts.append("fewer LoRA targets or a lower rank, or no full-weight tensors")
        if self.buffers > self.required / 4:
            parts.append("a model with fewer or smaller layers")
        if not parts:
            parts.append("closing other programs")
        return (
            f"this run needs about {self.required / gib:.1f} GiB besides the model file and the weight "
            f"cache, and {available / gib:.1f} GiB is free: try " + ", ".join(parts)
        )


def auto_headroom_for(available: int) -> int:
    """Memory left free for the rest of the system (and the studio's window)."""
    return min(auto_headroom(), max(0, available // 10))


def _per_layer(tensors: Mapping[str, TensorInfo], itemsize: int):
    """(largest layer's 2-D bytes + 3 experts) and the bytes a full dequantized copy takes."""
    layers: dict[str, int] = {}
    expert = 0
    dequant = 0
    for name, info in tensors.items():
        if len(info.shape) < 2:
            continue
        if info.qtype != "F32":
            dequant += info.n_elements * itemsize
        if name in ROW_WISE:
            continue
        if len(info.shape) == 3:
            expert = max(expert, math.prod(info.shape[1:]))
            continue
        m = _LAYER.match(name)
        key = m.group(1) if m else ""
        layers[key] = layers.get(key, 0) + info.n_elements
    return (max(layers.values(), default=0) + 3 * expert) * itemsize, dequant


def _activations(cfg: ModelConfig, config, lora_targets: Iterable[str], itemsize: int, checkpoint: bool):
    """(kept for the backward pass, one block's transient peak) in bytes."""
    B, T = config.batch_size, config.n_ctx
    N = B * T
    C, HS, NH, NKV = cfg.C, cfg.HS, cfg.NH, cfg.NKV
    r = config.rank
    kinds = {_LAYER.sub("", n) for n in lora_targets}
    xa = (
        N
        * r
        * sum(cfg.K if k.endswith("_exps.weight") else 1 for k in kinds if k.startswith(("attn_", "ffn_")))
    )
    attn = 2 * N * C + (2 * NH + 2 * NKV) * HS * N + B * NH * T * T
    if cfg.qk_norm:
        attn += (NH + NKV) * HS * N
    if cfg.is_moe:
        ffn = 2 * N * C + N * cfg.E + N * cfg.K * C + 4 * N * cfg.K * cfg.F_exp
        if cfg.F_shexp:
            ffn += 4 * N * cfg.F_shexp + N * C
    else:
        ffn = 2 * N * C + 4 * N * cfg.F
    block = (attn + ffn + xa) * itemsize
    kept = (cfg.L * N * C * itemsize + block) if checkpoint else cfg.L * block
    width = max(cfg.F, cfg.K * cfg.F_exp + cfg.F_shexp, C)
    transient = (3 * B * NH * T * T + 4 * N * width + 4 * N * C) * itemsize
    return kept, transient


def estimate_memory(
    cfg: ModelConfig,
    tensors: Mapping[str, TensorInfo],
    n_trainable: int,
    config,
    *,
    lora_targets: Iterable[str] = (),
    checkpoint: bool | None = None,
    budget: int | str | None = None,
    available: int | None = None,
    itemsize: int = 4,
) -> MemoryEstimate:
    """Bytes of a training run at its peak, from the tensor directory and the run's settings.

    checkpoint: layer checkpointing (None: config.checkpoint_layers, "auto" when that is None).
    budget: the weight cache in bytes or "auto" (None: config.cache_budget). Automatic choices
    are resolved against `available` bytes (None: what is free now).
    """
    if available is None:
        available = memory_available()
    working, dequant = _per_layer(tensors, itemsize)
    stored = sum(i.n_bytes for i in tensors.values())
    # file pages that stay resident: F32 tensors are used where they are mapped; the pages of the
    # others are let go once dequantized, so only the largest one is resident for a moment
    mapped = sum(i.n_bytes for i in tensors.values() if i.qtype == "F32") + max(
        (i.n_bytes for i in tensors.values() if i.qtype != "F32"), default=0
    )
    V = cfg.V
    runtime = RUNTIME_BASE + RUNTIME_PER_TOKEN * V
    copies = TRAINABLE_COPIES + (ACCUMULATION_COPIES if getattr(config, "grad_accum", 1) > 1 else 0)
    trainable = n_trainable * itemsize * copies
    gradients = n_trainable * itemsize
    n_label = config.batch_size * config.n_ctx
    # logits and probabilities of a block of label rows over the whole vocabulary (head in memory),
    # or of every label row over one block of vocabulary rows, with exp, p and dz (head streamed)
    rows = min(n_label, max(MIN_ROWS, LOGITS_BYTES // (V * itemsize)))  # lm_head_loss's block
    head_in_memory = 2 * rows * V * itemsize
    head_streamed = 4 * n_label * (ROW_CHUNK_BYTES // (cfg.C * itemsize)) * itemsize
    head = max(head_in_memory, head_streamed)  # for the automatic choices, before the cache is known
    if checkpoint is None:
        checkpoint = getattr(config, "checkpoint_choice", None)
    if budget is None:
        budget = getattr(config, "cache_budget", AUTO)
    kept_full, transient = _activations(cfg, config, lora_targets, itemsize, False)
    if checkpoint is None:  # auto: checkpoint when keeping every block would not fit
        others = runtime + trainable + head + working + transient
        checkpoint = others + max(kept_full, gradients) + auto_headroom_for(available) > available
    kept, transient = _activations(cfg, config, lora_targets, itemsize, bool(checkpoint))
    rest = runtime + trainable + head + max(kept, gradients) + transient
    b = parse_budget(budget)
    if b == AUTO:
        b = max(0, available - rest - working - auto_headroom_for(available))
    cache = min(int(b), dequant)
    # beyond the budget the store keeps one layer and streams the output head in blocks of rows
    streamed = cache < dequant
    buffers = working + ROW_CHUNK_BYTES if streamed else 0
    head = head_streamed if streamed else head_in_memory
    return MemoryEstimate(
        stored=int(stored),
        mapped=int(mapped),
        cache=int(cache),
        buffers=int(buffers),
        trainable=int(trainable),
        gradients=int(gradients),
        activations=int(kept),
        transient=int(transient),
        head=int(head),
        runtime=int(runtime),
        checkpoint=bool(checkpoint),
        budget=int(b),
        dequantized=int(dequant),
        available=int(available),
    )
