"""The Dataset page's import: a CSV through the column-mapping dialog with its live preview,
and Alpaca/ShareGPT JSON arrays straight in; the imported file is never modified."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QDialog, QDialogButtonBox

from studio.pages.dataset.import_dialog import ColumnMapDialog
from tests.studio import test_dataset_preferences

page = test_dataset_preferences.page  # the same Dataset page fixture

CSV = "Question,Answer,Stars\n" + "".join(f"Q{i}?,A{i},{i % 5}\n" for i in range(20)) + "broken row\n"


def _drive(monkeypatch, steps):
    """Run `steps(dialog)` where the modal dialog would wait for the person, then Import."""
    seen = {}

    def fake_exec(dialog: ColumnMapDialog) -> int:
        seen["dialog"] = dialog
        return steps(dialog)

    monkeypatch.setattr(ColumnMapDialog, "exec", fake_exec)
    return seen


def test_csv_import_through_the_mapping_dialog(qtbot, page, tmp_path, monkeypatch):
    src = tmp_path / "qa.csv"
    src.write_text(CSV, encoding="utf-8")
    previews = []

    def steps(dialog: ColumnMapDialog) -> int:
        # guessed from the header: Question is the prompt, Answer the response; Stars is not a reward name
        assert dialog.mapping().prompt == "Question" and dialog.mapping().response == "Answer"
        assert dialog.mapping().reward is None
        previews.append(dialog.preview.item(0, 1).text())
        assert dialog.preview.item(0, 1).text() == "user: Q0? | assistant: A0"
        # the person picks the reward column
        dialog.set_column("reward", "Stars")
        previews.append(dialog.preview.item(1, 1).text())  # the preview follows the mapping live
        assert dialog.preview.item(1, 1).text().endswith("reward 1")
        dialog.set_column("response", None)
        assert not dialog.buttons.button(QDialogButtonBox.Ok).isEnabled()
        assert "Cannot import" in dialog.status.text()
        dialog.set_column("response", "Answer")
        assert dialog.buttons.button(QDialogButtonBox.Ok).isEnabled()
        return QDialog.Accepted

    _drive(monkeypatch, steps)
    assert page.import_path(src)
    assert len(page.samples) == 20
    assert (
        page.samples[3].prompt == "Q3?" and page.samples[3].response == "A3" and page.samples[3].reward == 3
    )
    assert "broken row" not in "".join(s.prompt or "" for s in page.samples)
    assert "line 22" in page.message.text() and page.message.level == "warning"
    assert src.read_text(encoding="utf-8") == CSV  # the original is only read
    page.undo()
    assert len(page.samples) == 0


def test_cancelled_mapping_imports_nothing(page, tmp_path, monkeypatch):
    src = tmp_path / "qa.tsv"
    src.write_text("a\tb\nx\ty\n", encoding="utf-8")
    _drive(monkeypatch, lambda dialog: QDialog.Rejected)
    assert not page.import_path(src)
    assert len(page.samples) == 0 and page.document.undo_count() == 0


def test_alpaca_and_sharegpt_arrays_import_without_a_dialog(page, tmp_path, monkeypatch):
    monkeypatch.setattr(ColumnMapDialog, "exec", lambda d: pytest.fail("no mapping needed"))
    alpaca = tmp_path / "alpaca.json"
    alpaca.write_text(
        json.dumps([{"instruction": "Hi", "output": "Hello"}, {"instruction": 3}]), encoding="utf-8"
    )
    assert page.import_path(alpaca)
    share = tmp_path / "share.json"
    turns = [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]
    share.write_text(json.dumps([{"conversations": turns}]), encoding="utf-8")
    assert page.import_path(share)
    assert [s.messages[-1]["content"] for s in page.samples] == ["Hello", "b"]


def test_json_with_unknown_fields_asks_for_the_mapping(page, tmp_path, monkeypatch):
    src = tmp_path / "qa.json"
    src.write_text(json.dumps([{"question": "q", "answer": "a"}]), encoding="utf-8")
    seen = _drive(monkeypatch, lambda dialog: QDialog.Accepted)
    assert page.import_path(src)
    assert seen["dialog"].mapping().prompt == "question"
    assert page.samples[0].messages[-1]["content"] == "a"
