"""Data-parallel training over a `Collective`: what `Trainer` does differently with several ranks.

Every rank holds the same model file, dataset, settings and trainable parameters, and builds the
same global batches. Each optimizer step's rows (the windows of its `grad_accum` micro-batches, in
order) are cut into `size` contiguous shares; a rank computes the loss and gradients of its share,
one forward/backward per micro-batch it has rows of (never more rows at once than a micro-batch),
and one `allreduce` per step sums the gradients (LoRA factors and full-weight tensors, bucketed)
with the loss, the token counts and the MoE expert counts. Because a micro-batch's per-token loss
weights already carry its normalisation (engine.train.batches.make_batches), the sum over ranks is the
step one process computes, up to the order of the sums; the optimizer then takes the same step on
every rank.

Before step 1, `join` has every rank show its facts (model file size and SHA-256, dataset, encoded
data, targets, settings) or its own failure, and refuses a run where any differ, naming the rank
and what differs; then rank 0's parameters (and, on a resume, its optimizer state and step: only
rank 0 reads the checkpoint) are broadcast, so a checkpoint resumes with any number of ranks.
`on_root` runs the writes (checkpoints, the adapter) on rank 0 alone and tells every rank how they
went, so that all ranks end the same way. This module holds no transport (engine.train.collective)
and no training loop (engine.train.trainer).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from ..backend import to_host
from ..errors import EngineError
from ..io.hashes import cached_sha256
from .batches import Batch
from .collective import SETUP_TIMEOUT_S, Collective
from .optim import GradAccumulator
from .train_model import loss_and_grads

log = logging.getLogger(__name__)

T = TypeVar("T")
PROTOCOL = 1  # raised when what ranks exchange changes: ranks of different versions refuse to run
# settings that may differ between ranks: where each rank computes and what only rank 0 writes
PER_RANK_SETTINGS = (
    "device", "cache_budget", "checkpoint_layers", "checkpoint_dir", "keep_checkpoints", "out",
    "out_type", "norms_every",
)  # fmt: skip
STEP_TIMEOUT_FACTOR = 4.0  # a step's collective waits at least this many times the slowest step yet


def share(n: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi) of `n` items that `rank` of `size` takes: contiguous, sizes differing by at most one."""
    return n * rank // size, n * (rank + 1) // size


def sub_batch(batch: Batch, rows: list[int]) -> Batch:
    """The rows `rows` of a batch, with the batch's own loss weights (its normalisation kept)."""
    if len(rows) == batch.tokens.shape[0]:
        return batch
    idx = np.asarray(rows)
    targets = batch.targets[idx]
    return replace(
        batch,
        tokens=batch.tokens[idx],
        targets=targets,
        weights=batch.weights[idx],
        positions=batch.positions[idx],
        segments=batch.segments[idx],
        sample_ids=batch.sample_ids[idx],
        n_label_tokens=int(np.count_nonzero(targets >= 0)),
    )


def my_rows(batches: list[Batch], rank: int, size: int) -> list[tuple[int, list[int]]]:
    """This rank's share of the rows of `batches`: (batch index, rows) for each batch it has rows of."""
    rows = [(j, b) for j, batch in enumerate(batches) for b in range(batch.tokens.shape[0])]
    lo, hi = share(len(rows), rank, size)
    mine: dict[int, list[int]] = {}
    for j, b in rows[lo:hi]:
        mine.setdefault(j, []).append(b)
    return list(mine.items())


def step_timeout(comm: Collective, recent_seconds) -> float:
    """How long a step's collective waits for the other ranks: the collective's timeout, or several
    times the slowest recent step when steps are that long (a slower machine is not a dead one)."""
    slowest = max(recent_seconds, default=0.0)
    return max(comm.timeout, STEP_TIMEOUT_FACTOR * slowest)


# --- one step --------------------------------------------------------------------------------------


def sharded_step(trainer) -> tuple[float, float, int, int, Any, dict, int]:
    """This rank's share of the current step, summed over every rank: (loss, ce_sum, label tokens,
    sample tokens, expert counts or None, gradients, index of the step's last micro-batch)."""
    tr, cfg, comm = trainer, trainer.config, trainer.comm
    n_batches = tr.plan.batches_per_epoch
    batches = []
    m = 0
    for j in range(cfg.grad_accum):
        m = tr.step * cfg.grad_accum + j  # global micro-batch index
        batches.append(tr.batches_for_epoch(m // n_batches)[m % n_batches])
    acc: GradAccumulator = tr._accumulator
    acc.reset()
    loss = ce_sum = 0.0
    n_label = n_tok = 0
    counts = None
    kl = cfg.kl_coef if cfg.reward_mode == "group" else 0.0
    for j, rows in my_rows(batches, comm.rank, comm.size):
        part = sub_batch(batches[j], rows)
        res = loss_and_grads(tr.model, tr.trainable, part, checkpoint=tr.memory.checkpoint, kl_coef=kl)
        acc.add(res.grads)
        loss += res.loss
        ce_sum += res.ce_sum
        n_label += res.n_tokens
        n_tok += part.n_tokens
        if res.expert_counts is not None:
            c = to_host(res.expert_counts)
            counts = c if counts is None else counts + c
    params = tr.trainable.params()
    sums = acc.sums()
    xp = tr.backend.xp
    grads = {n: sums[n] if n in sums else xp.zeros_like(p) for n, p in params.items()}  # a rank with no rows
    cfg_m = tr.model.config
    if counts is None and cfg_m.E:
        counts = np.zeros((cfg_m.L, cfg_m.E), np.int64)
    scalars = np.array([loss, ce_sum, n_label, n_tok], np.float64)
    tail = [] if counts is None else [counts.astype(np.float64).reshape(-1)]
    arrays = [grads[n] for n in params] + [scalars, *tail]
    comm.allreduce(arrays, timeout=step_timeout(comm, tr._recent))
    if cfg.grad_accum > 1:  # the mean over micro-batches, as one process takes it
        for n, g in grads.items():
            grads[n] = g / xp.asarray(cfg.grad_accum, dtype=g.dtype)
    loss, ce_sum, n_label, n_tok = scalars.tolist()
    if counts is not None:
        counts = np.rint(tail[0]).astype(np.int64).reshape(counts.shape)
    return loss / cfg.grad_accum, ce_sum, int(n_label), int(n_tok), counts, grads, m


def sharded_eval(trainer) -> tuple[float, int]:
    """Validation cross-entropy sum and label tokens over every rank's share of the batches."""
    tr, comm = trainer, trainer.comm
    ce = 0.0
    n = 0
    for k, rows in my_rows(tr.val_batches, comm.rank, comm.size):
        res = loss_and_grads(tr.model, tr.trainable, sub_batch(tr.val_batches[k], rows), backward=False)
        ce += res.ce_sum
        n += res.n_tokens
    totals = np.array([ce, n], np.float64)
    comm.allreduce([totals], timeout=step_timeout(comm, tr._recent))
    return float(totals[0]), int(totals[1])


# --- writes on rank 0 -----------------------------------------------------------------------------


def on_root(comm: Collective, fn: Callable[[], T], *, timeout: float | None = None) -> T:
    """`fn()` on rank 0 alone; its result on every rank, or on every rank the OSError or EngineError
    it raised (rebuilt from its message), so that all ranks fail together."""
    if not comm.parallel:
        return fn()
    outcome: tuple = ("ok", None)
    if comm.is_root:
        try:
            outcome = ("ok", fn())
        except OSError as exc:
            outcome = ("os", exc.errno, exc.strerror or str(exc), exc.filename)
        except EngineError as exc:
            outcome = ("engine", type(exc).__name__, str(exc))
    outcome = comm.broadcast_object(outcome, timeout=timeout)
    if outcome[0] == "os":
        raise OSError(outcome[1], outcome[2], outcome[3])
    if outcome[0] == "engine":
        raise EngineError(outcome[2])
    return outcome[1]


# --- before step 1 --------------------------------------------------------------------------------


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def run_facts(trainer) -> dict[str, Any]:
    """What must be the same on every rank, in words a person can compare."""
    tr, cfg = trainer, trainer.config
    path = tr.model.path
    size = os.path.getsize(path)
    facts: dict[str, Any] = {
        "protocol": PROTOCOL,
        "model file": f"{size:,} bytes, sha256 {cached_sha256(path)}",
        "dataset": f"sha256 {tr.dataset_sha256}",
    }
    h = hashlib.sha256()
    for e in tr.enc_train:
        h.update(np.ascontiguousarray(e.tokens, np.int64).tobytes())
        h.update(np.ascontiguousarray(e.trained, np.bool_).tobytes())
    if tr.weights is not None:
        h.update(np.ascontiguousarray(tr.weights, np.float64).tobytes())
    facts["encoded dataset (tokenizer and chat template)"] = (
        f"{len(tr.enc_train)} training and {tr.n_val} validation samples, sha256 {h.hexdigest()}"
    )
    params = tr.trainable.params()
    shapes = sorted((n, tuple(p.shape)) for n, p in params.items())
    facts["targets"] = (
        f"{len(tr.trainable.pairs)} LoRA pairs of rank {tr.trainable.rank} (alpha {tr.trainable.alpha:g}) "
        f"and {len(tr.trainable.full)} full tensors, {sum(p.size for p in params.values()):,} values, "
        f"sha256 {_digest(*shapes)}"
    )
    settings = {k: v for k, v in cfg.to_json().items() if k not in PER_RANK_SETTINGS}
    facts["settings"] = json.loads(json.dumps(settings, sort_keys=True, default=str))
    facts["adapter to continue"] = f"sha256 {cached_sha256(tr.init_adapter)}" if tr.init_adapter else "none"
    facts["resume"] = "from rank 0's checkpoint" if tr.resume else "a new run"  # rank 0 alone reads it
    return facts


def _differences(mine: dict, root: dict, rank: int) -> list[str]:
    """What differs between rank `rank`'s facts and rank 0's, one phrase each."""
    out = []
    for key in sorted(set(mine) | set(root), key=lambda k: list(root).index(k) if k in root else 99):
        a, b = root.get(key), mine.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            fields = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            said = ", ".join(f"{k}: rank 0 {a.get(k)!r}, rank {rank} {b.get(k)!r}" for k in fields)
            out.append(f"the settings differ ({said})")
        else:
            out.append(f"the {key} differs (rank 0: {a}; rank {rank}: {b})")
    return out


def join(trainer, failure: EngineError | None) -> None:
    """Every rank's facts (or its failure) to every rank; an `EngineError` on every rank when a rank
    failed or differs from rank 0; then rank 0's parameters and resume state on every rank."""
    tr, comm = trainer, trainer.comm
    facts = None
    if failure is None:
        try:
            facts = run_facts(tr)
        except (OSError, EngineError) as exc:
            failure = EngineError(f"its facts cannot be gathered: {exc}")
    mine = {"host": comm.host, "facts": facts, "failure": None if failure is None else str(failure)}
    everyone = comm.allgather_object(mine, timeout=SETUP_TIMEOUT_S)
    tr._joined = True
    tr.hosts = [other["host"] for other in everyone]
    problems = []
    for r, other in enumerate(everyone):
        who = f"rank {r} ({other['host']})"
        if other["failure"] is not None:
            problems.append(f"{who} cannot start: {other['failure']}")
    root = everyone[0]["facts"]
    if not problems:
        for r, other in enumerate(everyone[1:], start=1):
            diffs = _differences(other["facts"], root, r)
            if diffs:
                who = f"rank {r} ({other['host']}) does not match rank 0 ({everyone[0]['host']})"
                problems.append(f"{who}: " + "; ".join(diffs))
    if problems:
        raise EngineError(
            f"the {comm.size} ranks of this run do not agree before step 1, so nothing was trained: "
            + " | ".join(problems)
        )
    sync_from_root(tr, with_optimizer=bool(tr.resume), timeout=SETUP_TIMEOUT_S)


def sync_from_root(trainer, *, with_optimizer: bool, timeout: float | None = None) -> None:
    """Rank 0's parameters (and optimizer state, step, time and tokens: a resume) on every rank."""
    tr, comm = trainer, trainer.comm
    params = tr.trainable.params()
    comm.broadcast([params[n] for n in params], timeout=timeout)
    if not with_optimizer:
        return
    state = None
    if comm.is_root:
        state = {
            "optimizer": tr.optimizer.state_dict(),
            "step": tr.step,
            "seconds": tr.train_seconds,
            "tokens": tr.tokens_done,
            "checkpoint": tr.last_ckpt,
        }
    state = comm.broadcast_object(state, timeout=timeout)
    if not comm.is_root:
        tr.optimizer.load_state_dict(state["optimizer"])
        tr.step, tr.train_seconds, tr.last_ckpt = state["step"], state["seconds"], state["checkpoint"]
        tr.tokens_done = state["tokens"]


def check_same(trainer) -> bool:
    """Whether every rank holds the same parameters and optimizer moments (a digest of each,
    compared); when not, rank 0's are given to every rank and a warning logged. False then."""
    tr, comm = trainer, trainer.comm
    if not comm.parallel:
        return True
    h = hashlib.sha256()
    for name, p in tr.trainable.params().items():
        h.update(name.encode())
        h.update(np.ascontiguousarray(to_host(p)).tobytes())
    h.update(str(tr.optimizer.step_count).encode())
    digests = comm.allgather_object(h.hexdigest(), timeout=step_timeout(comm, tr._recent))
    if len(set(digests)) == 1:
        return True
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    tr.resyncs += 1
    log.warning("ranks %s drifted from rank 0 at step %d: rank 0's parameters go to all", differ, tr.step)
    sync_from_root(tr, with_optimizer=True, timeout=step_timeout(comm, tr._recent))
    return False
