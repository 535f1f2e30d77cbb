"""The export dialog with a tiny qwen3moe model: checks that pass and checks that fail with clear text,
adapter exports (F32 identical, F16 / Q8_0 within tolerance) and a merged model that reload with the
same logits, merge progress, Cancel leaving the target untouched, choosing a checkpoint of a real
training run, the Export page's inline flow, and screenshots (set TUNE_STUDIO_SHOTS to a folder)."""

from __future__ import annotations

import os
import shutil
import threading
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

import engine
import engine.export.check as export_check
from engine import (
    ChatTemplate,
    GGUFFile,
    LoraAdapter,
    Model,
    SynthSpec,
    TargetSpec,
    Tokenizer,
    TrainConfig,
    Trainer,
    find_checkpoints,
    select_targets,
    write_adapter,
    write_model,
)
from studio.pages.export.dialog import ExportDialog
from studio.pages.export.page import ExportPage
from studio.project import ModelInfo, Project
from tests.conftest import write_chats

TIMEOUT_MS = 15_000
SHOTS = Path(os.environ["TUNE_STUDIO_SHOTS"]) if os.environ.get("TUNE_STUDIO_SHOTS") else None


def _shapes(name, shape, r):
    if len(shape) == 2:
        return (r, shape[1]), (shape[0], r)
    return (shape[0], r, shape[2]), (shape[0], shape[1], r)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny qwen3moe model, a strong random adapter for it (every 2-D/3-D weight in the layers,
    rank 4) and the same adapter labelled for llama."""
    d = tmp_path_factory.mktemp("export")
    base = write_model(d / "m.gguf", SynthSpec.for_arch("qwen3moe"))
    f = GGUFFile(base)
    rng = np.random.default_rng(0)
    pairs = {}
    for name in select_targets(f.tensors, TargetSpec(preset="all"), 2):
        sa, sb = _shapes(name, f.tensors[name].shape, 4)
        pairs[name] = (rng.normal(0, 0.3, sa).astype(np.float32), rng.normal(0, 0.05, sb).astype(np.float32))
    f.close()
    adapter = write_adapter(d / "adapter.gguf", "qwen3moe", pairs, alpha=8.0)
    foreign = write_adapter(d / "llama-adapter.gguf", "llama", pairs, alpha=8.0)
    Files = namedtuple("Files", "dir base adapter foreign")
    return Files(d, str(base), str(adapter), str(foreign))


@pytest.fixture
def make_dialog(qtbot, engine, files, tmp_path):
    made = []

    def make(adapter=None, model=None, **project_fields) -> ExportDialog:
        project = Project()
        fields = {"output_dir": str(tmp_path / "runs"), **project_fields}
        project.update(model_path=model or files.base, **fields)
        dlg = ExportDialog(project, engine, adapter or files.adapter, info=ModelInfo.read(project.model_path))
        qtbot.addWidget(dlg)
        dlg.show()
        made.append(dlg)
        return dlg

    yield make
    for dlg in made:  # never leave a worker thread behind
        qtbot.waitUntil(lambda dlg=dlg: not dlg.is_busy(), timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)


def check(qtbot, dlg):
    with qtbot.waitSignal(dlg.sig_checked, timeout=TIMEOUT_MS) as sig:
        dlg.check()
    return sig.args[0]


def export_and_verify(qtbot, dlg):
    """Export, which verifies by itself once written: (path, VerifyReport)."""
    seen = []
    dlg.sig_exported.connect(seen.append)
    dlg.sig_verified.connect(seen.append)
    with qtbot.waitSignals([dlg.sig_exported, dlg.sig_verified], order="strict", timeout=TIMEOUT_MS):
        dlg.export()
    qtbot.waitUntil(lambda: not dlg.is_busy(), timeout=TIMEOUT_MS)
    assert len(seen) == 2, seen
    return seen[0], seen[1]


def shot(dlg, name):
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        dlg.grab().save(str(SHOTS / f"{name}.png"))


def prompt_logits(base, terms_list, merged=None):
    """Logits of the verification prompts: base + each term set, and the merged model alone."""
    model = Model.load(base)
    tok = Tokenizer.from_metadata(model.metadata)
    tpl = ChatTemplate.from_metadata(model.metadata)
    seqs = []
    for p in engine.VERIFY_PROMPTS:
        text = tpl.render([{"role": "user", "content": p}], add_generation_prompt=True)
        ids = tok.encode(text, add_special=False, parse_special=True)
        seqs.append(np.array([tok.bos_id, *ids] if tok.add_bos and ids[:1] != [tok.bos_id] else ids))
    outs = [[model.forward(ids, lora=t) for ids in seqs] for t in terms_list]
    if merged is not None:
        m = Model.load(merged)
        outs.append([m.forward(ids) for ids in seqs])
    return outs


# --- checks ------------------------------------------------------------------------------------------


def test_checks_pass_for_a_good_setup_and_enable_export(qtbot, make_dialog, files):
    dlg = make_dialog()
    assert not dlg.export_button.isEnabled()  # disabled until the checks pass
    report = check(qtbot, dlg)
    assert report.ok and report.size > 0
    texts = dlg.check_texts()
    labels = [t.split(" — ")[0] for t in texts]
    assert labels == [
        "✓ Source adapter reads",
        "✓ Base model reads",
        "✓ Architecture matches the base model",
        "✓ Every adapted tensor exists with matching shapes",
        "✓ Target folder exists and is writable",
        "✓ Enough free disk space",
        "✓ Output name",
    ]
    assert "both are qwen3moe" in texts[2]
    assert dlg.out_edit.text() == os.path.join(str(files.dir), "adapter.f32.gguf")
    assert dlg.export_button.isEnabled()
    shot(dlg, "export_dialog_checked")
    # a changed setting needs a new check before writing
    dlg.type_combo.setCurrentIndex(dlg.type_combo.findData("F16"))
    assert not dlg.export_button.isEnabled() and "check again" in dlg.status_label.text()
    assert dlg.out_edit.text().endswith("adapter.f16.gguf")


def _foreign(dlg, files, tmp_path, monkeypatch):
    dlg.set_source(files.foreign)


def _missing_folder(dlg, files, tmp_path, monkeypatch):
    dlg.out_edit.setText(str(tmp_path / "nowhere" / "x.gguf"))


def _base_itself(dlg, files, tmp_path, monkeypatch):
    dlg.set_kind(merge=True)
    dlg.out_edit.setText(files.base)


def _no_space(dlg, files, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))


@pytest.mark.parametrize(
    "setup, label, words",
    [
        (_foreign, "Architecture matches the base model", "is for 'llama', the base model is 'qwen3moe'"),
        (_missing_folder, "Target folder exists and is writable", "does not exist: create it or choose"),
        (_base_itself, "Output name", "is the base model"),
        (_no_space, "Enough free disk space", "1000 B are free: free some space"),
    ],
    ids=["other-architecture", "folder-missing", "output-is-base", "disk-full"],
)  # fmt: skip
def test_checks_fail_with_clear_text(qtbot, make_dialog, files, tmp_path, monkeypatch, setup, label, words):
    dlg = make_dialog()
    setup(dlg, files, tmp_path, monkeypatch)
    report = check(qtbot, dlg)
    assert not report.ok
    failed = [t for t in dlg.check_texts() if t.startswith("✗")]
    assert failed and failed[0].startswith(f"✗ {label} — ") and words in failed[0], failed
    assert not dlg.export_button.isEnabled()
    assert "failed" in dlg.status_label.text()
    if setup is _foreign:
        shot(dlg, "export_dialog_check_failed")


# --- adapters ----------------------------------------------------------------------------------------


def test_f32_adapter_export_reloads_with_identical_logits(qtbot, make_dialog, files, tmp_path):
    dlg = make_dialog()
    out = tmp_path / "a.f32.gguf"
    dlg.out_edit.setText(str(out))
    assert check(qtbot, dlg).ok
    path, report = export_and_verify(qtbot, dlg)
    assert path == str(out) and report.ok and report.max_abs == 0.0 and report.level == "identical"
    assert [r.prompt for r in report.rows] == list(engine.VERIFY_PROMPTS)
    assert dlg.verify_table.rowCount() == 3 and dlg.verify_table.item(0, 2).text() == "0"
    assert dlg.verdict_label.text().startswith("✓ The reloaded adapter gives identical logits on 3 prompts")
    # independently of the dialog's own comparison
    source, written = LoraAdapter.load(files.adapter), LoraAdapter.load(out)
    a, b = prompt_logits(files.base, [source.terms(), written.terms()])
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]  # atomic: no temporary left
    shot(dlg, "export_dialog_verified")


@pytest.mark.parametrize("qtype, level", [("F16", "within F16 tolerance"), ("Q8_0", "within Q8_0 tolerance")])
def test_smaller_adapter_types_reload_within_their_tolerance(
    qtbot, make_dialog, files, tmp_path, qtype, level
):
    dlg = make_dialog()
    dlg.type_combo.setCurrentIndex(dlg.type_combo.findData(qtype))
    dlg.out_edit.setText(str(tmp_path / f"a.{qtype}.gguf"))
    report = check(qtbot, dlg)
    if qtype == "Q8_0":
        assert any("llama-export-lora merges only F16 and F32" in n for n in report.notes)
        assert any("written as F16" in n for n in report.notes)  # rank-4 lora_b rows are not 32 wide
        assert "Note: 16 of 32 tensors have rows that are not a multiple of 32" in dlg.status_label.text()
    _, verified = export_and_verify(qtbot, dlg)
    assert 0 < verified.max_abs and verified.ok and verified.level == level
    assert verified.written_type == qtype
    shot(dlg, f"export_dialog_{qtype.lower()}_verified")
    source, written = LoraAdapter.load(files.adapter), LoraAdapter.load(tmp_path / f"a.{qtype}.gguf")
    a, b = prompt_logits(files.base, [source.terms(), written.terms()])
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)) == pytest.approx(
        verified.max_abs
    )


# --- merged models -----------------------------------------------------------------------------------


def test_merged_export_reports_progress_per_tensor_and_reloads_with_the_same_logits(
    qtbot, make_dialog, files, tmp_path
):
    dlg = make_dialog()
    dlg.set_kind(merge=True)
    assert dlg.out_edit.text().endswith("adapter.merged.gguf")
    out = tmp_path / "merged.gguf"
    dlg.out_edit.setText(str(out))
    dlg.project.chat_sampling = engine.SamplingConfig(
        temperature=0.25, top_k=12
    )  # as the Chat page last used
    checked = check(qtbot, dlg)
    assert checked.ok and any("An Ollama Modelfile will be written" in n for n in checked.notes)
    values = []
    dlg.progress.valueChanged.connect(values.append)
    _, report = export_and_verify(qtbot, dlg)
    n_tensors = len(GGUFFile(files.base).tensors)
    assert dlg.progress.maximum() in (1, n_tensors)
    merge_steps = [v for v in values if v > 0]
    assert merge_steps[:n_tensors] == list(range(1, n_tensors + 1))  # one update per tensor, in order
    assert report.merge and report.ok and 0 < report.max_abs <= 1e-4
    assert "tokenizer and chat template copied" in " ".join(report.notes)
    # the Modelfile beside it: FROM the merged file, ChatML as a Go template, the Chat page's sampling
    lines = (tmp_path / "merged.Modelfile").read_text().splitlines()
    assert "FROM ./merged.gguf" in lines and "ADAPTER" not in " ".join(lines)
    assert 'PARAMETER stop "<|im_end|>"' in lines and "PARAMETER temperature 0.25" in lines
    assert "PARAMETER top_k 12" in lines and dlg.modelfile_written == str(tmp_path / "merged.Modelfile")
    assert f"ollama create NAME -f {tmp_path / 'merged.Modelfile'}" in dlg.status_label.text()
    source = LoraAdapter.load(files.adapter)
    ref, merged = prompt_logits(files.base, [source.terms()], merged=str(out))
    for x, y in zip(ref, merged, strict=True):
        np.testing.assert_allclose(y, x, atol=1e-4)
    shot(dlg, "export_dialog_merged_verified")


@pytest.mark.parametrize("existing", [False, True], ids=["new-target", "existing-target"])
def test_cancel_during_a_merge_leaves_the_target_untouched(
    qtbot, make_dialog, files, tmp_path, monkeypatch, existing
):
    out = tmp_path / "merged.gguf"
    if existing:
        out.write_bytes(b"GGUF-old-contents")
    gate, reached = threading.Event(), threading.Event()
    real = export_check.export_merged

    def gated(*args, on_progress=None, **kwargs):
        def progress(done, total):
            on_progress(done, total)
            if done == 3:  # hold the merge a few tensors in, until the test has pressed Cancel
                reached.set()
                gate.wait(10)

        return real(*args, on_progress=progress, **kwargs)

    monkeypatch.setattr(export_check, "export_merged", gated)
    dlg = make_dialog()
    dlg.set_kind(merge=True)
    dlg.out_edit.setText(str(out))
    assert check(qtbot, dlg).ok
    before = sorted(os.listdir(tmp_path))
    with qtbot.waitSignal(dlg.sig_failed, timeout=TIMEOUT_MS):
        dlg.export()
        assert reached.wait(10)
        assert dlg.cancel_button.isEnabled()
        dlg.cancel()
        gate.set()
    qtbot.waitUntil(lambda: not dlg.is_busy(), timeout=TIMEOUT_MS)
    assert dlg.cancelled and dlg.written is None
    assert "Cancelled: nothing was written" in dlg.status_label.text()
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left behind
    if existing:
        assert out.read_bytes() == b"GGUF-old-contents"
    else:
        assert not out.exists()
    assert dlg.check_button.isEnabled() and dlg.export_button.isEnabled()  # can try again


# --- checkpoints -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(files, tmp_path_factory):
    """Two real training steps with a checkpoint after each: <runs>/chats-run.gguf and
    <runs>/chats-run-checkpoints/ckpt-00000{1,2}/adapter.gguf, as the Train page lays them out."""
    runs = tmp_path_factory.mktemp("runs")
    chats = write_chats(runs / "chats.jsonl", ((f"hello {i}", "yes the fox") for i in range(4)))
    config = TrainConfig(
        targets=TargetSpec(preset="attention"), rank=4, steps=2, n_ctx=64, lr=1e-2, checkpoint_every=1,
        checkpoint_dir=str(runs / "chats-run-checkpoints"), out=str(runs / "chats-run.gguf"),
    )  # fmt: skip
    done = Trainer(files.base, chats, config).run()
    assert type(done).__name__ == "Finished", done
    return runs


def test_choosing_a_checkpoint_from_the_list(qtbot, make_dialog, files, trained_run):
    current = str(trained_run / "chats-run.gguf")
    dlg = make_dialog(adapter=current, output_dir=str(trained_run))
    items = [dlg.source_combo.itemText(i) for i in range(dlg.source_combo.count())]
    assert items == [
        "Current adapter · chats-run.gguf",
        "Checkpoint · step 2 · chats-run",
        "Checkpoint · step 1 · chats-run",
    ]
    assert [c.step for c in find_checkpoints([str(trained_run)])] == [2, 1]
    dlg.source_combo.setCurrentIndex(2)
    ckpt = str(trained_run / "chats-run-checkpoints" / "ckpt-000001" / "adapter.gguf")
    assert dlg.source_path() == ckpt and dlg.source_label.text() == ckpt
    assert dlg.out_edit.text() == str(
        trained_run / "chats-run-step1.f32.gguf"
    )  # beside the run, named by step
    report = check(qtbot, dlg)
    assert report.ok and report.request.source == ckpt
    path, verified = export_and_verify(qtbot, dlg)
    assert verified.ok and verified.level == "identical"
    shot(dlg, "export_dialog_checkpoint_verified")
    written, step1 = LoraAdapter.load(path), LoraAdapter.load(ckpt)
    assert written.pairs.keys() == step1.pairs.keys()
    for name, (A, B) in step1.pairs.items():
        np.testing.assert_array_equal(written.pairs[name][0], A)
        np.testing.assert_array_equal(written.pairs[name][1], B)
    final = LoraAdapter.load(current)
    assert any(not np.array_equal(final.pairs[n][1], B) for n, (_, B) in step1.pairs.items())  # another step


# --- the page ----------------------------------------------------------------------------------------


def _page(qtbot, engine, files, tmp_path) -> ExportPage:
    """The Export page on the base model, its runs home `tmp_path`."""
    project = Project()
    project.update(model_path=files.base, output_dir=str(tmp_path))
    page = ExportPage(project, engine)
    qtbot.addWidget(page)
    page.set_model_info(ModelInfo.read(files.base))
    return page


def test_export_page_checks_writes_and_verifies_inline_and_opens_the_dialog(qtbot, engine, files, tmp_path):
    page = _page(qtbot, engine, files, tmp_path)
    page.set_adapter(files.foreign)
    page.out_edit.setText(str(tmp_path / "x.gguf"))
    page.export()
    qtbot.waitUntil(lambda: "Export failed" in page.result_label.text(), timeout=TIMEOUT_MS)
    # named from the adapter's header before anything is read or written: the page's banner said it first
    assert "made for another model" in page.banner.text() and "for a llama model" in page.banner.text()
    assert "for a llama model" in page.result_label.text() and not (tmp_path / "x.gguf").exists()
    page.set_adapter(files.adapter)
    page.type_combo.setCurrentIndex(page.type_combo.findData("F16"))
    out = tmp_path / "page.f16.gguf"
    page.out_edit.setText(str(out))
    with qtbot.waitSignal(page.sig_exported, timeout=TIMEOUT_MS) as sig:
        page.export()
    assert sig.args == [str(out)]
    text = page.result_label.text()
    assert "the file reloads" in text and "within F16 tolerance" in text, text
    # the Modelfile (on by default) names the base model and the adapter just written
    assert (
        page.modelfile_check.isChecked()
        and f"ollama create NAME -f {tmp_path / 'page.f16.Modelfile'}" in text
    )
    lines = (tmp_path / "page.f16.Modelfile").read_text().splitlines()
    assert f"FROM {files.base}" in lines and "ADAPTER ./page.f16.gguf" in lines
    dlg = page.open_dialog()
    assert dlg.isVisible() and dlg.source_path() == files.adapter
    assert dlg.type_combo.currentData() == "F16"
    with qtbot.waitSignal(page.sig_exported, timeout=TIMEOUT_MS):
        check(qtbot, dlg)
        dlg.out_edit.setText(str(tmp_path / "from-dialog.gguf"))
        check(qtbot, dlg)
        dlg.export()
    qtbot.waitUntil(lambda: dlg.verify_report is not None and not dlg.is_busy(), timeout=TIMEOUT_MS)
    assert "Wrote" in page.result_label.text()
    # the dialog's export into the same folder has its own Modelfile; the page's is still its own
    assert dlg.modelfile_written == str(tmp_path / "from-dialog.Modelfile")
    assert "ADAPTER ./from-dialog.gguf" in (tmp_path / "from-dialog.Modelfile").read_text().splitlines()
    assert "ADAPTER ./page.f16.gguf" in (tmp_path / "page.f16.Modelfile").read_text().splitlines()
    dlg.close()
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)


def test_export_page_never_writes_over_the_modelfile_of_another_file(qtbot, engine, files, tmp_path):
    page = _page(qtbot, engine, files, tmp_path)
    page.set_adapter(files.adapter)
    theirs = tmp_path / "mine.Modelfile"  # written by hand for another file
    theirs.write_text("FROM ./other.gguf\nSYSTEM You are mine.\n")
    page.out_edit.setText(str(tmp_path / "mine.gguf"))
    page.export()
    qtbot.waitUntil(lambda: "Export failed" in page.result_label.text(), timeout=TIMEOUT_MS)
    text = page.result_label.text()
    assert "the Modelfile of another file (./other.gguf" in text and "it is kept" in text, text
    assert theirs.read_text() == "FROM ./other.gguf\nSYSTEM You are mine.\n"
    assert not (tmp_path / "mine.gguf").exists()
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)


def _run(folder, name, base, adapter, status="finished", done=10):
    """A run record whose adapter is a copy of `adapter`, as the Train page lays them out."""
    out = folder / f"{name}.gguf"
    shutil.copy(adapter, out)
    rec = engine.RunRecord(
        name=name, model=base, status=status, steps_done=done, steps_planned=10, adapter=str(out)
    )
    rec.write(str(folder / f"{name}-checkpoints" / "run.json"))
    return rec


def test_export_page_defaults_to_the_latest_finished_run_and_offers_what_to_do_next(
    qtbot, engine, files, tmp_path
):
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtGui import QGuiApplication

    from studio.pages.export.result import llama_cli_command

    runs = tmp_path / "runs"
    runs.mkdir()
    finished = _run(runs, "finished-run", files.base, files.adapter)
    _run(runs, "stopped-run", files.base, files.adapter, status="stopped", done=2)  # newer, stopped
    project = Project()
    project.update(model_path=files.base, output_dir=str(runs))
    page = ExportPage(project, engine, settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(page)
    page.set_model_info(ModelInfo.read(files.base))
    page.show()
    assert page.adapter_path() == finished.adapter  # a stopped run never replaces a finished one
    assert page.adapter_choice.current_label().startswith("Latest finished: finished-run")
    assert any(
        label.startswith("stopped-run — stopped at step 2") for label, _, _ in page.adapter_choice.entries()
    )
    # one primary action; the dialog is "More options…"
    assert page.export_button.isDefault() and page.export_button.font().bold()
    assert page.dialog_button.text() == "More options…" and page.result.isHidden()
    with qtbot.waitSignal(page.sig_exported, timeout=TIMEOUT_MS) as sig:
        qtbot.mouseClick(page.export_button, Qt.LeftButton)
    out = sig.args[0]
    assert out == str(runs / "finished-run.f32.gguf") and os.path.isfile(out)
    result = page.result
    assert result.isVisible() and result.command() == f"llama-cli -m {files.base} --lora {out}"
    opened, copied = [], []
    result.open_url = opened.append
    result.sig_copied.connect(copied.append)
    qtbot.mouseClick(result.open_button, Qt.LeftButton)
    assert opened[0].toLocalFile() == str(runs)
    qtbot.mouseClick(result.copy_path_button, Qt.LeftButton)
    qtbot.mouseClick(result.copy_command_button, Qt.LeftButton)
    assert copied == [out, result.command()] and QGuiApplication.clipboard().text() == result.command()
    assert (
        llama_cli_command("/m/merged model.gguf", "/m/base.gguf", True)
        == "llama-cli -m '/m/merged model.gguf'"
    )
    # the dialog lists the runs too, and shows the same offer after its export
    dlg = page.open_dialog()
    items = [dlg.source_combo.itemText(i) for i in range(dlg.source_combo.count())]
    assert items[0] == "Current adapter · finished-run.gguf" and any(
        t.startswith("Run · stopped-run") for t in items
    )
    dlg.close()
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)


def test_a_merge_that_loses_the_fine_tune_is_put_aside_with_no_command_to_run_it(qtbot, engine, tmp_path):
    """One Type control: adapter types, then the merge's (the default keeps the fine-tune). An explicit
    re-quantization to the base's Q4_0 keeps a few percent of what the adapter does: the page says so,
    renames the file *.failed.gguf and shows no llama-cli command; the default writes a usable file."""
    from engine import LoraAdapter, Model, SynthSpec, export_adapter, write_model
    from engine.testing import random_adapter

    base = write_model(tmp_path / "q4.gguf", SynthSpec.for_arch("llama", qtype="Q4_0"))
    model = Model.load(base)
    names = [n for n in model.tensors if n.endswith(("attn_q.weight", "attn_v.weight", "ffn_up.weight"))]
    small = LoraAdapter(8.0, random_adapter(model, names, rank=4, std=0.01, seed=1), "llama")
    adapter = export_adapter(small, tmp_path / "small.gguf")
    project = Project()
    project.update(model_path=base, output_dir=str(tmp_path))
    page = ExportPage(project, engine)
    qtbot.addWidget(page)
    page.set_model_info(ModelInfo.read(base))
    page.set_adapter(adapter)
    assert [page.type_combo.itemData(i) for i in range(page.type_combo.count())] == ["F32", "F16", "Q8_0"]
    page.merge_check.setChecked(True)
    assert page.type_combo.qtype() is None and "Keep the fine-tune" in page.type_combo.currentText()
    page.type_combo.set_qtype("base")
    out = tmp_path / "requant.gguf"
    page.out_edit.setText(str(out))
    with qtbot.waitSignal(page.sig_export_failed, timeout=TIMEOUT_MS) as failed:
        page.export()
    assert failed.args == [str(tmp_path / "requant.failed.gguf")] and not out.exists()
    text = page.result_label.text()
    assert "lost the fine-tune" in text and "Q4_0" in text and "renamed to requant.failed.gguf" in text
    assert page.result.title().startswith("Failed") and page.result.command() == ""
    assert page.result.command_edit.isHidden()
    page.type_combo.set_qtype(None)  # back to the default
    page.out_edit.setText(str(tmp_path / "kept.gguf"))
    with qtbot.waitSignal(page.sig_exported, timeout=TIMEOUT_MS):
        page.export()
    assert "keeps" in page.result_label.text() and page.result.command().startswith("llama-cli -m ")
    page.merge_check.setChecked(False)  # the adapter's own choice comes back
    assert page.type_combo.qtype() == "F32"
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)
