"""A sample as the Dataset page makes and shows it, without Qt: an empty one of a shape to fill in
(`new_sample`), an edited copy validated as a file's line would be (`rebuild_sample`), and the few
lines a tooltip shows (`sample_preview`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine import Problem, Sample, chosen_text, parse_sample, sample_to_json


def rebuild_sample(sample: Sample, **changes: Any) -> tuple[Sample, list[Problem]]:
    """A copy of `sample` with `changes` (messages=, prompt=, response=, text=, reward=, rejected=) and
    what is wrong with it.

    The copy goes through `sample_to_json` and `parse_sample`, which validates it and recomputes
    its `group`. When it is not valid (an error problem, e.g. no assistant turn left) the
    unvalidated copy comes back with the problems, so that an edit in progress is never lost.
    """
    new = replace(sample, **changes)
    if new.kind == "prompt" and ("prompt" in changes or "response" in changes):
        new = replace(
            new,
            messages=(
                {"role": "user", "content": new.prompt},
                {"role": "assistant", "content": new.response},
            ),
        )
    parsed, problems = parse_sample(sample_to_json(new), new.line)
    return (parsed if parsed is not None else new), problems


def new_sample(kind: str = "messages") -> Sample:
    """An empty sample of one shape, ready to be filled in the editor."""
    if kind == "messages":
        obj: dict[str, Any] = {
            "messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
        }
    elif kind == "prompt":
        obj = {"prompt": "", "response": ""}
    elif kind == "text":
        obj = {"text": "-"}
    elif kind == "preference":
        obj = {"prompt": "", "chosen": "", "rejected": "-"}
    else:
        raise ValueError(f"sample kind {kind!r} is not one of messages, prompt, text, preference")
    sample, problems = parse_sample(obj, 0)
    assert sample is not None, problems
    if kind == "text":
        sample = replace(sample, text="")
    elif kind == "preference":
        sample = replace(sample, rejected="")
    return sample


def sample_preview(sample: Sample, limit: int = 600) -> str:
    """A few lines showing the sample, for tooltips."""
    if sample.kind == "text":
        text = sample.text or ""
    else:
        text = "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in sample.messages)
        if sample.rejected is not None:  # a preference pair: its last turn is the chosen answer
            text = text.rsplit("\nassistant: ", 1)[0]
            text += f"\nchosen: {chosen_text(sample)}\nrejected: {sample.rejected}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["new_sample", "rebuild_sample", "sample_preview"]
