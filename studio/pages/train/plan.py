"""What the next run would do, worked out before Start: the check behind the Train page's progress bar
and its Start button.

`check_run(...)` encodes and packs the dataset the editor shows (or the project's file) with the
model's tokenizer and chat template, as the engine's trainer will, and returns a `RunCheck`: the step
total, windows, samples and tokens of the run (`DataPlan`), the trainable parameters, the memory
estimate, and the first reason the run cannot start (`Blocker`: nothing to train, no trainable
sample, not enough memory), in plain words with the page that fixes it. It runs as a job of the
engine worker (never on the UI thread: encoding a large dataset takes seconds); `EncodingCache`
keeps each sample's token counts between checks, so a change of batch size, epochs or validation
split does not encode anything again.

The counting follows engine.train.trainer (`Trainer._prepare` and `start`): the validation split
(`validation_indices`, the engine's), `encode_samples`, first-fit
decreasing packing into windows of n_ctx tokens (engine `count_windows`: the number of windows depends
only on the sample lengths), batches of batch_size windows, and steps = `steps` or
ceil(epochs * batches / grad_accum). The Train page's tests compare it with the engine's own `Plan`.

What this module is not: it trains nothing, opens no model weights and has no Qt.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine import (
    ChatTemplate,
    DatasetError,
    Encoded,
    EncodeOptions,
    EngineError,
    MemoryEstimate,
    Problem,
    Sample,
    TensorInfo,
    Tokenizer,
    TrainConfig,
    count_windows,
    encode_iter,
    estimate_memory,
    load_jsonl,
    lora_param_count,
    select_full,
    select_targets,
    validation_indices,
)

from ...count_process import MANY, CountJob

log = logging.getLogger(__name__)

CHILD_MIN = MANY  # samples encoded in a child process, as the Dataset page's counts are


@dataclass(frozen=True)
class Blocker:
    """Why Start is disabled, in plain words, and the page that fixes it ("" when it is this one)."""

    reason: str
    page: str = ""  # "Model", "Dataset", "Targets", or "" (the Train page's own settings)


@dataclass(frozen=True)
class DataPlan:
    """The data side of a run, as the trainer will see it."""

    n_samples: int  # samples read (the editor's, or the file's usable lines)
    n_train: int  # samples in the training split (before encoding drops any)
    n_val: int  # samples held out for validation
    n_trainable: int  # training samples with at least one trained token after encoding
    n_windows: int  # packed windows per epoch
    batches_per_epoch: int
    total_steps: int
    tokens_per_epoch: int
    label_tokens_per_epoch: int
    problems: tuple[str, ...]  # reading and encoding problems, one line each
    n_usable: int = 0  # samples of either split with a token to learn from
    usable_tokens: int = 0  # their tokens (the validation samples' too)
    longest: int = 0  # tokens of the longest of them (cut at the context length)

    def describe(self, config: TrainConfig) -> str:
        """One line for people: where the step total comes from."""
        if config.steps:
            how = f"{config.steps} steps as set"
        else:
            accum = f", {config.grad_accum} accumulated per step" if config.grad_accum > 1 else ""
            how = (
                f"{config.epochs:g} epoch{'s' if config.epochs != 1 else ''} of {self.batches_per_epoch} "
                f"batch{'es' if self.batches_per_epoch != 1 else ''}{accum}"
            )
        val = f" / {self.n_val} validation" if self.n_val else ""
        if config.objective != "sft":  # a preference run counts pairs (two answers each)
            return (
                f"{self.total_steps:,} steps ({how}, {config.batch_size} pairs a batch): "
                f"{self.n_trainable} training{val} preference pairs, "
                f"{self.tokens_per_epoch:,} tokens of chosen answers and prompts per epoch"
            )
        return (
            f"{self.total_steps:,} steps ({how}): {self.n_train} training{val} samples in "
            f"{self.n_windows} windows of up to {config.n_ctx} tokens, {self.tokens_per_epoch:,} tokens "
            f"({self.label_tokens_per_epoch:,} trained) per epoch"
        )


@dataclass(frozen=True)
class RunCheck:
    """The result of `check_run`."""

    plan: DataPlan | None  # None when the data could not be planned (see blocker)
    blocker: Blocker | None  # None: the run can start
    n_trainable_params: int = 0
    n_lora_tensors: int = 0
    n_full_tensors: int = 0
    memory: MemoryEstimate | None = None


# -- the engine's counting, from exported names ----------------------------------------------------


# -- encoding, cached ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleTokens:
    """One sample as the trainer will see it: its tokens and trained tokens (after truncation), or
    dropped (no trained token, or it cannot be encoded), and its problems."""

    n_tokens: int
    n_targets: int
    dropped: bool
    problems: tuple[tuple[int, str, str], ...]  # (line, severity, message)


class EncodingCache:
    """Token counts of samples between checks, used by the engine worker's jobs only (one at a time).

    Entries are kept per sample object (the editor's samples are frozen: an edit makes a new one)
    for one tokenizer, template and set of encoding options; a file is read again only when its size
    or modification time changed."""

    def __init__(self, pause: Callable[[], None] | None = None) -> None:
        self.pause = pause  # called between a few samples: gives the UI thread its turn (UiGate.pause)
        self.key: tuple | None = None
        self.entries: dict[int, tuple[Sample, SampleTokens]] = {}
        self.file_key: tuple | None = None
        self.file_data: tuple[list[Sample], list[str]] = ([], [])
        self.template_key: tuple | None = None
        self.template_value: ChatTemplate | None = None
        self._job: CountJob | None = None  # the child process encoding, while one does
        self._stopped = False

    def stop(self) -> None:
        """Encode nothing more (the app is quitting): a child under way is killed and reaped, and the
        check that waited for it fails at once (EngineError) instead of encoding here."""
        self._stopped = True
        job = self._job
        if job is not None:
            job.cancel()

    def template(self, key: tuple, make) -> ChatTemplate:
        """The chat template for `key` (made by `make()` the first time; its errors propagate)."""
        if key != self.template_key or self.template_value is None:
            self.template_value = make()
            self.template_key = key
        return self.template_value

    def read(self, path: str) -> tuple[list[Sample], list[str]]:
        """The samples of a dataset file and its problems (DatasetError when it cannot be read)."""
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
        if key != self.file_key:
            samples, problems = load_jsonl(path)
            self.file_key, self.file_data = key, (samples, [str(p) for p in problems])
        return self.file_data

    def encode(
        self, samples: Sequence[Sample], tokenizer: Tokenizer, template: ChatTemplate, options: EncodeOptions
    ) -> list[SampleTokens]:
        key = (id(tokenizer), id(template), options)
        if key != self.key:
            self.key, self.entries = key, {}
        known = self.entries
        missing = [s for s in samples if (hit := known.get(id(s))) is None or hit[0] is not s]
        new = dict(self._encode(missing, tokenizer, template, options)) if missing else {}
        out, entries = [], {}
        for sample in samples:
            hit = known.get(id(sample))
            if hit is None or hit[0] is not sample:
                hit = (sample, new[id(sample)])
            entries[id(sample)] = hit
            out.append(hit[1])
        self.entries = entries  # only the current samples stay
        return out

    def _encode(
        self, samples: list[Sample], tokenizer: Tokenizer, template: ChatTemplate, options: EncodeOptions
    ) -> Iterator[tuple[int, SampleTokens]]:
        """(id(sample), its tokens) for samples: many in a child process (`studio.count_process`), a
        few here, a batch at a time (`encode_iter`), pausing for the UI thread every few samples.

        Encoding 100,000 samples is seconds of Python; on the engine worker's thread it held the
        interpreter lock from the UI thread all along (the window stalled while a large dataset's
        run was checked). Where the child fails, the samples it did not count are encoded here."""
        done: dict[int, SampleTokens] = {}
        if len(samples) >= CHILD_MIN:

            def take(rows: list) -> None:
                for sample, n_tokens, _trained, _truncated, problems, n_targets in rows:
                    notes = tuple((p.line, p.severity, p.message) for p in problems)
                    dropped = n_tokens < 0
                    done[id(sample)] = SampleTokens(0 if dropped else n_tokens, n_targets, dropped, notes)

            if self._stopped:
                raise EngineError("the check was stopped: the window is closing")
            job = self._job = CountJob()
            try:
                error = job.count(samples, tokenizer, template, options, take)
            finally:
                self._job = None
            if job.cancelled or self._stopped:
                raise EngineError("the check was stopped: the window is closing")
            if error is not None:
                log.warning("checking the run's data in a child process failed (%s); encoding it here", error)
            yield from done.items()

        def given() -> Iterator[Sample]:
            for k, sample in enumerate(samples):
                if id(sample) in done:
                    continue
                if self.pause is not None and k % 16 == 0:
                    self.pause()
                yield sample

        for j, (sample, encoded, problems) in enumerate(
            encode_iter(given(), tokenizer, template, options, batch=64)
        ):
            yield id(sample), _sample_tokens(encoded, problems, f"sample {j}: ")


def _sample_tokens(encoded: Encoded | None, problems: Sequence[Problem], prefix: str) -> SampleTokens:
    """A sample's SampleTokens from its encoding (None: dropped) and problems ("sample N: " removed)."""
    notes = tuple((p.line, p.severity, p.message.removeprefix(prefix)) for p in problems)
    if encoded is None:
        return SampleTokens(0, 0, True, notes)
    return SampleTokens(len(encoded.tokens), encoded.n_targets, False, notes)


def _problem_line(row: int, line: int, severity: str, message: str) -> str:
    where = f"line {line}" if line else f"sample {row + 1}"
    return f"{where}: {severity}: {message}"


# -- the check -------------------------------------------------------------------------------------


def plan_data(
    samples: Sequence[Sample],
    read_problems: Sequence[str],
    tokenizer: Tokenizer,
    template: ChatTemplate,
    config: TrainConfig,
    cache: EncodingCache | None = None,
) -> DataPlan:
    """The data side of a run on `samples` with `config` (see the module docstring)."""
    cache = cache or EncodingCache()
    options = EncodeOptions(
        n_ctx=config.n_ctx, train_on_prompt=config.train_on_prompt, prompt_format=config.prompt_format
    )
    encoded = cache.encode(samples, tokenizer, template, options)
    train, val = validation_indices(samples, config.val_split, config.seed)
    kept = [encoded[i] for i in train if not encoded[i].dropped]
    n_windows = count_windows([e.n_tokens for e in kept], config.n_ctx)
    n_batches = math.ceil(n_windows / config.batch_size) if n_windows else 0
    if config.objective != "sft":  # DPO / ORPO: batches of pairs (engine.train.pref_data.PairBatches)
        pairs = [i for i, s in enumerate(samples) if s.kind == "preference"]  # the trainer's split: of pairs
        t, v = validation_indices([samples[i] for i in pairs], config.val_split, config.seed)
        train, val = [pairs[i] for i in t], [pairs[i] for i in v]
        kept = [encoded[i] for i in train if not encoded[i].dropped]
        n_batches = math.ceil(len(kept) / config.batch_size)
        n_windows = 2 * len(kept)  # two answers a pair
    total = config.steps or max(1, math.ceil(config.epochs * n_batches / config.grad_accum))
    problems = [*read_problems]
    usable = [e for e in encoded if not e.dropped]
    for row, e in enumerate(encoded):
        problems.extend(_problem_line(row, line, sev, msg) for line, sev, msg in e.problems)
    return DataPlan(
        n_samples=len(samples),
        n_train=len(train),
        n_val=len(val),
        n_trainable=len(kept),
        n_windows=n_windows,
        batches_per_epoch=n_batches,
        total_steps=total if kept else 0,
        tokens_per_epoch=sum(e.n_tokens for e in kept),
        label_tokens_per_epoch=sum(e.n_targets for e in kept),
        problems=tuple(problems),
        n_usable=len(usable),
        usable_tokens=sum(e.n_tokens for e in usable),
        longest=max((e.n_tokens for e in usable), default=0),
    )


def check_selection(
    tensors: dict[str, TensorInfo], model_config: Any, config: TrainConfig, itemsize: int = 4
) -> RunCheck:
    """What the run trains and whether it fits in memory; `plan` is left None."""
    n_layers = model_config.L
    try:
        names = (
            select_targets(tensors, config.targets, n_layers)
            if config.targets.preset != "none" or config.targets.patterns
            else []
        )
        full = select_full(tensors, tuple(config.full), n_layers) if config.full else []
    except EngineError as exc:
        return RunCheck(None, Blocker(f"the chosen targets do not fit this model: {exc}.", "Targets"))
    if not names and not full:
        return RunCheck(
            None,
            Blocker("nothing is chosen to train: no LoRA targets and no full-weight tensors.", "Targets"),
        )
    n_params = lora_param_count(tensors, names, config.rank) + sum(tensors[n].n_elements for n in full)
    memory = estimate_memory(
        model_config,
        tensors,
        n_params,
        config,
        lora_targets=names,
        checkpoint=config.checkpoint_choice,
        budget=config.cache_budget,
        itemsize=itemsize,
    )
    blocker = None
    if not memory.fits():
        blocker = Blocker(f"the run would not fit in memory: {memory.advice(config)}.", "Targets")
    return RunCheck(None, blocker, n_params, len(names), len(full), memory)


def check_run(
    data: str | Sequence[Sample],
    tokenizer: Tokenizer,
    template: ChatTemplate,
    tensors: dict[str, TensorInfo],
    model_config: Any,
    config: TrainConfig,
    cache: EncodingCache | None = None,
    read_problems: Sequence[str] = (),
) -> RunCheck:
    """Everything the Start button needs to know about the next run (see the module docstring).

    `data`: the samples the editor shows, or the path of the dataset file."""
    cache = cache or EncodingCache()
    selection = check_selection(tensors, model_config, config)
    try:
        if isinstance(data, str):
            samples, read_problems = cache.read(data)
        else:
            samples = list(data)
    except (DatasetError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return _with(selection, None, Blocker(f"the dataset cannot be read: {why}.", "Dataset"))
    if not samples:
        n = len(read_problems)
        why = f" ({n} line{'s' if n != 1 else ''} with problems; the first: {read_problems[0]})" if n else ""
        return _with(selection, None, Blocker(f"the dataset has no usable sample{why}.", "Dataset"))
    plan = plan_data(samples, read_problems, tokenizer, template, config, cache)
    if not plan.n_trainable and config.objective != "sft":
        blocker = Blocker(
            f"{config.objective.upper()} learns from preference pairs, and the dataset has none: open a "
            'preferences file (lines with "chosen" and "rejected"), for example the one your A/B choices '
            "on the Chat or Rewards page fill, or set the objective to SFT.",
            "Dataset",
        )
        return _with(selection, plan, selection.blocker or blocker)
    if not plan.n_trainable:
        first = f" The first problem: {plan.problems[0]}." if plan.problems else ""
        blocker = Blocker(
            f"no training sample has a token to learn from (answers too long for the context length, "
            f"or no assistant answer).{first}",
            "Dataset",
        )
        return _with(selection, plan, selection.blocker or blocker)
    return _with(selection, plan, selection.blocker)


def _with(selection: RunCheck, plan: DataPlan | None, blocker: Blocker | None) -> RunCheck:
    return RunCheck(
        plan,
        selection.blocker or blocker,
        selection.n_trainable_params,
        selection.n_lora_tensors,
        selection.n_full_tensors,
        selection.memory,
    )


__all__ = [
    "Blocker",
    "DataPlan",
    "EncodingCache",
    "RunCheck",
    "SampleTokens",
    "check_run",
    "check_selection",
    "plan_data",
]
