"""The project state: observers hear changes, JSON round trips, bad files are clear errors."""

from __future__ import annotations

import json

import pytest

from engine import TargetSpec
from studio.project import ModelInfo, Project, ProjectError
from studio.resources import DEMO_DATASET, DEMO_MODEL


def test_observers_hear_exactly_what_changed():
    p = Project()
    heard = []
    p.subscribe(heard.append)
    p.update(model_path="/m.gguf", dataset_path=None)
    p.update(model_path="/m.gguf")  # no change, no notification
    p.update_config(rank=8, lr=1e-3)
    p.update_targets(preset="experts", layers="0-1")
    assert heard[0] == {"model_path"}
    assert len(heard) == 3
    assert {"config", "config.rank", "config.lr"} == heard[1]
    assert p.config.targets == TargetSpec(preset="experts", layers="0-1")
    assert p.dirty
    with pytest.raises(AttributeError, match="no field"):
        p.update(colour="red")


def test_save_and_load_round_trip(tmp_path):
    p = Project()
    p.update(model_path=str(DEMO_MODEL), dataset_path=str(DEMO_DATASET), device="cpu")
    targets = TargetSpec(preset="all", patterns=("output",))
    p.update_config(rank=4, alpha=8.0, full=("attn_norm",), targets=targets)
    path = p.save(str(tmp_path / "p.tune.json"))
    assert not p.dirty
    q = Project()
    heard = []
    q.subscribe(heard.append)
    q.load(path)
    assert q.to_json() == p.to_json() and q.config == p.config
    assert heard and "config" in heard[0]


def test_bad_project_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ProjectError, match="line 1"):
        Project().load(str(bad))
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ProjectError, match="not a Tune Studio project"):
        Project().load(str(bad))
    bad.write_text(json.dumps({"config": {"rank": "x", "no_such_setting": 1}}))
    with pytest.raises(ProjectError, match="not valid"):
        Project().load(str(bad))
    with pytest.raises(ProjectError, match="Save As"):
        Project().save()


def test_model_info_reads_header_tokenizer_and_template():
    info = ModelInfo.read(str(DEMO_MODEL))
    assert info.summary.config.arch == "llama"
    assert "blk.0.attn_q.weight" in info.tensors
    assert info.tokenizer.encode("hello", add_special=False)
    assert "<|im_start|>" in info.template.render([{"role": "user", "content": "x"}])


def test_the_engine_prepares_datasets_in_the_folder_the_app_keeps_its_runs_in(monkeypatch, tmp_path):
    # one data folder for the app and the engine: the command line's runs reuse the app's prepared data
    import os

    from engine.train.prepared import default_cache_folder
    from studio.project import model_runs_folder, user_data_folder

    monkeypatch.delenv("TUNE_STUDIO_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    root = user_data_folder()
    assert root.startswith(str(tmp_path))
    assert default_cache_folder() == os.path.join(root, "prepared")
    assert model_runs_folder(None) == os.path.join(root, "runs")


def test_sample_answers_are_saved_with_the_project_and_older_files_open(tmp_path):
    from studio.project import SampleAnswerSettings

    p = Project()
    heard = []
    p.subscribe(heard.append)
    chosen = SampleAnswerSettings(("hello", "who are you"), "validation", 4, 25)
    p.update(sample_answers=chosen)
    assert heard == [{"sample_answers"}] and p.dirty
    path = p.save(str(tmp_path / "p.tune.json"))
    q = Project()
    q.load(path)
    assert q.sample_answers == chosen
    assert q.sample_answers.config_changes() == {
        "sample_prompts": (), "sample_from_validation": 4, "sample_every": 25,
    }  # fmt: skip
    typed = SampleAnswerSettings(("hello",), "typed", 4, 25).config_changes()
    assert typed == {"sample_prompts": ("hello",), "sample_from_validation": 0, "sample_every": 25}
    assert SampleAnswerSettings().config_changes()["sample_every"] == 0  # nothing to answer: off
    # a file written before sample answers were saved opens with the defaults
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    del data["sample_answers"]
    old = tmp_path / "old.tune.json"
    old.write_text(json.dumps(data))
    q.load(str(old))
    assert q.sample_answers == SampleAnswerSettings()
    data["sample_answers"] = {"prompts": "hello", "every": 0}
    old.write_text(json.dumps(data))
    with pytest.raises(ProjectError, match="'prompts' must be a list"):
        q.load(str(old))
