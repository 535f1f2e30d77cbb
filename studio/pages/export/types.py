"""The one Type control of an export, for adapters and merged models alike.

`ExportTypeCombo` lists what can be written for the kind of export chosen (`set_merge`): an
adapter's tensor type (F32 exact, F16, Q8_0), or what a merge does with the adapted tensors: by
default a type that keeps the fine-tune (F16 where the base is quantized: re-quantizing W + ΔW to
a 4- or 8-bit type rounds most of a LoRA update away), F32, or an explicit re-quantization (the
base's own types, Q8_0, Q6_K, Q4_K, BF16), whose result is measured after writing. Each kind
remembers its own choice when the other is shown. `qtype()` is what `engine.ExportRequest` takes.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QWidget

from engine import MERGE_BASE_TYPE

ADAPTER_CHOICES: tuple[tuple[str | None, str, str], ...] = (  # (qtype, text, tooltip)
    ("F32", "F32 — exact (default)", "The adapter's factors as trained. llama-cli --lora and "
     "llama-export-lora both read it."),
    ("F16", "F16 — half the size", "Logits move by about 1e-3 of their size. llama-cli --lora and "
     "llama-export-lora both read it."),
    ("Q8_0", "Q8_0 — a quarter; llama-cli --lora only", "llama-export-lora merges only F16/F32 "
     "adapters; tensors whose rows are not a multiple of 32 are written as F16."),
)  # fmt: skip
MERGE_CHOICES: tuple[tuple[str | None, str, str], ...] = (
    (None, "Keep the fine-tune — adapted tensors in F16 (default)",
     "Adapted tensors the base stores quantized are written as F16, the others in their own float "
     "type; every other tensor is copied as it is. The file grows by the F16 size of the adapted "
     "tensors and answers like base + adapter."),
    ("F32", "F32 — adapted tensors exact", "Adapted tensors as F32: exact, and twice the size of F16."),
    (MERGE_BASE_TYPE, "Re-quantize to the base's types — smallest; measured",
     "Each adapted tensor back in the base's own type (Q4_1 stays Q4_1): the file keeps its size, but "
     "a LoRA update is usually smaller than a quantization step and is mostly rounded away. After "
     "writing, the share of the fine-tune the file keeps is measured; below half it fails."),
    ("Q8_0", "Q8_0 — re-quantize; measured", "Adapted tensors as Q8_0; what survives is measured."),
    ("Q6_K", "Q6_K — re-quantize; measured", "Adapted tensors as Q6_K; what survives is measured."),
    ("Q4_K", "Q4_K — re-quantize; measured", "Adapted tensors as Q4_K; what survives is measured."),
    ("BF16", "BF16 — re-quantize; measured", "Adapted tensors as BF16 (8-bit mantissa: small "
     "updates are rounded away); what survives is measured."),
    ("F16", "F16 — every adapted tensor", "Adapted tensors as F16, whatever the base stores."),
)  # fmt: skip


class ExportTypeCombo(QComboBox):
    """The export's tensor type; see the module docstring."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.merge = False
        self._chosen: dict[bool, object] = {False: "F32", True: None}
        self._filling = False
        self.currentIndexChanged.connect(self._remember)
        self._fill()

    def set_merge(self, merge: bool) -> None:
        """Show the choices of an adapter export (False) or of a merged model (True)."""
        if merge != self.merge:
            self.merge = merge
            self._fill()

    def qtype(self) -> str | None:
        """The type to write: an adapter type, or for a merge None (keep the fine-tune), "base", or a type."""
        return self.currentData()

    def set_qtype(self, qtype: str | None) -> None:
        i = self.findData(qtype) if qtype is not None else self._index_of_none()
        if i >= 0:
            self.setCurrentIndex(i)

    def _index_of_none(self) -> int:
        for i in range(self.count()):
            if self.itemData(i) is None:
                return i
        return -1

    def _remember(self, _index: int) -> None:
        if not self._filling:
            self._chosen[self.merge] = self.currentData()

    def _fill(self) -> None:
        choices = MERGE_CHOICES if self.merge else ADAPTER_CHOICES
        self._filling = True
        self.blockSignals(True)
        self.clear()
        for qtype, text, tip in choices:
            self.addItem(text, qtype)
            self.setItemData(self.count() - 1, tip, Qt.ToolTipRole)
        self.blockSignals(False)
        self.set_qtype(self._chosen[self.merge])
        self._filling = False
        if self.merge:
            tip = "of the merged model's adapted tensors. Default: keep the fine-tune (F16 where the base is "
            tip += "quantized)."
        else:
            tip = "of the adapter file. Default: F32."
        self.setToolTip(f"Tensor type {tip}")
        self.currentIndexChanged.emit(self.currentIndex())


def modelfile_check(parent: QWidget | None = None) -> QCheckBox:
    """The "also write an Ollama Modelfile" option of the page and the dialog (on by default)."""
    box = QCheckBox("Also write an Ollama Modelfile beside it", parent)
    box.setChecked(True)
    box.setToolTip(
        "A Modelfile beside the file, named after it (run.merged.gguf: run.merged.Modelfile, for "
        "`ollama create NAME -f run.merged.Modelfile`), so every export in a folder keeps its own: FROM "
        "the merged file (or the base model with ADAPTER), the model's chat template as an Ollama "
        "TEMPLATE, its end-of-turn tokens as stops and the Chat page's last sampling settings. Written "
        "once the file verifies; skipped, with the reason, when the template is of no known family; a "
        "Modelfile of another file already there is never written over (the checks name it). Default: on."
    )
    return box


def modelfile_outcome(path: str | None, notes: list[str]) -> str:
    """What became of the Modelfile, in words: the command that uses it, or why none was written."""
    if path:
        return f"Wrote {path}: ollama create NAME -f {path}"
    return next((n for n in notes if n.startswith("No Ollama Modelfile")), "No Modelfile was written.")


__all__ = ["ADAPTER_CHOICES", "MERGE_CHOICES", "ExportTypeCombo", "modelfile_check", "modelfile_outcome"]
