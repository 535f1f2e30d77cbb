"""Preference files in the Dataset editor: pairs written by other tools open with their problems by
line, a pair is shown and edited as prompt, chosen and rejected answers (swap included, each one
undo step), a new pair can be added, and saving writes {"prompt" or "messages", "chosen", "rejected"}
lines that read back as the same pairs."""

from __future__ import annotations

import json

import pytest

from engine import load_jsonl
from studio.pages.dataset.page import DatasetPage
from studio.pages.dataset.table import SamplesModel
from studio.project import Project
from tests.studio.test_dataset_page import column, problem_texts, write_lines


@pytest.fixture
def page(qtbot) -> DatasetPage:
    p = DatasetPage(Project())
    qtbot.addWidget(p)
    p.resize(1200, 800)
    p.ask_unsaved = lambda: "discard"
    p.confirm = lambda title, text: True
    return p


def test_a_preferences_file_opens_edits_and_saves_as_pairs(qtbot, page, tmp_path):
    path = write_lines(tmp_path / "prefs.jsonl", [
        json.dumps({"prompt": "Is the sky blue?", "chosen": "Yes, on a clear day.", "rejected": "No."}),
        json.dumps({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                    "chosen": [{"role": "assistant", "content": "Hello!"}],
                    "rejected": [{"role": "assistant", "content": "What?"}]}),
        json.dumps({"prompt": "Only one answer", "chosen": "here"}),
        json.dumps({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}),
    ])  # fmt: skip
    page.show()
    qtbot.waitExposed(page)
    assert page.open_path(path)
    assert column(page, SamplesModel.COL_SHAPE) == ["preference", "preference", "messages"]
    texts = problem_texts(page)
    assert any(t.startswith("line 3: ") and 'needs "rejected"' in t for t in texts)
    assert column(page, SamplesModel.COL_WORDS)[0] == "Is the sky blue?"
    # the editor shows the pair as prompt, chosen and rejected
    page.select_rows([1])
    ed = page.editor
    assert ed.pages.currentWidget() is ed._page_of["preference"]
    assert (ed.pref_prompt.toPlainText(), ed.pref_chosen.toPlainText(), ed.pref_rejected.toPlainText()) == (
        "Hi", "Hello!", "What?")  # fmt: skip
    assert "system: Be brief." in ed.pref_context.text()
    page.select_rows([0])
    assert not ed.pref_context.isVisibleTo(page)
    ed.pref_rejected.setFocus()
    ed.pref_rejected.moveCursor(ed.pref_rejected.textCursor().MoveOperation.End)
    qtbot.keyClicks(ed.pref_rejected, " Never.")
    assert page.samples[0].rejected == "No. Never." and page.document.undo_count() == 1
    ed.swap_answers()
    s = page.samples[0]
    assert (s.messages[-1]["content"], s.rejected) == ("No. Never.", "Yes, on a clear day.")
    assert ed.pref_chosen.toPlainText() == "No. Never."
    page.undo()  # the swap is one step
    assert page.samples[0].messages[-1]["content"] == "Yes, on a clear day."
    ed.pref_prompt.setPlainText("Is the sky blue at noon?")
    assert page.samples[0].prompt == "Is the sky blue at noon?"
    # a new pair from the Add menu
    page.add_sample("preference")
    new = page.current_row()
    assert new == 1  # after the selected pair
    ed.pref_prompt.setPlainText("Name a colour.")
    ed.pref_chosen.setPlainText("Blue.")
    ed.pref_rejected.setPlainText("Seven.")
    assert page.samples[new].kind == "preference"
    assert page.save()
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == {"prompt": "Is the sky blue at noon?", "chosen": "Yes, on a clear day.",
                       "rejected": "No. Never."}  # fmt: skip
    assert (
        rows[2]["messages"][0] == {"role": "system", "content": "Be brief."} and rows[2]["chosen"] == "Hello!"
    )
    assert rows[new] == {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven."}
    samples, problems = load_jsonl(path)
    assert not [p for p in problems if p.severity == "error"]
    assert [s.kind for s in samples].count("preference") == 3
