"""Sample answers during training: a few prompts answered with the current adapter every N steps
(greedy, so the same adapter always gives the same answer; short), reported as `SampleAnswers`.

The prompts are typed ones (each rendered through the model's chat template as one user turn with
the generation prompt: the prompt `engine.export.verify` uses) or taken from the run's validation
split (`validation_prompts`: a held-out sample's conversation up to its last answer, rendered the
same way). Generation stops at the model's end-of-generation tokens or after `max_new_tokens`.

What this is not: it neither trains nor scores the answers; the table is for people to read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from ..export.verify import _prompt_ids
from ..model.generate import GREEDY, generate
from ..model.lora import LoraTerm
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from .data import Sample, iter_jsonl
from .events import SampleAnswers
from .pref_data import pair_rows

Prompt = str | tuple[dict, ...]  # a typed prompt, or a conversation's turns before its answer


def prompt_label(prompt: Prompt) -> str:
    """What the table shows of a prompt: a typed one as it is, a conversation by its last turn."""
    if isinstance(prompt, str):
        return prompt
    return str(prompt[-1].get("content", ""))


def answer_prompts(
    model,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    prompts: Sequence[Prompt],
    lora: Mapping[str, LoraTerm] | None,
    *,
    step: int,
    max_new_tokens: int = 48,
) -> SampleAnswers:
    """The greedy answers of `model` with `lora` to `prompts`, as the event of `step`."""
    sampling = replace(GREEDY, max_new_tokens=max_new_tokens, seed=0)
    answers = []
    for prompt in prompts:
        ids = _prompt_ids(tokenizer, template, prompt)
        (gen,) = generate(model, ids, sampling=sampling, stop_ids=tokenizer.eot_ids, lora=lora)
        answers.append(tokenizer.decode(list(gen.tokens)))
    return SampleAnswers(step, [prompt_label(p) for p in prompts], answers)


def prompt_part(sample: Sample) -> tuple[dict, ...] | None:
    """The turns of `sample` before its last answer (what the model is asked), or None when it has
    no prompt to answer (a text sample, a conversation that starts with its answer)."""
    if sample.kind == "text":
        return None
    messages = list(sample.messages)
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages))
    before = tuple(messages[:last])
    return before if any(m.get("role") == "user" for m in before) else None


def validation_prompts(
    source: str | os.PathLike[str] | Sequence[Sample], rows: np.ndarray, n: int, *, pairs: bool = False
) -> list[tuple[dict, ...]]:
    """The prompts of the first `n` of `rows` (rows of the prepared table: `prepare_data`'s, from the
    same `source` and `pairs`) that have one, in file order, each prompt once. A file is read again
    up to the last row needed, never kept whole."""
    wanted = {int(r) for r in rows}
    if not wanted or n <= 0:
        return []
    if isinstance(source, (str, os.PathLike)):
        samples: Iterable[Sample] = iter_jsonl(source, [])
    else:
        samples = source
    if pairs:
        samples = pair_rows(samples, [])
    found: list[tuple[dict, ...]] = []
    seen: set[str] = set()
    last = max(wanted)
    for row, sample in enumerate(samples):
        if row > last or len(found) == n:
            break
        if row not in wanted:
            continue
        prompt = prompt_part(sample)
        key = json.dumps(prompt, sort_keys=True, default=str)
        if prompt is not None and key not in seen:
            seen.add(key)
            found.append(prompt)
    return found
