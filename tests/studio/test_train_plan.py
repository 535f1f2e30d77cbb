"""The Train page's check of the next run (studio.pages.train.plan) against the engine's own plan, the
output folders it checks and tidies, and the project's output folder and hyperparameter presets.
No Qt, no training step: `Trainer.start()` gives the engine's Plan."""

from __future__ import annotations

import json
import os
import sys

import pytest

from engine import MemoryEstimate, Sample, TargetSpec, TrainConfig, Trainer, count_windows
from studio.pages.train.folders import clean_failed_run, folder_problem, missing_folders
from studio.pages.train.plan import EncodingCache, check_run
from studio.project import (
    DEFAULT_PRESET,
    HYPER_PRESETS,
    DataStats,
    ModelInfo,
    Project,
    describe_preset,
    matching_preset,
    model_runs_folder,
    preset_settings,
    user_data_folder,
)
from studio.resources import DEMO_MODEL


@pytest.fixture
def mixed(tmp_path):
    """Chats of various lengths, a prompt/response pair per prompt twice (groups), a text sample,
    a line that is not a sample, and one answer far longer than a short context."""
    path = tmp_path / "mixed.jsonl"
    rows = []
    for i in range(14):
        answer = " ".join(["word"] * (3 + 5 * (i % 4)))
        rows.append({"messages": [{"role": "user", "content": f"question {i}?"},
                                  {"role": "assistant", "content": f"{i}: {answer}"}]})  # fmt: skip
    for i in range(3):
        for k in range(2):
            rows.append({"prompt": f"prompt {i}", "response": f"answer {k} " * (k + 1), "reward": k})
    rows.append({"text": "plain text sample " * 4})
    lines = [json.dumps(r) for r in rows]
    lines.insert(5, '{"nothing": 1}')
    prompt = "a long prompt " * 40
    lines.append(json.dumps({"prompt": prompt, "response": "short"}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


CONFIGS = [
    dict(n_ctx=64),
    dict(n_ctx=128, batch_size=2, grad_accum=3, epochs=2.5, val_split=0.25, seed=3),
    dict(n_ctx=32, batch_size=3, val_split=0.1, seed=11, train_on_prompt=True),
    dict(n_ctx=256, steps=7, prompt_format="raw", val_split=0.5),
]


@pytest.mark.parametrize("settings", CONFIGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_check_counts_the_steps_windows_and_tokens_the_engine_plans(synth_model, mixed, settings):
    model = synth_model("llama")
    info = ModelInfo.read(model)
    config = TrainConfig(targets=TargetSpec(preset="attention"), **settings)
    check = check_run(mixed, info.tokenizer, info.template, info.tensors, info.summary.config, config)
    trainer = Trainer(model, mixed, config, template=info.template)
    engine_plan = trainer.start().plan
    plan = check.plan
    assert check.blocker is None
    assert (plan.n_train, plan.n_val) == (engine_plan.n_train, engine_plan.n_val)
    assert plan.n_windows == engine_plan.n_windows
    assert plan.batches_per_epoch == engine_plan.batches_per_epoch
    assert plan.total_steps == engine_plan.total_steps
    assert plan.tokens_per_epoch == engine_plan.tokens_per_epoch
    assert plan.label_tokens_per_epoch == engine_plan.label_tokens_per_epoch
    assert len(plan.problems) == len(engine_plan.problems)
    assert check.n_trainable_params == engine_plan.trainable_params
    assert check.n_lora_tensors == len(engine_plan.lora_targets)
    assert f"{plan.total_steps:,} steps" in plan.describe(config)


def test_packing_follows_the_engine():
    from engine.train.batches import pack  # the engine's own, to compare

    lengths = [5, 9, 3, 3, 7, 1, 8, 2, 6, 6]

    class E:  # what pack reads of an Encoded
        def __init__(self, n):
            self.tokens = [0] * n

    for n_ctx in (9, 10, 16, 64):
        assert count_windows(lengths, n_ctx) == len(pack([E(n) for n in lengths], n_ctx, shuffle_seed=4))
    assert count_windows([], 8) == 0


def encoded_here(monkeypatch) -> list:
    """The samples the check encodes in this process from now on (one entry each), as a list."""
    import studio.pages.train.plan as plan_module

    calls: list = []
    real = plan_module.encode_iter

    def counting(samples, *args, **kwargs):
        for sample, encoded, problems in real(samples, *args, **kwargs):
            calls.append(sample)
            yield sample, encoded, problems

    monkeypatch.setattr(plan_module, "encode_iter", counting)
    return calls


def test_the_encoding_cache_encodes_each_sample_once(synth_model, monkeypatch):

    info = ModelInfo.read(synth_model("llama"))
    samples = [Sample(0, "text", (), None, None, f"sample number {i}", None, "") for i in range(6)]
    calls = encoded_here(monkeypatch)
    cache = EncodingCache()
    args = (info.tokenizer, info.template, info.tensors, info.summary.config)
    first = check_run(samples, *args, TrainConfig(n_ctx=64), cache)
    assert len(calls) == 6
    # other batch, epochs, validation split: nothing encoded again
    second = check_run(samples, *args, TrainConfig(n_ctx=64, batch_size=2, epochs=3, val_split=0.3), cache)
    assert len(calls) == 6 and second.plan.total_steps != first.plan.total_steps
    edited = [*samples[:5], Sample(0, "text", (), None, None, "an edited sample", None, "")]
    check_run(edited, *args, TrainConfig(n_ctx=64), cache)
    assert len(calls) == 7  # only the edited one
    check_run(edited, *args, TrainConfig(n_ctx=32), cache)
    assert len(calls) == 13  # a new context length: everything again


@pytest.mark.parametrize("child", ["counts", "dies"])
def test_a_large_check_encodes_in_a_child_process_the_same(synth_model, mixed, monkeypatch, child):
    """Many samples are encoded in a child process (on the worker's thread they held the interpreter
    from the window for seconds): the same plan, problems included, and nothing encoded here; a
    child that dies leaves the samples to be encoded here, with the same plan."""
    import studio.pages.train.plan as plan_module
    from studio.count_process import CountJob

    info = ModelInfo.read(synth_model("llama"))
    args = (info.tokenizer, info.template, info.tensors, info.summary.config)
    config = TrainConfig(n_ctx=32, batch_size=3, val_split=0.1, seed=11, train_on_prompt=True)
    here = check_run(mixed, *args, config)  # fewer samples than CHILD_MIN: encoded here
    calls = encoded_here(monkeypatch)
    monkeypatch.setattr(plan_module, "CHILD_MIN", 4)
    if child == "dies":
        monkeypatch.setattr(plan_module, "CountJob", lambda: CountJob(target=os.abort))
    there = check_run(mixed, *args, config)
    assert there.plan == here.plan and here.plan.problems
    assert calls == [] if child == "counts" else len(calls) == here.plan.n_samples


def test_stopping_the_cache_kills_the_encoding_child_and_fails_the_check(synth_model, tmp_path, monkeypatch):
    """Quitting while a large dataset is checked: the child is killed, the check fails at once (no
    encoding here instead), and later checks fail at once too."""
    import multiprocessing as mp
    import threading

    import studio.pages.train.plan as plan_module
    from engine import EngineError

    info = ModelInfo.read(synth_model("llama"))
    args = (info.tokenizer, info.template, info.tensors, info.summary.config)
    samples = [Sample(0, "text", (), None, None, f"sample number {i} " * 20, None, "") for i in range(60_000)]
    monkeypatch.setattr(plan_module, "CHILD_MIN", 4)
    cache = EncodingCache()
    failed: list[BaseException] = []

    def check():
        try:
            check_run(samples, *args, TrainConfig(n_ctx=64), cache)
        except EngineError as exc:
            failed.append(exc)

    worker = threading.Thread(target=check)
    worker.start()
    for _ in range(600):
        if cache._job is not None and cache._job.pid is not None:
            break
        threading.Event().wait(0.05)
    cache.stop()
    worker.join(30)
    assert not worker.is_alive() and "stopped" in str(failed[0])
    assert not mp.active_children()
    with pytest.raises(EngineError, match="stopped"):
        check_run(samples[:10], *args, TrainConfig(n_ctx=64), cache)


def test_blockers_name_the_cause_in_plain_words_and_the_page(synth_model, tmp_path, monkeypatch):
    info = ModelInfo.read(synth_model("llama"))
    args = (info.tokenizer, info.template, info.tensors, info.summary.config)
    good = [Sample(0, "text", (), None, None, "a sample with tokens", None, "")]
    nothing = check_run(good, *args, TrainConfig(targets=TargetSpec(preset="none")))
    assert nothing.blocker.page == "Targets" and "nothing is chosen to train" in nothing.blocker.reason
    bad = check_run(good, *args, TrainConfig(targets=TargetSpec(preset="attention", patterns=("nosuch*",))))
    assert bad.blocker.page == "Targets"
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"nothing": 1}\n', encoding="utf-8")
    no_data = check_run(str(empty), *args, TrainConfig())
    assert no_data.blocker.page == "Dataset" and "no usable sample" in no_data.blocker.reason
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00hell\x00o")
    unreadable = check_run(str(binary), *args, TrainConfig())
    assert unreadable.blocker.page == "Dataset"
    assert "b'" not in unreadable.blocker.reason and "\\x" not in unreadable.blocker.reason
    turns = ({"role": "user", "content": "x " * 300}, {"role": "assistant", "content": "y"})
    long_prompt = [Sample(0, "prompt", turns, "x " * 300, "y", None, None, "g")]
    untrainable = check_run(long_prompt, *args, TrainConfig(n_ctx=16))
    assert (
        untrainable.blocker.page == "Dataset"
        and "no training sample has a token" in untrainable.blocker.reason
    )
    assert untrainable.plan.total_steps == 0
    monkeypatch.setattr(MemoryEstimate, "fits", lambda self, available=None: False)
    big = check_run(good, *args, TrainConfig())
    assert big.blocker.page == "Targets" and "would not fit in memory" in big.blocker.reason
    assert "GiB is free: try" in big.blocker.reason  # the engine's advice
    for check in (nothing, bad, no_data, unreadable, untrainable, big):
        assert "Problem(" not in check.blocker.reason and "Sample(" not in check.blocker.reason


def test_folders_are_checked_without_being_made_and_tidied_after_an_early_failure(tmp_path):
    target = tmp_path / "runs" / "deep" / "x-checkpoints"
    assert folder_problem(str(target)) is None
    assert not (tmp_path / "runs").exists()  # asked, not made
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "is a file, not a folder" in folder_problem(str(blocker / "out"))
    created = missing_folders(str(target.parent), str(target))
    assert created[0] == str(target) and str(tmp_path / "runs") in created
    target.mkdir(parents=True)
    (target / "run.json").write_text("{}")
    (target / ".tmp-run-1.json").write_text("")
    removed = clean_failed_run(str(target), created)
    assert not (tmp_path / "runs").exists() and str(target) in removed
    # a folder with checkpoints, or one that held something before, is kept
    target.mkdir(parents=True)
    (target / "ckpt-000002").mkdir()
    assert clean_failed_run(str(target), created) == [] and (target / "ckpt-000002").exists()
    other = tmp_path / "kept"
    (other / "c").mkdir(parents=True)
    (other / "notes.txt").write_text("mine")
    clean_failed_run(str(other / "c"), [str(other / "c")])
    assert (other / "notes.txt").exists() and not (other / "c").exists()


def test_each_model_has_one_runs_home_in_the_app_data_folder(tmp_path, monkeypatch):
    """The runs folder follows the model only: opening a dataset or saving the project elsewhere does
    not move it, a model in a read-only or installed folder gets one too, and older runs beside the
    project are still found."""
    monkeypatch.setenv("TUNE_STUDIO_DATA", str(tmp_path / "data"))
    project = Project()
    assert project.output_folder() == str(tmp_path / "data" / "runs")  # no model yet
    project.update(model_path=str(DEMO_MODEL))  # the bundled demo, inside the program
    home = project.output_folder()
    assert home.startswith(str(tmp_path / "data" / "runs" / "demo-")) and "resources" not in home
    assert not os.path.exists(home)  # asking makes nothing
    mine = tmp_path / "work" / "d.jsonl"
    mine.parent.mkdir()
    mine.write_text("")
    project.update(dataset_path=str(mine))
    project.path = str(tmp_path / "elsewhere" / "p.json")
    assert project.output_folder() == home == model_runs_folder(str(DEMO_MODEL))
    other = tmp_path / "ro" / "demo.gguf"  # same name, another file: another home
    assert model_runs_folder(str(other)) != home and os.path.basename(
        model_runs_folder(str(other))
    ).startswith("demo-")
    project.update(output_dir=str(tmp_path / "chosen"))
    assert project.output_folder() == str(tmp_path / "chosen")  # a chosen folder always wins
    assert project.default_output_folder() == home
    assert project.legacy_output_folder() is None
    (tmp_path / "work" / "tune-studio-out").mkdir()  # where older versions wrote, beside the dataset
    assert project.legacy_output_folder() == str(tmp_path / "work" / "tune-studio-out")
    monkeypatch.delenv("TUNE_STUDIO_DATA")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert user_data_folder() == str(tmp_path / "xdg" / "tune-studio")  # one folder, not two nested


def test_presets_scale_to_the_dataset_and_plan_enough_learning():
    """A 16-sample dataset of short chats gets a short context, a batch of its windows and many epochs
    (enough steps that lr × steps teaches it); a large dataset gets its epochs; held-out validation only
    when there are samples to spare."""
    small_model = 135_000_000
    facts = DataStats(n_samples=16, n_tokens=16 * 40, longest=45, measured_ctx=512)
    s = preset_settings("balanced", small_model, facts)
    assert s["n_ctx"] == 64 and s["steps"] == 60 and s["lr"] == 1e-3 and s["val_split"] == 0.0
    assert s["batch_size"] == 8 and s["lr"] * s["steps"] >= 0.04
    quick = preset_settings("quick", small_model, facts)
    assert quick["steps"] == 30 and quick["lr"] * quick["steps"] >= 0.01
    big = DataStats(n_samples=20_000, n_tokens=20_000 * 300, longest=900, measured_ctx=1024)
    b = preset_settings("balanced", small_model, big)
    assert b["steps"] == 0 and b["epochs"] == 2.0 and b["n_ctx"] == 512 and b["val_split"] == 0.1
    cut = DataStats(n_samples=200, n_tokens=200 * 256, longest=256, measured_ctx=256)  # cut at 256
    assert preset_settings("balanced", small_model, cut)["n_ctx"] == 512
    # the context is a fixed point: measured again with the context it chose, nothing changes
    again = DataStats(16, 16 * 40, 45, s["n_ctx"])
    assert preset_settings("balanced", small_model, again) == s
    assert matching_preset(TrainConfig(**s), small_model, facts) == "balanced"


def test_presets_follow_the_model_size_and_a_reset_keeps_the_targets():
    tiny, big = 1_000_000, 30_000_000_000
    for name in HYPER_PRESETS:
        assert preset_settings(name, tiny)["lr"] > preset_settings(name, big)["lr"]
        text = describe_preset(name, big)
        assert f"learning rate {preset_settings(name, big)['lr']:g}" in text and "steps" in text
    assert preset_settings("quick", tiny)["epochs"] < preset_settings("thorough", tiny)["epochs"]
    project = Project()
    targets = TargetSpec(preset="mlp", layers="0-1")
    project.update_config(targets=targets, rank=4, alpha=8.0, device="cpu")
    project.apply_preset("thorough", tiny)
    assert matching_preset(project.config, tiny) == "thorough"
    assert matching_preset(project.config, big) is None  # other values for another size
    project.update_config(lr=0.123)
    assert matching_preset(project.config, tiny) is None
    heard = []
    project.subscribe(heard.append)
    project.reset_hyperparameters(tiny)
    cfg = project.config
    assert matching_preset(cfg, tiny) == DEFAULT_PRESET == "balanced" and cfg.lr == 2e-3
    assert cfg.targets == targets and cfg.rank == 4 and cfg.alpha == 8.0
    assert heard and "config" in heard[0] and "config.lr" in heard[0]
