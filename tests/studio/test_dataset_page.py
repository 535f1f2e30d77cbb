"""The Dataset page: opening files with problems, searching, sorting, undoable edits, saving safely,
importing ShareGPT/Alpaca, and the token view against the engine's own encoding."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl, qInstallMessageHandler
from PySide6.QtGui import QDropEvent, QKeySequence
from PySide6.QtTest import QAbstractItemModelTester
from PySide6.QtWidgets import QApplication

from engine import EncodeOptions, encode_samples, load_jsonl, sample_to_json
from studio.dataset_document import DatasetDocument
from studio.pages.dataset.page import DatasetPage
from studio.pages.dataset.proxy import SamplesFilterModel
from studio.pages.dataset.table import SamplesModel
from studio.pages.dataset.tokens import TOKEN_PROPERTY
from studio.project import ModelInfo, Project
from studio.resources import DEMO_MODEL

DATASETS = Path(__file__).resolve().parents[1] / "data" / "datasets"
SAMPLE_DATA = DATASETS / "sample_data.jsonl"
RWSFT_DATA = DATASETS / "sample_rwsft_data.jsonl"


@pytest.fixture(scope="module")
def info() -> ModelInfo:
    return ModelInfo.read(str(DEMO_MODEL))


@pytest.fixture
def project() -> Project:
    return Project()


@pytest.fixture
def page(qtbot, project) -> DatasetPage:
    p = DatasetPage(project)
    qtbot.addWidget(p)
    p.resize(1200, 800)
    p.ask_unsaved = lambda: "discard"
    p.confirm = lambda title, text: True
    return p


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copyfile(src, dst)
    return dst


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def column(page: DatasetPage, col: int) -> list[str]:
    proxy = page.proxy
    return [proxy.index(r, col).data() for r in range(proxy.rowCount())]


def problem_texts(page: DatasetPage) -> list[str]:
    page.problems_count()  # the list is made a slice at a time: finish it
    return [page.problems_model.text(i) for i in range(page.problems_model.rowCount())]


def as_json(samples) -> list[dict]:
    return [sample_to_json(s) for s in samples]


def options(project: Project) -> EncodeOptions:
    c = project.config
    return EncodeOptions(n_ctx=c.n_ctx, train_on_prompt=c.train_on_prompt, prompt_format=c.prompt_format)


# --- the table model --------------------------------------------------------------------------


def test_samples_model_passes_the_model_tester_with_and_without_a_model(qtmodeltester, info, project):
    samples, _ = load_jsonl(SAMPLE_DATA)
    model = SamplesModel(DatasetDocument(samples))
    qtmodeltester.check(model)
    assert model.index(0, SamplesModel.COL_TOKENS).data() == "–"
    model.set_encoder(info.tokenizer, info.template, options(project))
    qtmodeltester.check(model)
    encoded, _ = encode_samples(samples, info.tokenizer, info.template, options(project))
    counts = [model.index(r, SamplesModel.COL_TOKENS).data() for r in range(model.rowCount())]
    assert counts == [f"{len(e.tokens):,}" for e in encoded]
    proxy = SamplesFilterModel()
    proxy.setSourceModel(model)
    proxy.set_search("lora")
    qtmodeltester.check(proxy)


@pytest.mark.no_qt_log  # the tester's reports are read here (see below), not failed on wholesale
def test_samples_model_follows_every_change_of_its_document(tmp_path):
    reports: list[str] = []
    previous = qInstallMessageHandler(lambda mode, context, message: reports.append(message))
    try:
        samples, _ = load_jsonl(SAMPLE_DATA)
        doc = DatasetDocument(samples)
        model = SamplesModel(doc)
        # Qt's tester stays on and checks each begin/end signal against the rows
        tester = QAbstractItemModelTester(model, QAbstractItemModelTester.FailureReportingMode.Warning)
        doc.insert(2, [replace(samples[0], line=0), replace(samples[1], line=0)])
        doc.remove([0, 3, 4, 8])
        doc.move(0, 4)
        doc.move(4, 1)
        doc.edit(2, replace(doc.sample(2), reward=0.25))
        for _ in range(5):
            doc.undo()
        doc.redo()
        doc.save(tmp_path / "saved.jsonl")  # renumbers lines
        doc.open(SAMPLE_DATA)
        del tester
    finally:
        qInstallMessageHandler(previous)
    assert model.samples == doc.samples() and model.rowCount() == len(doc)
    lines = [model.index(r, SamplesModel.COL_LINE).data() for r in range(model.rowCount())]
    assert lines == [str(i) for i in range(1, 8)]
    # every failure the tester reports, but for its comparisons of column 0 beside rows that came or
    # went: that column is the position ("#"), which renumbers by design (a dataChanged follows)
    failures = [m for m in reports if m.startswith("FAIL")]
    assert [m for m in failures if "(c.next)" not in m and "(c.last)" not in m] == []


# --- opening and problems ---------------------------------------------------------------------


def test_bad_lines_are_listed_by_line_and_clicking_one_selects_its_sample(qtbot, page, tmp_path, project):
    path = write_lines(
        tmp_path / "bad.jsonl",
        [
            json.dumps({"prompt": "Hi", "response": "Hello!"}),
            '{"prompt": "broken',
            json.dumps({"text": "plain text sample"}),
            json.dumps(
                {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ""}]}
            ),
            json.dumps({"messages": [{"role": "user", "content": "no reply"}]}),
        ],
    )
    page.show()
    qtbot.waitExposed(page)
    assert page.open_path(path)
    assert [s.line for s in page.samples] == [1, 3, 4]
    texts = problem_texts(page)
    assert texts[0].startswith("line 2: invalid JSON")
    assert any(t.startswith("line 4: ") and "empty content" in t for t in texts)
    assert any(t.startswith("line 5: ") and "no assistant message" in t for t in texts)
    assert "2 line(s) could not be read" in page.message.text() and page.message.isVisible()

    page.select_rows([0])
    row4 = next(i for i, t in enumerate(texts) if t.startswith("line 4: "))
    index = page.problems_model.index(row4, 0)
    page.problems.scrollTo(index)
    rect = page.problems.visualRect(index)
    qtbot.mouseClick(page.problems.viewport(), Qt.LeftButton, pos=rect.center())
    assert page.current_row() == 2 and page.samples[page.current_row()].line == 4
    assert page.editor.sample == page.samples[2]

    # a skipped line has no row: clicking it explains that instead of selecting another sample
    page.select_problem(0)
    assert page.current_row() == 2
    assert "Line 2 could not be read" in page.message.text()


def test_a_line_that_is_not_utf8_is_a_problem_of_that_line(qtbot, page, tmp_path):
    """One bad line never stops the file: it is reported with its number, the rest loads."""
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n{"text": "fine"}\n')
    assert page.open_path(path)
    assert [s.text for s in page.samples] == ["fine"]
    [problem] = page.skipped
    assert problem.line == 1 and "not UTF-8" in problem.message and "encoding" in problem.message


def test_project_dataset_path_follows_open_and_save_as_and_a_loaded_project(page, project, tmp_path):
    first = copy_of(SAMPLE_DATA, tmp_path)
    assert page.open_path(first)
    assert project.dataset_path == str(first)
    other = tmp_path / "renamed.jsonl"
    assert page.save_as(other)
    assert project.dataset_path == str(other) and page.path == str(other)
    rw = copy_of(RWSFT_DATA, tmp_path)
    project.update(dataset_path=str(rw))  # e.g. a project file was loaded
    assert page.path == str(rw) and len(page.samples) == len(load_jsonl(rw)[0])


def test_unsaved_changes_are_not_discarded_without_asking(page, tmp_path):
    assert page.open_path(copy_of(SAMPLE_DATA, tmp_path))
    page.select_rows([0])
    page.delete_selected()
    asked = []
    page.ask_unsaved = lambda: asked.append(1) or "cancel"
    assert not page.open_path(RWSFT_DATA)
    assert asked and page.is_modified and len(page.samples) == 6
    page.ask_unsaved = lambda: "discard"
    assert page.open_path(RWSFT_DATA)
    assert not page.is_modified and page.document.undo_count() == 0


def test_dropping_a_jsonl_file_opens_it(qtbot, page, tmp_path):
    path = copy_of(RWSFT_DATA, tmp_path)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    with qtbot.waitSignal(page.sig_dataset_opened) as opened:
        page.dropEvent(event)
    assert opened.args == [str(path)]


# --- searching and sorting --------------------------------------------------------------------


def test_search_filters_rows_on_all_text_ignoring_case(page):
    assert page.open_path(SAMPLE_DATA)
    assert page.proxy.rowCount() == 7
    page.search.setText("LORA")
    words = column(page, SamplesModel.COL_WORDS)
    assert len(words) == 2 and words[0] == "What is LoRA?" and words[1].startswith("QLoRA")
    page.search.setText("concise coding")  # only in a system turn, not in the first words
    assert column(page, SamplesModel.COL_INDEX) == [3]
    assert "1 shown" in page.stats_label.text()
    page.search.clear()
    assert page.proxy.rowCount() == 7


def test_sorting_by_reward(page):
    assert page.open_path(RWSFT_DATA)
    page.table.sortByColumn(SamplesModel.COL_REWARD, Qt.DescendingOrder)
    rewards = [float(r) for r in column(page, SamplesModel.COL_REWARD)]
    assert rewards == sorted((s.reward for s in page.samples), reverse=True)
    page.table.sortByColumn(SamplesModel.COL_REWARD, Qt.AscendingOrder)
    assert [float(r) for r in column(page, SamplesModel.COL_REWARD)] == sorted(rewards)


# --- undoable edits ---------------------------------------------------------------------------


def test_add_duplicate_delete_reorder_undo_and_redo_restore_the_exact_list(page):
    assert page.open_path(SAMPLE_DATA)
    original = page.samples
    states = [original]  # the list after each command

    page.select_rows([1])
    page.add_sample()
    assert page.current_row() == 2 and page.samples[2].kind == "messages" and page.samples[2].line == 0
    states.append(page.samples)

    page.select_rows([0, 3])
    page.duplicate_selected()
    assert page.samples[4:6] == [replace(states[-1][0], line=0), replace(states[-1][3], line=0)]
    assert page.samples[:4] == states[-1][:4] and page.samples[6:] == states[-1][4:]
    states.append(page.samples)

    page.select_rows([5])
    page.move_current(-1)
    states.append(page.samples)
    page.move_current(-1)
    assert page.samples[3] == states[-2][5] and page.current_row() == 3
    states.append(page.samples)

    page.select_rows([0, 7])
    page.delete_selected()
    assert page.samples == [s for i, s in enumerate(states[-1]) if i not in (0, 7)]
    states.append(page.samples)

    assert page.document.undo_count() == len(states) - 1 and page.is_modified
    assert page.action_undo.text() == "Undo delete 2 samples" and page.action_undo.isEnabled()
    assert not page.action_redo.isEnabled()
    for expected in reversed(states[:-1]):
        page.undo()
        assert page.samples == expected
    assert page.samples == original and not page.is_modified
    assert not page.action_undo.isEnabled() and page.action_undo.text() == "Undo"
    assert page.action_redo.text() == "Redo add a conversation"
    for expected in states[1:]:
        page.redo()
        assert page.samples == expected


def test_editing_a_turn_and_the_reward_is_one_undo_step_each(qtbot, page):
    assert page.open_path(SAMPLE_DATA)
    page.show()
    qtbot.waitExposed(page)
    page.select_rows([0])
    original = page.samples[0]
    edit = page.editor.turns[2].edit
    edit.setFocus()
    edit.moveCursor(edit.textCursor().MoveOperation.End)
    qtbot.keyClicks(edit, " Yes.")
    assert page.samples[0].messages[2]["content"] == "The capital of France is Paris. Yes."
    assert page.document.undo_count() == 1  # five keystrokes merged
    assert page.samples[0].group == original.group  # the prompt did not change

    page.editor.reward.setFocus()
    page.editor.reward.setValue(0.75)
    assert page.samples[0].reward == 0.75
    assert page.model.index(0, SamplesModel.COL_REWARD).data() == "0.75"
    assert page.document.undo_count() == 2

    page.undo()
    assert page.samples[0].reward is None and page.editor.reward.reward() is None
    page.undo()
    assert page.samples[0] == original
    assert edit.toPlainText() == "The capital of France is Paris."
    page.redo()
    assert edit.toPlainText().endswith("Yes.")


def test_ctrl_z_in_a_turn_box_undoes_through_the_dataset(qtbot, page):
    assert page.open_path(SAMPLE_DATA)
    page.show()
    qtbot.waitExposed(page)
    page.select_rows([3])  # prompt/response
    box = page.editor.response
    box.setFocus()
    qtbot.keyClicks(box, "!!")
    assert page.samples[3].response.startswith("!!")
    assert page.samples[3].messages[1]["content"] == page.samples[3].response
    qtbot.keyClick(box, Qt.Key_Z, Qt.ControlModifier)
    assert page.samples[3] == load_jsonl(SAMPLE_DATA)[0][3]


def test_structural_turn_edits_and_role_change_are_undoable(page):
    assert page.open_path(SAMPLE_DATA)
    page.select_rows([1])
    original = page.samples[1]
    page.editor.add_turn()
    assert [m["role"] for m in page.samples[1].messages] == ["user", "assistant", "user"]
    assert len(page.editor.turns) == 3
    page.editor.move_turn(2, 0)
    page.editor.turns[1].role.setCurrentText("system")
    assert [m["role"] for m in page.samples[1].messages] == ["user", "system", "assistant"]
    page.editor.remove_turn(0)
    assert [m["role"] for m in page.samples[1].messages] == ["system", "assistant"]
    for _ in range(4):
        page.undo()
    assert page.samples[1] == original
    assert [t.role.currentText() for t in page.editor.turns] == ["user", "assistant"]


# --- saving -----------------------------------------------------------------------------------


def test_save_writes_a_file_that_reads_back_equal(qtbot, page, tmp_path):
    path = copy_of(RWSFT_DATA, tmp_path)
    assert page.open_path(path)
    page.select_rows([1])
    page.editor.reward.setValue(-0.5)
    page.add_sample("text")
    page.editor.text.setPlainText("A new plain text sample.")
    assert page.is_modified
    with qtbot.waitSignal(page.sig_modified) as modified:
        assert page.save()
    assert modified.args == [False] and not page.is_modified
    samples, problems = load_jsonl(path)
    assert problems == []
    assert as_json(samples) == as_json(page.samples)
    assert [s.line for s in page.samples] == list(range(1, len(samples) + 1))
    assert samples[1].reward == -0.5 and samples[2].text == "A new plain text sample."


def test_save_failure_shows_the_error_and_leaves_the_file_unchanged(qtbot, page, tmp_path, monkeypatch):
    path = copy_of(SAMPLE_DATA, tmp_path)
    before = path.read_bytes()
    assert page.open_path(path)
    page.select_rows([0])
    page.delete_selected()

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with qtbot.waitSignal(page.sig_error) as error:
        assert not page.save()
    assert "No space left on device" in error.args[0]
    assert page.message.level == "error" and "file on disk was not changed" in page.message.text()
    assert path.read_bytes() == before
    assert page.is_modified and page.path == str(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    monkeypatch.undo()

    folder = tmp_path / "a_folder.jsonl"
    folder.mkdir()
    with qtbot.waitSignal(page.sig_error):
        assert not page.save_as(folder)
    assert "is a folder" in page.message.text()
    assert page.path == str(path) and path.read_bytes() == before


def test_saving_over_a_file_with_unreadable_lines_asks_first(page, tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"text": "ok"}), "not json"])
    before = path.read_bytes()
    assert page.open_path(path)
    page.confirm = lambda title, text: False
    assert not page.save()
    assert path.read_bytes() == before
    page.confirm = lambda title, text: True
    assert page.save()
    assert load_jsonl(path) == (page.samples, [])


# --- import -----------------------------------------------------------------------------------


def test_sharegpt_and_alpaca_import_as_messages_and_undo_removes_them(page, tmp_path):
    assert page.open_path(SAMPLE_DATA)
    sharegpt = write_lines(
        tmp_path / "sharegpt.jsonl",
        [
            json.dumps(
                {
                    "conversations": [
                        {"from": "system", "value": "Be brief."},
                        {"from": "human", "value": "Hi there"},
                        {"from": "gpt", "value": "Hello!"},
                    ]
                }
            ),
            "{oops",
        ],
    )
    alpaca = write_lines(
        tmp_path / "alpaca.jsonl",
        [json.dumps({"instruction": "Translate", "input": "chat", "output": "cat"})],
    )
    assert page.import_path(sharegpt)
    assert "1 line(s) could not be read" in page.message.text()
    assert page.import_path(alpaca)
    added = page.samples[7:]
    assert [s.kind for s in added] == ["messages", "messages"]
    assert [m["role"] for m in added[0].messages] == ["system", "user", "assistant"]
    assert added[1].messages == (
        {"role": "user", "content": "Translate\n\nchat"},
        {"role": "assistant", "content": "cat"},
    )
    assert [s.line for s in added] == [0, 0]
    out = tmp_path / "merged.jsonl"
    assert page.save_as(out)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all("messages" in obj for obj in lines[7:]) and len(lines) == 9
    page.undo()
    assert len(page.samples) == 8
    assert page.is_modified


def test_import_of_an_unreadable_file_changes_nothing(qtbot, page, tmp_path):
    assert page.open_path(SAMPLE_DATA)
    with qtbot.waitSignal(page.sig_error):
        assert not page.import_path(tmp_path / "missing.jsonl")
    assert len(page.samples) == 7 and page.document.undo_count() == 0


# --- tokens -----------------------------------------------------------------------------------


def test_token_view_trains_exactly_the_assistant_reply_and_its_end_of_turn(page, info, project):
    assert page.open_path(SAMPLE_DATA)
    page.set_model_info(info)
    page.select_rows([0])
    view = page.token_view
    reply = page.samples[0].messages[-1]["content"]
    assert "".join(t.text for t in view.tokens if t.trained) == reply + "<|im_end|>"

    [encoded], _ = encode_samples([page.samples[0]], info.tokenizer, info.template, options(project))
    n_trained = int(encoded.trained.sum())
    assert (view.n_trained, view.n_masked) == (n_trained, len(encoded.tokens) - n_trained)
    assert view.counts.text().startswith(f"{n_trained} trained / {len(encoded.tokens) - n_trained} masked")
    assert [t.token_id for t in view.tokens] == encoded.tokens.tolist()
    assert page.model.index(0, SamplesModel.COL_TRAINED).data() == str(n_trained)

    # the document shows the same: the spans on a trained background are the reply and <|im_end|>
    trained_bgs = {c.name() for c in view_colours(view)["trained"]}
    shown, block = [], view.text.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fmt = fragment.charFormat()
            if fmt.background().color().name() in trained_bgs:
                shown.append(fragment.text())
                assert isinstance(fmt.property(TOKEN_PROPERTY), int)
            it += 1
        block = block.next()
    assert "".join(shown) == reply + "<|im_end|>"
    specials = [t.text for t in view.tokens if t.special]
    assert "<|im_start|>" in specials and "<|im_end|>" in specials


def view_colours(view):
    from studio.pages.dataset.tokens import token_colours

    return token_colours(view.palette())


def test_token_view_follows_edits_and_decodes_multibyte_characters(qtbot, page, info, tmp_path):
    reply = "Héllo wörld — ✓ 日本"
    path = write_lines(
        tmp_path / "utf8.jsonl",
        [
            json.dumps(
                {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": reply}]}
            )
        ],
    )
    page.set_model_info(info)
    assert page.open_path(path)
    view = page.token_view
    assert "".join(t.text for t in view.tokens if t.trained) == reply + "<|im_end|>"
    assert any(t.text == "" for t in view.tokens)  # byte tokens that only start a character
    page.editor.turns[1].edit.setPlainText("Bye")
    qtbot.waitUntil(lambda: "".join(t.text for t in view.tokens if t.trained) == "Bye<|im_end|>")
    [encoded], _ = encode_samples(page.samples, info.tokenizer, info.template, options(page.project))
    assert [t.token_id for t in view.tokens] == encoded.tokens.tolist()


def test_without_a_model_counts_are_dashes_and_the_token_view_says_why(page, info):
    assert page.open_path(SAMPLE_DATA)
    page.select_rows([0])
    assert set(column(page, SamplesModel.COL_TOKENS)) == {"–"}
    assert "No model is open" in page.token_view.text.toPlainText()
    assert "no model open" in page.stats_label.text()
    page.set_model_info(info)
    page.model.encode_all()
    page.refresh()
    assert "–" not in column(page, SamplesModel.COL_TOKENS)
    assert "tokens (" in page.stats_label.text()
    page.set_model_info(None)
    assert set(column(page, SamplesModel.COL_TOKENS)) == {"–"}


def test_changing_n_ctx_recounts_and_reports_truncation(page, info, project):
    assert page.open_path(SAMPLE_DATA)
    page.set_model_info(info)
    page.select_rows([1])
    project.update_config(n_ctx=64)
    assert page.model.index(1, SamplesModel.COL_TOKENS).data() == "64 ✂"
    assert any("truncated to n_ctx=64" in p.message for p in page.model.problems(1))
    assert len(page.token_view.tokens) == 64 and "cut at n_ctx = 64" in page.token_view.counts.text()
    project.update_config(n_ctx=16)  # the prompt alone is longer: nothing left to train on
    assert page.model.index(1, SamplesModel.COL_TOKENS).data() == "–"
    assert "no trained tokens left" in page.token_view.text.toPlainText()


# --- actions and looks ------------------------------------------------------------------------


def test_actions_have_the_documented_shortcuts(page):
    shortcuts = {a.text(): a.shortcut().toString() for a in page.actions()}
    assert shortcuts == {
        "Open dataset…": "Ctrl+Shift+O",
        "Save dataset": "Ctrl+S",
        "Save dataset as…": "Ctrl+Shift+S",
        "Import CSV/ShareGPT/Alpaca…": "",
        "Add sample": "Ctrl+Shift+N",
        "Duplicate": "Ctrl+D",
        "Delete": "Del",
        "Move up": "Alt+Up",
        "Move down": "Alt+Down",
        "Undo": "Ctrl+Z",
        "Redo": "Ctrl+Shift+Z",
        "Find": "Ctrl+F",
    }
    assert all(a.toolTip() for a in page.actions())


def test_keyboard_shortcuts_act_on_the_table(qtbot, page):
    assert page.open_path(SAMPLE_DATA)
    page.show()
    qtbot.waitExposed(page)
    page.windowHandle().requestActivate()  # shortcuts need an active window
    qtbot.waitUntil(lambda: QApplication.activeWindow() is page)
    page.select_rows([0])
    page.table.setFocus()
    qtbot.keyClick(page.table, Qt.Key_Down, Qt.AltModifier)
    assert page.samples[1].line == 1 and page.current_row() == 1
    qtbot.keyClick(page.table, Qt.Key_D, Qt.ControlModifier)
    assert len(page.samples) == 8
    qtbot.keyClick(page.table, Qt.Key_Delete)
    assert len(page.samples) == 7
    qtbot.keySequence(page.table, QKeySequence("Ctrl+Z"))
    assert len(page.samples) == 8
    qtbot.keySequence(page.table, QKeySequence("Ctrl+F"))
    assert page.search.hasFocus()


def test_screenshots_with_a_model_and_a_problem_selected(qtbot, page, info, tmp_path):
    shots = Path(os.environ.get("TUNE_STUDIO_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    page.set_model_info(info)
    assert page.open_path(SAMPLE_DATA)
    page.show()
    qtbot.waitExposed(page)
    page.model.encode_all()
    page.refresh()
    page.select_rows([0])
    qtbot.wait(50)  # let the layouts settle, as the event loop would
    assert [t.isVisible() and t.height() > 40 for t in page.editor.turns] == [True] * 3
    stats = page.stats_label
    assert stats.width() >= stats.sizeHint().width()  # not clipped by a long path
    pixmap = page.grab()
    assert pixmap.width() == 1200 and pixmap.height() == 800
    assert pixmap.save(str(shots / "page.png"))

    bad = write_lines(
        tmp_path / "problems.jsonl",
        [*SAMPLE_DATA.read_text(encoding="utf-8").splitlines()[:4], '{"prompt": "x"', '{"text": ""}']
        + [json.dumps({"prompt": "Say hi", "response": "", "reward": 2.5})],
    )
    assert page.open_path(bad)
    page.model.encode_all()
    page.refresh()
    row = next(i for i, text in enumerate(problem_texts(page)) if "line 7" in text)
    page.select_problem_at(row)
    assert page.samples[page.current_row()].line == 7
    qtbot.wait(50)
    assert page.grab().save(str(shots / "page_problem.png"))
