"""The next run of the Train page, before it starts, without Qt: what is missing (`Blocker`s in plain
words, with the page that fixes them), which samples it trains (the editor's, or the dataset file),
where it writes (`RunPaths`), what the plot area says before the first run (`first_look`), what the
Start button says (`start_hint`), the engine job that checks it (`check_job`, plan.check_run), and,
for a resume, whose settings and data go on
(`resume_question`, `run_settings`). studio.pages.train.page shows what these answer.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from engine import (
    TRAJECTORY_FIELDS,
    CheckpointInfo,
    EngineError,
    TrainConfig,
    find_runs,
    read_checkpoint_info,
    template_for,
    trajectory_changes,
)

from ...dataset_document import DatasetDocument
from ...paths import same_file
from ...project import DEFAULT_PRESET, ModelInfo, Project, matching_preset
from .folders import checkpoint_model, folder_problem
from .plan import Blocker, EncodingCache, RunCheck, check_run, check_selection


@dataclass
class RunPaths:
    out: str  # adapter GGUF written at the end
    checkpoint_dir: str  # checkpoint folders


# --- what is missing, which samples, where it writes ----------------------------------------------
def doc_is_dataset_file(doc: DatasetDocument | None, project: Project) -> bool:
    """The editor shows the project's dataset file (saved or not)."""
    path = project.dataset_path
    return bool(doc is not None and doc.path and path and os.path.isfile(path) and same_file(doc.path, path))


def edited_samples(doc: DatasetDocument | None, project: Project):
    """The editor's samples when they are not the dataset file as saved (unsaved edits, or a
    dataset never saved), else None: then the file is trained (and named in the run's record)."""
    if doc is None or not len(doc):
        return None
    return None if (doc_is_dataset_file(doc, project) and not doc.dirty) else doc.samples()


def _file_blocker(path: str | None, none: str, gone: str, page: str) -> Blocker | None:
    """`none` when no file is chosen, `gone` when the chosen one does not exist; None when it does."""
    if not path:
        return Blocker(none, page)
    return None if os.path.isfile(path) else Blocker(gone, page)


def model_blocker(project: Project) -> Blocker | None:
    path = project.model_path
    return _file_blocker(path, "No model is chosen. Open a .gguf model on the Model page.",
                         f"The model file {path} does not exist any more. Open it again on the Model page.",
                         "Model")  # fmt: skip


def input_blocker(project: Project, edited: bool) -> Blocker | None:
    """What is missing before anything can be checked: a model, a dataset (edited: the editor has
    samples to train, saved or not)."""
    model = model_blocker(project)
    if model is not None or edited:
        return model
    path = project.dataset_path
    return _file_blocker(path, "No dataset is chosen. Open or create a JSONL dataset on the Dataset page.",
                         f"The dataset file {path} does not exist. Choose it again on the Dataset page.",
                         "Dataset")  # fmt: skip


def processes_blocker(config: TrainConfig, processes: int) -> Blocker | None:
    """A preference objective on several processes (the engine trains DPO and ORPO in one)."""
    if config.objective == "sft" or processes < 2:
        return None
    return Blocker(f"{config.objective.upper()} trains in one process (its loss compares the two "
                   "answers of each pair, which cannot be split across processes): set Processes "
                   "to 1.")  # fmt: skip


def paths_problem(paths: RunPaths) -> str:
    """Why a run cannot write to `paths` (its adapter's folder, its checkpoints folder), or ""."""
    for folder in dict.fromkeys([os.path.dirname(os.path.abspath(paths.out)), paths.checkpoint_dir]):
        why = folder_problem(folder)
        if why:
            return (f"The output folder {folder} cannot be written ({why}). Choose another output folder "
                    "(the Output folder… button), or fix its permissions, then press Start.")  # fmt: skip
    return ""


def settings_for_model(project: Project, config_model: str | None, info: ModelInfo, data) -> str:
    """The settings of a newly opened model `info`, when the settings were made for `config_model`:
    another model's become the default preset for this one's size and `data` (the dataset's
    statistics; the targets stay), said in words; the engine's bare defaults of a new project's first
    model become the default preset too (nothing said: "")."""
    n_params = info.summary.n_params
    if config_model and not same_file(config_model, info.path):
        project.reset_hyperparameters(n_params, data)
        return (f"the training settings are the {DEFAULT_PRESET} preset for its size and the dataset (the "
                "targets are kept)")  # fmt: skip
    if not config_model and not project.path and matching_preset(project.config, n_params) == "defaults":
        project.reset_hyperparameters(n_params, data)
    return ""


def default_paths(project: Project, stamp: str | None = None) -> RunPaths:
    """Where a run started now writes: output_folder()/<dataset stem>-<time>.gguf and the sibling
    <dataset stem>-<time>-checkpoints folder (the project's config.out / checkpoint_dir win)."""
    folder = project.output_folder()
    stem = Path(project.dataset_path).stem if project.dataset_path else "adapter"
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(folder, f"{stem}-{stamp}")
    cfg = project.config
    out = cfg.out or base + ".gguf"
    ckpt = cfg.checkpoint_dir or (out[:-5] if out.endswith(".gguf") else out) + "-checkpoints"
    return RunPaths(out, ckpt)


def resume_paths(info: CheckpointInfo, config: TrainConfig, default_out: str) -> RunPaths:
    """Where a run resumed from checkpoint `info` writes: its own adapter (config.out, else beside
    its -checkpoints folder, else `default_out`) and its checkpoints folder."""
    parent = info.run_dir
    out = config.out or (
        parent[: -len("-checkpoints")] + ".gguf" if parent.endswith("-checkpoints") else None
    )
    return RunPaths(out or default_out, parent)


def open_checkpoint(folder: str, project: Project) -> tuple[CheckpointInfo | None, Blocker | None]:
    """The checkpoint in `folder` (ckpt-NNNNNN, or a folder of them: the newest), or why it cannot go
    on with the open model (none open, not a checkpoint, trained on another model)."""
    blocker = model_blocker(project)
    if blocker is not None:
        return None, blocker
    try:
        info = read_checkpoint_info(folder)
    except EngineError as exc:
        return None, Blocker(f"{folder} is not a checkpoint: choose a ckpt-NNNNNN folder (inside a run's "
                             f"-checkpoints folder), or the -checkpoints folder itself ({exc}).")  # fmt: skip
    other_model = checkpoint_model_problem(info, project.model_path)
    return (None, Blocker(other_model, "Model")) if other_model else (info, None)


def curves_to(checkpoint_dir: str, step: int) -> tuple[list, list]:
    """The loss and validation loss points of the run of `checkpoint_dir` up to `step` (its record)."""
    record = next(iter(find_runs([checkpoint_dir])), None)
    if record is None:
        return [], []
    return [x for x in record.losses if x[0] <= step], [x for x in record.val_losses if x[0] <= step]


def checkpoint_model_problem(info: CheckpointInfo, open_model: str) -> str | None:
    """Why checkpoint `info` cannot go on with the open model (it was trained on another), or None."""
    trained_on = info.model or checkpoint_model(info.path)
    if trained_on and not same_file(trained_on, open_model):
        name = Path(trained_on).name
        return (f"This checkpoint was trained on {name}, not on the open model {Path(open_model).name}. "
                f"Open {name} on the Model page to continue it.")  # fmt: skip
    return None


# --- resume: whose settings and data --------------------------------------------------------------
@dataclass
class ResumeQuestion:
    """How the page's settings and dataset differ from the run of a checkpoint."""

    differences: list[str]  # one line each ("lr 0.001 -> 0.002", "dataset a.jsonl -> b.jsonl")
    run_data: object  # the run's own samples or file; None when they are gone
    page_data: object  # what the page would train instead: the editor's samples, or the dataset file
    text: str = ""  # the question to ask ("" when the run's own settings go on without asking)
    impossible: str = ""  # the run's data is gone and the page has none: a banner, nothing to ask


def resume_question(info: CheckpointInfo, project: Project, edited, custom: bool) -> ResumeQuestion:
    """What resuming from `info` would change, and whether the person must be asked: when the run's
    data is gone, when the page's dataset differs, or when settings shaped by hand (`custom`: no
    preset's) differ. A preset is a suggestion for new runs: the run's own settings replace it."""
    p = project
    run_data = info.data()
    page_data = edited if edited is not None else p.dataset_path
    differences = trajectory_changes(info.config, p.config)
    if edited is not None:
        differences.append(f"dataset {info.describe_data()} -> the {len(edited)} samples in the editor")
    elif p.dataset_path and not info.same_data(p.dataset_path) and info.knows_data:
        differences.append(f"dataset {info.describe_data()} -> {p.dataset_path}")
    if run_data is None and not info.knows_data:
        run_data = page_data  # an older checkpoint that does not record its data: the page's
    q = ResumeQuestion(differences, run_data, page_data)
    data_differs = any(d.startswith("dataset ") for d in differences)
    if not (run_data is None or data_differs or (differences and custom)):
        return q
    if run_data is None and page_data is None:
        q.impossible = (f"The data this run trained on is gone ({info.describe_data()}). Open a dataset on "
                        "the Dataset page to continue on it.")  # fmt: skip
        return q
    lines = "\n".join(f"• {d}" for d in differences)
    if run_data is None:
        q.text = (f"The data this run trained on is gone ({info.describe_data()}). Continuing on the "
                  f"page's dataset changes the run's trajectory.\n{lines}")  # fmt: skip
    else:
        q.text = (f"The page's settings differ from the run's (step {info.step} of "
                  f"{info.total_steps or '?'}):\n{lines}\nContinuing the run as it was uses its own "
                  "settings and data; the page's change its trajectory.")  # fmt: skip
    return q


def run_settings(info: CheckpointInfo, project: Project) -> TrainConfig:
    """The run of checkpoint `info` as it was, on this machine: its own settings (they also go on
    the page, so that what is shown is what runs) with the page's device and memory settings."""
    p = project
    runtime = {name: getattr(p.config, name) for name in ("device", "cache_budget", "checkpoint_layers")}
    shown = {name: getattr(info.config, name) for name in TRAJECTORY_FIELDS}
    changed = {k: v for k, v in shown.items() if getattr(p.config, k) != v}
    if changed:
        p.update_config(**changed)
    return replace(info.config, **runtime)


# --- what the page says before the first run ------------------------------------------------------
def link_html(text: str, page: str = "") -> str:
    """`text` as rich text, with a link to `page` ("page:<name>") when one fixes it."""
    link = f' <a href="page:{page}">Go to the {page} page</a>' if page else ""
    return html.escape(text) + link


@dataclass(frozen=True)
class StartHint:
    """The Start button and the line above the progress bar."""

    enabled: bool
    reason: str  # rich text; "" hides the line
    tooltip: str


START_TIP = "Start a new training run with these settings (Ctrl+Enter)."


def start_hint(active: bool, blocker: Blocker | None, weak: str | None) -> StartHint:
    """Start is unavailable while a run is active or something blocks it (the line says why, with a
    link); `weak`: why the run is unlikely to change the model (a warning, Start stays)."""
    if active:
        return StartHint(False, "", START_TIP)
    if blocker is not None:
        return StartHint(False, f"<b>Start is unavailable:</b> {link_html(blocker.reason, blocker.page)}",
                         f"Start is unavailable: {blocker.reason}")  # fmt: skip
    if weak:
        return StartHint(True, f"<b>Before you start:</b> {html.escape(weak)}", f"{START_TIP} {weak}")
    return StartHint(True, "", START_TIP)


def first_look(project: Project, check: RunCheck | None, edited, samples_summary: str) -> str:
    """The plot area before the first run: what to do, step by step, with links (edited: the
    editor's samples when they are trained; samples_summary: the Sample answers tab's prompts)."""
    p = project
    done, todo = "✓", "○"

    def row(ok: bool | None, text: str, page: str = "") -> str:
        link = f' — <a href="page:{page}">{page} page</a>' if page and not ok else ""
        mark = "•" if ok is None else done if ok else todo
        return f"<tr><td>{mark}&nbsp;</td><td>{text}{link}</td></tr>"

    model = Path(p.model_path).name if p.model_path else ""
    data = (f"{len(edited)} samples in the editor" if edited is not None
            else Path(p.dataset_path).name if p.dataset_path else "")  # fmt: skip
    if check is not None and check.plan is not None:
        data += f" ({check.plan.n_trainable} to train)"
    targets_ok = check is not None and (check.blocker is None or check.blocker.page != "Targets")
    what = ""
    if check is not None and check.n_lora_tensors + check.n_full_tensors:
        what = f"{check.n_lora_tensors} LoRA tensors"
        what += f" + {check.n_full_tensors} full" if check.n_full_tensors else ""
    rows = [
        row(bool(model), f"A model{': ' + html.escape(model) if model else ''}", "Model"),
        row(bool(data), f"A dataset{': ' + html.escape(data) if data else ''}", "Dataset"),
        row(targets_ok, f"What to train{': ' + what if what else ''}", "Targets"),
        row(None, "Settings on the left: a preset, or your own"),
        row(None, "Optional: prompts answered as it trains, in "
            '<a href="tab:samples">Sample answers</a>' + samples_summary),
    ]  # fmt: skip
    return (
        "<h3>Train a LoRA adapter</h3><table>" + "".join(rows) + "</table>"
        "<p>Then press <b>Start</b> (Ctrl+Enter). The loss, learning rate, gradient norm, throughput "
        "and LoRA norms appear here as the run goes; the Layers tab shows each adapted tensor.</p>"
    )


# --- the check of the next run-----------------------
def check_data(doc: DatasetDocument | None, project: Project):
    """What the check encodes: the editor's samples (edited, or the file as the editor read it), else
    the project's dataset file."""
    edited = edited_samples(doc, project)
    if edited is not None:
        return edited
    if doc is not None and len(doc) and doc_is_dataset_file(doc, project):
        return doc.samples()
    return project.dataset_path


def check_job(info: ModelInfo, data, config: TrainConfig, template_file: str | None, cache: EncodingCache):
    """The engine job that checks the next run (plan.check_run) on the model `info`; the chat
    template is made once per model and template file (the encodings are cached for it)."""

    def check(session, job) -> RunCheck:
        try:
            template = cache.template((id(info), template_file), lambda: (
                template_for(info.metadata, template_file) if template_file else info.template
            ))  # fmt: skip
        except EngineError as exc:
            selection = check_selection(info.tensors, info.summary.config, config)
            return replace(selection, blocker=Blocker(f"The chat template cannot be used: {exc}.", "Model"))
        return check_run(data, info.tokenizer, template, info.tensors, info.summary.config, config, cache)

    return check
