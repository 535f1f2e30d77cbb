"""Text generation with a KV cache: greedy or sampled, N samples of one prompt as one batch.

The prompt is run once (prefill) and its cache copied to N rows; each step
then decodes one token for every unfinished sample. Sampling follows
llama.cpp's default chain: top-k, then top-p, then min-p on the probabilities
at temperature 1, then temperature, then a draw from a seeded generator.
A sample stops at an end-of-generation token (not included in its text), at
its token budget, or at the context length. A NaN logit is never drawn and an
infinite one always is; a row with neither a finite nor an infinite logit is a
`ModelError`. This module does not tokenize or template; callers pass token ids
and get token ids back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from ..ranges import check_number
from .ops import LoraTerm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen (llama.cpp's names and defaults)."""

    temperature: float = 0.8  # 0: greedy (argmax)
    top_k: int = 40  # keep the k most likely tokens; 0 = off
    top_p: float = 0.95  # keep the smallest set with cumulative probability >= p; 1 = off
    min_p: float = 0.05  # drop tokens with probability < min_p * max probability; 0 = off
    seed: int | None = None  # None: a fresh random seed each call
    max_new_tokens: int = 128  # token budget per sample

    def __post_init__(self) -> None:
        """ConfigError (an EngineError) naming the first setting out of range, and what it accepts
        (engine.ranges: the table the CLI and the app share)."""
        for name in ("temperature", "top_k", "top_p", "min_p", "max_new_tokens"):
            check_number(name, getattr(self, name), label=f"sampling setting {name}")
        if self.seed is not None:
            check_number("sampling_seed", self.seed, label="sampling setting seed")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


GREEDY = SamplingConfig(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)


@dataclass(frozen=True)
class Generation:
    """One sample's new tokens (without the stop token) and why it ended."""

    tokens: tuple[int, ...]
    stop_reason: str  # "eos" (end-of-generation token), "length" (budget), "context" (n_ctx), "stopped"


def check_logits(logits, where: str) -> None:
    """ModelError when `logits` (any shape; NumPy or CuPy) hold a NaN or an infinity, saying how
    many and where they first appear: non-finite logits never leave the engine silently."""
    bad = ~np.isfinite(logits)
    if not bool(bad.any()):
        return
    bad = np.asarray(getattr(bad, "get", lambda: bad)())  # CuPy: to the host once, on failure only
    first = np.unravel_index(int(np.argmax(bad)), bad.shape)
    at = f" (first at position {first[-2]}, token {first[-1]})" if bad.ndim >= 2 else ""
    raise ModelError(
        f"{where} hold {int(bad.sum())} non-finite values (NaN or infinity) of {bad.size}{at}: the model's "
        "weights, the adapter or its scale overflow float32; nothing was produced from them"
    )


def _usable(logits: np.ndarray) -> np.ndarray:
    """Logits (B, V) with NaN as -inf (never drawn) and +inf as the largest float (the model is certain:
    those tokens share the probability); ModelError when a row has no finite or +inf logit left."""
    logits = np.where(np.isnan(logits), -np.inf, logits)
    logits = np.where(logits == np.inf, np.finfo(np.float64).max, logits)
    dead = ~np.isfinite(logits).any(axis=-1)
    if dead.any():
        b = int(np.argmax(dead))
        raise ModelError(
            f"the model's logits for sample {b} are all NaN or -inf ({logits.shape[-1]} tokens): the "
            "model or adapter weights hold non-finite values; nothing can be sampled"
        )
    return logits


def sample_next(logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator) -> np.ndarray:
    """Next token per row of logits (B, V). NaN logits are never drawn, +inf ones always are (among
    themselves); ModelError when a row has no other."""
    logits = logits.astype(np.float64)
    B, V = logits.shape
    if V == 0:
        raise ModelError("cannot sample from logits over an empty vocabulary (V = 0)")
    if not np.isfinite(logits).all():
        logits = _usable(logits)
    if cfg.greedy:
        return logits.argmax(axis=-1)
    out = np.empty(B, dtype=np.int64)
    for b in range(B):
        z = logits[b]
        k = cfg.top_k if 0 < cfg.top_k < V else V
        cand = np.argpartition(-z, k - 1)[:k] if k < V else np.arange(V)
        cand = cand[np.argsort(-z[cand], kind="stable")]  # descending
        zc = z[cand]
        p = np.exp(zc - zc[0])
        p /= p.sum()
        keep = len(cand)
        if cfg.top_p < 1.0:
            cum = np.cumsum(p)
            keep = min(keep, int(np.searchsorted(cum, cfg.top_p) + 1))
        if cfg.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(p >= cfg.min_p * p[0]))))
        with np.errstate(over="ignore"):  # a gap over a tiny temperature is -inf: probability 0
            q = np.exp((zc[:keep] - zc[0]) / cfg.temperature)  # zc[0] is the largest: q <= 1
        q /= q.sum()
        out[b] = cand[rng.choice(keep, p=q)]
    return out


def generate(
    model,
    prompt: Iterable[int],
    *,
    n_samples: int = 1,
    sampling: SamplingConfig = GREEDY,
    stop_ids: Iterable[int] = (),
    lora: Mapping[str, LoraTerm] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Generation]:
    """Continue `prompt` (token ids) n_samples times. `on_token(sample, token)` streams new tokens."""
    prompt = np.asarray(list(prompt), dtype=np.int64)
    if prompt.size == 0:
        raise ModelError("generation needs at least one prompt token (for example BOS)")
    if n_samples < 1:
        raise ModelError(f"n_samples must be >= 1, got {n_samples}")
    n_ctx = model.config.n_ctx_train
    if prompt.size >= n_ctx:
        raise ModelError(f"prompt of {prompt.size} tokens does not fit the context of {n_ctx}")
    budget = min(sampling.max_new_tokens, n_ctx - prompt.size)
    stop = set(int(t) for t in stop_ids)
    rng = np.random.default_rng(sampling.seed)
    device_terms = getattr(model, "device_terms", None)
    if device_terms is not None:
        lora = device_terms(lora)  # the adapter's factors on the model's device once, not per token

    # prefill once, then give every sample its own copy of the cache
    one = model.new_cache(1, prompt.size + budget)
    logits = model.forward(prompt[None], lora=lora, cache=one, last_only=True)[:, -1]  # (1, V)
    cache = model.new_cache(n_samples, prompt.size + budget)
    for layer in range(model.config.L):
        cache.k[layer][:] = one.k[layer]
        cache.v[layer][:] = one.v[layer]
    cache.pos[:] = one.pos
    cache.length = one.length
    logits = np.repeat(logits, n_samples, axis=0)  # (N, V)

    out: list[list[int]] = [[] for _ in range(n_samples)]
    reason: list[str | None] = [None] * n_samples
    for step in range(budget):
        check_logits(logits[:1] if step == 0 else logits, f"the logits of generated token {step + 1}")
        nxt = sample_next(logits, sampling, rng)
        for b in range(n_samples):
            if reason[b] is not None:
                continue
            t = int(nxt[b])
            if t in stop:
                reason[b] = "eos"
                continue
            out[b].append(t)
            if on_token is not None:
                on_token(b, t)
        if all(r is not None for r in reason):
            break
        if should_stop is not None and should_stop():
            reason = [r or "stopped" for r in reason]
            break
        if step + 1 == budget:
            break
        logits = model.forward(nxt[:, None], lora=lora, cache=cache)[:, -1]
    final = "length" if budget == sampling.max_new_tokens else "context"
    return [Generation(tuple(toks), r or final) for toks, r in zip(out, reason, strict=True)]
