"""The Model page in a real (offscreen) window: the demo opens, a bad file shows its error."""

from __future__ import annotations

from studio.main_window import MainWindow
from studio.model_page import ModelPage
from studio.resources import DEMO_MODEL


def test_demo_model_opens_and_shows_its_facts(qtbot):
    page = ModelPage()
    qtbot.addWidget(page)
    with qtbot.waitSignal(page.sig_model_opened) as opened:
        assert page.open_path(DEMO_MODEL)
    assert opened.args == [str(DEMO_MODEL)]
    assert page.fact_labels["Architecture"].text().startswith("llama")
    assert "4 layers" in page.fact_labels["Layers"].text()
    kinds = {page.kinds.item(r, 0).text() for r in range(page.kinds.rowCount())}
    assert {"attn_q.weight", "ffn_down.weight", "token_embd.weight"} <= kinds
    assert page.error_label.isHidden()


def test_bad_file_shows_error_in_the_page(qtbot, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 10)
    page = ModelPage()
    qtbot.addWidget(page)
    with qtbot.waitSignal(page.sig_error):
        assert not page.open_path(bad)
    assert not page.error_label.isHidden()
    assert "broken.gguf" in page.error_label.text() and "Choose another file" in page.error_label.text()


def test_main_window_screenshot(qtbot, tmp_path):
    window = MainWindow()
    qtbot.addWidget(window)
    window.model_page.open_path(DEMO_MODEL)
    window.show()
    assert "llama" in window.statusBar().currentMessage()
    pixmap = window.grab()
    assert pixmap.width() > 400 and pixmap.height() > 300
