"""The pages follow the CLI's rule for outputs (engine.io.files.check_outputs): a ratings file, a
saved dataset or a project file aimed at the model (or another file the project reads, or a link to
it) is refused with the reason in the window, and the file is unchanged."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from engine import TargetSpec
from studio.main_window import MainWindow
from studio.pages.rewards.page import RewardsPage
from studio.project import ModelInfo, Project, ProjectError
from studio.resources import DEMO_DATASET, DEMO_MODEL


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def model(tmp_path) -> str:
    path = tmp_path / "model.gguf"
    shutil.copyfile(DEMO_MODEL, path)
    return str(path)


def test_the_rewards_page_never_appends_ratings_to_the_model(qtbot, engine, tmp_path, model):
    project = Project()
    project.update(model_path=model, dataset_path=str(DEMO_DATASET), output_dir=str(tmp_path / "out"))
    project.update_config(targets=TargetSpec(preset="all"), rank=8, alpha=16.0)
    page = RewardsPage(project, engine, settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(page)
    page.set_model_info(ModelInfo.read(model))
    before = _digest(model)
    link = tmp_path / "ratings-link.jsonl"
    os.symlink(model, link)
    for path in (model, str(link)):
        assert not page.set_ratings_path(path)
        assert "is the model" in page.banner_text() and "cannot be written" in page.banner_text()
    assert page.ratings_path() != model and _digest(model) == before
    assert page.set_ratings_path(str(tmp_path / "ratings.jsonl"))


def test_neither_the_dataset_nor_the_project_is_saved_over_the_model(qtbot, tmp_path, model):
    window = MainWindow(
        QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat), recovery_dir=tmp_path / "r"
    )
    window.confirm = lambda title, text: True
    qtbot.addWidget(window)
    try:
        with qtbot.waitSignal(window.sig_model_changed, timeout=30_000):
            assert window.open_model(model)
        before = _digest(model)
        data = tmp_path / "data.jsonl"
        shutil.copyfile(DEMO_DATASET, data)
        assert window.open_dataset(str(data))
        assert not window.dataset_page.save_as(model)  # Save As onto the model: refused, the reason shown
        assert "is the model" in window.dataset_page.message.text()
        assert _digest(model) == before and window.dataset.path == str(data)
        hard = tmp_path / "hard.json"
        os.link(model, hard)
        with pytest.raises(ProjectError, match="is the model"):
            window.project.save(str(hard))
        assert _digest(model) == before
        assert window.project.save(str(tmp_path / "p.tune.json")) == str(tmp_path / "p.tune.json")
    finally:
        window.engine.shutdown()


@pytest.mark.parametrize("name", ["run-events.jsonl", "run-data.jsonl", "run-settings.json"])
def test_a_run_on_several_processes_never_writes_its_files_over_the_dataset(tmp_path, name):
    """The files a run on several processes keeps beside its adapter (run-settings.json,
    run-events.jsonl, run-output.log, run-data.jsonl for edited samples) are refused, nothing
    written, when one of them is the dataset the run reads (or the model): a dataset that happens to
    be named like one is kept."""
    from engine import ConfigError, TrainConfig
    from studio.pages.train.processes import RunFiles

    dataset = tmp_path / name
    shutil.copyfile(DEMO_DATASET, dataset)
    before = _digest(dataset)
    files = RunFiles.beside(str(tmp_path / "run.gguf"), str(tmp_path / "run.checkpoints"), str(dataset))
    with pytest.raises(ConfigError, match="is the dataset"):
        files.write(TrainConfig(), samples=[], inputs={"model": DEMO_MODEL})
    assert _digest(dataset) == before and sorted(os.listdir(tmp_path)) == [name]
