"""AdamW, gradient clipping, learning-rate schedules and gradient accumulation, in NumPy.

Parameters are a plain dict `name -> np.ndarray` (the float32 master copies the
trainer owns); `AdamW.step` updates them in place from a dict of gradients with
the same names and shapes. The update is torch.optim.AdamW's (decoupled weight
decay, bias-corrected moments, eps outside the square root), with the moments
kept in each parameter's own dtype; norms are summed in float64.

Per step, in order:

1. grad_norm = ||g||_2 over every given gradient. Non-finite: nothing changes.
2. element-wise clip g = clamp(g, -gclip, gclip) when gclip > 0;
3. global clip g *= max_grad_norm / ||g|| when max_grad_norm > 0 and ||g|| exceeds it;
4. for each parameter that has a gradient, with t its own count of updates:
   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
   p -= lr_t * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr_t * wd * p   (wd only where decayed)

Weight decay applies to parameters with `ndim >= decay_min_ndim` (ggml's rule,
and nanoGPT's `p.dim() >= 2`): LoRA A/B factors and weight matrices decay;
norm weights and biases (1-D) do not.

On a GPU run (`AdamW(..., runtime=rt)`, parameters and gradients on the device) the same step
is one multi-tensor launch of `engine.kernels.adamw` with the moments in float32 on the device;
the step reads the device twice (the gradient norms the clipping needs, then the update and
parameter norms), and `state_dict()` copies the moments to the host.

This module holds no model knowledge and never touches files: the trainer
saves `state_dict()` wherever it saves checkpoints.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from ..backend import array_module, to_host
from ..kernels.adamw import clip_scale, sumsq, sumsq_fast
from ..model import ops

logger = logging.getLogger(__name__)

SCHEDULES = ("constant", "linear", "cosine")
STATE_KIND = "adamw"


@dataclass(frozen=True)
class OptimConfig:
    """Hyperparameters of AdamW and of its learning-rate schedule."""

    lr: float = 2e-4  # peak learning rate, reached at the end of warmup
    betas: tuple[float, float] = (0.9, 0.999)  # decay rates of the first and second moment averages
    eps: float = 1e-8  # added to sqrt(v_hat) in the denominator (outside the root, as torch)
    weight_decay: float = 0.0  # decoupled (AdamW): p -= lr_t * weight_decay * p on decayed params
    gclip: float = 0.0  # element-wise gradient clip to [-gclip, gclip]; 0 = off
    max_grad_norm: float = 1.0  # global L2-norm clip over all gradients (after gclip); 0 = off
    schedule: str = "cosine"  # "constant" | "linear" | "cosine" decay after warmup
    warmup_steps: int = 0  # linear warmup from 0 to lr over this many optimizer steps
    total_steps: int = 1  # optimizer steps the schedule spans, warmup included
    min_lr_ratio: float = 0.0  # floor of the linear/cosine decay, as a fraction of lr
    decay_min_ndim: int = 2  # weight decay applies to params with ndim >= this (0 = all, 99 = none)

    def __post_init__(self) -> None:
        betas = tuple(float(b) for b in self.betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", betas)
        for name in ("lr", "weight_decay", "gclip", "max_grad_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.eps) and self.eps > 0.0):
            raise ValueError(f"eps must be a finite number > 0, got {self.eps!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.decay_min_ndim < 0:
            raise ValueError(f"decay_min_ndim must be >= 0, got {self.decay_min_ndim!r}")


def lr_at(cfg: OptimConfig, step: int) -> float:
    """Learning rate for the optimizer step taken after `step` steps (0-based), as HF's schedules.

    With W = warmup_steps, N = total_steps, r = min_lr_ratio:

    - warmup, step < W:  lr * step / W  (so the very first step runs at lr 0 when W > 0)
    - after, progress = clamp((step - W) / max(1, N - W), 0, 1):
      - constant: lr
      - linear:   lr * (r + (1 - r) * (1 - progress))
      - cosine:   lr * (r + (1 - r) * 0.5 * (1 + cos(pi * progress)))

    With r = 0 these are transformers' get_constant_schedule_with_warmup,
    get_linear_schedule_with_warmup and get_cosine_schedule_with_warmup; with r > 0
    cosine is get_cosine_with_min_lr_schedule_with_warmup (min_lr_rate = r). Unlike
    HF's cosine, steps past N stay at the floor instead of climbing back up.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    W, N, r = cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio
    if step < W:
        return cfg.lr * step / W
    if cfg.schedule == "constant":
        return cfg.lr
    progress = min(1.0, (step - W) / max(1, N - W))
    if cfg.schedule == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (r + (1.0 - r) * decay)


def _exceeds(g: np.ndarray, bound: float) -> bool:
    """Whether any element of g lies outside [-bound, bound] (two reductions, no temporary)."""
    return g.size > 0 and (float(g.max()) > bound or float(g.min()) < -bound)


def clip_grads(
    grads: Mapping[str, np.ndarray], gclip: float, max_norm: float
) -> tuple[dict[str, np.ndarray], float, bool]:
    """Clip gradients element-wise to [-gclip, gclip], then to a global L2 norm of at most `max_norm`.

    Returns (clipped grads, L2 norm of the grads before any clipping, whether anything was clipped).
    0 turns either clip off. The inputs are never modified: an array that needs no
    change is returned as is, others as new arrays. A non-finite norm returns the
    grads unchanged with clipped False, so the caller can skip the step.
    """
    grad_norm = math.sqrt(sum(sumsq(g) for g in grads.values()))
    out = dict(grads)
    if not math.isfinite(grad_norm):
        return out, grad_norm, False
    clipped = False
    if gclip > 0.0:
        for name, g in grads.items():
            if _exceeds(g, gclip):
                out[name] = np.clip(g, -gclip, gclip)
                clipped = True
    norm = math.sqrt(sum(sumsq(g) for g in out.values())) if clipped else grad_norm
    scale = clip_scale(norm, max_norm)
    if scale != 1.0:
        out = {name: g * np.asarray(scale, dtype=g.dtype) for name, g in out.items()}
        clipped = True
    return out, grad_norm, clipped


@dataclass(frozen=True)
class StepStats:
    """What one `AdamW.step` did; a non-finite grad_norm means the step was skipped."""

    lr: float  # learning rate the step ran at (lr_at(cfg, step_count before the step))
    grad_norm: float  # global L2 norm of the gradients before any clipping
    clipped: bool  # whether element-wise or global-norm clipping changed the gradients
    update_norm: float  # global L2 norm of the change applied to the params (0 when skipped)
    param_norm: float  # global L2 norm of all params after the step


class AdamW:
    """AdamW over a dict of parameters, updated in place; see the module docstring for the update.

    `step_count` counts the steps taken (it drives the schedule); each parameter
    also counts its own updates for bias correction, as torch does, so a
    parameter that got no gradient for a while is corrected for what it has seen.
    """

    def __init__(self, params: Mapping[str, np.ndarray], cfg: OptimConfig, runtime=None) -> None:
        """`runtime`: an engine.kernels.runtime.Runtime whose arrays the params are (a GPU run), or None."""
        for name, p in params.items():
            array = isinstance(p, np.ndarray) or (runtime is not None and hasattr(p, "__array_priority__"))
            if not array or not np.issubdtype(p.dtype, np.floating):
                raise ValueError(
                    f"param {name!r} must be a floating-point np.ndarray, got {type(p).__name__}"
                )
            if runtime is None and not p.flags.writeable:
                raise ValueError(f"param {name!r} must be writeable: the optimizer updates it in place")
            if runtime is not None and (p.dtype != np.float32 or not p.flags.c_contiguous):
                raise ValueError(f"param {name!r} must be C-contiguous float32 on the device, got {p.dtype}")
        self.params = dict(params)
        self.cfg = cfg
        self.runtime = runtime
        self.step_count = 0
        xp = runtime.xp if runtime is not None else np
        self._m = {name: xp.zeros_like(p) for name, p in self.params.items()}
        self._v = {name: xp.zeros_like(p) for name, p in self.params.items()}
        self._t = dict.fromkeys(self.params, 0)

    def decays(self, name: str) -> bool:
        """Whether weight decay applies to param `name` (ndim >= cfg.decay_min_ndim)."""
        return self.params[name].ndim >= self.cfg.decay_min_ndim

    def _param_norm(self) -> float:
        if self.runtime is not None:
            xp = self.runtime.xp
            if not self.params:
                return 0.0
            sums = xp.stack([xp.sum(xp.square(p.astype(xp.float64))) for p in self.params.values()])
            return math.sqrt(float(to_host(sums.sum())))
        return math.sqrt(sum(sumsq(p) for p in self.params.values()))

    def _adamw(self, grads: Mapping[str, np.ndarray], names: list[str], lr: float):
        """One AdamW step over `names` through the twin for where the params live (the CUDA twin on
        the runtime, the CPU twin otherwise: engine.kernels.adamw_cpu, the same bits as the
        reference); the update counts advance unless the gradient norm is not finite."""
        cfg = self.cfg
        if self.runtime is not None:
            from ..kernels.adamw import adamw_step_on

            xp = self.runtime.xp
            step = functools.partial(adamw_step_on, self.runtime)
            g = [xp.ascontiguousarray(grads[n], dtype=xp.float32) for n in names]
        else:
            step, g = ops.adamw_step, [grads[n] for n in names]
        res = step(
            [self.params[n] for n in names],
            g,
            [self._m[n] for n in names],
            [self._v[n] for n in names],
            [self._t[n] + 1 for n in names],
            [self.decays(n) for n in names],
            lr=lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            gclip=cfg.gclip,
            max_grad_norm=cfg.max_grad_norm,
        )
        if res.skipped:
            logger.warning(
                "non-finite gradient norm %s at step %d: update skipped", res.grad_norm, self.step_count
            )
        else:
            for n in names:
                self._t[n] += 1
        return res

    def step(self, grads: Mapping[str, np.ndarray]) -> StepStats:
        """One update from `grads`; params missing from `grads` are left alone (params and moments).

        A gradient named after no param, or shaped unlike its param, raises
        ValueError. Non-finite gradients change nothing, not even step_count, and
        return stats whose grad_norm is nan or inf for the trainer to report.
        """
        for name, g in grads.items():
            if name not in self.params:
                raise ValueError(f"gradient {name!r} names no parameter of this optimizer")
            if g.shape != self.params[name].shape:
                raise ValueError(
                    f"gradient {name!r} has shape {g.shape}, its parameter {self.params[name].shape}"
                )
        lr = lr_at(self.cfg, self.step_count)
        names = [name for name in self.params if name in grads]
        res = self._adamw(grads, names, lr)
        if res.skipped:
            return StepStats(lr, res.grad_norm, False, 0.0, self._param_norm())
        self.step_count += 1
        untouched = [p for n, p in self.params.items() if n not in grads]
        if self.runtime is not None:
            xp = self.runtime.xp
            sums = [xp.asarray(res.update_sumsq), xp.asarray(res.param_sumsq)]
            sums += [xp.sum(xp.square(p.astype(xp.float64))) for p in untouched]
            host = to_host(xp.stack(sums))  # the update and parameter norms: the step's second read
            update_sumsq, param_sumsq = float(host[0]), float(host[1:].sum())
        else:
            update_sumsq, param_sumsq = res.update_sumsq, res.param_sumsq
            for p in untouched:
                param_sumsq += sumsq_fast(p)
        return StepStats(lr, res.grad_norm, res.clipped, math.sqrt(update_sumsq), math.sqrt(param_sumsq))

    def state_dict(self) -> dict[str, np.ndarray | int | float | str]:
        """Everything needed to resume exactly: moments, update counts, step count and config.

        Keys: "kind" ("adamw"), "step_count", "cfg.<field>" (betas as "cfg.beta1" and
        "cfg.beta2"), and per param "m.<name>", "v.<name>" (copies) and "t.<name>".
        Values are plain ints, floats, strings and arrays, so the dict can go into an
        .npz file or a GGUF as it is.
        """
        state: dict[str, np.ndarray | int | float | str] = {"kind": STATE_KIND, "step_count": self.step_count}
        state.update(_config_to_state(self.cfg))
        for name in self.params:
            state[f"m.{name}"] = np.array(to_host(self._m[name]), copy=True)
            state[f"v.{name}"] = np.array(to_host(self._v[name]), copy=True)
            state[f"t.{name}"] = self._t[name]
        return state

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore moments, counts and config saved by `state_dict` (0-d arrays accepted for scalars).

        The saved config replaces `self.cfg`, so a resumed run follows the same
        trajectory; to change hyperparameters on resume, assign
        `dataclasses.replace(opt.cfg, ...)` afterwards. Everything is checked before
        anything changes: a missing, unexpected or wrongly shaped entry raises
        ValueError naming the param or key.
        """
        kind = _scalar(state, "kind", str)
        if kind != STATE_KIND:
            raise ValueError(f"state kind is {kind!r}, expected {STATE_KIND!r}")
        cfg = _config_from_state(state)
        step_count = _scalar(state, "step_count", int)
        known = {"kind", "step_count"} | set(_config_to_state(cfg))
        for name, p in self.params.items():
            for prefix in ("m.", "v."):
                key = prefix + name
                if key not in state:
                    raise ValueError(f"optimizer state has no {key!r} for param {name!r}")
                arr = np.asarray(state[key])
                if arr.shape != p.shape:
                    raise ValueError(
                        f"optimizer state {key!r} has shape {arr.shape}, param {name!r} {p.shape}"
                    )
            _scalar(state, f"t.{name}", int)
            known |= {f"m.{name}", f"v.{name}", f"t.{name}"}
        unexpected = sorted(set(state) - known)
        if unexpected:
            raise ValueError(
                f"optimizer state has {unexpected[0]!r}, which names no param of this optimizer "
                f"({len(unexpected)} unexpected keys in all)"
            )
        for name in self.params:
            for buf, key in ((self._m[name], f"m.{name}"), (self._v[name], f"v.{name}")):
                if self.runtime is not None:
                    buf[...] = self.runtime.xp.asarray(np.asarray(state[key], dtype=buf.dtype))
                else:
                    np.copyto(buf, np.asarray(state[key]), casting="same_kind")
            self._t[name] = _scalar(state, f"t.{name}", int)
        self.step_count = step_count
        self.cfg = cfg


def _config_to_state(cfg: OptimConfig) -> dict[str, int | float | str]:
    out: dict[str, int | float | str] = {}
    for f in fields(cfg):
        if f.name == "betas":
            out["cfg.beta1"], out["cfg.beta2"] = cfg.betas
        else:
            out[f"cfg.{f.name}"] = getattr(cfg, f.name)
    return out


def _config_from_state(state: Mapping[str, object]) -> OptimConfig:
    kwargs: dict[str, object] = {}
    for f in fields(OptimConfig):
        if f.name == "betas":
            kwargs["betas"] = (_scalar(state, "cfg.beta1", float), _scalar(state, "cfg.beta2", float))
        else:
            kwargs[f.name] = _scalar(state, f"cfg.{f.name}", type(f.default))
    return OptimConfig(**kwargs)


def _scalar(state: Mapping[str, object], key: str, kind: type):
    """state[key] as a plain int, float or str; accepts 0-d arrays (what an .npz gives back)."""
    if key not in state:
        raise ValueError(f"optimizer state has no {key!r}")
    value = state[key]
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise ValueError(f"optimizer state {key!r} must be a scalar, got shape {value.shape}")
        value = value.item()
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"optimizer state {key!r} must be a string, got {value!r}")
        return value
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"optimizer state {key!r} must be a number, got {value!r}")
    if kind is int and float(value) != int(value):
        raise ValueError(f"optimizer state {key!r} must be an integer, got {value!r}")
    return kind(value)


class GradAccumulator:
    """Sums micro-batch gradients and averages them over the number of micro-batches.

    `mean()` is sum_i(scale_i * g_i) / n, where n counts `add` calls since the last
    `reset`; a name missing from a micro-batch counts as a zero gradient there.
    Sums are kept in each gradient's dtype, in buffers reused across resets.
    """

    def __init__(self) -> None:
        self.n = 0
        self._sum: dict[str, np.ndarray] = {}
        self._live: dict[str, None] = {}  # names added since the last reset, in order

    def add(self, grads: Mapping[str, np.ndarray], scale: float = 1.0) -> None:
        """Add one micro-batch's gradients, multiplied by `scale`; a shape change raises ValueError."""
        for name, g in grads.items():
            if name in self._live and g.shape != self._sum[name].shape:
                raise ValueError(
                    f"gradient {name!r} has shape {g.shape}, earlier micro-batches {self._sum[name].shape}"
                )
        for name, g in grads.items():
            buf = self._sum.get(name)
            xp = array_module(g)
            if name not in self._live:
                if buf is None or buf.shape != g.shape or buf.dtype != g.dtype or array_module(buf) is not xp:
                    buf = self._sum[name] = xp.empty_like(g)
                xp.multiply(g, xp.asarray(scale, dtype=g.dtype), out=buf)
                self._live[name] = None
            elif scale == 1.0:
                buf += g
            else:
                buf += g * xp.asarray(scale, dtype=buf.dtype)
        self.n += 1

    def mean(self) -> dict[str, np.ndarray]:
        """The averaged gradients, as new arrays; ValueError when nothing was added."""
        if self.n == 0:
            raise ValueError("no micro-batch gradients to average: call add() first")
        out = {}
        for name in self._live:
            buf = self._sum[name]
            out[name] = buf / array_module(buf).asarray(self.n, dtype=buf.dtype)
        return out

    def sums(self) -> dict[str, np.ndarray]:
        """The summed gradients themselves (the accumulator's buffers, valid until the next `add`
        or `reset`): what a data-parallel step all-reduces before taking the mean."""
        return {name: self._sum[name] for name in self._live}

    def reset(self) -> None:
        """Forget the sums (the buffers stay for the next accumulation)."""
        self.n = 0
        self._live.clear()
