"""The Targets page on tiny dense (llama) and MoE (qwen2moe) models written by the tests: grid and tree
show the model's tensors, presets and layer ranges select what the engine selects, edits in either
view reach the other and the project, and the summary's figures follow the selection."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QApplication

import engine
from engine import (
    PRESETS,
    TargetSpec,
    estimate_memory,
    lora_param_count,
    select_full,
    select_targets,
    split_name,
)
from engine.train.train_model import Trainable  # not exported: the test checks the studio against it
from studio.pages.targets.page import TargetsPage
from studio.project import ModelInfo, Project

L = 4


@pytest.fixture(scope="module")
def infos(tmp_path_factory) -> dict[str, ModelInfo]:
    folder = tmp_path_factory.mktemp("targets")
    out = {}
    for arch in ("llama", "qwen2moe"):
        path = engine.write_model(folder / f"{arch}.gguf", engine.SynthSpec.for_arch(arch, L=L))
        out[arch] = ModelInfo.read(str(path))
    return out


def make_page(qtbot, info: ModelInfo | None, project: Project | None = None) -> TargetsPage:
    page = TargetsPage(project or Project())
    qtbot.addWidget(page)
    page.resize(1200, 800)
    page.set_model_info(info)
    return page


def column_of(page: TargetsPage, kind: str) -> int:
    return [c.kind for c in page.selection.columns].index(kind)


def cell(page: TargetsPage, layer: int | None, kind: str):
    return page.grid_model.index(page.selection.rows.index(layer), column_of(page, kind))


def click_cell(qtbot, page: TargetsPage, layer: int | None, kind: str) -> None:
    view = page.grid_view
    index = cell(page, layer, kind)
    view.scrollTo(index)
    qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=view.visualRect(index).center())


def val(index, role=Qt.DisplayRole):
    """index.data(role) through the Python model (see studio.targets_views.value: PySide6 6.12 drops a
    reference to None on each QModelIndex.data() that yields None)."""
    return index.model().data(index, role)


def is_checked(index) -> bool:
    return val(index, Qt.CheckStateRole) == Qt.Checked


def expected_params(info: ModelInfo, names: list[str], rank: int) -> int:
    """Independent count: r (n_in + n_out) per 2-D weight, E r (n_in + n_out) per expert stack."""
    total = 0
    for name in names:
        shape = info.tensors[name].shape
        if len(shape) == 3:
            E, n_out, n_in = shape
            total += E * rank * (n_in + n_out)
        else:
            n_out, n_in = shape
            total += rank * (n_in + n_out)
    return total


# --- layout ---------------------------------------------------------------------------------------
def test_without_a_model_the_page_asks_for_one(qtbot, infos):
    page = make_page(qtbot, None)
    page.show()
    assert page.stack.currentWidget() is page.empty_panel
    assert page.placeholder.text() == "Open a model to choose targets"
    assert page.selected_names() == []
    assert not page.apply_preset("attention") and "Open a model" in page.error_label.text()
    page.set_model_info(infos["llama"])
    assert page.stack.currentIndex() == 1
    page.set_model_info(None)
    assert page.stack.currentWidget() is page.empty_panel


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_grid_shows_exactly_the_models_kinds_and_layers(qtbot, infos, arch):
    info = infos[arch]
    page = make_page(qtbot, info)
    model = page.grid_model
    kinds = [model.headerData(c, Qt.Horizontal) for c in range(model.columnCount())]
    assert sorted(kinds) == sorted({split_name(n)[1] for n in info.tensors})
    rows = [model.headerData(r, Qt.Vertical) for r in range(model.rowCount())]
    assert rows == [f"blk.{i}" for i in range(L)] + ["global"]
    lora_kinds = [c.kind for c in page.selection.columns if c.lora]
    if arch == "llama":
        assert lora_kinds == [*PRESETS["all"][:7], "token_embd", "output"]
    else:
        assert lora_kinds[:4] == ["attn_q", "attn_k", "attn_v", "attn_output"]
        assert set(lora_kinds) == {
            "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_shexp", "ffn_up_shexp",
            "ffn_down_shexp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_inp",
            "token_embd", "output",
        }  # fmt: skip
    # every tensor has exactly one cell, and a cell exists only where a tensor does
    cells = {
        model.candidate(model.index(r, c)).name
        for r in range(model.rowCount())
        for c in range(model.columnCount())
        if model.candidate(model.index(r, c)) is not None
    }
    assert cells == set(info.tensors)
    assert model.candidate(cell(page, None, "attn_q")) is None
    assert model.candidate(cell(page, 0, "output")) is None


def test_grid_and_tree_models_pass_the_model_tester(qtbot, qtmodeltester, infos):
    page = make_page(qtbot, infos["qwen2moe"])
    qtmodeltester.check(page.grid_model)
    qtmodeltester.check(page.tree_model)


def test_vector_cells_are_disabled_with_reasons(qtbot, infos):
    page = make_page(qtbot, infos["qwen2moe"])
    before = page.selected_names()
    for layer, kind, why in (
        (0, "attn_norm", "train it in full instead"),
        (2, "attn_q.bias", "a bias vector: train it in full instead"),
        (1, "ffn_gate_inp_shexp", "train it in full instead"),
        (None, "output_norm", "train it in full instead"),
    ):
        index = cell(page, layer, kind)
        assert not page.grid_model.flags(index) & Qt.ItemIsEnabled
        assert why in val(index, Qt.ToolTipRole)
        assert val(index, Qt.CheckStateRole) is None
        click_cell(qtbot, page, layer, kind)
        name = page.grid_model.candidate(index).name
        leaf = page.tree_model.index_of(name)
        assert not page.tree_model.flags(leaf) & Qt.ItemIsEnabled
        assert "train it in full instead" in val(page.tree_model.index_of(name, 4))
        assert why in val(page.tree_model.index_of(name, 4), Qt.ToolTipRole)
        assert not page.tree_model.setData(leaf, Qt.Checked, Qt.CheckStateRole)
    assert page.selected_names() == before
    header_tip = page.grid_model.headerData(column_of(page, "ffn_norm"), Qt.Horizontal, Qt.ToolTipRole)
    assert "cannot take LoRA" in header_tip


def test_expert_cells_show_how_many_experts(qtbot, infos):
    page = make_page(qtbot, infos["qwen2moe"])
    index = cell(page, 3, "ffn_up_exps")
    assert val(index, Qt.DisplayRole) == "4×"
    assert "One A/B pair per expert, 4 experts" in val(index, Qt.ToolTipRole)
    assert val(cell(page, 3, "ffn_up_shexp"), Qt.DisplayRole) == ""
    assert "one A/B per expert (4)" in val(page.tree_model.index_of("blk.3.ffn_up_exps.weight", 4))


# --- presets and layer ranges ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_presets_select_what_the_engine_selects(qtbot, infos, arch):
    info = infos[arch]
    page = make_page(qtbot, info)
    expected_enabled = {"attention", "mlp", "all", "none"} | (
        {"experts", "router"} if arch != "llama" else set()
    )
    assert {k for k, b in page.preset_buttons.items() if b.isEnabled()} == expected_enabled
    for preset in sorted(expected_enabled - {"none"}):
        qtbot.mouseClick(page.preset_buttons[preset], Qt.LeftButton)
        assert page.selected_names() == select_targets(info.tensors, TargetSpec(preset), L)
        assert page.project.config.targets == TargetSpec(preset)
        assert page.preset_buttons[preset].isChecked()
        assert sum(b.isChecked() for b in page.preset_buttons.values()) == 1
    assert page.apply_preset("none")
    assert page.selected_names() == [] and page.project.config.targets == TargetSpec("none")
    assert not page.apply_preset("bogus") and "Unknown preset" in page.error_label.text()
    if arch == "llama":
        assert "This model has no ffn_gate_exps" in page.preset_buttons["experts"].toolTip()
        page.set_model_info(infos["qwen2moe"])  # another model: the buttons follow it
        assert page.preset_buttons["experts"].isEnabled()
        assert page.preset_buttons["experts"].toolTip().startswith("Select the routed expert stacks")


def test_layer_range_restricts_the_preset(qtbot, infos):
    info = infos["qwen2moe"]
    page = make_page(qtbot, info)
    page.apply_preset("experts")
    assert page.set_layer_range("1-2")
    want = select_targets(info.tensors, TargetSpec("experts", layers="1-2"), L)
    assert page.selected_names() == want
    assert {split_name(n)[0] for n in want} == {1, 2}
    assert page.project.config.targets == TargetSpec("experts", layers="1-2")
    # a preset applied afterwards keeps the range; typing a range and Enter re-applies it
    page.apply_preset("attention")
    assert page.project.config.targets == TargetSpec("attention", layers="1-2")
    page.layer_edit.clear()
    qtbot.keyClicks(page.layer_edit, "3")
    qtbot.keyClick(page.layer_edit, Qt.Key_Return)
    assert page.selected_names() == select_targets(info.tensors, TargetSpec("attention", layers="3"), L)
    assert page.project.config.targets == TargetSpec("attention", layers="3")
    assert page.set_layer_range("")
    assert page.project.config.targets == TargetSpec("attention")
    assert "all layers" in page.selection_label.text()


def test_bad_layer_range_shows_an_error_and_changes_nothing(qtbot, infos):
    page = make_page(qtbot, infos["llama"])
    page.show()
    page.apply_preset("mlp")
    before, spec = page.selected_names(), page.project.config.targets
    for bad in ("0-9", "2-1", "x", "-1"):
        assert not page.set_layer_range(bad)
        assert page.error_label.isVisible() and "layer range" in page.error_label.text()
        assert page.selected_names() == before
        assert page.project.config.targets == spec
    assert "c0392b" in page.layer_edit.styleSheet()
    assert page.set_layer_range("0-3")
    assert not page.error_label.isVisible() and page.layer_edit.styleSheet() == ""
    # typing marks a bad range at once; the error text comes with Enter, and goes when it is fixed
    page.layer_edit.clear()
    qtbot.keyClicks(page.layer_edit, "0-")
    assert "c0392b" in page.layer_edit.styleSheet() and not page.error_label.isVisible()
    qtbot.keyClick(page.layer_edit, Qt.Key_Return)
    assert page.error_label.isVisible() and page.selected_names() == before
    qtbot.keyClicks(page.layer_edit, "1")
    assert not page.error_label.isVisible() and page.layer_edit.styleSheet() == ""


# --- clicking -------------------------------------------------------------------------------------
def test_header_clicks_toggle_a_kind_or_a_layer(qtbot, infos):
    info = infos["qwen2moe"]
    page = make_page(qtbot, info)
    page.show()
    page.apply_preset("none")
    header = page.grid_view.horizontalHeader()
    col = column_of(page, "ffn_up_exps")
    pos = QPoint(header.sectionViewportPosition(col) + header.sectionSize(col) // 2, header.height() // 2)
    qtbot.mouseClick(header.viewport(), Qt.LeftButton, pos=pos)
    assert page.selected_names() == [f"blk.{i}.ffn_up_exps.weight" for i in range(L)]
    qtbot.mouseClick(header.viewport(), Qt.LeftButton, pos=pos)
    assert page.selected_names() == []

    vheader = page.grid_view.verticalHeader()
    row = page.selection.rows.index(2)
    vpos = QPoint(vheader.width() // 2, vheader.sectionViewportPosition(row) + vheader.sectionSize(row) // 2)
    qtbot.mouseClick(vheader.viewport(), Qt.LeftButton, pos=vpos)
    layer2 = [c.name for c in page.selection.candidates if c.layer == 2 and c.lora_ok]
    assert page.selected_names() == layer2 and len(layer2) == 11
    # a partly selected layer becomes fully selected, then empty
    click_cell(qtbot, page, 2, "attn_q")
    qtbot.mouseClick(vheader.viewport(), Qt.LeftButton, pos=vpos)
    assert page.selected_names() == layer2
    qtbot.mouseClick(vheader.viewport(), Qt.LeftButton, pos=vpos)
    assert page.selected_names() == []
    page.grid_view.horizontalHeader().sectionClicked.emit(column_of(page, "output"))
    assert page.selected_names() == ["output.weight"]


def test_dragging_paints_cells_and_space_toggles(qtbot, infos):
    page = make_page(qtbot, infos["llama"])
    page.show()
    page.apply_preset("none")
    view = page.grid_view
    a, b = cell(page, 0, "ffn_up"), cell(page, 3, "ffn_up")
    pa, pb = QPointF(view.visualRect(a).center()), QPointF(view.visualRect(b).center())
    for kind, pos, button, buttons in (
        (QEvent.MouseButtonPress, pa, Qt.LeftButton, Qt.LeftButton),
        (QEvent.MouseMove, (pa + pb) / 2, Qt.NoButton, Qt.LeftButton),
        (QEvent.MouseMove, pb, Qt.NoButton, Qt.LeftButton),
        (QEvent.MouseButtonRelease, pb, Qt.LeftButton, Qt.NoButton),
    ):
        event = QMouseEvent(kind, pos, view.viewport().mapToGlobal(pos), button, buttons, Qt.NoModifier)
        QApplication.sendEvent(view.viewport(), event)
    assert {f"blk.{i}.ffn_up.weight" for i in (0, 3)} <= set(page.selected_names())
    view.setFocus()
    view.setCurrentIndex(cell(page, 1, "attn_k"))
    qtbot.keyClick(view, Qt.Key_Space)
    assert "blk.1.attn_k.weight" in page.selected_names()


def test_grid_and_tree_stay_in_sync_both_ways(qtbot, infos):
    page = make_page(qtbot, infos["qwen2moe"])
    page.show()
    tree = page.tree_model
    emitted = []
    page.sig_selection_changed.connect(emitted.append)
    # grid -> tree
    click_cell(qtbot, page, 1, "ffn_down_exps")
    assert is_checked(tree.index_of("blk.1.ffn_down_exps.weight"))
    assert emitted[-1] == page.selected_names() and "blk.1.ffn_down_exps.weight" in emitted[-1]
    assert page.tree_view.currentIndex() == tree.index_of("blk.1.ffn_down_exps.weight")
    click_cell(qtbot, page, 1, "attn_q")
    assert not is_checked(tree.index_of("blk.1.attn_q.weight"))
    assert val(tree.group_index(1), Qt.CheckStateRole) == Qt.PartiallyChecked
    # tree -> grid: one leaf, then a whole group
    assert tree.setData(tree.index_of("blk.0.ffn_gate_inp.weight"), Qt.Checked, Qt.CheckStateRole)
    assert is_checked(cell(page, 0, "ffn_gate_inp"))
    assert tree.setData(tree.group_index(None), Qt.Checked, Qt.CheckStateRole)
    assert is_checked(cell(page, None, "token_embd")) and is_checked(cell(page, None, "output"))
    assert val(tree.group_index(None), Qt.CheckStateRole) == Qt.Checked
    assert tree.setData(tree.group_index(1), Qt.Unchecked, Qt.CheckStateRole)
    assert not any(
        is_checked(cell(page, 1, c.kind)) for c in page.selection.columns if c.lora and not c.is_global
    )
    # both views show exactly the selection
    grid_names = {
        page.grid_model.candidate(page.grid_model.index(r, c)).name
        for r in range(page.grid_model.rowCount())
        for c in range(page.grid_model.columnCount())
        if is_checked(page.grid_model.index(r, c))
    }
    tree_names = {name for name in page.selection.by_name if is_checked(tree.index_of(name))}
    assert grid_names == tree_names == set(page.selected_names())
    # selecting a tree row makes its cell the grid's current cell
    page.tree_view.setCurrentIndex(tree.index_of("blk.2.attn_v.weight"))
    assert page.grid_view.currentIndex() == cell(page, 2, "attn_v")


# --- project --------------------------------------------------------------------------------------
def test_project_targets_follow_presets_and_custom_edits(qtbot, infos):
    project = Project()
    page = make_page(qtbot, infos["qwen2moe"], project)
    page.show()
    assert page.selected_names() == select_targets(infos["qwen2moe"].tensors, TargetSpec(), L)
    page.apply_preset("router")
    page.set_layer_range("0-1")
    assert project.config.targets == TargetSpec(preset="router", layers="0-1")
    click_cell(qtbot, page, 3, "attn_v")
    names = page.selected_names()
    assert names == ["blk.0.ffn_gate_inp.weight", "blk.1.ffn_gate_inp.weight", "blk.3.attn_v.weight"]
    assert project.config.targets == TargetSpec(preset="none", patterns=tuple(names))
    assert not any(b.isChecked() for b in page.preset_buttons.values())
    assert "Custom selection: 3 tensors" in page.selection_label.text()
    # a range on a custom selection drops what is outside it
    assert page.set_layer_range("0-2")
    assert project.config.targets == TargetSpec(preset="none", patterns=tuple(names[:2]))


def test_a_saved_custom_selection_loads_back(qtbot, infos, tmp_path):
    project = Project()
    page = make_page(qtbot, infos["qwen2moe"], project)
    page.show()
    page.apply_preset("experts")
    click_cell(qtbot, page, 0, "ffn_gate_exps")
    click_cell(qtbot, page, None, "output")
    page.rank_spin.setValue(4)
    chosen = page.selected_names()
    path = project.save(str(tmp_path / "p.json"))

    other = Project()
    other.load(path)
    again = make_page(qtbot, infos["qwen2moe"], other)
    assert again.selected_names() == chosen
    assert again.rank_spin.value() == 4
    assert other.config.targets == TargetSpec(preset="none", patterns=tuple(chosen))
    # loading into a page that is already showing a model updates it too
    page.apply_preset("all")
    project.load(path)
    assert page.selected_names() == chosen


def test_a_spec_that_does_not_fit_shows_an_error_not_an_exception(qtbot, infos):
    project = Project()
    project.update_config(targets=TargetSpec("attention", layers="0-40"))
    page = make_page(qtbot, infos["llama"], project)
    page.show()
    assert page.error_label.isVisible() and "do not fit this model" in page.error_label.text()
    assert page.selected_names() == []
    assert project.config.targets == TargetSpec("attention", layers="0-40")  # not overwritten
    project.update_config(targets=TargetSpec("experts"))  # llama has no experts
    assert "no tensor selected" in page.error_label.text()
    page.apply_preset("attention")
    assert not page.error_label.isVisible()
    assert project.config.targets == TargetSpec("attention")


def test_rank_and_alpha_write_to_the_project(qtbot, infos):
    project = Project()
    page = make_page(qtbot, infos["llama"], project)
    assert (page.rank_spin.value(), page.alpha_spin.value()) == (16, 32.0)
    assert (page.rank_spin.minimum(), page.rank_spin.maximum()) == (1, 256)
    page.rank_spin.setValue(8)
    page.alpha_spin.setValue(16.0)
    assert (project.config.rank, project.config.alpha) == (8, 16.0)
    assert "scale α/r = 2" in page.scale_label.text()
    project.update_config(rank=64, alpha=8.0)
    assert (page.rank_spin.value(), page.alpha_spin.value()) == (64, 8.0)
    assert "0.125" in page.scale_label.text()
    for w in (page.rank_spin, page.alpha_spin, page.layer_edit, *page.preset_buttons.values()):
        assert w.toolTip()
    assert "Default 16" in page.rank_spin.toolTip() and "alpha / r" in page.alpha_spin.toolTip()


def test_train_in_full_list_writes_project_full(qtbot, infos):
    project = Project()
    page = make_page(qtbot, infos["qwen2moe"], project)
    kinds = [page.full_list.item(i).data(Qt.UserRole) for i in range(page.full_list.count())]
    assert {"attn_norm", "ffn_norm", "output_norm", "attn_q.bias", "ffn_gate_inp"} <= set(kinds)
    assert "attn_q" not in kinds
    lora = page.stats.trainable
    page.full_list.item(kinds.index("attn_norm")).setCheckState(Qt.Checked)
    assert project.config.full == ("attn_norm",)
    assert page.stats.full_tensors == L and page.stats.full_params == L * 64
    assert page.stats.trainable == lora + L * 64
    assert "4 tensors" in page.summary_labels["Train in full"].text()
    project.update_config(full=())
    assert page.full_list.item(kinds.index("attn_norm")).checkState() == Qt.Unchecked


# --- figures --------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_parameter_count_matches_the_engine(qtbot, infos, arch):
    info = infos[arch]
    project = Project()
    page = make_page(qtbot, info, project)
    page.apply_preset("all")
    page.grid_view.horizontalHeader().sectionClicked.emit(column_of(page, "token_embd"))
    names = page.selected_names()
    assert "token_embd.weight" in names
    for rank in (16, 3):
        page.rank_spin.setValue(rank)
        want = expected_params(info, names, rank)
        assert page.stats.lora_params == want == lora_param_count(info.tensors, names, rank)
        assert f"{want:,}" in page.summary_labels["Trainable parameters"].text()
        experts = [n for n in names if len(info.tensors[n].shape) == 3]
        assert page.stats.expert_params == expected_params(info, experts, rank)
        assert page.stats.n_expert_tensors == (3 * L if arch == "qwen2moe" else 0)
    if arch == "qwen2moe":
        assert f"{page.stats.expert_params:,}" in page.summary_labels["Expert parameters"].text()
        assert page.summary_labels["Expert parameters"].isVisibleTo(page)
    else:
        assert not page.summary_labels["Expert parameters"].isVisibleTo(page)
    # the engine's own trainable set for this selection (LoRA pairs plus full-weight tensors)
    project.update_config(full=("attn_norm", "output_norm"))
    model = engine.Model.load(info.path)
    trainable = Trainable.init(
        model, names, rank=3, full=select_full(info.tensors, ("attn_norm", "output_norm"), L)
    )
    assert page.stats.trainable == trainable.n_params
    assert page.stats.full_params == (L + 1) * info.summary.config.C
    # the tree's per-tensor figures add up to the same total
    per_tensor = sum(int(val(page.tree_model.index_of(n, 3)).replace(",", "")) for n in names)
    assert per_tensor == page.stats.lora_params


def test_adapter_size_share_and_memory_update_live(qtbot, infos, tmp_path):
    info = infos["qwen2moe"]
    project = Project()
    page = make_page(qtbot, info, project)
    page.apply_preset("attention")
    labels = page.summary_labels
    size1, share1 = labels["Adapter file (F32)"].text(), labels["Share of model"].text()
    assert size1.startswith("≈")
    click_cell(qtbot, page, 0, "ffn_up_exps")
    size2, share2 = labels["Adapter file (F32)"].text(), labels["Share of model"].text()
    assert size2 != size1 and share2 != share1
    page.rank_spin.setValue(32)
    assert labels["Adapter file (F32)"].text() != size2
    st = page.stats
    assert share2 != labels["Share of model"].text()
    assert f"{100 * st.trainable / info.summary.n_params:.3g} %" in labels["Share of model"].text()
    # the estimate is close to a real F32 adapter file with the same tensors
    rank = 32
    pairs = {}
    for name in page.selected_names():
        shape = info.tensors[name].shape
        if len(shape) == 3:
            a, b = (shape[0], rank, shape[2]), (shape[0], shape[1], rank)
        elif name == "token_embd.weight":
            a, b = (shape[0], rank), (shape[1], rank)
        else:
            a, b = (rank, shape[1]), (shape[0], rank)
        pairs[name] = (np.zeros(a, np.float32), np.zeros(b, np.float32))
    real = Path(engine.write_adapter(tmp_path / "a.gguf", "qwen2moe", pairs, 32.0)).stat().st_size
    assert 4 * st.lora_params < real and math.isclose(st.adapter_bytes, real, rel_tol=0.02)
    # memory: engine estimate_memory on the same figures; follows the batch size
    mem = estimate_memory(
        info.summary.config, info.tensors, st.trainable, project.config, lora_targets=page.selected_names()
    )
    for part in ("stored", "trainable", "activations", "head", "runtime"):
        assert getattr(st.memory, part) == getattr(mem, part), part
    text = labels["Memory (estimate)"].text()
    project.update_config(batch_size=4)
    after = labels["Memory (estimate)"].text()
    assert after != text and "4 × 512 tokens" in after
    assert "estimate" in page._summary_rows["Memory (estimate)"].text()
    # an empty selection says there is nothing to train
    page.apply_preset("none")
    assert "nothing to train" in labels["Adapted tensors"].text()
    assert labels["Adapter file (F32)"].text() == "no adapter"


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_screenshot(qtbot, infos, arch, shots):
    page = make_page(qtbot, infos[arch])
    page.show()
    page.apply_preset("all" if arch == "llama" else "attention")
    if arch == "qwen2moe":
        page.grid_view.horizontalHeader().sectionClicked.emit(column_of(page, "ffn_up_exps"))
        page.set_layer_range("0-2")
    qtbot.wait(10)
    pixmap = page.grab()
    assert pixmap.width() == 1200 and pixmap.height() == 800
    assert pixmap.save(str(shots / f"targets_{arch}.png"))


# --- another model --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_layers(tmp_path_factory) -> ModelInfo:
    path = engine.write_model(
        tmp_path_factory.mktemp("two") / "llama2.gguf", engine.SynthSpec.for_arch("llama", L=2)
    )
    return ModelInfo.read(str(path))


def test_another_model_keeps_the_targets_it_has_and_says_which_were_dropped(qtbot, infos):
    project = Project()
    page = make_page(qtbot, infos["llama"], project)
    chosen = ["blk.0.attn_q.weight", "blk.1.ffn_gate.weight", "blk.2.ffn_up.weight"]
    page.selection.replace(chosen, origin="user")  # a custom selection, saved by name
    assert project.config.targets == TargetSpec(preset="none", patterns=tuple(chosen))
    project.update_config(full=("attn_norm", "ffn_gate_inp"))  # ffn_gate_inp: the MoE has it, not llama
    page.set_model_info(infos["qwen2moe"])  # no dense ffn_gate/ffn_up in the MoE
    assert page.selected_names() == ["blk.0.attn_q.weight"]
    assert project.config.targets == TargetSpec(preset="none", patterns=("blk.0.attn_q.weight",))
    text = page.message.text()
    assert not page.message.isHidden() and "kept 1 of 3 tensors" in text
    assert "blk.1.ffn_gate.weight" in text and "blk.2.ffn_up.weight" in text
    assert project.config.full == ("attn_norm", "ffn_gate_inp")  # both exist in the MoE
    page.set_model_info(infos["llama"])  # back: the router is dropped from Train in full, and said so
    assert project.config.full == ("attn_norm",) and "ffn_gate_inp" in page.message.text()


def test_another_model_narrows_a_layer_range_it_does_not_have(qtbot, infos, two_layers):
    project = Project()
    page = make_page(qtbot, infos["llama"], project)
    page.set_layer_range("1-3")
    page.apply_preset("mlp")
    page.set_model_info(two_layers)
    assert project.config.targets == TargetSpec("mlp", layers="1")
    assert page.selected_names() == select_targets(two_layers.tensors, TargetSpec("mlp", layers="1"), 2)
    assert "layers 2-3 of the range 1-3 were dropped" in page.message.text()
    assert not page.error_label.isVisible() and page.layer_edit.text() == "1"


def test_a_project_opened_with_its_model_keeps_its_targets_as_saved(qtbot, infos, tmp_path):
    project = Project()
    page = make_page(qtbot, infos["llama"], project)
    saved = Project()
    saved.update(model_path=infos["qwen2moe"].path)
    saved.update_config(targets=TargetSpec(preset="none", patterns=("blk.0.ffn_up.weight",)))
    path = str(tmp_path / "p.json")
    saved.save(path)
    project.load(path)  # the window then opens the project's model
    page.set_model_info(infos["qwen2moe"])
    assert page.message.isHidden()  # nothing carried over: the project's targets are its own
    assert project.config.targets == TargetSpec(preset="none", patterns=("blk.0.ffn_up.weight",))
