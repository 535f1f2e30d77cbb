"""The Train page's log keeps its last LOG_MAX_LINES lines: a QPlainTextEdit lays out every line it
holds (about 7 KB a line), and 5,000 lines were the app's largest memory growth in a long session
(`bench/soak.py app`: +35 MiB over the first hundred rounds)."""

from __future__ import annotations

from studio.pages.train.layout import LOG_MAX_LINES
from studio.pages.train.page import TrainPage
from studio.project import Project


def test_the_log_keeps_its_last_lines_only(qtbot, engine):
    page = TrainPage(Project(), engine, None)
    qtbot.addWidget(page)
    for i in range(LOG_MAX_LINES + 250):
        page._log(f"step {i}")
    assert page.log.blockCount() == LOG_MAX_LINES <= 1000
    lines = page.log.toPlainText().splitlines()
    assert lines[-1].endswith(f"step {LOG_MAX_LINES + 249}") and lines[0].endswith("step 250")
