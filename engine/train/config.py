"""A training run's settings (`TrainConfig`) and the files a run writes and reads: its output
paths, the checkpoint a resume starts from, stale temporaries of an interrupted run.

Every number of a TrainConfig is checked against its range in `engine.ranges` (the table the CLI
shares) and every choice against its list, when the config is made.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field

from ..backend import parse_device
from ..errors import ConfigError, ModelError
from ..io.files import check_outputs
from ..io.weights import parse_budget
from ..model.targets import TargetSpec
from ..ranges import check_number
from .checkpoint import (
    PREFIX as CHECKPOINT_PREFIX,
)
from .checkpoint import (
    STATE_FILE,
    latest_checkpoint,
)
from .optim import OptimConfig
from .runs import record_path

log = logging.getLogger(__name__)

CONFIG_FILE = "trainer.json"  # the facts file of a run's checkpoints (engine.train.checkpoint)

# numeric fields, each checked against its range in engine.ranges (the table the CLI shares)
_NUMBERS = (
    "rank", "n_ctx", "batch_size", "grad_accum", "steps", "seed", "warmup_steps", "checkpoint_every",
    "keep_checkpoints", "eval_every", "norms_every", "alpha", "epochs", "val_split", "lr", "min_lr_ratio",
    "weight_decay", "gclip", "max_grad_norm", "kl_coef", "dpo_beta", "orpo_lambda", "sample_every",
    "sample_tokens", "sample_from_validation", "router_aux_coef",
)  # fmt: skip
_CHOICES = {
    "lora_init": ("kaiming", "gaussian"),
    "prompt_format": ("chat", "raw"),
    "schedule": ("constant", "linear", "cosine"),
    "reward_mode": ("none", "weighted", "group"),
    "out_type": ("F32", "F16", "Q8_0"),
    "gpu_step": ("graph", "eager", "generic"),
    "objective": ("sft", "dpo", "orpo"),
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs besides the model and the data. Defaults suit a first LoRA run."""

    # adapter
    targets: TargetSpec = field(default_factory=TargetSpec)  # which tensors get LoRA
    rank: int = 16  # LoRA rank r
    alpha: float = 32.0  # LoRA alpha (scale alpha / r)
    lora_init: str = "kaiming"  # "kaiming" (PEFT) or "gaussian" (N(0, 1/r))
    full: tuple[str, ...] = ()  # tensors trained in full: names, globs or kinds ("attn_norm", "all", ...)
    # data
    n_ctx: int = 512  # packed window length in tokens
    batch_size: int = 1  # windows per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    epochs: float = 1.0  # passes over the data (used when steps is 0)
    steps: int = 0  # optimizer steps; 0 = from epochs
    val_split: float = 0.0  # fraction of samples held out for validation
    train_on_prompt: bool = False  # loss on prompt tokens too
    prompt_format: str = "chat"  # prompt/response samples: "chat" template or "raw" concatenation
    seed: int = 0  # shuffling, validation split, LoRA init
    # optimizer
    lr: float = 2e-4  # peak learning rate
    schedule: str = "cosine"  # constant | linear | cosine
    warmup_steps: int = 0  # linear warm-up steps
    min_lr_ratio: float = 0.0  # floor of the decay, as a fraction of lr
    weight_decay: float = 0.0  # decoupled weight decay (matrices only)
    gclip: float = 0.0  # element-wise gradient clipping; 0 = off
    max_grad_norm: float = 1.0  # global gradient-norm clipping; 0 = off
    # rewards
    reward_mode: str = "none"  # none | weighted (reward-weighted SFT) | group (group-relative)
    kl_coef: float = 0.0  # group mode: weight of KL(adapter || base) per label token
    # preferences (engine.train.preferences): "sft" trains the samples' answers (a preference sample: its
    # chosen one); "dpo" and "orpo" train on pairs of a chosen and a rejected answer
    objective: str = "sft"
    dpo_beta: float = 0.1  # DPO: beta, how far the adapter may move from the base model (higher: less)
    orpo_lambda: float = 0.1  # ORPO: lambda, the weight of the odds-ratio term beside the SFT loss
    # runtime
    device: str = "cpu"  # where the run computes: "cpu", "cuda:N" or "auto" (engine.backend)
    cache_budget: str = "auto"  # dequantized weights kept between uses: "auto", "off" or a size ("4G")
    data_cache: str = "auto"  # folder keeping prepared datasets between runs: "auto" (the app's data
    # folder, engine.train.prepared.default_cache_folder), "off" (prepared again by every run), or a path
    checkpoint_layers: str = "auto"  # recompute each block in the backward pass: "on", "off", or
    # "auto" (on when the memory estimate says keeping every block's activations would not fit)
    checkpoint_every: int = 0  # steps between checkpoints; 0 = only at the end / on stop
    checkpoint_dir: str | None = None  # folder for checkpoints (None: no checkpoints)
    keep_checkpoints: int = 2  # newest checkpoints kept
    eval_every: int = 0  # steps between validation passes; 0 = at the end only
    norms_every: int = 1  # steps between LoraNorms events
    sample_prompts: tuple[str, ...] = ()  # answered every sample_every steps (SampleAnswers events)
    sample_every: int = 0  # steps between sample answers; 0 = none
    sample_tokens: int = 48  # new tokens per sample answer (greedy)
    sample_from_validation: int = 0  # also answer the prompts of the first N validation samples (file
    # order, distinct prompts; engine.train.samples.validation_prompts); 0 = none
    out: str | None = None  # adapter GGUF written at the end
    out_type: str = "F32"  # F32 | F16 | Q8_0
    router_aux_coef: float = 0.0  # MoE with the router (ffn_gate_inp) trained: the weight of the Switch
    # Transformer load-balancing loss of each MoE layer, summed over the layers (engine.model.layers.
    # load_balance); 0 = off
    skip_unreached_experts: bool = False  # MoE: freeze the LoRA factors of the experts the routing census
    # (engine.train.census: the base model over the whole prepared dataset) says no token reaches
    gpu_step: str = "graph"  # on a GPU, the step of a model the fused step covers (dense_step: llama, qwen2,
    # qwen3, Mixtral, qwen2moe, qwen3moe, olmoe): "graph" (captured as one CUDA graph, replayed), "eager" (the
    # fused step launched from Python), "generic" (the op-by-op path)

    def __post_init__(self) -> None:
        """Every field checked, so that the CLI and the app get the same one-line messages."""
        ckpt = self.checkpoint_layers
        if isinstance(ckpt, bool) or ckpt is None:  # True/False from older project files and callers
            object.__setattr__(self, "checkpoint_layers", {True: "on", False: "off", None: "auto"}[ckpt])
        elif ckpt not in ("auto", "on", "off"):
            raise ConfigError(f"checkpoint_layers must be auto, on or off, got {ckpt!r}")
        object.__setattr__(self, "cache_budget", str(self.cache_budget))
        if not isinstance(self.data_cache, str) or not self.data_cache:
            raise ConfigError(f"data_cache must be 'auto', 'off' or a folder, got {self.data_cache!r}")
        parse_budget(self.cache_budget)  # EngineError naming the value when it is not understood
        parse_device(self.device)
        if not isinstance(self.targets, TargetSpec):
            raise ConfigError(f"targets must be a TargetSpec, got {type(self.targets).__name__}")
        for name in _NUMBERS:
            check_number(name, getattr(self, name))
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.objective != "sft" and self.reward_mode != "none":
            raise ConfigError(
                f"objective {self.objective} learns from preference pairs, not rewards: set reward_mode to "
                f"none (got {self.reward_mode})"
            )
        if not isinstance(self.full, tuple) or not all(isinstance(x, str) for x in self.full):
            raise ConfigError(f"full must be a tuple of tensor names, globs or kinds, got {self.full!r}")

    @property
    def checkpoint_choice(self) -> bool | None:
        """Layer checkpointing: True, False, or None when the memory plan decides."""
        return {"on": True, "off": False}.get(self.checkpoint_layers)

    def optim(self, total_steps: int) -> OptimConfig:
        return OptimConfig(
            lr=self.lr,
            weight_decay=self.weight_decay,
            gclip=self.gclip,
            max_grad_norm=self.max_grad_norm,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            total_steps=max(1, total_steps),
            min_lr_ratio=self.min_lr_ratio,
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["targets"] = asdict(self.targets)
        return d

    @classmethod
    def from_json(cls, d: dict) -> TrainConfig:
        d = dict(d)
        t = d.pop("targets", {})
        t = TargetSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()})
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(targets=t, **d)


def replace_config(cfg: TrainConfig, **changes) -> TrainConfig:
    from dataclasses import replace

    return replace(cfg, **changes)


def os_error_text(exc: OSError) -> str:
    """An OSError in plain words: 'No space left on device (/path)'; a full disk says what to do."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    text = f"{exc.strerror or exc}{where}"
    if exc.errno == errno.ENOSPC:
        text += "; free some disk space"
    return text


def resolve_checkpoint(path: str) -> str:
    """A checkpoint folder (ckpt-NNNNNN), or a folder of them: its newest complete checkpoint."""
    if not os.path.isdir(path):
        raise ModelError(f"{path}: no such checkpoint folder")
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        return path
    latest = latest_checkpoint(path, CONFIG_FILE)
    if latest is None:
        raise ModelError(
            f"{path}: holds no complete checkpoint (a ckpt-NNNNNN folder with {STATE_FILE} and {CONFIG_FILE})"
        )
    return latest


def full_model_path(out: str) -> str:
    """Where a run with full-weight tensors and LoRA pairs writes its whole model: OUT.model.gguf."""
    stem = out[:-5] if out.endswith(".gguf") else out
    return stem + ".model.gguf"


def run_outputs(config: TrainConfig) -> dict[str, str | None]:
    """Every path a run with `config` writes, by what it is (engine.io.files.check_outputs)."""
    out = config.out
    return {
        "adapter": out,
        "full model": full_model_path(out) if out and config.full else None,
        "checkpoint folder": config.checkpoint_dir,
        "run record": record_path(config.checkpoint_dir, out),
    }


def run_kinds(config: TrainConfig) -> dict[str, str]:
    """What each output of `run_outputs` writes (engine.io.files.KINDS): a file already at its path
    is replaced only when it is of that kind."""
    return {"adapter": "gguf" if config.full else "adapter", "full model": "model", "run record": "json"}


RUN_FOLDERS = {"checkpoint folder": CHECKPOINT_PREFIX}  # what a run replaces and prunes in its folder
RESUMED = "checkpoint to resume"  # the input a run's own checkpoint folder may hold


def check_run_paths(config: TrainConfig, inputs: dict[str, str | None]) -> None:
    """ConfigError, before any work, when an output of the run would replace or change one of its
    `inputs` (model, dataset, adapter to continue, checkpoint to resume, chat template) or another
    of its outputs, or lands on a file of another kind (engine.io.files.check_outputs)."""
    check_outputs(
        run_outputs(config), inputs, folders=RUN_FOLDERS, continues=RESUMED, kinds=run_kinds(config)
    )


def clean_stale_temporaries(folder: str | None, max_age_s: float = 0.0) -> int:
    """Remove `.tmp-*` files and folders this engine left in `folder` when a run was killed
    (older than `max_age_s`); returns how many."""
    if not folder or not os.path.isdir(folder):
        return 0
    removed = 0
    now = time.time()
    for name in os.listdir(folder):
        if not name.startswith(".tmp-"):
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.path.getmtime(path) < max_age_s:
                continue
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed += 1
        except OSError:
            continue
    if removed:
        log.info("%s: removed %d temporary files left by an earlier run", folder, removed)
    return removed
