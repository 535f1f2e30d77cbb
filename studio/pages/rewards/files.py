"""The Rewards page's "Adapter and files" box: the adapter the rounds continue, saving the adapter
trained on the page, and the ratings file.

The adapter the rounds continue ("Continue:") comes from the run history (`engine.find_runs`): by
default the latest finished run of the open model (`engine.latest_finished`; a stopped run is listed,
never chosen by itself), or any run, file or a new adapter. It follows the model: another model
resets it to that model's latest finished run. An adapter made for another model is named from its
header before anything loads. Choosing another one while a session that took steps goes on asks
first (the controller's `RewardsController.start_change` decides). "Optimizer steps taken on this page
from your ratings" counts the steps of the session going on. Save adapter… writes it as a LoRA
GGUF (a job of the page's engine worker); Ratings file… chooses where ratings are appended.

`AdapterFilesWidget` is the box and what its controls do, on the page's controller (`page.ctrl`); the
page (studio.pages.rewards.page) answers for it to the window.
"""

from __future__ import annotations

import html
import os

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QGroupBox, QLabel, QVBoxLayout, QWidget

from ...paths import writable_problem
from ...widgets.buttons import action_button
from ...widgets.runs import RunChoiceWidget
from ...widgets.wrapping_label import wrapping_label
from . import controller as rewards
from .controller import NEW_ADAPTER, NEW_ADAPTER_TEXT, RATINGS_FILE, StartChange


class AdapterFilesWidget(QGroupBox):
    """The "Adapter and files" box; see the module docstring. page: the RewardsPage."""

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__("Adapter and files", parent)
        self.page = page
        self._syncing = False  # the adapter list is being set to match the adapter to continue
        self.ratings_label = wrapping_label(interaction=Qt.TextSelectableByMouse)
        self.ratings_button = action_button(
            "Ratings file…",
            self.choose_ratings_file,
            "Choose the JSON Lines file every rating and better answer is appended to (never rewritten). "
            f"Default: {RATINGS_FILE} in the project's output folder.",
        )
        self.adapter_label = wrapping_label()
        self.adapter_choice = RunChoiceWidget(
            fixed=[(NEW_ADAPTER_TEXT, NEW_ADAPTER,
                    "Start from the model alone: a new adapter with the Targets page's targets, rank and "
                    "alpha")],
        )  # fmt: skip
        self.adapter_choice.setToolTip(
            "The adapter the rating rounds continue: a run's adapter (default: the latest finished run of "
            "the open model; after rating rounds, the reward-tuned one), a file (File…), or a new adapter. A "
            "stopped or failed run is listed but never chosen by itself."
        )
        self.adapter_choice.combo.setToolTip(self.adapter_choice.toolTip())
        self.adapter_choice.sig_changed.connect(self._start_changed)
        self.start_from_button = self.adapter_choice.file_button
        self.start_from_button.setToolTip(
            "Continue any adapter GGUF (for example one from the Train page) or a reward checkpoint's "
            "adapter instead of a run from the list."
        )
        self.new_adapter_button = action_button(
            "New adapter", self.new_adapter, "Forget the adapter trained here and start again from the model"
        )
        self.save_button = action_button(
            "Save adapter…",
            self.choose_save_adapter,
            "Write the adapter trained on this page as a llama.cpp LoRA GGUF",
        )
        start = QLabel("Continue:")
        start.setToolTip(self.adapter_choice.toolTip())
        fl = QVBoxLayout(self)
        fl.setContentsMargins(6, 4, 6, 4)
        fl.setSpacing(3)
        adapter = (start, self.adapter_choice, self.adapter_label, self.save_button, self.new_adapter_button)
        for w in adapter:
            fl.addWidget(w)
        fl.addSpacing(4)  # then the ratings file
        for w in (self.ratings_label, self.ratings_button):
            fl.addWidget(w)

    # --- the adapter to continue ----------------------------------------------------------------
    def refresh_runs(self) -> None:
        """Read the run history again: the list of adapters to continue, and its default (the latest
        finished run of the open model) unless the person chose one or a session is going on."""
        page = self.page
        self.adapter_choice.refresh(page.project, page.settings, page.model_path())

    def set_adapter(self, path: str | None) -> None:
        """Continue this adapter (GGUF or reward checkpoint folder) from the next new session on; it is
        selected in the list (None: a new adapter). A session going on is kept."""
        ctrl = self.page.ctrl
        ctrl.start_adapter = path or None
        self._select(path or NEW_ADAPTER)
        self.page.warn_fit(ctrl.start_adapter)
        self.show_paths()

    def _select(self, data: str) -> None:
        """Select `data` in the list without taking it as the person's choice."""
        self._syncing = True
        try:
            self.adapter_choice.set_path(data)
        finally:
            self._syncing = False

    def _start_changed(self, data: object, _label: str) -> None:
        if self._syncing:
            return
        page, ctrl = self.page, self.page.ctrl
        path = rewards.start_path(data, self.adapter_choice.current_run())
        change = ctrl.start_change(path, self.adapter_choice.chosen, bool(page.busy))
        if change is StartChange.SAME:
            self.show_paths()
            return
        if change is StartChange.ASK:
            question = ctrl.forget_question(rewards.short(path) if path else "a new adapter")
            change = (
                StartChange.DROP if page.confirm("Continue another adapter", question) else StartChange.KEEP
            )
        if change is StartChange.KEEP:  # show the adapter being continued in the list again
            keep = ctrl.session_start if ctrl.session is not None else ctrl.start_adapter
            self._select(rewards.start_entry(keep, self.adapter_choice.runs))
            return
        ctrl.start_adapter = path
        if change is StartChange.DROP:
            page._drop_session()
        page.warn_fit(ctrl.start_adapter)
        self.show_paths()

    def start_from(self, path: str) -> None:
        """Continue `path` now: the session going on is dropped (asked first when it took steps)."""
        page, s = self.page, self.page.ctrl.session
        if (
            s is not None
            and s.step
            and not page.confirm(
                "Start from another adapter",
                f"Forget the {s.step} step(s) trained on this page and continue {path} instead?",
            )
        ):
            return
        self.set_adapter(path)
        if page.ctrl.session is not None:
            page._drop_session()

    def new_adapter(self) -> None:
        page, s = self.page, self.page.ctrl.session
        if page.busy or s is None:
            return
        if s.step and not page.confirm(
            "New adapter", f"Forget the {s.step} step(s) trained on this page (save it first with Save "
            "adapter… to keep it)?"
        ):  # fmt: skip
            return
        page._drop_session()
        self.set_adapter(None)

    def show_paths(self) -> None:
        """The ratings file and what the adapter box says (the session's steps, or what comes next)."""
        page = self.page
        s = page.ctrl.session
        path = s.ratings_path if s is not None else page.ratings_path()
        self.ratings_label.setText(f"Ratings file:<br><code>{html.escape(path)}</code>")
        self.ratings_label.setToolTip(path)
        c = page.project.config
        self.adapter_label.setText(page.ctrl.adapter_text(c.rank, c.alpha, c.targets.preset or "custom"))

    # --- the ratings file -----------------------------------------------------------------------
    def choose_ratings_file(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Ratings file", self.page.ratings_path(), "JSON Lines (*.jsonl);;All files (*)",
            options=QFileDialog.DontConfirmOverwrite,
        )  # fmt: skip
        if path:
            self.set_ratings_path(path)

    def set_ratings_path(self, path: str) -> bool:
        """Append ratings to `path` from now on; False (and why, in the page) if it cannot be written."""
        page, ctrl = self.page, self.page.ctrl
        path = os.path.abspath(path)
        p = page.project  # never one of the files the page reads (the model, the adapter it continues, ...)
        why = ctrl.ratings_problem(path, {"model": p.model_path, "dataset": p.dataset_path,
                                           "chat template": p.template_file})  # fmt: skip
        if why:
            page.show_error(f"The ratings file {path} cannot be written ({why}). Choose another file with "
                            "Ratings file….")  # fmt: skip
            return False
        ctrl.custom_ratings_path = path
        if ctrl.session is not None:
            ctrl.session.ratings_path = path
        page.banner.hide()
        self.show_paths()
        return True

    # --- saving ---------------------------------------------------------------------------------
    def choose_save_adapter(self) -> None:
        s = self.page.ctrl.session
        if s is None:
            return
        default = os.path.join(self.page.project.output_folder(), f"rewards-step{s.step}.gguf")
        path, _ = QFileDialog.getSaveFileName(self, "Save adapter", default, "LoRA adapters (*.gguf)")
        if path:
            self.save_adapter(path)

    def save_adapter(self, path: str) -> bool:
        """Write the adapter (F32 LoRA GGUF) in the worker; the page's sig_adapter_saved(path) when it is
        written."""
        page, s = self.page, self.page.ctrl.session
        if page.busy or s is None:
            return False
        if not path.endswith(".gguf"):
            path += ".gguf"
        why = writable_problem(os.path.dirname(os.path.abspath(path)))
        if why:
            page.show_error(f"The adapter cannot be written to {path} ({why}). Choose another folder with "
                            "Save adapter….")  # fmt: skip
            return False

        def done(written: str) -> None:
            steps = f"{s.step} step{'s' if s.step != 1 else ''}"
            page.show_error(f"Adapter saved: {written} ({steps}). Open it on the Export page to merge it, or "
                            "use it with llama.cpp (--lora).", "info")  # fmt: skip
            page.sig_adapter_saved.emit(written)

        page._run("saving", lambda engine_session: s.save_adapter(path), done, needs_model=False)
        return True


__all__ = ["AdapterFilesWidget"]
