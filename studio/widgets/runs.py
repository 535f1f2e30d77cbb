"""Run records as the pages show them, and the adapter choice that Chat, Rewards and Export share.

- `run_folders(project, settings)`: where the app looks for run records (engine `find_runs`): the
  project's runs home (`Project.output_folder()`), the open model's own folder under the app's data
  folder when the project chose another, the `tune-studio-out` folder older versions wrote, and the
  folders added on the Runs page or written to by a run (remembered with QSettings under
  `runs/folders`); `load_runs` reads them, and the runs of the events files the Runs page follows
  (`runs/followed`: runs on other processes or machines, engine `run_from_events`), which take the
  place of their own record when both are found.
- `status_text`, `run_label`: a run's state and a one-line name for lists ("stopped at step 2 of
  150", "Reward-tuned: …").
- `same_model`, `adapter_problems`: is a run or an adapter file made for the open model? The
  adapter file's header (architecture, tensor names and shapes) is compared with the model's
  tensor directory: nothing but headers is read, so a wrong adapter is named before any weights
  load.
- `RunChoiceWidget`: a list of the runs' adapters (and files chosen by hand) that defaults to the
  latest finished run of the open model (`engine.latest_finished`): a stopped two-step run is
  listed, never picked by itself.

What this is not: it neither trains nor loads adapters; it reads run records and file headers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import datetime

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QSizePolicy, QWidget

from engine import (
    EngineError,
    GGUFFile,
    RunRecord,
    find_runs,
    latest_finished,
    lora_shapes,
    read_run,
    run_from_events,
)

from ..paths import same_file
from ..project import model_runs_folder
from .buttons import action_button

FOLDERS_KEY = "runs/folders"
FOLLOWED_KEY = "runs/followed"  # events files of runs started outside the app
SETTINGS_ORG, SETTINGS_APP = "TuneStudio", "TuneStudio"  # the window's own QSettings
ADAPTER_FILE = "adapter.gguf"  # inside a checkpoint folder
LORA_A, LORA_B = ".lora_a", ".lora_b"


def app_settings() -> QSettings:
    """The settings the window keeps (the same file), for pages made without one."""
    return QSettings(SETTINGS_ORG, SETTINGS_APP)


# --- folders and records ------------------------------------------------------------------------
def _paths(settings: QSettings | None, key: str) -> list[str]:
    """A list of paths kept under `key` (QSettings gives a lone one as a string)."""
    if settings is None:
        return []
    value = settings.value(key, [])
    if isinstance(value, str):
        value = [value]
    return [p for p in (value or []) if isinstance(p, str) and p]


def extra_folders(settings: QSettings | None) -> list[str]:
    """The folders added on the Runs page, in the order they were added."""
    return _paths(settings, FOLDERS_KEY)


def set_extra_folders(settings: QSettings, folders: Sequence[str]) -> None:
    settings.setValue(FOLDERS_KEY, list(dict.fromkeys(folders)))


def remember_folder(settings: QSettings | None, folder: str) -> bool:
    """Add `folder` to the remembered run folders (a run wrote there); True when it was new."""
    if settings is None:
        return False
    folder = os.path.abspath(folder)
    known = extra_folders(settings)
    if any(same_file(folder, f) for f in known):
        return False
    set_extra_folders(settings, [*known, folder])
    return True


def model_homes(project) -> list[str]:
    """Every model's runs home under the app's data folder (runs/<model>-<hash>): the history lists
    the runs of every model, those of the open one first to hand."""
    root = model_runs_folder(None)  # user_data_folder()/runs
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))]


def run_folders(project, settings: QSettings | None = None) -> list[str]:
    """The project's runs home, the model's default home, the legacy folder, then the remembered
    folders (no repeats)."""
    folders = [project.output_folder(), project.default_output_folder()]
    legacy = project.legacy_output_folder()
    if legacy:
        folders.append(legacy)
    folders += model_homes(project)
    folders += extra_folders(settings)
    seen, out = set(), []
    for f in folders:
        key = os.path.normcase(os.path.abspath(f))
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def followed_events(settings: QSettings | None) -> list[str]:
    """The events files the Runs page follows, in the order they were added."""
    return _paths(settings, FOLLOWED_KEY)


def add_followed(settings: QSettings | None, path: str) -> None:
    """Follow a run's events file on the Runs page (remembered for the next start)."""
    settings = settings if settings is not None else app_settings()
    settings.setValue(FOLLOWED_KEY, list(dict.fromkeys([*followed_events(settings), os.path.abspath(path)])))


def remove_followed(settings: QSettings, path: str) -> None:
    settings.setValue(FOLLOWED_KEY, [p for p in followed_events(settings) if p != path])


class RecordCache:
    """Run records read once while their file is unchanged (same size and modification time), shared
    by every page that lists runs: a record holds its run's loss history, and the pages (Chat,
    Rewards, Export, Runs) each kept a copy of every record, read again on every refresh."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._records: dict[str, tuple[tuple[int, int], RunRecord | None]] = {}

    def read(self, path: str) -> RunRecord | None:
        try:
            st = os.stat(path)
        except OSError:
            self._records.pop(path, None)
            return read_run(path)  # (it says why it is skipped)
        stamp = (st.st_mtime_ns, st.st_size)
        hit = self._records.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        record = read_run(path)
        if len(self._records) >= self.limit:
            self._records.clear()
        self._records[path] = (stamp, record)
        return record


RECORDS = RecordCache()  # the app's one cache of run records


def load_runs(project, settings: QSettings | None = None) -> list[RunRecord]:
    """Every run record in the run folders and every followed events file's run, newest first
    (never raises: broken records are skipped). Unchanged records are the same objects every time
    (`RECORDS`): treat them as read-only."""
    try:
        runs = find_runs(run_folders(project, settings), RECORDS.read)
    except OSError:
        runs = []
    followed = [r for r in (run_from_events(p) for p in followed_events(settings)) if r is not None]
    if not followed:
        return runs
    folders = {os.path.normcase(os.path.abspath(r.checkpoints)) for r in followed if r.checkpoints}
    adapters = {os.path.normcase(os.path.abspath(r.adapter)) for r in followed if r.adapter}

    def shadowed(r: RunRecord) -> bool:  # the followed events are the fresher account of the same run
        return bool(
            (r.checkpoints and os.path.normcase(os.path.abspath(r.checkpoints)) in folders)
            or (r.adapter and os.path.normcase(os.path.abspath(r.adapter)) in adapters)
        )

    return sorted([*followed, *(r for r in runs if not shadowed(r))], key=lambda r: r.started, reverse=True)


def same_model(run: RunRecord, model_path: str | None) -> bool:
    """The run trained the model at `model_path` (True when no model is open: nothing to compare)."""
    return not model_path or not run.model or same_file(run.model, model_path)


def has_adapter(run: RunRecord) -> bool:
    return bool(run.adapter) and os.path.exists(run.adapter)


def resume_checkpoint(run: RunRecord) -> str | None:
    """The checkpoint a training run that did not finish can be resumed from (its last one, else the
    newest in its checkpoint folder), or None: finished runs, rating sessions and runs without one."""
    if run.kind != "training" or run.status == "finished":
        return None
    if run.steps_planned and run.steps_done >= run.steps_planned:
        return None
    last = run.last_checkpoint
    if last and os.path.isfile(os.path.join(last, "state.npz")):
        return last
    folder = run.checkpoints
    if folder and os.path.isdir(folder):
        names = sorted(n for n in os.listdir(folder) if n.startswith("ckpt-"))
        for name in reversed(names):
            if os.path.isfile(os.path.join(folder, name, "state.npz")):
                return os.path.join(folder, name)
    return None


def _when(iso: str) -> str:
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone()
    except (ValueError, AttributeError):
        return ""
    return t.strftime("%Y-%m-%d %H:%M")


def status_text(run: RunRecord) -> str:
    """finished / stopped at step N / failed at step N: message / paused at step N / running."""
    n = run.steps_done
    if run.status == "finished":
        return "finished"
    if run.status == "stopped":
        return f"stopped at step {n}"
    if run.status == "failed":
        return f"failed at step {n}: {run.message}" if run.message else f"failed at step {n}"
    if run.status == "paused":
        return f"paused at step {n}"
    if run.status == "running":
        when = _when(run.updated)
        return f"running (step {n}, last update {when[-5:]})" if when else f"running (step {n})"
    return run.status


def run_label(run: RunRecord) -> str:
    """One line for a list: what the run is, how it ended, how far it got."""
    if run.kind == "rewards":
        steps = f"{run.steps_done} step{'s' if run.steps_done != 1 else ''} from your ratings"
        return f"Reward-tuned: {run.name} — {steps}"
    if run.status == "finished":
        loss = f", loss {run.final_loss:.3f}" if run.final_loss is not None else ""
        return f"{run.name} — finished, {run.steps_done} steps{loss}"
    planned = f" of {run.steps_planned}" if run.steps_planned else ""
    state = status_text(run).split(":")[0]
    return f"{run.name} — {state}{planned}"


def model_name(path: str | None) -> str:
    return os.path.basename(path) if path else "?"


# --- does an adapter fit the model? -------------------------------------------------------------
def adapter_file(path: str) -> str:
    """An adapter GGUF itself, or the adapter.gguf inside a checkpoint folder."""
    return os.path.join(path, ADAPTER_FILE) if os.path.isdir(path) else path


def adapter_problems(path: str, info) -> list[str]:
    """Why the adapter (file or checkpoint folder) cannot go on the model of `info` (a ModelInfo):
    the file's header against the model's tensor directory. Empty when it fits. Reads headers only."""
    file = adapter_file(path)
    try:
        f = GGUFFile(file)
    except (EngineError, OSError, ValueError) as exc:
        return [f"it cannot be read ({exc})"]
    try:
        if f.get("general.type") != "adapter":
            return ["it is not a LoRA adapter (a model file?)"]
        problems = []
        arch, model_arch = str(f.get("general.architecture", "") or ""), info.summary.config.arch
        if arch and arch != model_arch:
            problems.append(f"it is for a {arch} model, the open model is {model_arch}")
        missing, wrong = [], []
        for name, a in f.tensors.items():
            if not name.endswith(LORA_A):
                continue
            base = name[: -len(LORA_A)]
            b = f.tensors.get(base + LORA_B)
            t = info.tensors.get(base)
            if t is None:
                missing.append(base)
                continue
            if b is None:
                continue
            try:
                want_a, want_b = lora_shapes(base, t.shape, int(b.shape[-1]))
            except EngineError as exc:
                wrong.append(str(exc))
                continue
            if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
                wrong.append(f"{base} is {t.shape[::-1]} in the model, the adapter's factors do not fit it")
        if missing:
            more = f" and {len(missing) - 2} more" if len(missing) > 2 else ""
            problems.append(f"the model has no tensor {', '.join(missing[:2])}{more}")
        if wrong:
            more = f" ({len(wrong) - 1} more like it)" if len(wrong) > 1 else ""
            problems.append(wrong[0] + more)
        return problems
    finally:
        f.close()


def fit_message(path: str, info, problems: list[str]) -> str:
    """The page's sentence for an adapter made for another model, with what to do."""
    name = os.path.basename(os.path.normpath(path))
    return (
        f"{name} was made for another model: {'; '.join(problems)}. Choose an adapter trained on "
        f"{model_name(info.path)}, or open the model it was trained on (Model page)."
    )


# --- the adapter choice --------------------------------------------------------------------------
class RunChoiceWidget(QWidget):
    """A list of adapters: optional fixed entries (e.g. "A new adapter"), the runs of the open model
    (latest finished chosen by default), files chosen by hand, and the other models' runs (listed,
    not selectable). `Choose file…` adds any adapter file.

    `sig_changed(path, label)`: the chosen adapter (path None for a fixed entry without a file; the
    fixed entries' data is given back as `path`)."""

    sig_changed = Signal(object, str)

    def __init__(
        self,
        fixed: Sequence[tuple[str, object, str]] = (),
        parent: QWidget | None = None,
        *,
        file_button: bool = True,
        placeholder: str = "No finished run yet: train one, or choose a file",
    ):
        """fixed: (label, data, tooltip) entries listed first (data None or a str such as engine.RUN)."""
        super().__init__(parent)
        self.fixed = list(fixed)
        self.placeholder = placeholder
        self.runs: list[RunRecord] = []
        self.model_path: str | None = None
        self.files: list[str] = []  # chosen by hand, listed after the runs
        self.file_labels: dict[str, str] = {}  # a label given with set_path, for a file that is no run
        self.chosen = False  # the person picked an entry: a refresh keeps it
        self._rebuilding = False
        self.combo = QComboBox()
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(6)  # a narrow column still shows the button beside it
        self.combo.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.combo.setToolTip(
            "The adapter to use. Default: the latest run of the open model that finished (a stopped or "
            "failed run is listed but never chosen by itself); after rating rounds, the reward-tuned one."
        )
        self.model = QStandardItemModel(self)
        self.combo.setModel(self.model)
        self.combo.activated.connect(self._activated)
        self.combo.currentIndexChanged.connect(self._index_changed)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.combo, 1)
        self.file_button = action_button(
            "File…", self.choose_file, "Choose any LoRA adapter file (.gguf) or checkpoint folder's adapter"
        )
        layout.addWidget(self.file_button)
        self.file_button.setHidden(not file_button)
        self.start_folder = ""
        self._rebuild(None)

    # --- content -----------------------------------------------------------------------------
    def refresh(self, project, settings: QSettings | None, model_path: str | None) -> None:
        """Read `project`'s run history again (`load_runs`; its output folder is where the file
        dialog starts) for the open model; the chosen entry is kept."""
        self.start_folder = project.output_folder()
        self.set_runs(load_runs(project, settings), model_path)

    def set_runs(self, runs: Iterable[RunRecord], model_path: str | None) -> None:
        """The runs (newest first) and the open model; keeps a chosen entry, else picks the default."""
        model_changed = (
            not same_file(model_path, self.model_path) if (model_path or self.model_path) else False
        )
        self.runs = [r for r in runs if r.adapter]
        self.model_path = model_path
        keep = self.current_data() if self.chosen and not model_changed else None
        if model_changed:
            self.chosen = False
        self._rebuild(keep)

    def default_run(self) -> RunRecord | None:
        """The latest finished run of the open model that left an adapter file (None without a model)."""
        if not self.model_path:
            return None
        return latest_finished([r for r in self.runs if same_model(r, self.model_path)])

    def _mine(self, run: RunRecord) -> bool:
        return bool(self.model_path) and same_model(run, self.model_path)

    def set_path(self, path: str | None, label: str = "") -> None:
        """Choose `path` (a run's adapter, or any file: listed as a file) or a fixed entry's data."""
        if path is not None and self._find(path) < 0 and not any(d == path for _, d, _ in self.fixed):
            self.files = [f for f in self.files if not same_file(f, path)] + [path]
        if path is not None and label:
            self.file_labels[path] = label
        self.chosen = True
        self._rebuild(path)

    def reset(self) -> None:
        """Forget the person's choice: back to the default (the latest finished run)."""
        self.chosen = False
        self._rebuild(None)

    def choose_file(self) -> None:
        start = self.start_folder or (os.path.dirname(self.model_path) if self.model_path else "")
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose adapter", start, "LoRA adapters (*.gguf);;All files (*)"
        )
        if path:
            self.set_path(path)

    # --- reading -----------------------------------------------------------------------------
    def current_data(self) -> object:
        item = self.model.item(self.combo.currentIndex()) if self.combo.currentIndex() >= 0 else None
        return item.data(Qt.UserRole) if item is not None else None

    def current_path(self) -> str | None:
        """The chosen adapter's path (None for a fixed entry or nothing)."""
        data = self.current_data()
        if data is None or any(d == data for _, d, _ in self.fixed):
            return None
        return str(data)

    def current_label(self) -> str:
        return self.combo.currentText()

    def current_run(self) -> RunRecord | None:
        path = self.current_path()
        if path is None:
            return None
        return next((r for r in self.runs if same_file(r.adapter, path)), None)

    def entries(self) -> list[tuple[str, object, bool]]:
        """(label, data, selectable) of every entry, in order (tests, and people reading logs)."""
        out = []
        for row in range(self.model.rowCount()):
            item = self.model.item(row)
            out.append((item.text(), item.data(Qt.UserRole), bool(item.flags() & Qt.ItemIsEnabled)))
        return out

    # --- building ----------------------------------------------------------------------------
    def _find(self, data: object) -> int:
        for row in range(self.model.rowCount()):
            item = self.model.item(row)
            d = item.data(Qt.UserRole)
            if (
                item.flags() & Qt.ItemIsEnabled
                and d is not None
                and (d == data or (isinstance(d, str) and isinstance(data, str) and same_file(d, data)))
            ):
                return row
        return -1

    def _add(self, text: str, data: object, tip: str = "", enabled: bool = True) -> None:
        item = QStandardItem(text)
        item.setData(data, Qt.UserRole)
        item.setToolTip(tip or text)
        if not enabled:
            item.setFlags(item.flags() & ~(Qt.ItemIsEnabled | Qt.ItemIsSelectable))
        self.model.appendRow(item)

    def _header(self, text: str) -> None:
        item = QStandardItem(text)
        item.setFlags(Qt.NoItemFlags)
        font = item.font()
        font.setItalic(True)
        item.setFont(font)
        self.model.appendRow(item)

    def _rebuild(self, keep: object) -> None:
        before = self.current_data()
        self._rebuilding = True
        self.model.clear()
        for label, data, tip in self.fixed:
            self._add(label, data, tip)
        default = self.default_run()
        mine = [r for r in self.runs if self._mine(r)]
        others = [r for r in self.runs if not self._mine(r)]
        for r in mine:
            usable = has_adapter(r)
            latest = r is default and r.kind != "rewards"  # a reward-tuned one says so in its label
            text = ("Latest finished: " if latest else "") + run_label(r)
            tip = f"{r.adapter}\nModel: {r.model}\nDataset: {r.dataset}"
            if not usable:
                text += " (no adapter file)"
                tip = f"{r.adapter} does not exist (yet): the run has not written it"
            self._add(text, r.adapter, tip, usable)
        for path in self.files:
            name = self.file_labels.get(path) or os.path.basename(os.path.normpath(path))
            self._add(f"File · {name}", path, path)
        if others:
            whose = "other models" if self.model_path else "their models"
            self._header(f"Runs of {whose} ({len(others)}): open their model to use them")
            for r in others:
                tip = f"Made for {r.model}: open that model on the Model page to use it"
                self._add(f"   {run_label(r)} · {model_name(r.model)}", r.adapter, tip, False)
        if keep is not None and self._find(keep) >= 0:
            row = self._find(keep)
        elif default is not None:
            row = self._find(default.adapter)
        elif self.fixed:
            row = 0
        elif self.files:
            row = self._find(self.files[-1])
        else:  # nothing finished: say so, never pick a stopped or failed run by itself
            item = QStandardItem(self.placeholder)
            item.setToolTip(self.placeholder)
            item.setFlags(Qt.NoItemFlags)
            self.model.insertRow(0, item)
            row = 0
        self.combo.setCurrentIndex(row)
        self._rebuilding = False
        if self.current_data() != before:
            self._emit()

    def _activated(self, _row: int) -> None:
        self.chosen = True

    def _index_changed(self, _row: int) -> None:
        if not self._rebuilding:
            self._emit()

    def _emit(self) -> None:
        data = self.current_data()
        fixed = next((d for _, d, _ in self.fixed if d == data and data is not None), None)
        self.sig_changed.emit(fixed if fixed is not None else self.current_path(), self.current_label())


__all__ = [
    "FOLDERS_KEY",
    "RunChoiceWidget",
    "adapter_file",
    "adapter_problems",
    "app_settings",
    "extra_folders",
    "fit_message",
    "has_adapter",
    "load_runs",
    "model_name",
    "remember_folder",
    "resume_checkpoint",
    "run_folders",
    "run_label",
    "same_file",
    "same_model",
    "set_extra_folders",
    "status_text",
]
