"""The training loop: `Trainer.run(on_event, should_stop)`, plain Python with no UI in it.

A run loads the dataset (every problem reported, never fatal), holds out a validation split,
encodes and packs the samples, builds the trainable parameters (LoRA on the chosen targets and
full-weight copies), then takes AdamW steps with gradient accumulation, emitting the events of
`engine.train.events`. Rewards turn into per-sample weights (reward-weighted SFT) or advantages
(group-relative, optionally with a KL term to the base model).

Checkpoints are folders written atomically (temporary name, then rename) holding the adapter as a
llama.cpp-loadable GGUF, and `state.npz` with the exact parameters, optimizer moments and the
position in the data, so a resumed run continues the same trajectory bit for bit. A non-finite
loss or gradient stops the run with `Failed`, leaving the last good checkpoint untouched.

The run's settings and the files it writes and reads are `engine.train.config`. Trainer stays one
class (about 1,200 lines) on purpose: it is one run's state (data, parameters, optimizer, position,
record) that preparing, stepping, evaluating, checkpointing and finishing all read and change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from ..backend import select_backend, to_host
from ..errors import ConfigError, DatasetError, EngineError, ModelError
from ..model.lora import LoraAdapter
from ..model.model import Model
from ..model.targets import select_full, select_targets
from ..text.chat_template import ChatTemplate, template_for
from ..text.tokenizer import Tokenizer
from . import events as ev
from . import parallel
from .checkpoint import (
    SAMPLES_FILE,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from .collective import Collective, RankTimeout
from .config import (
    CONFIG_FILE,
    RESUMED,
    TrainConfig,
    check_run_paths,
    clean_stale_temporaries,
    full_model_path,
    os_error_text,
    replace_config,
    resolve_checkpoint,
)
from .data import Problem, Sample, save_jsonl
from .encode import Encoded, EncodeOptions
from .heap import keep_step_buffers
from .memory import MemoryEstimate, estimate_memory
from .optim import AdamW, GradAccumulator
from .pref_data import EncodedPair, PairBatches, PreparedPairs
from .prepared import KEPT, PackedBatches, PreparedData, default_cache_folder, prepare_data
from .rewards import group_advantages, reward_weights
from .runs import RunRecord, read_run, record_path, tensor_kinds
from .threads import adjust_blas_threads
from .train_model import Trainable, loss_and_grads
from .val_split import split_groups

log = logging.getLogger(__name__)

ETA_WINDOW = 10  # steps the ETA averages over
MAX_PARAM = 1e4  # |value| no trained weight reaches in a healthy run (LoRA factors are O(1) or less)
STALL_STEPS = 20  # steps of a flat loss with exploding norms before the run is flagged


MAX_PLAN_PROBLEMS = 1000  # dataset problems a Plan lists (it counts them all)


def _check_rank(model, targets: list[str], rank: int) -> None:
    """A rank above every adapted tensor's own rank (min of its two dimensions) adds nothing but
    memory anywhere: refuse it, naming the bound. (Above some tensors' is fine: rank-deficient.)"""
    if not targets:
        return
    best = max(min(model.tensors[n].shape[-2:]) for n in targets)
    if rank > best:
        raise ConfigError(
            f"LoRA rank {rank} is larger than any adapted tensor can use (at most {best} here): "
            f"choose a rank of at most {best}"
        )


class _Encodings(Sequence[Encoded]):
    """Prepared samples as a sequence of `Encoded` (rows of `data.samples`, with their indexes)."""

    def __init__(self, data: PreparedData, rows: np.ndarray, positions: np.ndarray):
        self.data, self.rows, self.positions = data, rows, positions

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Encoded:  # type: ignore[override]
        if not -len(self.rows) <= i < len(self.rows):
            raise IndexError(f"encoding {i} of {len(self.rows)}")
        return self.data.encoded(int(self.rows[i]), int(self.positions[i]))


def _plan_problems(
    data: PreparedData, train: np.ndarray, val: np.ndarray, rows_per_item: int = 1
) -> tuple[list[Problem], int]:
    """The first MAX_PLAN_PROBLEMS problems as a run meets them (reading the file, then encoding
    the training samples, then the validation ones; a sample made in memory is named by its
    position in its list), and how many there are. rows_per_item 2: prepared pairs, `train` and
    `val` numbering pairs (rows 2k and 2k + 1): a problem both answers of a pair have is one."""
    total = data.n_read_problems + data.n_encode_problems
    n = len(data) // rows_per_item
    side = np.zeros(n, dtype=np.int8)  # 0: training, 1: validation
    side[val] = 1
    position = np.zeros(n, dtype=np.int64)
    position[train], position[val] = np.arange(len(train)), np.arange(len(val))
    read: list[Problem] = []
    encoded: tuple[list[Problem], list[Problem]] = ([], [])
    seen: tuple[int, set[str]] = (-1, set())  # a pair's messages so far
    for stage, sample, problem in data.problems():  # those of reading first, then of encoding
        if stage == "read":
            if len(read) < MAX_PLAN_PROBLEMS:
                read.append(problem)
            continue
        item = sample // rows_per_item
        if rows_per_item > 1:
            if item != seen[0]:
                seen = (item, set())
            if problem.message in seen[1]:
                total -= 1
                continue
            seen[1].add(problem.message)
        which = encoded[side[item]]
        if len(read) + len(which) >= MAX_PLAN_PROBLEMS:
            if side[item] == 0 and rows_per_item == 1:
                break  # enough from the file and the training samples: the validation ones come after
            continue
        if not problem.line:
            problem = Problem(0, f"sample {position[item]}: {problem.message}", problem.severity)
        which.append(problem)
    return [*read, *encoded[0], *encoded[1]][:MAX_PLAN_PROBLEMS], total


class Trainer:
    """One training run of a model on a dataset. Build it, then call `run` (in a worker thread)."""

    def __init__(
        self,
        model: Model | str,
        data: str | list[Sample],
        config: TrainConfig = TrainConfig(),  # noqa: B008 - frozen dataclass
        *,
        template: ChatTemplate | str | None = None,
        resume: str | None = None,
        init_adapter: str | None = None,
        tokenizer: Tokenizer | None = None,
        template_file: str | None = None,
        collective: Collective | None = None,
    ):
        """tokenizer: the model's, when the caller has it built (an engine session): building a
        150k-token vocabulary takes ~0.1 s in one call that holds the interpreter lock.
        template_file: the file `template` was read from, when it came from one (no output of the
        run may replace it).
        collective: the ranks this run is spread over (engine.train.collective; one process by
        default); with several, every rank builds the same Trainer and calls the same methods, and
        rank 0 alone writes the checkpoints, the adapter and the run's record (engine.train.parallel)."""
        self.config = config
        self.comm = collective if collective is not None else Collective()
        self._joined = False  # the ranks exchanged their facts (engine.train.parallel.join)
        self._frozen: dict[str, tuple[Any, Any]] = {}  # left-out expert slices (_freeze_unreached)
        self._aux_coef = 0.0  # the load-balancing loss's weight where it applies (_router_aux_coef)
        self._step_aux: float | None = None  # its value in the last step (mean over the micro-batches)
        self.frozen_params = 0  # LoRA parameters in them
        self.hosts: list[str] = [self.comm.host]  # the machine of each rank (set by parallel.join)
        self.rank_lost = False  # the run failed because another rank stopped answering
        self.resyncs = 0  # times ranks that drifted from rank 0 were given its parameters (expect none)
        self._silent_rank: RankTimeout | None = None  # a rank stopped answering while ranks agreed to stop
        self.tokenizer = tokenizer
        if isinstance(model, Model):  # the model is open on its device already: the run computes there
            self.model = model
            self.backend = model.backend
        else:
            self.backend = select_backend(config.device)  # EngineError when the device cannot be used
            self.model = Model.load(model, cache_budget=0, backend=self.backend)
        self.data = data
        self.template_arg = template
        self.template_file = template_file or (template if isinstance(template, str) else None)
        self.resume = resume
        self.init_adapter = init_adapter
        self.trainable: Trainable | None = None
        self.optimizer: AdamW | None = None
        self.step = 0  # optimizer steps taken
        self.plan: ev.Plan | None = None  # set by start()
        self.ended = False  # finished, stopped or failed: no more steps
        self.train_seconds = 0.0  # time spent in steps (pauses excluded; carried by checkpoints)
        self.tokens_done = 0  # sample tokens processed by the steps taken (carried by checkpoints)
        self.dataset_path: str | None = None  # the dataset file trained (None: samples in memory)
        self.samples_file: str | None = None  # the run's copy of in-memory samples, in its checkpoint folder
        self._recent: deque[float] = deque(maxlen=ETA_WINDOW + 1)  # seconds of the last steps
        self.last_ce: float | None = None
        self.last_ckpt: str | None = resume
        self.record: RunRecord | None = None  # engine.train.runs: written at start, checkpoints, end
        self._loss_window: deque[float] = deque(maxlen=STALL_STEPS)
        self._norm_window: deque[float] = deque(maxlen=STALL_STEPS)
        self._stall_warned = False
        self.preference = None  # the PreferenceObjective of a DPO or ORPO run (engine.train.preferences)
        # the conversations of sample_from_validation (engine.train.samples.validation_prompts)
        self.validation_prompts: list[tuple[dict, ...]] = []

    def inputs(self) -> dict[str, str | None]:
        """Every file the run reads, by what it is: no output may replace one (check_run_paths)."""
        return {
            "model": self.model.path,
            "dataset": os.fspath(self.data) if isinstance(self.data, (str, os.PathLike)) else None,
            "adapter to continue": self.init_adapter,
            RESUMED: self.resume,
            "chat template": self.template_file,
        }

    # --- data ---------------------------------------------------------------------------------
    def _prepare(self) -> PackedBatches:
        """Prepare the dataset (engine.train.prepared: from the cache when nothing that shaped it
        changed), split it, weight it by rewards, and pack the first epoch."""
        cfg = self.config
        md = self.model.metadata
        tok = self.tokenizer if self.tokenizer is not None else Tokenizer.from_metadata(md, self.model.path)
        if isinstance(self.template_arg, ChatTemplate):
            template = self.template_arg
        else:  # a template file, or the model's own
            template = template_for(md, self.template_arg)
        self._sample_text = (tok, template)  # what sample answers are prompted and decoded with
        pairs = cfg.objective != "sft"  # DPO / ORPO: each preference pair prepared as two rows
        options = EncodeOptions(  # a pair's answers alone are trained: their log-probabilities count
            n_ctx=cfg.n_ctx,
            train_on_prompt=cfg.train_on_prompt and not pairs,
            prompt_format=cfg.prompt_format,
        )
        if isinstance(self.data, str):
            cache = {"auto": default_cache_folder(), "off": None}.get(cfg.data_cache, cfg.data_cache)
            data = prepare_data(self.data, tok, template, options, cache=cache, pairs=pairs)
            self.dataset_sha256 = data.dataset_sha256
            own = cfg.checkpoint_dir and os.path.abspath(self.data) == os.path.abspath(
                os.path.join(cfg.checkpoint_dir, SAMPLES_FILE)
            )
            if own:  # a run of in-memory samples, resumed on its own copy of them
                self.samples_file = SAMPLES_FILE
            else:
                self.dataset_path = os.path.abspath(self.data)
        else:
            samples = list(self.data)
            data = prepare_data(samples, tok, template, options, pairs=pairs)
            self.dataset_sha256 = hashlib.sha256(
                json.dumps([asdict(s) for s in samples], sort_keys=True, default=str).encode()
            ).hexdigest()
            if cfg.checkpoint_dir and samples:
                # samples from the app's editor: a copy beside the checkpoints, so that the run can be
                # resumed on exactly these samples after the editor changed or the app closed (rank 0)
                if self.comm.is_root:
                    os.makedirs(cfg.checkpoint_dir, exist_ok=True)
                    save_jsonl(os.path.join(cfg.checkpoint_dir, SAMPLES_FILE), samples)
                self.samples_file = SAMPLES_FILE
        self.prepared = data
        if pairs:
            return self._prepare_pairs(data)
        table = data.samples
        if not len(table):
            n = data.n_read_problems
            raise DatasetError("the dataset has no usable sample" + (f" ({n} problems)" if n else ""))
        train, val = split_groups(table["group"], cfg.val_split, cfg.seed)
        kept = (table["flags"] & KEPT).astype(bool)
        train_pos, val_pos = np.flatnonzero(kept[train]), np.flatnonzero(kept[val])
        self.problems, self.problems_total = _plan_problems(data, train, val)
        if not len(train_pos):
            raise DatasetError(
                "no training sample is left after encoding: " + "; ".join(str(p) for p in self.problems[:5])
            )
        rewards = [None if math.isnan(r) else r for r in table["reward"][train].tolist()]
        weights, normalize = None, "tokens"
        if cfg.reward_mode == "weighted":
            weights = reward_weights(rewards)
        elif cfg.reward_mode == "group":
            weights = group_advantages(rewards, table["group"][train].tolist())
            normalize = "samples"
        elif cfg.reward_mode != "none":
            raise DatasetError(f"unknown reward mode {cfg.reward_mode!r} (none, weighted, group)")
        self.train_rows, self.train_pos = train[train_pos], train_pos
        self.weights, self.normalize = weights, normalize
        self.val_batches = (
            PackedBatches(data, val[val_pos], val_pos, None, cfg.n_ctx, cfg.batch_size)
            if len(val_pos)
            else []
        )
        self.n_train, self.n_val = len(train), len(val)
        self._find_validation_prompts(val[val_pos])
        self._epoch_cache: dict[int, PackedBatches] = {}
        return self.batches_for_epoch(0)

    def _prepare_pairs(self, data: PreparedData) -> PairBatches:
        """DPO and ORPO: the prepared pairs (rows 2k and 2k + 1: pair k's chosen and rejected
        answers), split by prompt (the held-out pairs: the held-out accuracy), `batch_size` pairs a
        batch; a pair with an answer that could not be encoded is left out."""
        from .preferences import PreferenceObjective

        cfg = self.config
        table = data.samples
        flags = table["flags"].reshape(-1, 2)
        kept = ((flags[:, 0] & KEPT) & (flags[:, 1] & KEPT)).astype(bool)
        train, val = split_groups(table["group"][0::2], cfg.val_split, cfg.seed)
        train_pos, val_pos = np.flatnonzero(kept[train]), np.flatnonzero(kept[val])
        self.problems, self.problems_total = _plan_problems(data, train, val, rows_per_item=2)
        if not len(train_pos):
            raise DatasetError(
                f"no preference pair to train with {cfg.objective.upper()}: the dataset needs lines with "
                '"prompt" (or "messages"), "chosen" and "rejected"'
                + ("; " + "; ".join(str(p) for p in self.problems[:3]) if self.problems else "")
            )
        self.train_rows, self.train_pos = train[train_pos], train_pos  # pair numbers
        self.weights, self.normalize = None, "tokens"
        self.val_batches = (
            PairBatches(PreparedPairs(data, val[val_pos]), cfg.n_ctx, cfg.batch_size) if len(val_pos) else []
        )
        self.n_train, self.n_val = len(train_pos), len(val_pos)
        self._find_validation_prompts(2 * val[val_pos])  # each pair's chosen row
        self.preference = PreferenceObjective(
            self.model, cfg.objective, beta=cfg.dpo_beta, lam=cfg.orpo_lambda
        )
        self._epoch_cache = {}
        return self.batches_for_epoch(0)

    @property
    def enc_train(self) -> Sequence[Encoded] | Sequence[EncodedPair]:
        """The training samples that are trained on, encoded, in the order of the training list
        (each made from the prepared files when read); a preference run's pairs."""
        if self.preference is not None:
            return PreparedPairs(self.prepared, self.train_rows)
        return _Encodings(self.prepared, self.train_rows, self.train_pos)

    def batches_for_epoch(self, epoch: int) -> PackedBatches | PairBatches:
        """Deterministic batches of one epoch (shuffled by seed + epoch): the basis of exact resume."""
        if epoch not in self._epoch_cache and self.preference is not None:
            cfg = self.config
            self._epoch_cache = {epoch: PairBatches(self.enc_train, cfg.n_ctx, cfg.batch_size,
                                                    shuffle_seed=cfg.seed + epoch)}  # fmt: skip
        if epoch not in self._epoch_cache:
            self._epoch_cache = {
                epoch: PackedBatches(
                    self.prepared,
                    self.train_rows,
                    self.train_pos,
                    self.weights,
                    self.config.n_ctx,
                    self.config.batch_size,
                    shuffle_seed=self.config.seed + epoch,
                    normalize=self.normalize,
                )
            }
        return self._epoch_cache[epoch]

    # --- parameters ---------------------------------------------------------------------------
    def _build_trainable(self) -> Trainable:
        cfg, model = self.config, self.model
        if self.init_adapter:
            tr = Trainable.from_adapter(LoraAdapter.load(self.init_adapter, model), model)
        else:
            targets = (
                select_targets(model.tensors, cfg.targets, model.config.L)
                if cfg.targets.preset != "none" or cfg.targets.patterns
                else []
            )
            _check_rank(model, targets, cfg.rank)
            tr = Trainable.init(model, targets, cfg.rank, cfg.alpha, (), cfg.seed, cfg.lora_init)
        full = select_full(model.tensors, cfg.full, model.config.L) if cfg.full else []
        xp = self.backend.xp
        tr.full = {n: xp.array(model.weights.dense(n), copy=True) for n in full if n in model.weights}
        if not tr.pairs and not tr.full:
            raise ModelError("nothing to train: choose LoRA targets or full-weight tensors")
        return tr.to(self.backend)

    def _freeze_unreached(self) -> None:
        """With skip_unreached_experts: the routed-expert factor slices of the experts the routing census
        says no token reaches (engine.train.census), kept at their values (no gradient, no update)."""
        self._frozen = {}  # optimizer param name -> (expert indices, their values)
        self.frozen_params = 0
        if not self.config.skip_unreached_experts or not any(self.model.moe_layers):
            return
        if not any(A.ndim == 3 for A, _ in self.trainable.pairs.values()):
            return
        from .census import census_of, left_out

        cache = "auto" if self.config.data_cache != "off" else None
        census = census_of(self.model, self.prepared, cache=cache)
        shapes = {
            n: tuple(self.model.tensors[n].shape) for n in self.trainable.pairs if n in self.model.tensors
        }
        out = left_out(census, shapes, self.trainable.rank)
        self.frozen_params = out.params
        xp = self.backend.xp
        for name, experts in out.frozen.items():
            idx = xp.asarray(experts)
            for suffix, p in zip((".lora_a", ".lora_b"), self.trainable.pairs[name], strict=True):
                self._frozen[name + suffix] = (idx, p[idx].copy())
        log.info("leaving out unreached experts: %s", out.describe())

    def _router_aux_coef(self) -> float:
        """The load-balancing loss's weight: router_aux_coef when the run trains a MoE model's router
        (LoRA or full), else 0 (logged). A preference objective or several ranks refuse it."""
        coef = self.config.router_aux_coef
        if not coef:
            return 0.0
        from ..model.targets import split_name

        names = list(self.trainable.pairs) + list(self.trainable.full)
        if not any(self.model.moe_layers) or not any(split_name(n)[1] == "ffn_gate_inp" for n in names):
            log.warning("router_aux_coef %g is not used: the run trains no MoE router (ffn_gate_inp)", coef)
            return 0.0
        if self.config.objective != "sft":
            raise ConfigError("the load-balancing loss (router_aux_coef) trains with the SFT objective only")
        if self.comm.parallel:
            raise ConfigError(
                "the load-balancing loss (router_aux_coef) trains in one process: run without --ranks"
            )
        return float(coef)

    def _step_frozen(self, grads):
        """The optimizer step with the left-out expert slices given no gradient (so they count in no
        norm or clipping) and put back to their values after it (weight decay moves nothing)."""
        for name, (idx, _) in self._frozen.items():
            if name in grads:
                grads[name][idx] = 0
        stats = self.optimizer.step(grads)
        params = self.optimizer.params
        for name, (idx, values) in self._frozen.items():
            params[name][idx] = values
        return stats

    def _plan_memory(self) -> MemoryEstimate:
        """The run's memory plan: refuse what cannot fit (before any weight is dequantized), then
        set the weight cache's budget and whether layers are checkpointed."""
        cfg, model = self.config, self.model
        available = None
        if self.backend.is_gpu:
            from ..io.device_weights import device_free_bytes

            available = device_free_bytes(self.backend.xp)  # None on an emulated device: the host's
        est = estimate_memory(
            model.config,
            model.tensors,
            self.trainable.n_params,
            # a batch of preference pairs holds two answers per pair
            cfg if self.preference is None else replace_config(cfg, batch_size=2 * cfg.batch_size),
            lora_targets=self.trainable.pairs,
            checkpoint=cfg.checkpoint_choice,
            budget=cfg.cache_budget,
            itemsize=np.dtype(model.dtype).itemsize,
            available=available,
        )
        if not est.fits():
            where = f"on {self.backend.device}: " if self.backend.is_gpu else ""
            raise ModelError(where + est.advice(cfg))
        model.weights.set_budget(est.budget)
        log.info(
            "memory plan: %.0f MiB at peak (cache budget %.0f MiB, checkpointing %s)",
            est.total / 2**20, est.budget / 2**20, "on" if est.checkpoint else "off",
        )  # fmt: skip
        return est

    # --- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, folder: str) -> str:
        """Write adapter + exact state into `folder/ckpt-<step>` atomically; prune old checkpoints."""
        from ..export.write import export_adapter

        meta = {
            "step": self.step,
            "total_steps": self.plan.total_steps if self.plan is not None else 0,
            "config": self.config.to_json(),
            "model": os.path.abspath(self.model.path),
            "dataset": self.dataset_path,
            "dataset_sha256": self.dataset_sha256,
            "samples_file": self.samples_file,
            "tokens": self.tokens_done,
            "seconds": self.train_seconds,
            "rank": self.trainable.rank,
            "alpha": self.trainable.alpha,
            "lora_targets": sorted(self.trainable.pairs),
            "full": sorted(self.trainable.full),
            "ranks": self.comm.size,  # a checkpoint resumes with any number of ranks
        }
        adapter = None
        if self.trainable.pairs:

            def adapter(path: str) -> None:
                export_adapter(self._adapter(), path, training=self._training_facts())

        return write_checkpoint(
            folder,
            self.step,
            params={k: to_host(v) for k, v in self.trainable.params().items()},
            optimizer=self.optimizer.state_dict(),
            meta=meta,
            meta_file=CONFIG_FILE,
            extra={
                "trainer.step": self.step,
                "trainer.seconds": self.train_seconds,
                "trainer.tokens": self.tokens_done,
            },
            write_adapter=adapter,
            keep=self.config.keep_checkpoints,
        )

    def _load_checkpoint(self, path: str) -> None:
        try:
            meta, saved, optim, other = read_checkpoint(path, CONFIG_FILE)
        except CheckpointError as exc:
            raise ModelError(str(exc)) from exc
        params = self.trainable.params()
        if set(saved) != set(params):
            raise ModelError(
                f"{path}: checkpoint trains {len(saved)} tensors, this run {len(params)}; "
                "resume with the same targets, rank and full-weight tensors"
            )
        for k, v in saved.items():
            if v.shape != params[k].shape:
                raise ModelError(f"{path}: {k} has shape {v.shape} in the checkpoint, {params[k].shape} here")
            params[k][...] = self.backend.asarray(v, params[k].dtype)
        self.optimizer.load_state_dict(optim)
        if "trainer.step" not in other:
            raise ModelError(f"{path}: not a training-run checkpoint (it has no step count)")
        self.step = int(other["trainer.step"])
        self.train_seconds = float(other.get("trainer.seconds", 0.0))
        self.tokens_done = int(other.get("trainer.tokens", meta.get("tokens", 0)) or 0)
        if meta.get("step") != self.step:
            raise ModelError(f"{path}: inconsistent checkpoint (step {meta.get('step')} vs {self.step})")

    def _planned_note(self) -> str:
        """ " (it planned N steps)" from the checkpoint being resumed, when it says."""
        try:
            with open(os.path.join(self.resume, CONFIG_FILE), encoding="utf-8") as f:
                planned = int(json.load(f).get("total_steps", 0) or 0)
        except (OSError, ValueError, TypeError, AttributeError):
            planned = 0
        return f" (it planned {planned} steps)" if planned else ""

    def sample_answers(self) -> ev.SampleAnswers:
        """The greedy answers to `config.sample_prompts` with the adapter as it is now."""
        from .samples import answer_prompts

        tok, template = self._sample_text
        terms = self.trainable.terms() if self.trainable.pairs else None
        prompts = [*self.config.sample_prompts, *self.validation_prompts]
        n = self.config.sample_tokens
        return answer_prompts(self.model, tok, template, prompts, terms, step=self.step, max_new_tokens=n)

    def _find_validation_prompts(self, rows: np.ndarray) -> None:
        """The prompts of the first `sample_from_validation` validation samples (`rows`), or none."""
        from .samples import validation_prompts

        want = self.config.sample_from_validation
        if not want or not self.comm.is_root:
            return
        source = self.data if isinstance(self.data, str) else list(self.data)
        self.validation_prompts = validation_prompts(
            source, np.sort(rows), want, pairs=self.config.objective != "sft"
        )

    def _validation_prompts_warning(self) -> ev.RunWarning | None:
        """What a run asked to answer validation prompts and has none says."""
        cfg = self.config
        if not cfg.sample_from_validation or self.validation_prompts or not self.comm.is_root:
            return None
        if not cfg.sample_every:
            return None
        why = (
            "there is no validation split (set one, e.g. 0.1)"
            if not self.n_val
            else f"none of its {self.n_val} validation samples has a prompt (text samples have none)"
        )
        return ev.RunWarning(
            self.step,
            f"no sample answers from the validation split: {why}"
            + ("; the typed prompts are answered" if cfg.sample_prompts else ""),
        )

    def _adapter(self) -> LoraAdapter:
        return self.trainable.to_adapter(self.model.config.arch)

    def _training_facts(self) -> dict:
        return {
            "training.rank": self.trainable.rank,
            "training.targets": sorted(self.trainable.pairs),
            "training.steps": self.step,
            "training.final_loss": float(self.last_ce) if self.last_ce is not None else float("nan"),
            "training.dataset_sha256": self.dataset_sha256,
            "training.base_model": os.path.basename(self.model.path),
            "training.reward_mode": self.config.reward_mode,
            "training.objective": self.config.objective,
            "training.tool": "tune-studio",
        }

    # --- the loop -----------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self.plan is not None

    @property
    def done(self) -> bool:
        """Every planned step is taken (or the run ended)."""
        return self.ended or (self.plan is not None and self.step >= self.plan.total_steps)

    def start(self, on_event: Callable[[object], None] = lambda e: None) -> ev.Started | ev.Failed:
        """Prepare the run (data, parameters, memory plan, optimizer, resume) and emit `Started`.

        Every problem (bad data, a model that cannot train, a run that will not fit) ends in a
        `Failed` event instead, and the run is over."""
        self.last_ce = None
        root = self.comm.is_root  # with several ranks only rank 0 reads the checkpoint and writes files
        try:
            cfg = self.config
            if self.resume and root:
                self.resume = resolve_checkpoint(self.resume)
            self.last_ckpt = self.resume
            if root:
                check_run_paths(cfg, self.inputs())
                clean_stale_temporaries(cfg.checkpoint_dir)
                if cfg.out:
                    clean_stale_temporaries(os.path.dirname(os.path.abspath(cfg.out)), max_age_s=600)
            if self.comm.parallel and cfg.objective != "sft":
                raise ConfigError(
                    f"{cfg.objective.upper()} trains in one process: its loss compares the two answers of "
                    "each pair, which cannot be split across processes. Train it without --ranks (on "
                    "one process)"
                )
            batches = self._prepare()
            cfg = self.config
            n_batches = len(batches)
            total = cfg.steps or max(1, math.ceil(cfg.epochs * n_batches / cfg.grad_accum))
            self.trainable = self._build_trainable()
            self.memory = self._plan_memory()
            self.optimizer = AdamW(self.trainable.params(), cfg.optim(total), runtime=self.backend.runtime)
            if self.resume and root:
                self._load_checkpoint(self.resume)
            if self.comm.parallel:  # every rank's facts checked, then rank 0's state on every rank
                parallel.join(self, None)
            self._freeze_unreached()
            self._aux_coef = self._router_aux_coef()
            if self.resume and self.step >= total:  # every rank has rank 0's step now: all fail alike
                raise ConfigError(
                    f"the checkpoint is at step {self.step} and these settings plan {total} steps: "
                    "nothing is left to train. Resume with the checkpoint's own settings"
                    + self._planned_note()
                )
            self.plan = ev.Plan(
                n_train=self.n_train,
                n_val=self.n_val,
                n_windows=batches.n_windows,
                tokens_per_epoch=batches.n_tokens,
                label_tokens_per_epoch=batches.n_label_tokens,
                batches_per_epoch=n_batches,
                total_steps=total,
                trainable_params=self.trainable.n_params - self.frozen_params,
                lora_targets=tuple(self.trainable.pairs),
                full_tensors=tuple(self.trainable.full),
                memory_bytes=self.memory.to_dict(),
                problems=tuple(str(p) for p in self.problems),
                start_step=self.step,
                start_tokens=self.tokens_done,
                start_seconds=self.train_seconds,
                ranks=self.comm.size,
                hosts=tuple(self.hosts),
                model=self.model.path,
                lora_rank=self.trainable.rank,
                lora_alpha=self.trainable.alpha,
                dataset=self.data if isinstance(self.data, str) else f"{len(self.data)} samples (edited)",
                problems_total=self.problems_total,
                objective=cfg.objective,
            )
        except EngineError as exc:
            if self.comm.parallel and not self._joined:
                try:  # the other ranks wait for this one's word before step 1: it is this failure
                    parallel.join(self, exc)
                except EngineError as joined:
                    exc = joined
            self.ended = True
            failed = ev.Failed(0, str(exc), self.last_ckpt)
            record = record_path(self.config.checkpoint_dir, self.config.out)
            if not (self.resume and record and os.path.exists(record)):  # a resume refused before its
                self._note("failed", str(exc))  # first step leaves the record of the run it resumes as it was
            on_event(failed)
            return failed
        self._accumulator = GradAccumulator()
        self._fused = self._graph = None
        self._fused_why = self._fused_reason()
        self._fused_runs = 0
        started = ev.Started(self.plan)
        self._note("running")
        on_event(started)
        warning = self._validation_prompts_warning()
        if warning is not None:
            on_event(warning)
        return started

    def train_step(self, on_event: Callable[[object], None] = lambda e: None) -> ev.Step | ev.Failed:
        """One optimizer step and the events that follow it (norms, evaluation, checkpoint).

        A non-finite loss or gradient ends the run with `Failed`, keeping the last good checkpoint."""
        assert self.plan is not None and not self.done, "start() the run first; it must have steps left"
        if not self.backend.is_gpu:
            adjust_blas_threads()  # the cores other programs leave free, before each step
            keep_step_buffers()  # once per process: no page faults for the same buffers every step
        t_step = time.perf_counter()
        if self._fused_why is None:
            return self._fused_train_step(on_event, t_step)
        figures = None
        if self.comm.parallel:  # this rank's share of the step, summed over the ranks
            try:
                loss, ce_sum, n_label, n_tok, counts, grads, m = parallel.sharded_step(self)
            except RankTimeout as exc:
                return self._lost(on_event, exc)
        else:
            loss, ce_sum, n_label, n_tok, counts, grads, m, figures = self._local_step()
        if not math.isfinite(loss):
            return self._fail(
                on_event,
                f"the loss became {loss} at step {self.step + 1}: training stopped. "
                "Lower the learning rate or check the data; the last good checkpoint is kept.",
            )
        stats = self._step_frozen(grads)
        if not math.isfinite(stats.grad_norm):
            return self._fail(
                on_event,
                f"the gradient became {stats.grad_norm} at step {self.step + 1}: "
                "training stopped; lower the learning rate. The last good checkpoint is kept.",
            )
        return self._after_step(
            on_event, t_step, m, loss, ce_sum, n_label, n_tok, stats, counts, self._exploded(), figures
        )

    def _after_step(self, on_event, t_step, m, loss, ce_sum, n_label, n_tok, stats, counts, exploded,
                    figures=None):  # fmt: skip
        """What follows an optimizer step on either path: the exploded-weights check, the Step event,
        norms, evaluation, checkpoint. figures: a preference run's, per micro-batch."""
        cfg = self.config
        total, n_batches = self.plan.total_steps, self.plan.batches_per_epoch
        if exploded:
            return self._fail(
                on_event,
                f"the trained weights {exploded} after step {self.step + 1} (learning rate {stats.lr:.3g}): "
                "training stopped before writing them; lower the learning rate. The last good checkpoint "
                "is kept.",
            )
        self.step += 1
        self.tokens_done += n_tok
        self.last_ce = ce_sum / max(1, n_label) if not figures else loss  # a preference run: its objective
        seconds = time.perf_counter() - t_step
        self.train_seconds += seconds
        self._recent.append(seconds)
        step = ev.Step(
            self.step,
            total,
            m / n_batches + 1 / n_batches,
            loss,
            self.last_ce,
            stats.lr,
            stats.grad_norm,
            n_tok,
            n_tok / max(seconds, 1e-9),
            self.train_seconds,
            self._eta(total - self.step),
            self._step_aux,
        )
        if self.record is not None:
            self.record.add_loss(self.step, self.last_ce)
        on_event(step)
        if figures:
            from .preferences import merge_figures

            on_event(ev.PreferenceStep(self.step, self.config.objective, **asdict(merge_figures(figures))))
        if self.trainable.pairs:
            self._loss_window.append(self.last_ce)
            self._norm_window.append(stats.param_norm)
            self._watch_progress(on_event)
        if counts is not None:
            on_event(ev.ExpertUsage(self.step, to_host(counts)))
        norms_due = self.trainable.pairs and cfg.norms_every and self.step % cfg.norms_every == 0
        if norms_due and self.comm.is_root:  # what only rank 0 reports, only rank 0 computes
            on_event(self._norms_event())
        has_prompts = cfg.sample_prompts or self.validation_prompts
        samples_due = cfg.sample_every and has_prompts and self.step % cfg.sample_every == 0
        if samples_due and self.comm.is_root:
            answers = self.sample_answers()
            if self.record is not None:  # kept in the run's record too (the Runs page shows them)
                self.record.add_sample_answers(answers.step, answers.prompts, answers.answers)
            on_event(answers)
        try:
            if self.val_batches and cfg.eval_every and self.step % cfg.eval_every == 0:
                on_event(self.evaluate())
            if cfg.checkpoint_dir and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                parallel.check_same(self)  # every rank holds rank 0's parameters (one digest each)
                path = parallel.on_root(
                    self.comm,
                    lambda: self.save_checkpoint(cfg.checkpoint_dir),
                    timeout=parallel.step_timeout(self.comm, self._recent),
                )
            else:
                return step
        except OSError as exc:
            why = os_error_text(exc)
            return self._fail(
                on_event,
                f"the checkpoint of step {self.step} could not be written: {why}. Training stopped; "
                "the last good checkpoint is kept.",
            )
        except RankTimeout as exc:
            return self._lost(on_event, exc)
        except EngineError as exc:  # rank 0 could not write the checkpoint
            return self._fail(on_event, f"{exc}. Training stopped; the last good checkpoint is kept.")
        self.last_ckpt = path
        self._note("running")
        on_event(ev.Checkpoint(self.step, self.last_ckpt))
        return step

    # --- the fused GPU step ----------------------------------------------------------------------
    def _fused_reason(self) -> str | None:
        """Why this run takes the generic op-by-op path (logged on a GPU), or None: the fused step."""
        if not self.backend.is_gpu:
            return "CPU"
        if self.comm.parallel:
            return "data-parallel ranks take the generic step"
        from .dense_step import unsupported

        cfg = self.config
        if self.preference is not None:  # the fused step computes the weighted cross-entropy alone
            why = "a preference objective"
        elif self._aux_coef:  # the fused step computes the cross-entropy alone
            why = "the router's load-balancing loss"
        elif self._frozen:  # the fused step updates every factor slice
            why = "experts the data never reaches are left out"
        elif cfg.gpu_step == "generic":
            why = "gpu_step is generic"
        else:
            kl = cfg.reward_mode == "group" and cfg.kl_coef > 0
            why = unsupported(self.model, self.trainable, cfg.grad_accum, kl, self.memory.checkpoint)
        if why:
            log.info("training step: the generic op-by-op path (%s)", why)
        return why

    def _fused_train_step(self, on_event, t_step: float):
        """One step of the fused step (engine.train.dense_step; MoE layers: engine.train.moe_step): the
        inputs uploaded, the step replayed as a CUDA graph (captured at the second step; the first runs
        eagerly and warms up: kernels loaded, memory pools grown), one read of its scalars (and expert
        counts) at the end."""
        from .dense_step import DenseStep, stats_of
        from .optim import StepStats, lr_at

        cfg = self.config
        n_batches = self.plan.batches_per_epoch
        m = self.step  # grad_accum is 1 on this path
        batch = self.batches_for_epoch(m // n_batches)[m % n_batches]
        if self._fused is None:
            self._fused = DenseStep(self.model, self.trainable, self.optimizer, cfg.batch_size, cfg.n_ctx)
            how = "captured as a CUDA graph from the second step" if cfg.gpu_step == "graph" else "eager"
            log.info("training step: the fused step (%s)", how)
        fused = self._fused
        lr = lr_at(self.optimizer.cfg, self.optimizer.step_count)
        n_label = fused.load(batch, lr)
        with self.backend.active():
            if self._graph is None and cfg.gpu_step == "graph" and self._fused_runs == 1:
                failed = None
                try:
                    with self.backend.runtime.capture() as graph:
                        fused.run()
                    self._graph = graph
                except Exception as exc:  # noqa: BLE001 - any failure to capture means eager steps
                    log.warning("training step: runs eagerly, the capture as a CUDA graph failed (%s: %s)",
                                type(exc).__name__, exc)  # fmt: skip
                    self.config = cfg = replace_config(cfg, gpu_step="eager")
                    failed = getattr(exc, "graph", None)
                if failed is not None:  # the failed capture's temporaries are free now: give them back
                    failed.release()
            if self._graph is not None:
                self._graph.replay()
            else:
                fused.run()
        self._fused_runs += 1
        st, counts = fused.read()  # the step's one host read (its scalars and the expert counts)
        fused.finish(st)
        loss, ce_sum = st["loss"], st["ce_sum"]
        if not math.isfinite(loss):
            return self._fail(
                on_event,
                f"the loss became {loss} at step {self.step + 1}: training stopped. "
                "Lower the learning rate or check the data; the last good checkpoint is kept.",
            )
        grad_norm, update_norm, param_norm, peak = stats_of(st)
        if not math.isfinite(grad_norm):
            return self._fail(
                on_event,
                f"the gradient became {grad_norm} at step {self.step + 1}: "
                "training stopped; lower the learning rate. The last good checkpoint is kept.",
            )
        stats = StepStats(lr, grad_norm, bool(st["clipped"]), update_norm, param_norm)
        exploded = None
        if st["nonfinite_params"]:
            exploded = f"became non-finite ({int(st['nonfinite_params'])} values)"
        elif peak > MAX_PARAM:
            exploded = f"exploded to {peak:.3g}"
        n_tok = batch.n_tokens
        return self._after_step(on_event, t_step, m, loss, ce_sum, n_label, n_tok, stats, counts, exploded)

    def _local_step(self):
        """The step's micro-batches in this process: (loss, ce_sum, label tokens, sample tokens,
        expert counts, gradients, index of the last micro-batch, a preference run's figures per
        micro-batch)."""
        cfg = self.config
        n_batches = self.plan.batches_per_epoch
        acc = self._accumulator
        acc.reset()
        loss = ce_sum = 0.0
        n_tok = n_label = 0
        counts = grads = None
        figures = []
        aux = 0.0
        for j in range(cfg.grad_accum):
            m = self.step * cfg.grad_accum + j  # global micro-batch index
            batch = self.batches_for_epoch(m // n_batches)[m % n_batches]
            if self.preference is not None:
                res = self.preference.loss_and_grads(self.trainable, batch, checkpoint=self.memory.checkpoint)
                figures.append(res.extra)
            else:
                res = loss_and_grads(
                    self.model,
                    self.trainable,
                    batch,
                    checkpoint=self.memory.checkpoint,
                    kl_coef=cfg.kl_coef if cfg.reward_mode == "group" else 0.0,
                    router_aux_coef=self._aux_coef,
                )
            if res.router_aux is not None:
                aux += res.router_aux / cfg.grad_accum
            if cfg.grad_accum > 1:
                acc.add(res.grads)
            else:
                grads = res.grads  # one micro-batch: its gradients are the step's, no copies
            loss += res.loss / cfg.grad_accum
            ce_sum += res.ce_sum
            n_label += res.n_tokens
            n_tok += batch.n_tokens
            if res.expert_counts is not None:
                counts = res.expert_counts if counts is None else counts + res.expert_counts
        self._step_aux = aux if self._aux_coef else None
        return loss, ce_sum, n_label, n_tok, counts, acc.mean() if cfg.grad_accum > 1 else grads, m, figures

    def _exploded(self) -> str | None:
        """What is wrong with the parameters after a step (not finite, or far beyond what training
        produces: |value| > MAX_PARAM), or None. Checked before they can reach a checkpoint."""
        params = {n: p for n, p in self.trainable.params().items() if p.size}
        if not params:
            return None
        xp = self.backend.xp
        peaks = to_host(xp.stack([xp.max(xp.abs(p)) for p in params.values()]))  # one read
        for name, peak in zip(params, peaks.tolist(), strict=True):
            if not math.isfinite(peak):
                return f"became {peak} ({name})"
            if peak > MAX_PARAM:
                return f"exploded to {peak:.3g} ({name})"
        return None

    def _watch_progress(self, on_event) -> None:
        """Flag, once, a run whose loss stopped moving while its adapter norms keep exploding."""
        if self._stall_warned or len(self._loss_window) < STALL_STEPS:
            return
        losses, norms = list(self._loss_window), list(self._norm_window)
        flat = abs(losses[-1] - losses[0]) <= 0.01 * max(abs(losses[0]), 1e-6)
        growing = norms[0] > 0 and norms[-1] > 10.0 * norms[0]
        if flat and growing:
            self._stall_warned = True
            growth = norms[-1] / norms[0]
            message = (
                f"the loss has not moved for {STALL_STEPS} steps (about {losses[-1]:.4g}) while the "
                f"adapter's norm grew {growth:.0f}x: the learning rate ({self.config.lr:g}) is probably "
                "too high; stop and lower it"
            )
            on_event(ev.RunWarning(self.step, message))

    def _eta(self, steps_left: int) -> float:
        """Seconds to the end from the mean of the last steps, the first step of a start excluded
        (it warms caches: dequantization, allocations)."""
        recent = list(self._recent)[1:] if len(self._recent) > 1 else list(self._recent)
        recent = recent[-ETA_WINDOW:]
        return (sum(recent) / len(recent)) * steps_left if recent else float("nan")

    def finish(self, on_event: Callable[[object], None] = lambda e: None, *, stopped: bool = False):
        """End the run: a last evaluation (when it ran to the end), a checkpoint, the adapter (and
        the model of full-weight tensors); `Finished`, or `Failed` when a file cannot be written."""
        cfg = self.config
        if self._silent_rank is not None:  # the stop was agreed without one rank: fail, write nothing
            self.ended = True
            return self._lost(on_event, self._silent_rank)
        if not stopped and self.val_batches and not (cfg.eval_every and self.step % cfg.eval_every == 0):
            try:
                on_event(self.evaluate())
            except RankTimeout as exc:
                return self._lost(on_event, exc)
        self.ended = True
        try:
            return self._finish(on_event, stopped=stopped, last_ckpt=self.last_ckpt)
        finally:
            self.release_step()

    def release_step(self) -> None:
        """Give back the fused step's device buffers and its captured graph's memory (what a run holds
        on the device besides the model, the adapter and the optimizer's moments), as the run ends. A
        later step builds the fused step again and runs it eagerly (a run captures its step once)."""
        graph, self._graph, self._fused = self._graph, None, None
        if graph is not None:
            graph.release()

    def agree_stop(self, requested: bool) -> bool:
        """Whether the run stops before its next step: `requested` in one process; with several
        ranks, True on every rank as soon as one asks (a stop reaches them at different moments)."""
        if not self.comm.parallel:
            return requested
        try:
            return self.comm.any(requested, timeout=parallel.step_timeout(self.comm, self._recent))
        except RankTimeout as exc:  # `finish` then reports it
            self._silent_rank = exc
            return True

    def run(
        self,
        on_event: Callable[[object], None] = lambda e: None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> ev.Finished | ev.Failed:
        """Train; every outcome (including bad data or a model that cannot train) ends in an event."""
        if not self.started:
            started = self.start(on_event)
            if isinstance(started, ev.Failed):
                return started
        while not self.done:
            if self.agree_stop(should_stop()):
                return self.finish(on_event, stopped=True)
            result = self.train_step(on_event)
            if isinstance(result, ev.Failed):
                return result
        return self.finish(on_event)

    def evaluate(self) -> ev.Eval | ev.PreferenceEval:
        """Mean cross-entropy over the validation batches (with several ranks, each takes a share);
        a preference run's figures of its held-out pairs."""
        if self.preference is not None:  # the held-out pairs (one process: start() refuses several)
            f = self.preference.evaluate(self.trainable, self.val_batches)
            if self.record is not None:
                self.record.add_val_loss(self.step, f.loss)
            return ev.PreferenceEval(self.step, self.config.objective, **asdict(f))
        ce = n = 0
        if self.comm.parallel:
            ce, n = parallel.sharded_eval(self)
        else:
            for b in self.val_batches:
                res = loss_and_grads(self.model, self.trainable, b, backward=False)
                ce += res.ce_sum
                n += res.n_tokens
        result = ev.Eval(self.step, ce / max(1, n), n)
        if self.record is not None:
            self.record.add_val_loss(self.step, result.mean_ce)
        return result

    # --- the run's record ------------------------------------------------------------------------
    def _note(self, status: str, message: str = "") -> None:
        """Write the run's record (engine.train.runs) with this status; a record that cannot be
        written is logged, never a reason to stop training."""
        cfg = self.config
        path = record_path(cfg.checkpoint_dir, cfg.out)
        if path is None or not self.comm.is_root:  # one record per run, written by rank 0
            return
        if self.record is None:
            self.record = self._new_record(path)
        rec = self.record
        rec.status, rec.message = status, message
        rec.steps_done = self.step
        rec.last_checkpoint = self.last_ckpt
        if self.plan is not None:
            rec.steps_planned = self.plan.total_steps
        try:
            rec.write(path)
        except (OSError, ValueError) as exc:
            log.warning("the run record %s could not be written: %s", path, exc)

    def _new_record(self, path: str) -> RunRecord:
        cfg = self.config
        previous = read_run(path) if self.resume and os.path.exists(path) else None
        if previous is not None:  # a resumed run goes on in its own record, its curve cut at the resume
            previous.cut_at(self.step)
            return previous
        data = self.data if isinstance(self.data, str) else f"{len(self.data)} samples (edited)"
        out = cfg.out or cfg.checkpoint_dir or "run"
        name = os.path.basename(out[:-5] if out.endswith(".gguf") else out).removesuffix("-checkpoints")
        pairs = self.trainable.pairs if self.trainable is not None else {}
        kinds = tensor_kinds(pairs)
        return RunRecord(
            name=name,
            model=self.model.path,
            dataset=data,
            targets=kinds,
            n_targets=len(pairs),
            full=sorted(self.trainable.full) if self.trainable is not None else [],
            rank=self.trainable.rank if self.trainable is not None else cfg.rank,
            alpha=self.trainable.alpha if self.trainable is not None else cfg.alpha,
            adapter=cfg.out,
            checkpoints=cfg.checkpoint_dir,
            config=cfg.to_json(),
        )

    def note_paused(self) -> None:
        """The session paused this run between steps: say so in its record."""
        self._note("paused")

    def _norms_event(self) -> ev.LoraNorms:
        from .norms import lora_norms

        report = lora_norms(self._adapter())
        return ev.LoraNorms(
            self.step,
            dict(report.by_kind),
            dict(report.by_layer),
            {t.name: t.norm_delta for t in report.tensors},
        )

    def _lost(self, on_event, exc: RankTimeout) -> ev.Failed:
        """Another rank stopped answering: the run fails here (the caller ends every rank)."""
        self.rank_lost = True
        return self._fail(on_event, f"{exc}. The last good checkpoint is kept.")

    def _fail(self, on_event, message: str, last_ckpt: str | None = None) -> ev.Failed:
        self.ended = True
        self.release_step()
        failed = ev.Failed(self.step + 1, message, last_ckpt or self.last_ckpt)
        self._note("failed", message)
        on_event(failed)
        return failed

    def _finish(self, on_event, *, stopped: bool, last_ckpt: str | None) -> ev.Finished | ev.Failed:
        from ..export.write import export_adapter

        cfg = self.config
        new_ckpt = cfg.checkpoint_dir and (not last_ckpt or not last_ckpt.endswith(f"ckpt-{self.step:06d}"))
        saved = [last_ckpt]  # the newest checkpoint, even when the adapter cannot be written after it

        def write() -> tuple[str | None, str | None, str | None]:  # on rank 0 alone with several ranks
            ckpt = self.save_checkpoint(cfg.checkpoint_dir) if new_ckpt else last_ckpt
            if new_ckpt:
                saved[0] = ckpt
                on_event(ev.Checkpoint(self.step, ckpt))
            adapter_path = merged_path = None
            if cfg.out and self.trainable.pairs:
                adapter_path = export_adapter(
                    self._adapter(), cfg.out, qtype=cfg.out_type, training=self._training_facts()
                )
            if cfg.out and self.trainable.full:
                merged_path = self._export_full(cfg.out)
            return ckpt, adapter_path, merged_path

        try:
            parallel.check_same(self)  # every rank holds rank 0's parameters (one digest each)
            last_ckpt, adapter_path, merged_path = parallel.on_root(
                self.comm, write, timeout=parallel.step_timeout(self.comm, self._recent)
            )
        except RankTimeout as exc:
            return self._lost(on_event, exc)
        except OSError as exc:
            return self._fail(
                on_event,
                f"training finished but the result could not be written: {os_error_text(exc)}",
                saved[0],
            )
        except EngineError as exc:
            return self._fail(
                on_event, f"training finished but the result could not be written: {exc}", saved[0]
            )
        done = ev.Finished(self.step, stopped, self.last_ce, adapter_path, merged_path, last_ckpt)
        self.last_ckpt = last_ckpt
        self._note("stopped" if stopped else "finished")
        on_event(done)
        return done

    def _export_full(self, out: str) -> str:
        """Runs with full-weight tensors write a whole model: base + trained tensors (+ merged LoRA)."""
        from ..export.write import export_merged

        path = full_model_path(out) if self.trainable.pairs else out
        full = {n: to_host(w) for n, w in self.trainable.full.items()}
        export_merged(self.model.path, self._adapter(), path, replace_tensors=full)
        return path
