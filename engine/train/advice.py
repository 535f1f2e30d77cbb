"""Whether a planned run is likely to change the model at all, in numbers, before it starts.

A LoRA run that takes a handful of optimizer steps at a small learning rate leaves the model's answers
as they were: SmolLM2-135M needs about 40 steps at lr 1e-3 (lr × steps = 0.04) to learn a made-up fact
from 16 samples, and 3 steps at 2e-4 (8e-4) teach it nothing. `plan_warning` names such a plan, with
its numbers, so that the app (before Start) and the CLI (at the start) can say so. It is advice: it
never stops a run.
"""

from __future__ import annotations

MIN_STEPS = 20  # fewer optimizer steps than this rarely change a model's answers
MIN_LR_STEPS = 0.01  # nor does a smaller product of the peak learning rate and the steps


def plan_warning(total_steps: int, lr: float, start_step: int = 0) -> str | None:
    """Why a run of `total_steps` optimizer steps (from `start_step`) at peak learning rate `lr` is
    unlikely to change the model, with the numbers; None when it looks able to."""
    steps = max(0, total_steps - start_step)
    if not steps:
        return None
    reasons = []
    if steps < MIN_STEPS:
        reasons.append(f"it takes {steps} optimizer step{'s' if steps != 1 else ''} (a run that changes "
                       f"the answers takes {MIN_STEPS} or more)")  # fmt: skip
    budget = lr * steps
    if budget < MIN_LR_STEPS:
        reasons.append(f"learning rate × steps is {lr:g} × {steps} = {budget:.2g} (below {MIN_LR_STEPS:g})")
    if not reasons:
        return None
    return (
        "This run is unlikely to change the model: " + "; ".join(reasons) + ". More steps (or epochs) or "
        "a higher learning rate teach more; the balanced preset sets both for the dataset."
    )


__all__ = ["MIN_LR_STEPS", "MIN_STEPS", "plan_warning"]
