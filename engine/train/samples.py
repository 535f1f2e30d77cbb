"""Sample answers during training: a few prompts answered with the current adapter every N steps
(greedy, so the same adapter always gives the same answer; short), reported as `SampleAnswers`.

The prompts are rendered through the model's chat template as one user turn with the generation
prompt (the same prompt `engine.export.verify` uses), and generation stops at the model's
end-of-generation tokens or after `max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..export.verify import _prompt_ids
from ..model.generate import GREEDY, generate
from ..model.lora import LoraTerm
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from .events import SampleAnswers


def answer_prompts(
    model,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    prompts: Sequence[str],
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
    return SampleAnswers(step, list(prompts), answers)
