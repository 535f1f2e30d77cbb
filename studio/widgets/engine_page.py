"""What the pages that use the engine share: the project, the engine, the open model and a banner.

- `EnginePage`: a page made from (project, engine, parent, settings). It keeps the project, the
  engine (studio.worker), the window's QSettings (the run folders `load_runs` reads; the app's own
  when none is given) and the open model (`info`, set by `set_model_info`), follows the project's
  changes (`_project_changed(changed)`, subscribed for the page's life), shows problems in its
  `banner` (`show_error`, `banner_text`, and `sig_error` for errors) and checks that an adapter
  fits the open model (`fit_problems`, `warn_fit`).
- `JobPage`: an EnginePage that runs engine jobs of its own, one at a time (Chat's answers, the
  Rewards page's generations and steps): `job` in flight, `busy` (the task by name, "" when idle,
  announced by `sig_busy_changed(str)`), `_stop` (set to end streaming early), `is_busy` and
  `shutdown` (the app is quitting: stop, and drop a queued job), and `_submit_job` (an engine job
  that leaves the page idle before its result is shown).

Layout and everything else stay in the page.
"""

from __future__ import annotations

import os
import threading

from PySide6.QtCore import QSettings, Signal
from PySide6.QtWidgets import QWidget

from ..project import ModelInfo, Project
from ..worker import Engine, Job
from .banner import MessageBar
from .runs import adapter_file, adapter_problems, app_settings, fit_message

# The project changes that move the run history (where runs are kept, which model they are for).
RUNS_MOVED = frozenset({"output_dir", "path", "dataset_path", "model_path"})


class EnginePage(QWidget):
    """The plumbing of a page that uses the engine; see the module docstring."""

    sig_error = Signal(str)  # a problem shown in the page

    def __init__(
        self,
        project: Project,
        engine: Engine,
        parent: QWidget | None = None,
        settings: QSettings | None = None,
    ):
        """settings: where the Runs page keeps its added folders (default: the app's settings)."""
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.settings = settings if settings is not None else app_settings()
        self.info: ModelInfo | None = None
        self.banner = MessageBar()
        self._fits: dict[tuple[str, float, str], list[str]] = {}
        project.subscribe(self._project_changed)
        self.destroyed.connect(lambda *_, cb=self._project_changed: project.unsubscribe(cb))

    def model_path(self) -> str | None:
        """The open model's file, else the project's."""
        return self.info.path if self.info is not None else self.project.model_path

    def fit_problems(self, path: str | None) -> list[str]:
        """Why the adapter at `path` (a GGUF file, or a checkpoint folder) does not fit the open model,
        from headers only, cached while the file is unchanged; [] when it fits or no model is open."""
        if self.info is None or not path:
            return []
        file = adapter_file(path)
        try:
            key = (file, os.path.getmtime(file), self.info.path)
        except OSError:
            return [f"{file} does not exist"]
        if key not in self._fits:
            self._fits[key] = adapter_problems(path, self.info)
        return self._fits[key]

    def warn_fit(self, path: str | None, level: str = "warning") -> bool:
        """Say in the banner when the adapter at `path` was made for another model (and take back an
        earlier such warning when it fits); True when it fits."""
        problems = self.fit_problems(path)
        if problems:
            self.show_error(fit_message(path, self.info, problems), level)
            return False
        if "made for another model" in self.banner_text():
            self.banner.hide()
        return True

    def open_model(self, again: str) -> str | None:
        """The model file a task uses; None, and why in the banner, when none is open or the file is
        gone (`again`: what to do once it is, "press Generate again")."""
        model = self.model_path()
        if not model:
            self.show_error(f"No model is open. Open a .gguf model on the Model page, then {again}.")
            return None
        if not os.path.isfile(model):
            self.show_error(
                f"The model file {model} does not exist any more. Open it again on the Model page."
            )
            return None
        return model

    def _project_changed(self, changed: set[str]) -> None:
        """The project's fields named in `changed` were set; the page follows what it shows."""

    def show_error(self, text: str, level: str = "error") -> None:
        """Show `text` in the page's banner (level "error", "warning" or "info"); errors also go out
        on sig_error."""
        self.banner.show_message(level, text)
        if level == "error":
            self.sig_error.emit(text)

    def banner_text(self) -> str:
        return self.banner.text() if not self.banner.isHidden() else ""


class JobPage(EnginePage):
    """An EnginePage that runs engine jobs of its own; see the module docstring."""

    sig_busy_changed = Signal(str)  # the running task ("chat", "generating", ...) or "" when idle

    def __init__(self, *args, **kwargs):
        """EnginePage's arguments."""
        super().__init__(*args, **kwargs)
        self.job: Job | None = None  # the engine job in flight
        self.busy = ""
        self._stop = threading.Event()

    def is_busy(self) -> bool:
        """A job of this page is queued or running."""
        return bool(self.busy) or (self.job is not None and self.job.active)

    def shutdown(self) -> None:
        """The app is quitting: stop what streams and drop the job (the window then waits for the
        engine worker)."""
        self._stop.set()
        if self.job is not None:
            self.engine.cancel(self.job)

    def _set_busy(self, busy: str) -> None:
        """Enable what `busy` allows (the page's own widgets); announce it on sig_busy_changed."""
        self.busy = busy
        self.sig_busy_changed.emit(busy)

    def _submit_job(self, kind: str, name: str, fn, on_done, on_error, model: str | None, **options) -> Job:
        """Run fn(session, job) as the page's engine job `name`, busy with `kind` until it ends:
        on_done(result) or on_error(message) on the UI thread, each after the page is idle again.
        model: the file the job needs open (None: none); options go to Engine.submit."""

        def done(result) -> None:
            self.job = None
            self._set_busy("")
            on_done(result)

        def failed(message: str) -> None:
            self.job = None
            self._set_busy("")
            on_error(message)

        self._set_busy(kind)
        self.job = self.engine.submit(
            name,
            fn,
            on_done=done,
            on_error=failed,
            model=(model, self.project.device) if model else None,
            **options,
        )
        return self.job
