"""The Model page: the demo opens with its facts and a memory estimate; a bad file shows its error."""

from __future__ import annotations

import pytest

from engine import TargetSpec
from studio.pages.model import ModelPage
from studio.project import Project
from studio.resources import DEMO_MODEL
from tests.conftest import GOLDEN_EXTRA


def opened_page(qtbot, engine, path, project: Project | None = None) -> ModelPage:
    """A Model page that has opened the model file at `path`."""
    page = ModelPage(project or Project(), engine)
    qtbot.addWidget(page)
    with qtbot.waitSignal(page.sig_model_opened, timeout=20_000):
        page.open_path(path)
    return page


def test_demo_model_opens_and_shows_its_facts(qtbot, engine):
    project = Project()
    page = ModelPage(project, engine)
    qtbot.addWidget(page)
    with qtbot.waitSignal(page.sig_model_opened, timeout=20_000) as opened:
        assert page.open_path(DEMO_MODEL)
        assert not page.open_button.isEnabled() and "Opening" in page.path_label.text()  # busy
    assert opened.args[0].path == str(DEMO_MODEL)
    assert project.model_path == str(DEMO_MODEL)
    assert page.fact_labels["Architecture"].text().startswith("llama")
    assert "4 layers" in page.fact_labels["Layers"].text()
    assert page.fact_labels["Tokenizer"].text().startswith("gpt2")
    kinds = {page.kinds.item(r, 0).text() for r in range(page.kinds.rowCount())}
    assert {"attn_q.weight", "ffn_down.weight", "token_embd.weight"} <= kinds
    assert page.error_label.isHidden()


def test_memory_estimate_follows_targets_and_settings(qtbot, engine):
    project = Project()
    page = opened_page(qtbot, engine, DEMO_MODEL, project)
    attention = page.memory_label.text()
    assert attention.startswith("≈") and "16 adapted tensors" in attention
    assert "model file" in attention and "stays quantized" in attention
    project.update_config(targets=TargetSpec(preset="all"))
    assert "28 adapted tensors" in page.memory_label.text()
    project.update_config(n_ctx=2048)
    assert "2048 tokens" in page.memory_label.text()


def test_bad_file_shows_error_in_the_page(qtbot, engine, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 10)
    page = ModelPage(Project(), engine)
    qtbot.addWidget(page)
    with qtbot.waitSignal(page.sig_error, timeout=20_000):
        page.open_path(bad)
    assert not page.error_label.isHidden()
    assert "broken.gguf" in page.error_label.text() and "Choose another file" in page.error_label.text()


def test_device_choice_offers_cpu_and_explains_missing_gpu(qtbot, engine):
    page = ModelPage(Project(), engine)
    qtbot.addWidget(page)
    assert page.device_combo.itemData(0) == "cpu"
    texts = [page.device_combo.itemText(i) for i in range(page.device_combo.count())]
    assert any("CUDA" in t for t in texts)
    from engine import available_devices

    for d in available_devices():  # an unusable GPU is listed, disabled, with the engine's reason
        if not d.usable:
            i = next(i for i, t in enumerate(texts) if d.name in t)
            assert d.reason in texts[i] and not page.device_combo.model().item(i).isEnabled()


def test_another_model_replaces_every_fact_of_the_old_one(qtbot, engine, synth_model):
    project = Project()
    page = opened_page(qtbot, engine, DEMO_MODEL, project)
    dense_memory = page.memory_label.text()
    moe = synth_model("qwen3moe", L=2)
    with qtbot.waitSignal(page.sig_model_opened, timeout=20_000) as opened:
        page.open_path(moe)
    assert opened.args[0].path == moe and page.info is opened.args[0] and project.model_path == moe
    assert page.path_label.text() == moe
    assert page.fact_labels["Architecture"].text().startswith("qwen3moe")
    assert "2 layers" in page.fact_labels["Layers"].text()
    assert "experts" in page.fact_labels["Feed-forward"].text()
    kinds = {page.kinds.item(r, 0).text() for r in range(page.kinds.rowCount())}
    assert "ffn_up_exps.weight" in kinds and "ffn_up.weight" not in kinds  # none of the old rows left
    assert page.kinds.rowCount() == len(opened.args[0].summary.kinds)
    assert page.memory_label.text() != dense_memory and page.error_label.isHidden()


@pytest.mark.parametrize(
    "name, attention, ffn, also",
    [
        ("deepseek2", "multi-head latent attention", "shared experts", "no LoRA to attn_k_b"),
        ("gemma3", "sliding window 8 on 5 of 6 layers", "GEGLU", "soft-capped at 15"),
        ("gpt-oss", "attention sinks", "clamped SwiGLU", "biases on attn_k"),
    ],
)
def test_the_facts_name_each_architectures_layout(qtbot, engine, name, attention, ffn, also):
    page = opened_page(qtbot, engine, str(GOLDEN_EXTRA / f"{name}.gguf"))
    f = page.fact_labels
    assert attention in f["Attention"].text() and ffn in f["Feed-forward"].text()
    assert also in f["Also"].text() and page.facts.isRowVisible(f["Also"])
    assert f["Chat template"].text() == "none in the file (the default ChatML template is used)"
    with qtbot.waitSignal(page.sig_model_opened, timeout=20_000):
        page.open_path(DEMO_MODEL)  # plain llama: nothing more to say, the row goes
    assert not page.facts.isRowVisible(f["Also"])
