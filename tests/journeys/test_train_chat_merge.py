"""Journey (a): open a quantized model, open a dataset, train with the default preset, chat with the
adapter, export it merged with the Export page's defaults: the merged file answers as base + adapter
(its logits within F16's tolerance of theirs), the page offers a command to run it, and an Ollama
Modelfile beside it carries the chat template, the stop token and the Chat page's sampling.

Journey (c): the default preset on a 16-sample dataset changes the model's answer (on the code before
it planned 1-4 steps at lr 2e-4 and the answer stayed the base model's).
"""

from __future__ import annotations

import os

import numpy as np

from engine import TOLERANCE, ChatTemplate, Finished, GGUFFile
from tests.engine import gotemplate

from .conftest import (
    ANSWER,
    QUESTIONS,
    TEACHING,
    answer_accuracy,
    chat,
    greedy,
    logits,
    open_model_and_dataset,
    train,
    train_with,
)


def test_train_chat_and_merge_with_defaults_keeps_the_fine_tune(qtbot, app, tiny_q4, facts):
    window = app.launch()
    open_model_and_dataset(qtbot, window, tiny_q4, facts)
    # settings of one's own, that teach the tiny model the answer word for word
    result = train_with(qtbot, window, steps=60, **TEACHING)
    assert not result.stopped and result.step == 60
    adapter = result.adapter_path
    # Chat offers the run that just finished, and its answers are the adapter's, not the base model's
    question = QUESTIONS[0]
    assert window.chat_page.adapter_choice.current_path() == adapter
    tuned = chat(qtbot, window, question, adapter=True)
    base = chat(qtbot, window, question, adapter=False)
    taught = ANSWER[:-4]  # "the quick brown fox jumps over the lazy": what 60 steps teach it for sure
    assert tuned.startswith(taught) and greedy(tiny_q4, question, adapter).startswith(taught)
    assert not base.startswith(taught[:9])
    # Export, merged, with every other setting as the page has it
    page = window.export_page
    window.show_page_named("Export")
    assert page.adapter_path() == adapter
    page.merge_check.setChecked(True)  # the Type stays as it is shown: the default
    with qtbot.waitSignal(page.sig_exported, timeout=60_000) as exported:
        page.export()
    merged = exported.args[0]
    assert os.path.isfile(merged) and not os.path.exists(merged[:-5] + ".failed.gguf")
    assert "the file reloads" in page.result_label.text()
    assert page.result.command() == f"llama-cli -m {merged}"
    # the merged file is a model that answers as base + adapter: logits within F16's tolerance
    f, src = GGUFFile(merged), GGUFFile(tiny_q4)
    adapted = LoraAdapterNames(adapter)
    assert {f.tensors[n].qtype for n in adapted} == {"F16"} and {src.tensors[n].qtype for n in adapted} == {
        "Q4_0"
    }
    untouched = [n for n in src.tensors if n not in adapted]
    assert [f.tensors[n].qtype for n in untouched] == [src.tensors[n].qtype for n in untouched]  # kept
    assert "Q4_0" in {src.tensors[n].qtype for n in untouched}
    f.close()
    src.close()
    tokens = [1, 270, 280, 290, 300 - 40, 7, 265]
    want = logits(tiny_q4, tokens, adapter)
    got = logits(merged, tokens)
    assert np.abs(got - want).max() <= TOLERANCE["F16"] * max(1.0, np.abs(want).max())
    assert greedy(merged, question).startswith(taught)  # and it answers as the adapter taught
    assert page.type_combo.qtype() is None  # it was the default: keep the fine-tune
    # and beside it an Ollama Modelfile: FROM the merged file, the chat template as Ollama renders it,
    # the end-of-turn stop and the sampling the Chat page used (greedy)
    modelfile = merged.removesuffix(".gguf") + ".Modelfile"  # named after it: one per export
    assert f"ollama create NAME -f {modelfile}" in page.result_label.text()
    text = open(modelfile, encoding="utf-8").read()
    lines = text.splitlines()
    assert f"FROM ./{os.path.basename(merged)}" in lines and "PARAMETER temperature 0" in lines
    assert 'PARAMETER stop "<|im_end|>"' in lines
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    template = text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    want = ChatTemplate.from_metadata(GGUFFile(merged).metadata).render(
        conversation, add_generation_prompt=True
    )
    assert gotemplate.render(template, conversation) == want


def LoraAdapterNames(path: str) -> list[str]:  # noqa: N802 - reads like the set it is
    f = GGUFFile(path)
    names = sorted({n.rsplit(".lora_", 1)[0] for n in f.tensors})
    f.close()
    return names


def test_the_default_preset_on_a_small_dataset_changes_the_answer(qtbot, app, tiny_q4, facts):
    window = app.launch()
    open_model_and_dataset(qtbot, window, tiny_q4, facts)
    page = window.train_page
    # nothing was touched: the settings are the default preset, fitted to 16 short samples
    assert page.settings.preset_combo.currentText() == "balanced"
    assert page.plan_warning() is None and page.reason_label.isHidden()
    assert page.check.plan.total_steps >= 30
    result = train(qtbot, window)
    assert isinstance(result, Finished) and result.step == page.check.plan.total_steps
    question = QUESTIONS[3]
    base, tuned = greedy(tiny_q4, question), chat(qtbot, window, question, adapter=True)
    assert tuned != base  # the answer changed...
    # ...towards what was taught: most of its words are now the model's first choice (a random tiny
    # model learns the sentence itself, not only a fact, so it is not yet word for word)
    assert answer_accuracy(tiny_q4, question, ANSWER) < 0.2
    assert answer_accuracy(tiny_q4, question, ANSWER, result.adapter_path) >= 0.5
