"""Journey: a person with a quantized MoE model (every matrix Q8_0, the experts included) opens it and a
small dataset, trains LoRA on attention, router and every expert, chats with the adapter, closes the
app, opens it again and chats with the same run's adapter: the answers are the ones it learned.

On the CPU the experts are multiplied straight from their int8 codes (engine.kernels.blockq_cpu): with
the cache budget the run chooses by itself ("auto"), which keeps every expert's codes, the file's
layout forward and its transpose backward; with the cache off (the Train page's setting for a model
larger than memory) codes made on each use forward and float experts backward. The adapter written
must not depend on that: the engine loading it with float experts (the NumPy reference kernels, as any
other program reads the file) gives the same logits within float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import SynthSpec, write_model
from engine.kernels import blockq_cpu, jit, moe_cpu

from .conftest import (
    ANSWER,
    QUESTIONS,
    TEACHING,
    answer_accuracy,
    chat,
    logits,
    open_model,
    open_model_and_dataset,
    train_with,
)


@pytest.mark.parametrize(("budget", "backward_layout"), [("auto", "out"), ("off", None)])
def test_train_a_quantized_moe_model_chat_relaunch_and_chat_again(
    qtbot, app, facts, tmp_path, monkeypatch, budget, backward_layout
):
    path = write_model(tmp_path / "moe-q8.gguf", SynthSpec.for_arch("qwen3moe", qtype="Q8_0", seed=5))
    # as in the app, where the studio asks OpenBLAS for a short spin before NumPy loads and the experts
    # run on CPU workers: codes (this test process loaded NumPy first, so its BLAS threads decide)
    monkeypatch.setattr(moe_cpu, "codes_pay", lambda: True)
    layouts = []
    monkeypatch.setattr(moe_cpu, "xwt_cpu", lambda x, w: layouts.append(w.along) or blockq_cpu.xwt_cpu(x, w))

    window = app.launch()
    open_model_and_dataset(qtbot, window, path, facts)
    # LoRA on attention, router and every expert, with settings that teach the tiny model the answer
    result = train_with(qtbot, window, steps=40, cache_budget=budget, **TEACHING)
    assert not result.stopped and result.step == 40
    # the experts' products: forward from codes; backward from their transpose where the cache keeps
    # every expert's codes, else by float experts
    assert "in" in layouts and ("out" in layouts) == (backward_layout is not None)
    adapter = result.adapter_path
    question = QUESTIONS[0]
    base_accuracy = answer_accuracy(path, question, ANSWER)
    tuned_accuracy = answer_accuracy(path, question, ANSWER, adapter)
    assert tuned_accuracy >= 0.75 > base_accuracy, (tuned_accuracy, base_accuracy)
    tuned = chat(qtbot, window, question, adapter=True)
    assert tuned != chat(qtbot, window, question, adapter=False)

    # closed and opened again: the run is in the history, and Chat answers with its adapter as before
    window.close()
    window = app.launch()
    open_model(qtbot, window, path)
    assert window.chat_page.adapter_choice.current_path() == adapter
    assert chat(qtbot, window, question, adapter=True) == tuned

    # the adapter file read with float experts (the NumPy reference kernels): the same model
    tokens = [1, 270, 280, 290, 260, 7, 265]
    from_codes = logits(path, tokens, adapter)
    monkeypatch.setenv(jit.OFF_VARIABLE, "1")
    jit.reset()
    try:
        from_floats = logits(path, tokens, adapter)
    finally:
        monkeypatch.delenv(jit.OFF_VARIABLE)
        jit.reset()
    scale = float(np.abs(from_floats).max())
    np.testing.assert_allclose(from_codes, from_floats, rtol=1e-4, atol=1e-4 * scale)
