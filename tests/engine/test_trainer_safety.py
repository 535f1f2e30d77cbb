"""What a run refuses and how it fails: bad settings named up front, outputs that would replace an
input refused, runaway weights and a full disk stopping the run with the last good checkpoint kept."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.io.files import check_outputs
from engine.model.model import Model
from engine.model.targets import TargetSpec
from engine.train import events as ev
from engine.train import trainer as trainer_module
from engine.train.config import RUN_FOLDERS, clean_stale_temporaries, resolve_checkpoint
from engine.train.trainer import TrainConfig, Trainer


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def model(synth_model):
    return Model.load(synth_model("llama", seed=21))


def _config(tmp_path, **changes) -> TrainConfig:
    base = {
        "targets": TargetSpec(preset="attention"),
        "rank": 4,
        "alpha": 8,
        "lr": 1e-2,
        "steps": 4,
        "n_ctx": 64,
        "schedule": "constant",
        "max_grad_norm": 0.0,
        "checkpoint_every": 1,
        "keep_checkpoints": 10,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "out": str(tmp_path / "adapter.gguf"),
    }
    base.update(changes)
    return TrainConfig(**base)


def _run(model, chats, cfg, **kwargs):
    got: list = []
    result = Trainer(model, chats, cfg, **kwargs).run(got.append, lambda: False)
    return got, result


@pytest.mark.parametrize(
    "change,words",
    [
        ({"lr": -1.0}, "lr must be in (0, 10]"),
        ({"lr": float("nan")}, "lr must be a finite number"),
        ({"lr": 1e30}, "lr must be in (0, 10]"),
        ({"rank": 0}, "rank must be in 1..65536"),
        ({"rank": 2.5}, "rank must be a whole number"),
        ({"batch_size": True}, "batch_size must be a whole number"),
        ({"n_ctx": -5}, "n_ctx must be in 2..1048576"),
        ({"epochs": 0.0}, "epochs must be in (0, 1e+06]"),
        ({"val_split": 1.0}, "val_split must be in [0, 0.99]"),
        ({"schedule": "exp"}, "schedule must be one of constant, linear, cosine, got 'exp'"),
        ({"out_type": "Q4_0"}, "out_type must be one of F32, F16, Q8_0"),
        ({"checkpoint_layers": "maybe"}, "checkpoint_layers must be auto, on or off"),
        ({"full": "all"}, "full must be a tuple"),
    ],
)
def test_every_setting_is_checked_with_a_one_line_message(change, words):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**change)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


def test_a_rank_no_tensor_can_use_is_refused_naming_the_bound(model, chats, tmp_path):
    got, result = _run(model, chats, _config(tmp_path, rank=4096))
    assert result is None or isinstance(got[-1], ev.Failed)
    failed = got[-1]
    assert isinstance(failed, ev.Failed) and "rank 4096" in failed.message and "at most" in failed.message
    assert not os.path.exists(tmp_path / "adapter.gguf")


@pytest.mark.parametrize("which", ["model", "dataset"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(model, chats, tmp_path, which):
    target = model.path if which == "model" else chats
    before = _digest(target)
    got, _ = _run(model, chats, _config(tmp_path, out=target))
    failed = got[-1]
    assert isinstance(failed, ev.Failed) and f"is the {which}" in failed.message
    assert _digest(target) == before


def test_outputs_that_are_folders_or_files_of_the_wrong_kind(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a folder"):
        check_outputs({"adapter": str(tmp_path / "folder")}, {})
    with pytest.raises(ConfigError, match="is a file"):
        check_outputs({"checkpoint folder": str(tmp_path / "file")}, {}, folders=RUN_FOLDERS)
    check_outputs({"adapter": str(tmp_path / "new.gguf")}, {"model": str(tmp_path / "file")})


def test_runaway_weights_stop_the_run_before_any_checkpoint_holds_them(model, chats, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "MAX_PARAM", 0.5)  # lr 1 moves each zero-initialised B entry by ~1
    got, _ = _run(model, chats, _config(tmp_path, lr=1.0, steps=3))
    failed = got[-1]
    assert isinstance(failed, ev.Failed) and "exploded" in failed.message
    assert "lower the learning rate" in failed.message
    assert not any(isinstance(e, ev.Checkpoint) for e in got)
    assert not [p for p in os.listdir(tmp_path / "ckpt") if p.startswith(("ckpt-", ".tmp-"))]
    assert not os.path.exists(tmp_path / "adapter.gguf")


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_leaves_no_temporary(
    model, chats, tmp_path, monkeypatch
):
    real_savez = np.savez
    calls = {"n": 0}

    def savez(path, **arrays):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_savez(path, **arrays)

    monkeypatch.setattr(trainer_module.np, "savez", savez)
    got, _ = _run(model, chats, _config(tmp_path, steps=5))
    failed = got[-1]
    assert isinstance(failed, ev.Failed)
    assert "step 3" in failed.message and "No space left on device" in failed.message
    assert "free some disk space" in failed.message
    assert failed.checkpoint_path.endswith("ckpt-000002")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ckpt-000001", "ckpt-000002", "run.json"]
    monkeypatch.setattr(trainer_module.np, "savez", real_savez)
    # The kept checkpoint is whole: the run continues from it.
    got, _ = _run(model, chats, _config(tmp_path, steps=5), resume=failed.checkpoint_path)
    assert isinstance(got[-1], ev.Finished) and sum(isinstance(e, ev.Step) for e in got) == 3


def test_a_full_disk_at_the_end_names_the_file_and_writes_nothing_partial(
    model, chats, tmp_path, monkeypatch
):
    import engine.export.write as export

    real = export.export_adapter

    def export_adapter(adapter, path, **kw):
        if os.path.abspath(path) == os.path.abspath(tmp_path / "adapter.gguf"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(adapter, path, **kw)

    monkeypatch.setattr(export, "export_adapter", export_adapter)
    got, _ = _run(model, chats, _config(tmp_path, steps=2))
    failed = got[-1]
    assert isinstance(failed, ev.Failed) and "No space left on device" in failed.message
    assert str(tmp_path / "adapter.gguf") in failed.message and failed.checkpoint_path.endswith("ckpt-000002")
    assert not os.path.exists(tmp_path / "adapter.gguf")
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def test_resume_accepts_the_checkpoint_folder_and_picks_the_newest_complete(model, chats, tmp_path):
    got, _ = _run(model, chats, _config(tmp_path, steps=3))
    assert isinstance(got[-1], ev.Finished)
    folder = tmp_path / "ckpt"
    os.makedirs(folder / "ckpt-000009")  # an incomplete one (killed while written) is passed over
    assert resolve_checkpoint(str(folder)).endswith("ckpt-000003")
    assert resolve_checkpoint(str(folder / "ckpt-000002")).endswith("ckpt-000002")
    with pytest.raises(Exception, match="no complete checkpoint"):
        resolve_checkpoint(str(tmp_path))
    got, _ = _run(model, chats, _config(tmp_path, steps=5), resume=str(folder))
    steps = [e.step for e in got if isinstance(e, ev.Step)]
    assert steps == [4, 5] and isinstance(got[-1], ev.Finished)


def test_temporaries_left_by_a_killed_run_are_removed(tmp_path):
    (tmp_path / ".tmp-ckpt-abc").mkdir()
    (tmp_path / ".tmp-ckpt-abc" / "state.npz").write_bytes(b"partial")
    (tmp_path / ".tmp-adapter.gguf.1").write_bytes(b"partial")
    (tmp_path / "ckpt-000001").mkdir()
    assert clean_stale_temporaries(str(tmp_path)) == 2
    assert os.listdir(tmp_path) == ["ckpt-000001"]
    assert clean_stale_temporaries(str(tmp_path / "missing")) == 0


def test_a_flat_loss_with_exploding_norms_warns_once(model, chats, tmp_path):
    trainer = Trainer(model, chats, _config(tmp_path))
    seen: list = []
    trainer.trainable = type("T", (), {"pairs": {"x": None}})()
    for i in range(trainer_module.STALL_STEPS + 5):
        trainer._loss_window.append(2.0)
        trainer._norm_window.append(1.5**i)
        trainer.step = i + 1
        trainer._watch_progress(seen.append)
    assert len(seen) == 1 and isinstance(seen[0], ev.RunWarning)
    assert "has not moved" in seen[0].message and "learning rate" in seen[0].message
    assert json.loads(ev.event_to_json(seen[0]))["event"] == "RunWarning"


def test_cli_train_refuses_bad_options_in_one_line(synth_model, chats, tmp_path):
    model = synth_model("llama", seed=21)
    before = _digest(model)
    for args, words in [
        (["--lr", "1e30"], "lr must be in (0, 10]"),
        (["--rank", "0"], "rank must be in 1..65536"),
        (["--out", model], "is the model"),
    ]:
        out = str(tmp_path / "a.gguf")
        argv = ["train", model, chats, "--out", out, "--steps", "1", "--ctx", "64", *args]
        r = subprocess.run([sys.executable, "-m", "engine.cli", *argv], capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and words in lines[-1] and "Traceback" not in r.stderr
    assert _digest(model) == before
    assert not os.path.exists(tmp_path / "a.gguf")


def test_cli_turns_unexpected_errors_into_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    import importlib

    cli = importlib.import_module("engine.cli.main")

    def broken(args):
        raise RuntimeError("boom")

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.npy")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["inspect"].set_defaults(func=broken)
    assert cli.main(["inspect", "x.gguf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: RuntimeError: boom (this is a bug in Tune Studio; run again with --debug for the traceback)"
    ]
    with pytest.raises(RuntimeError):
        cli.main(["--debug", "inspect", "x.gguf"])
    parser._subparsers._group_actions[0].choices["inspect"].set_defaults(func=full)
    assert cli.main(["inspect", "x.gguf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: No space left on device (/data/out.npy); free some disk space"
