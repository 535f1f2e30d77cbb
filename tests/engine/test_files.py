"""The engine's one way of writing files (engine.io.files) and its one checkpoint format
(engine.train.checkpoint): a failure leaves what was there, nothing half-written stays behind."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from engine.io.files import TMP_PREFIX, atomic_folder, atomic_path, atomic_write, durable_append
from engine.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    read_checkpoint,
    write_checkpoint,
)


def test_atomic_write_replaces_whole_and_keeps_permissions(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("old\n")
    os.chmod(path, 0o640)
    with atomic_write(path) as f:
        f.write("new\n")
        assert path.read_text() == "old\n"  # nothing changes until the block ends
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["data.jsonl"]


def test_a_failure_while_writing_leaves_the_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"precious")
    with pytest.raises(OSError, match="No space"):
        with atomic_write(path, "wb") as f:
            f.write(b"half")
            raise OSError(28, "No space left on device")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(path) as tmp:
            assert os.path.basename(tmp).startswith(TMP_PREFIX)
            raise KeyboardInterrupt
    assert path.read_bytes() == b"precious" and os.listdir(tmp_path) == ["model.gguf"]
    with pytest.raises(ValueError, match="whole files"):
        with atomic_write(path, "a"):
            pass


def test_atomic_folder_replaces_an_old_folder_only_when_complete(tmp_path):
    final = tmp_path / "ckpt-000001"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_folder(final) as tmp:
            open(os.path.join(tmp, "new.txt"), "w").close()
            raise RuntimeError("killed")
    assert os.listdir(final) == ["old.txt"] and os.listdir(tmp_path) == ["ckpt-000001"]
    with atomic_folder(final) as tmp:
        open(os.path.join(tmp, "new.txt"), "w").close()
    assert os.listdir(final) == ["new.txt"]


def test_durable_append_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / "ratings.jsonl"
    durable_append(path, b'{"a": 1}\n')
    with open(path, "ab") as f:
        f.write(b'{"cut short')  # a crash mid-line
    durable_append(path, b'{"b": 2}\n')
    assert path.read_bytes().splitlines() == [b'{"a": 1}', b'{"cut short', b'{"b": 2}']


def test_checkpoints_round_trip_and_the_newest_complete_one_is_found(tmp_path):
    params = {"w.lora_a": np.arange(6, dtype=np.float32).reshape(2, 3)}
    optim = {"kind": "adamw", "step_count": 3, "m.w.lora_a": np.ones((2, 3), np.float32)}
    written: list[str] = []

    def adapter(p: str) -> None:
        open(p, "w").close()
        written.append(p)

    for step in (1, 2, 3):
        path = write_checkpoint(
            str(tmp_path), step, params=params, optimizer=optim, meta={"step": step}, meta_file="run.json",
            extra={"trainer.step": step}, write_adapter=adapter, keep=2,
        )  # fmt: skip
        assert len(written) == step and os.path.isfile(os.path.join(path, "adapter.gguf"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000002", "ckpt-000003"]
    os.makedirs(tmp_path / "ckpt-000009")  # killed while written: not complete
    assert latest_checkpoint(str(tmp_path), "run.json").endswith("ckpt-000003")
    meta, p, o, other = read_checkpoint(latest_checkpoint(str(tmp_path), "run.json"), "run.json")
    assert meta == {"step": 3} and int(other["trainer.step"]) == 3 and str(o["kind"]) == "adamw"
    np.testing.assert_array_equal(p["w.lora_a"], params["w.lora_a"])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_checkpoint(str(tmp_path / "ckpt-000009"), "run.json")
