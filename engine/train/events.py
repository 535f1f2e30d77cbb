"""Events a training run reports, as frozen dataclasses holding host data only.

`Trainer.run(on_event, should_stop)` emits them in this order: one `Started`, then per optimizer
step a `Step` (and, when due, `Eval`, `LoraNorms`, `ExpertUsage`, `SampleAnswers`, `Checkpoint`),
and finally one `Finished` or `Failed`. A preference run (DPO, ORPO) adds a `PreferenceStep` after
each `Step` and a `PreferenceEval` in place of `Eval`. A run driven by an engine session may also
stop at `Paused` and go on later. The CLI prints them and writes them as JSON lines; the studio plots them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Plan:
    """What a run will do, known before the first step."""

    n_train: int  # training samples (after problems were dropped)
    n_val: int  # validation samples
    n_windows: int  # packed windows per epoch
    tokens_per_epoch: int  # sample tokens per epoch (no padding)
    label_tokens_per_epoch: int  # tokens with a loss term per epoch
    batches_per_epoch: int  # micro-batches per epoch
    total_steps: int  # optimizer steps of the whole run
    trainable_params: int  # LoRA factors + full-weight tensors
    lora_targets: tuple[str, ...]  # adapted tensor names
    full_tensors: tuple[str, ...]  # tensors trained in full
    memory_bytes: dict[str, int]  # estimate: weights, trainable + optimizer, activations, total
    problems: tuple[str, ...]  # dataset problems, one line each ("line 12: ..."): the first 1000
    start_step: int  # 0, or the step a resumed run starts from
    start_tokens: int = 0  # sample tokens the steps before start_step processed (a resumed run)
    start_seconds: float = 0.0  # training time before start_step (a resumed run)
    ranks: int = 1  # processes the run is spread over (data parallel: engine.train.parallel)
    hosts: tuple[str, ...] = ()  # the machine each rank runs on, in rank order
    model: str = ""  # the model file trained (rank 0's path)
    lora_rank: int = 0  # the adapter's rank r and alpha
    lora_alpha: float = 0.0
    dataset: str = ""  # the dataset file, or "N samples (edited)"
    problems_total: int = 0  # how many dataset problems there are (problems lists the first 1000)
    objective: str = "sft"  # "sft", or a preference objective ("dpo", "orpo"): n_train counts pairs then


@dataclass(frozen=True)
class Started:
    plan: Plan


@dataclass(frozen=True)
class Step:
    step: int  # optimizer steps done (1-based)
    total_steps: int
    epoch: float  # fractional epoch reached
    loss: float  # objective of this step (weighted; with the KL term in group mode)
    mean_ce: float  # plain mean cross-entropy over the step's label tokens (a preference run: its objective)
    lr: float  # learning rate used for this step
    grad_norm: float  # global gradient norm before clipping
    tokens: int  # sample tokens processed by this step
    tokens_per_s: float
    elapsed_s: float  # seconds spent training in this run's steps (pauses excluded; kept by checkpoints)
    eta_s: float  # estimated seconds to the end (mean of the last steps, a start's first step excluded)
    router_aux: float | None = None  # the MoE load-balancing loss in `loss` (router_aux_coef), else None


@dataclass(frozen=True)
class PreferenceFigures:
    """A preference objective's figures (engine.train.preferences): after each step of a DPO or ORPO
    run (`PreferenceStep`, the step's pairs) and at each evaluation (`PreferenceEval`, the held-out pairs)."""

    step: int
    objective: str  # "dpo" | "orpo"
    loss: float  # the objective, mean over the pairs
    chosen_logp: float  # mean log-probability per token of the chosen answers
    rejected_logp: float  # ... of the rejected answers
    chosen_reward: float  # DPO: beta (log pi - log ref) of an answer; ORPO: lambda x its mean token log-prob
    rejected_reward: float
    margin: float  # mean over the pairs of chosen reward - rejected reward
    accuracy: float  # share of the pairs with a positive margin (a tie counts half)
    n_pairs: int


@dataclass(frozen=True)
class PreferenceStep(PreferenceFigures):
    pass


@dataclass(frozen=True)
class PreferenceEval(PreferenceFigures):
    pass


@dataclass(frozen=True)
class Eval:
    step: int
    mean_ce: float  # mean cross-entropy over the validation label tokens
    n_tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.mean_ce, 50.0))


@dataclass(frozen=True)
class LoraNorms:
    step: int
    by_kind: dict[str, float]  # tensor kind -> ||delta W||_F over the layers (root of sum of squares)
    by_layer: dict[int, float]  # layer -> ||delta W||_F over the kinds
    per_tensor: dict[str, float]  # tensor name -> ||delta W||_F


@dataclass(frozen=True)
class ExpertUsage:
    step: int
    counts: np.ndarray  # (L, E) tokens routed to each expert during this step


@dataclass(frozen=True)
class SampleAnswers:
    step: int  # 0: the base model's answers, before the first step
    prompts: list[str]  # the prompts, in order
    answers: list[str]  # the greedy answer to each with the adapter of this step


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str  # checkpoint folder


@dataclass(frozen=True)
class Finished:
    step: int
    stopped: bool  # True when should_stop ended the run early
    final_loss: float | None  # last step's mean cross-entropy
    adapter_path: str | None  # the written adapter, when the run was given an output path
    merged_path: str | None  # the written full model, for runs with full-weight tensors
    checkpoint_path: str | None  # the last checkpoint


@dataclass(frozen=True)
class RunWarning:
    step: int
    message: str  # something that looks wrong, and what to do; the run goes on


@dataclass(frozen=True)
class Paused:
    step: int  # steps taken; the run continues from here, in memory, when it is resumed


@dataclass(frozen=True)
class Failed:
    step: int  # the step that failed (0: before training started)
    message: str  # what went wrong and what to do next
    checkpoint_path: str | None  # the last good checkpoint, untouched


Event = (
    Started | Step | Eval | LoraNorms | ExpertUsage | Checkpoint | RunWarning | Paused | Finished | Failed
    | PreferenceStep | PreferenceEval | SampleAnswers
)  # fmt: skip


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def event_to_json(event: Any) -> str:
    """One JSON line: {"event": "Step", ...fields}."""
    return json.dumps({"event": type(event).__name__, **_plain(event)}, ensure_ascii=False)


_EVENTS = {cls.__name__: cls for cls in (Started, Step, Eval, LoraNorms, ExpertUsage, Checkpoint, RunWarning,
                                         Paused, Finished, Failed, PreferenceStep,
                                         PreferenceEval, SampleAnswers)}  # fmt: skip


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, str) and value in ("nan", "inf", "-inf") else value


def event_from_json(line: str) -> Event | None:
    """The event of one line `event_to_json` wrote (another process's events file), or None for a
    line that is not one (cut short by a crash, or from a newer version)."""
    try:
        d = json.loads(line)
        cls = _EVENTS[d.pop("event")]
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: _number(v) for k, v in d.items() if k in names}
        if cls is Started:
            plan = {k: v for k, v in d["plan"].items() if k in {f.name for f in dataclasses.fields(Plan)}}
            for key in ("lora_targets", "full_tensors", "problems", "hosts"):
                if key in plan:
                    plan[key] = tuple(plan[key])
            return Started(Plan(**plan))
        if cls is ExpertUsage:
            d["counts"] = np.asarray(d["counts"])
        if cls is LoraNorms:
            d["by_layer"] = {int(k): v for k, v in d["by_layer"].items()}
        return cls(**d)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def follow_events(path: str, offset: int = 0) -> tuple[list[Event], int]:
    """The events written to an events file since byte `offset`, and the offset to read from next
    (after the last whole line: a line still being written is read next time). A file that is not
    there yet gives nothing; one shorter than `offset` (a new run replaced it) is read from the start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        event = event_from_json(line.decode("utf-8", errors="replace"))
        if event is not None:
            events.append(event)
    return events, offset + end
