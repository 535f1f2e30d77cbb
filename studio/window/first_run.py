"""The first-run strip of the window (studio.widgets.first_steps): each step ticked from the open
model, the dataset and the targets, with the window's shortcuts (`update_first_steps(w)`)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QKeySequence


def update_first_steps(w) -> None:
    """Tick the strip's steps from the open model, the dataset and the targets."""
    steps = w.first_steps
    info = w.model_info
    go = {name: w.page_actions[i].shortcut().toString(QKeySequence.NativeText) for i, name in
          enumerate(w.page_names)}  # fmt: skip
    if w.model_page.opening:
        steps.set_step("Model", False, "opening…", f"The model is opening ({go['Model']})")
    elif info is not None:
        steps.set_step("Model", True, Path(info.path).name, f"{info.path} ({go['Model']})")
    else:
        steps.set_step("Model", False, "open a .gguf file", f"Open a model on the Model page ({go['Model']})")
    n = len(w.dataset)
    if n:
        detail = f"{n:,} sample" + ("s" if n != 1 else "")
        steps.set_step("Dataset", True, detail, f"The samples being edited ({go['Dataset']})")
    else:
        steps.set_step(
            "Dataset",
            False,
            "open or write samples",
            f"Open a .jsonl file or add samples ({go['Dataset']})",
        )
    names = w.targets_page.selected_names() if info is not None else []
    full = w.project.config.full if info is not None else ()
    if names or full:
        detail = f"{len(names)} tensor" + ("s" if len(names) != 1 else "") if names else "in full"
        steps.set_step("Targets", True, detail, f"The tensors that are trained ({go['Targets']})")
    else:
        what = "choose tensors" if info is not None else ""
        steps.set_step("Targets", False, what, f"Choose the tensors to train ({go['Targets']})")
    steps.set_step("Train", False, "", f"Start training on the Train page ({go['Train']})")
