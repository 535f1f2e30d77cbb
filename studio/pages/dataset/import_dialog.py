"""The column-mapping dialog of an import: which column of a CSV/TSV (or which field of a JSON
file) is the prompt, the response, the system message, the reward, the chosen and rejected answers,
or a whole text, with a live preview of the samples the first rows become and their problems."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import ColumnMap, DatasetError, Source, convert_source

PREVIEW_ROWS = 8  # rows converted for the preview (the import converts them all)
_NONE = "(none)"
_LABELS = {
    "prompt": "Prompt (user)",
    "response": "Response (assistant)",
    "system": "System message",
    "reward": "Reward (number)",
    "chosen": "Chosen answer",
    "rejected": "Rejected answer",
    "text": "Whole text",
}


class ColumnMapDialog(QDialog):
    """Choose the columns; the preview shows the first rows as samples, as they will be imported."""

    def __init__(self, source: Source, guess: ColumnMap, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.source = source
        self.setWindowTitle(f"Import {source.path.name}")
        self.resize(860, 520)
        layout = QVBoxLayout(self)
        unread = [p for p in source.problems if p.severity == "error"]
        skipped = ""
        if unread:
            skipped = f" {len(unread)} record(s) cannot be read and are left out (line {unread[0].line}: "
            skipped += f"{unread[0].message})."
        intro = QLabel(
            f"{source.format.upper()} file, {len(source.rows)} rows, columns: "
            f"{', '.join(source.columns) or 'none'}. Choose which column is which; the file itself "
            f"is only read.{skipped}"
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        top = QHBoxLayout()
        form = QFormLayout()
        self.combos: dict[str, QComboBox] = {}
        for role, label in _LABELS.items():
            box = QComboBox()
            box.setObjectName(f"map_{role}")
            box.addItem(_NONE, None)
            for column in source.columns:
                box.addItem(column, column)
            chosen = getattr(guess, role)
            if chosen in source.columns:
                box.setCurrentIndex(source.columns.index(chosen) + 1)
            box.currentIndexChanged.connect(self.update_preview)
            form.addRow(label, box)
            self.combos[role] = box
        top.addLayout(form)
        layout.addLayout(top)
        self.preview = QTableWidget(0, 3)
        self.preview.setHorizontalHeaderLabels(["Line", "Sample", "Problems"])
        self.preview.horizontalHeader().setStretchLastSection(True)
        self.preview.setColumnWidth(1, 460)
        self.preview.verticalHeader().hide()
        layout.addWidget(self.preview, 1)
        self.status = QLabel()
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.button(QDialogButtonBox.Ok).setText("Import")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.update_preview()

    def mapping(self) -> ColumnMap:
        return ColumnMap(**{role: box.currentData() for role, box in self.combos.items()})

    def set_column(self, role: str, column: str | None) -> None:
        box = self.combos[role]
        box.setCurrentIndex(max(0, box.findData(column)) if column else 0)

    def update_preview(self) -> None:
        """Convert the first rows under the current mapping and show them (or why not)."""
        head = Source(
            self.source.path, self.source.format, self.source.columns, self.source.rows[:PREVIEW_ROWS]
        )
        ok = self.buttons.button(QDialogButtonBox.Ok)
        self.preview.setRowCount(0)
        try:
            result = convert_source(head, self.mapping())
        except DatasetError as exc:
            self.status.setText(f"Cannot import with this mapping: {exc}")
            ok.setEnabled(False)
            return
        by_line = {s.line: s for s in result.samples}
        problems: dict[int, list[str]] = {}
        for p in result.problems:
            problems.setdefault(p.line, []).append(f"{p.severity}: {p.message}")
        for row in head.rows:
            sample = by_line.get(row.line)
            shown = _describe(sample) if sample is not None else "(left out)"
            r = self.preview.rowCount()
            self.preview.insertRow(r)
            for c, text in enumerate((str(row.line), shown, "; ".join(problems.get(row.line, [])))):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.preview.setItem(r, c, item)
        ok.setEnabled(bool(result.samples))
        more = len(self.source.rows) - len(head.rows)
        self.status.setText(
            f"Preview of the first {len(head.rows)} rows: {len(result.samples)} become samples"
            + (f"; {more} more rows are converted on import." if more > 0 else ".")
        )


def _describe(sample) -> str:
    parts = []
    for m in sample.messages:
        parts.append(f"{m['role']}: {m['content']}")
    if sample.kind == "text":
        parts = [f"text: {sample.text}"]
    if sample.rejected is not None:
        parts.append(f"rejected: {sample.rejected}")
    if sample.reward is not None:
        parts.append(f"reward {sample.reward:g}")
    return " | ".join(p.replace("\n", " ⏎ ") for p in parts)
