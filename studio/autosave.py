"""Autosave: the window's dataset document and project, copied to a recovery folder a few seconds
after each change so that a crash loses no edit, and found again on the next start.

Layout under the recovery root (QStandardPaths.AppDataLocation/recovery by default):
`<root>/<slot>/` is one window's copy and `<root>/<slot>.lock` a `QLockFile` held while that
window lives, so a slot whose lock is free belongs to a window that is gone (a crash: a clean
close removes its slot). A slot holds `recovery.json` (when it was written, the files the
dataset and the project were edited from, the project's state) and `dataset-<n>.jsonl` (every
field of every sample, one JSON object a line, so that samples still being edited, even invalid
ones, come back exactly). Each file is written to a temporary file in the slot, flushed and
renamed into place (`os.replace`), and `recovery.json` last, so a crash while writing leaves the
previous copy whole. Only what has unsaved changes is copied; with none, the slot is removed.

Writing happens on a thread of its own from a snapshot taken on the UI thread (the samples are
frozen), so a large dataset never stalls the window. `Autosave.pending()` lists the copies left
by windows that are gone and are newer than the files they came from; the window offers to
restore them (`adopt`) or `discard`s them.

What this module is not: it never writes outside its slot, so never over the person's own files
(saving those is the Dataset page's and the window's work), and it asks nothing.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, fields
from typing import Any

from PySide6.QtCore import QLockFile, QObject, QStandardPaths, QTimer, Signal

from engine import Problem, Sample

from .dataset_document import DatasetChange, DatasetDocument
from .paths import same_file
from .project import Project
from .weak_listener import listen_while_alive

log = logging.getLogger(__name__)

RECOVERY_VERSION = 1
META = "recovery.json"
DEFAULT_DELAY_MS = 3000


class RecoveryError(Exception):
    """A recovery copy that cannot be read or written; the message says which and why."""


@dataclass(frozen=True)
class Snapshot:
    """What one autosave writes, taken on the UI thread."""

    written: float  # time.time() when it was taken
    samples: tuple[Sample, ...] | None  # None: the dataset had no unsaved changes
    dataset_path: str | None  # the file the dataset was read from or saved to (None: never saved)
    skipped: tuple[Problem, ...]  # lines of that file that gave no sample
    project: dict | None  # Project.to_json() when the project had unsaved changes
    project_path: str | None


@dataclass(frozen=True)
class Recovery:
    """A copy left by a window that is gone."""

    folder: str  # its slot
    written: float  # when it was written (time.time())
    samples: list[Sample] | None  # the dataset being edited (None: it had no unsaved changes)
    dataset_path: str | None
    skipped: list[Problem]
    project: dict | None  # the project's state (None: it had no unsaved changes)
    project_path: str | None

    def describe(self) -> str:
        """A sentence for the person: what was recovered and from when."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.written))
        parts = []
        if self.samples is not None:
            name = os.path.basename(self.dataset_path) if self.dataset_path else "a new dataset"
            parts.append(f"the dataset {name} ({len(self.samples)} samples)")
        if self.project is not None:
            name = os.path.basename(self.project_path) if self.project_path else "the untitled project"
            parts.append(f"the project {name}")
        return f"Unsaved changes to {' and '.join(parts)}, autosaved at {when}."


# -- files (no Qt: these run on the writer thread) -----------------------------------------------


def _write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, flushed, then renamed."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _sample_fields(sample: Sample) -> dict[str, Any]:
    return {f.name: getattr(sample, f.name) for f in fields(Sample)}


def _sample_from_fields(obj: Any) -> Sample:
    if not isinstance(obj, dict):
        raise TypeError(f"expected an object, got {type(obj).__name__}")
    obj = dict(obj)
    obj["messages"] = tuple(dict(m) for m in obj.get("messages") or ())
    return Sample(**obj)


def write_snapshot(folder: str, snapshot: Snapshot, serial: int) -> None:
    """Write a snapshot into a slot folder (created if missing); the previous copy stays whole
    until `recovery.json` names the new one. RecoveryError or OSError when it cannot be written."""
    os.makedirs(folder, exist_ok=True)
    meta: dict[str, Any] = {
        "version": RECOVERY_VERSION,
        "app": "Tune Studio",
        "written": snapshot.written,
        "pid": os.getpid(),
        "dataset": None,
        "project": None,
    }
    keep = {META}
    if snapshot.samples is not None:
        name = f"dataset-{serial}.jsonl"
        target = os.path.join(folder, name)
        if same_file(target, snapshot.dataset_path) or same_file(target, snapshot.project_path):
            raise RecoveryError(f"{target}: the recovery copy would replace the person's own file")
        try:
            # ASCII with escapes: any text a box holds (a lone surrogate too) round-trips exactly
            lines = [json.dumps(_sample_fields(s)) for s in snapshot.samples]
        except (TypeError, ValueError) as exc:
            raise RecoveryError(f"the dataset cannot be copied as JSON ({exc})") from exc
        _write_atomic(target, "".join(line + "\n" for line in lines))
        keep.add(name)
        meta["dataset"] = {
            "file": name,
            "path": snapshot.dataset_path,
            "samples": len(lines),
            "skipped": [[p.line, p.message, p.severity] for p in snapshot.skipped],
        }
    if snapshot.project is not None:
        meta["project"] = {"path": snapshot.project_path, "state": snapshot.project}
    target = os.path.join(folder, META)
    if same_file(target, snapshot.dataset_path) or same_file(target, snapshot.project_path):
        raise RecoveryError(f"{target}: the recovery copy would replace the person's own file")
    _write_atomic(target, json.dumps(meta, ensure_ascii=False, indent=1))
    for entry in os.listdir(folder):  # earlier copies, and temporary files a crash left behind
        if entry not in keep:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, entry))


def read_recovery(folder: str) -> Recovery:
    """The copy in a slot folder; RecoveryError when it has none or it cannot be read."""
    meta_path = os.path.join(folder, META)
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError as exc:
        raise RecoveryError(f"{folder}: no recovery copy in it") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecoveryError(f"{meta_path}: cannot be read ({exc})") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("written"), (int, float)):
        raise RecoveryError(f"{meta_path}: not a Tune Studio recovery file")
    if meta.get("version", 1) > RECOVERY_VERSION:
        raise RecoveryError(f"{meta_path}: made by a newer Tune Studio (version {meta['version']})")
    samples = dataset_path = project = project_path = None
    skipped: list[Problem] = []
    dataset = meta.get("dataset")
    if isinstance(dataset, dict):
        path = os.path.join(folder, os.path.basename(str(dataset.get("file"))))
        try:
            with open(path, encoding="utf-8") as f:
                samples = [_sample_from_fields(json.loads(line)) for line in f if line.strip()]
            skipped = [
                Problem(int(line), str(msg), str(sev)) for line, msg, sev in dataset.get("skipped", [])
            ]
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise RecoveryError(f"{path}: the dataset copy cannot be read ({exc})") from exc
        if len(samples) != dataset.get("samples", len(samples)):
            raise RecoveryError(f"{path}: {len(samples)} samples where {dataset['samples']} were written")
        dataset_path = dataset.get("path")
    proj = meta.get("project")
    if isinstance(proj, dict) and isinstance(proj.get("state"), dict):
        project, project_path = proj["state"], proj.get("path")
    return Recovery(folder, float(meta["written"]), samples, dataset_path, skipped, project, project_path)


def _newer_than(path: str | None, written: float) -> bool:
    """The person's file was changed after the copy was written (the copy is out of date)."""
    try:
        return path is not None and os.path.getmtime(path) > written
    except OSError:
        return False


def without_stale_parts(recovery: Recovery) -> Recovery | None:
    """The copy without the parts the person's files have superseded since (saved after it was
    written); None when nothing is left."""
    samples, project = recovery.samples, recovery.project
    if samples is not None and _newer_than(recovery.dataset_path, recovery.written):
        samples = None
    if project is not None and _newer_than(recovery.project_path, recovery.written):
        project = None
    if samples is None and project is None:
        return None
    return Recovery(
        recovery.folder,
        recovery.written,
        samples,
        recovery.dataset_path,
        recovery.skipped,
        project,
        recovery.project_path,
    )


def remove_slot(folder: str) -> None:
    """Delete a slot folder and what is in it (only files this module writes are there)."""
    shutil.rmtree(folder, ignore_errors=True)


# -- the autosave --------------------------------------------------------------------------------


def _lock_for(folder: str) -> QLockFile:
    lock = QLockFile(folder.rstrip("/\\") + ".lock")
    lock.setStaleLockTime(0)  # held as long as its window lives; a crash frees it (dead process)
    return lock


class Autosave(QObject):
    """Copies a window's dataset document and project into its recovery slot `delay_ms` after the
    first change not yet copied (edits in a row wait for at most that long), removes the copy once
    nothing is unsaved (a real save, every change undone) and on `close()` (a clean close).

    `sig_written(folder)` after each copy; `sig_failed(message)` when one could not be written
    (the next change tries again)."""

    sig_written = Signal(str)
    sig_failed = Signal(str)

    def __init__(
        self,
        document: DatasetDocument,
        project: Project,
        root: str | os.PathLike[str],
        delay_ms: int = DEFAULT_DELAY_MS,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.document, self.project = document, project
        self.root = os.path.abspath(os.fspath(root))
        self._slot: str | None = None  # this window's slot folder, made at the first copy
        self._lock: QLockFile | None = None
        self._held: dict[str, QLockFile] = {}  # slots of windows that are gone, while pending
        self._serial = 0
        self._futures: list[concurrent.futures.Future] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(delay_ms)
        self._timer.timeout.connect(self.write_now)
        self._poll = QTimer(self)
        self._poll.setInterval(50)
        self._poll.timeout.connect(self._check_writes)
        listen_while_alive(self, document, Autosave._document_changed)
        listen_while_alive(self, project, lambda autosave, _changed: autosave._changed())

    # --- settings and state -------------------------------------------------------------------
    @property
    def delay_ms(self) -> int:
        """How long after a change the copy is written (default 3 s)."""
        return self._timer.interval()

    @delay_ms.setter
    def delay_ms(self, value: int) -> None:
        self._timer.setInterval(int(value))

    @property
    def slot(self) -> str | None:
        """This window's slot folder while it holds a copy, else None."""
        return self._slot if self._slot is not None and os.path.isdir(self._slot) else None

    def unsaved(self) -> bool:
        return self.document.dirty or self.project.dirty

    # --- writing ------------------------------------------------------------------------------
    def _document_changed(self, change: DatasetChange) -> None:
        if change.kind != "history":
            self._changed()

    def _changed(self) -> None:
        if self._closed:
            return
        if not self.unsaved():
            self._timer.stop()
            self.clear()
        elif not self._timer.isActive():
            self._timer.start()

    def write_now(self) -> None:
        """Copy what is unsaved now (on the writer thread); remove the copy when nothing is."""
        self._timer.stop()
        if self._closed:
            return
        if not self.unsaved():
            self.clear()
            return
        doc, project = self.document, self.project
        snapshot = Snapshot(
            written=time.time(),
            samples=tuple(doc.samples()) if doc.dirty else None,
            dataset_path=doc.path,
            skipped=tuple(doc.skipped),
            project=project.to_json() if project.dirty else None,
            project_path=project.path,
        )
        try:
            folder = self._own_slot()
        except OSError as exc:
            self._failed(f"the recovery folder {self.root} cannot be used ({exc.strerror or exc})")
            return
        self._serial += 1
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="autosave")
        self._futures.append(self._pool.submit(write_snapshot, folder, snapshot, self._serial))
        self._poll.start()

    def wait(self, timeout: float | None = 60.0) -> bool:
        """Wait for the copies being written; True when none is left in flight."""
        _, pending = concurrent.futures.wait(self._futures, timeout=timeout)
        self._check_writes()
        return not pending

    def _check_writes(self) -> None:
        done = [f for f in self._futures if f.done()]
        self._futures = [f for f in self._futures if not f.done()]
        if not self._futures:
            self._poll.stop()
        for future in done:
            exc = future.exception()
            if exc is not None:
                self._failed(f"the unsaved changes could not be copied for recovery ({exc})")
            elif self._slot is not None:
                self.sig_written.emit(self._slot)

    def _failed(self, message: str) -> None:
        log.warning("autosave: %s", message)
        self.sig_failed.emit(message)
        if not self._closed and self.unsaved() and not self._timer.isActive():
            self._timer.start()  # try again

    def _own_slot(self) -> str:
        if self._slot is not None and self._lock is not None:
            return self._slot
        os.makedirs(self.root, exist_ok=True)
        for _ in range(5):
            name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            folder = os.path.join(self.root, name)
            lock = _lock_for(folder)
            if lock.tryLock(0):
                os.makedirs(folder, exist_ok=True)
                self._slot, self._lock = folder, lock
                return folder
        raise OSError(f"no recovery slot can be locked in {self.root}")

    def clear(self) -> None:
        """Remove this window's copy (nothing unsaved any more: a real save, a clean close)."""
        self._timer.stop()
        if self._futures:
            concurrent.futures.wait(self._futures)
            self._futures = []
            self._poll.stop()
        if self._slot is not None:
            remove_slot(self._slot)
        if self._lock is not None:
            self._lock.unlock()
        self._slot = self._lock = None

    def close(self) -> None:
        """A clean close: no more copies, this window's copy removed, pending slots left alone."""
        if self._closed:
            return
        self.clear()
        self._closed = True
        for folder in list(self._held):
            self._release_lock(folder)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # --- copies left by windows that are gone -------------------------------------------------
    def pending(self) -> list[Recovery]:
        """Copies left by windows that are gone (crashed) and newer than the files they came from,
        newest first. Their slots stay reserved for this window until `adopt`, `discard` or
        `release`; copies that are out of date or empty are removed."""
        try:
            entries = sorted(os.listdir(self.root))
        except OSError:
            return []
        found: list[Recovery] = []
        for entry in entries:
            folder = os.path.join(self.root, entry)
            if entry.endswith(".lock"):
                if not os.path.isdir(folder[: -len(".lock")]):  # a lock left without its slot
                    lock = _lock_for(folder[: -len(".lock")])
                    if lock.tryLock(0):
                        lock.unlock()
                continue
            if not os.path.isdir(folder) or folder in (self._slot, *self._held):
                continue
            lock = _lock_for(folder)
            if not lock.tryLock(0):
                continue  # a live window's
            try:
                recovery = read_recovery(folder)
            except RecoveryError as exc:
                if not os.path.exists(os.path.join(folder, META)):  # a crash before the first copy
                    remove_slot(folder)
                else:
                    log.warning("autosave: %s (left where it is)", exc)
                lock.unlock()
                continue
            current = without_stale_parts(recovery)
            if current is None:
                remove_slot(folder)
                lock.unlock()
                continue
            self._held[folder] = lock
            found.append(current)
        return sorted(found, key=lambda r: r.written, reverse=True)

    def adopt(self, recovery: Recovery) -> None:
        """The copy was restored: its slot becomes this window's (the next copy replaces it)."""
        lock = self._held.pop(recovery.folder, None)
        if lock is None:
            raise RecoveryError(f"{recovery.folder}: not a pending copy of this window")
        if self._slot is not None:
            self.clear()
        self._slot, self._lock = recovery.folder, lock
        if self.unsaved() and not self._timer.isActive():
            self._timer.start()

    def discard(self, recovery: Recovery) -> None:
        """The person does not want the copy: remove it."""
        if recovery.folder in self._held:
            remove_slot(recovery.folder)
            self._release_lock(recovery.folder)

    def release(self, recovery: Recovery) -> None:
        """Leave the copy where it is, for a later start."""
        self._release_lock(recovery.folder)

    def _release_lock(self, folder: str) -> None:
        lock = self._held.pop(folder, None)
        if lock is not None:
            lock.unlock()


def default_recovery_root() -> str:
    """AppDataLocation/recovery (needs the application's name set: QApplication.setApplicationName)."""
    return os.path.join(QStandardPaths.writableLocation(QStandardPaths.AppDataLocation), "recovery")


__all__ = [
    "Autosave",
    "Recovery",
    "RecoveryError",
    "Snapshot",
    "default_recovery_root",
    "read_recovery",
    "remove_slot",
    "without_stale_parts",
    "write_snapshot",
]
