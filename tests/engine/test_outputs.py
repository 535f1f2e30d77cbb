"""The one rule for every output of every command: an output aimed at an input of the same command
(directly, through a symbolic link or a hard link, or inside a checkpoint the command reads) or at
another of its outputs is refused in one line before any work, and the input is unchanged; a file of
another kind is never replaced by an output; a run's events are appended, never truncated."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest

from bench.fuzz_cli import CliFiles, run_cli
from engine.errors import ConfigError
from engine.io.files import AppendLog, check_outputs, replace_problem

pytestmark = pytest.mark.timeout(60)


def _digest(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    if p.is_dir():
        return ",".join(f"{q.relative_to(p)}:{_digest(q)}" for q in sorted(p.rglob("*")) if q.is_file())
    return hashlib.sha256(p.read_bytes()).hexdigest()


# what the fixture hands a test -> the name bench.fuzz_cli.CliFiles writes it under
INPUTS = {
    "model": "model.gguf",
    "adapter": "adapter.gguf",
    "data": "data.jsonl",
    "template": "template.jinja",
    "prompts": "prompts.txt",
    "checkpoints": "run.checkpoints",
    "settings": "settings.json",
}


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory) -> CliFiles:
    """A model, its adapter, a dataset, a chat template, prompts, a run's settings and a training
    checkpoint, written once (the fuzzer's own inputs)."""
    return CliFiles(tmp_path_factory.mktemp("inputs"))


@pytest.fixture
def files(cli_files, tmp_path_factory) -> dict[str, str]:
    """A fresh copy of the inputs for each test (on code without the rule, one test's destroyed
    input must not fail the next): what -> path."""
    paths = cli_files.copy_to(tmp_path_factory.mktemp("case"))
    return {what: paths[name] for what, name in INPUTS.items()}


def _argv(command: str, **paths: str) -> list[str]:
    """`command` split into words as a shell splits it, then each word's {names} filled from `paths`
    (a path holding a space stays one word)."""
    return [word.format(**paths) for word in shlex.split(command)]


def _refused(argv: list[str], protected: list[str], words: str) -> str:
    """`tune-engine argv` exits 2 with one error line holding `words`; every protected path unchanged."""
    before = {p: _digest(p) for p in protected}
    rc, out, err = run_cli(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and lines and lines[-1].startswith("error: "), (rc, err)
    assert words in lines[-1] and "Traceback" not in err and "bug" not in err, lines[-1]
    assert {p: _digest(p) for p in protected} == before
    return lines[-1]


# The six destroyed inputs the issue's fuzz found, and their kin: an output option of each command
# aimed at each input of the same command.
AIMED = [
    ("logits --out MODEL", "logits {model} --tokens '1 2' --out {model}", "is the model"),
    ("logits --out ADAPTER", "logits {model} --tokens 1 --lora {adapter} --out {adapter}", "is the adapter"),
    ("logits --out DATASET", "logits {model} --tokens 1 --out {data}", "is not a NumPy .npy file"),
    (
        "train --events MODEL",
        "train {model} {data} --out {tmp}/a.gguf --events {model}",
        "the events file {model} is the model",
    ),
    ("train --events DATASET", "train {model} {data} --out {tmp}/a.gguf --events {data}", "is the dataset"),
    (
        "train --template-file T --out T",
        "train {model} {data} --template-file {template} --out {template}",
        "is the chat template",
    ),
    ("train --out DATASET", "train {model} {data} --out {data}", "is the dataset"),
    (
        "train --init-adapter A --out A",
        "train {model} {data} --init-adapter {adapter} --out {adapter}",
        "is the adapter to continue",
    ),
    (
        "train --out inside the checkpoint resumed",
        "train {model} {data} --resume {checkpoints} --out {checkpoints}/ckpt-000002/adapter.gguf",
        "is inside the checkpoint to resume",
    ),
    (
        "train --events = --out",
        "train {model} {data} --out {tmp}/a.gguf --events {tmp}/a.gguf",
        "are the same path",
    ),
    (
        "train --settings S --out S",
        "train {model} {data} --settings {settings} --out {settings}",
        "is the settings file",
    ),
    (
        "export --prompts P --out P",
        "export {adapter} --model {model} --merge --prompts {prompts} --out {prompts}",
        "is the verification prompts",
    ),
    (
        "export --merge --out ADAPTER",
        "export {adapter} --model {model} --merge --out {adapter}",
        "is the adapter",
    ),
    ("export --out MODEL", "export {adapter} --model {model} --out {model}", "is the base model"),
    (
        "reward --ratings PROMPTS",
        "reward {model} --prompts {prompts} --ratings {prompts} --out {tmp}/r.gguf",
        "is the prompts file",
    ),
    (
        "reward --ratings MODEL",
        "reward {model} --prompts {prompts} --ratings {model} --out {tmp}/r.gguf",
        "is the model",
    ),
    (
        "reward --adapter A --out A",
        "reward {model} --adapter {adapter} --prompts {prompts} --ratings {tmp}/r.jsonl --out {adapter}",
        "is the adapter to continue",
    ),
]


@pytest.mark.parametrize(("command", "words"), [a[1:] for a in AIMED], ids=[a[0] for a in AIMED])
def test_an_output_aimed_at_an_input_of_the_command_is_refused_and_the_input_kept(
    files, tmp_path, command, words
):
    paths = {**files, "tmp": str(tmp_path)}
    _refused(_argv(command, **paths), list(files.values()), words.format(**paths))
    assert sorted(os.listdir(tmp_path)) == []  # nothing was written: refused before any work


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_to_an_input_is_the_input(files, tmp_path, link):
    target = tmp_path / f"{link}.gguf"
    (os.symlink if link == "symlink" else os.link)(files["model"], target)
    line = _refused(
        ["logits", files["model"], "--tokens", "1", "--out", str(target)], [files["model"]], "is the model"
    )
    assert ("hard link" in line) == (link == "hardlink") and ("symbolic link" in line) == (link == "symlink")
    assert os.path.samefile(target, files["model"]) or os.path.islink(target)  # the link itself is kept too


def test_a_checkpoint_folder_holding_an_input_is_refused(files, tmp_path):
    held = tmp_path / "ck" / "ckpt-000001"
    held.mkdir(parents=True)
    adapter = held / "adapter.gguf"
    adapter.write_bytes(Path(files["adapter"]).read_bytes())
    command = "train {model} {data} --init-adapter {held} --out {tmp}/a.gguf"
    command += " --checkpoint-every 1 --checkpoint-dir {tmp}/ck"  # the folder holding the adapter
    argv = _argv(command, **files, held=str(adapter), tmp=str(tmp_path))
    _refused(argv, [str(adapter)], "which the run replaces or deletes")


def test_the_rule_resolves_paths_and_compares_outputs_with_each_other(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF model")
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "..link"
    os.symlink(tmp_path, link)
    with pytest.raises(ConfigError, match="is the model"):  # through a linked folder and "..": the same file
        check_outputs({"adapter": str(link / "sub" / ".." / "m.gguf")}, {"model": str(model)})
    with pytest.raises(ConfigError, match="the adapter and the logits file are the same path"):
        check_outputs({"logits file": str(tmp_path / "x"), "adapter": str(tmp_path / "." / "x")}, {})
    with pytest.raises(ConfigError, match="is inside ckpt-000003 of the checkpoint folder"):
        check_outputs(
            {"checkpoint folder": str(tmp_path / "ck"), "adapter": str(tmp_path / "ck/ckpt-000003/a.gguf")},
            {},
            folders={"checkpoint folder": "ckpt-"},
        )
    # a run may go on in the folder of the checkpoint it resumes; files beside an input are fine
    check_outputs(
        {"checkpoint folder": str(tmp_path / "ck")},
        {"resumed": str(tmp_path / "ck/ckpt-000002")},
        folders={"checkpoint folder": "ckpt-"},
        continues="resumed",
    )
    check_outputs(
        {"adapter": str(tmp_path / "new.gguf")}, {"model": str(model), "missing": str(tmp_path / "no")}
    )


def test_an_output_replaces_only_a_file_of_its_own_kind(cli_files, files, tmp_path):
    npy = tmp_path / "old.npy"
    np.save(npy, np.zeros(2))
    assert replace_problem(npy, "npy") is None and replace_problem(files["data"], "npy")
    assert replace_problem(files["adapter"], "adapter") is None
    assert replace_problem(files["model"], "adapter") == "it is a GGUF model"
    assert replace_problem(files["adapter"], "model") == "it is a LoRA adapter"
    assert "not an event" in replace_problem(files["data"], "events")
    assert replace_problem(tmp_path / "none", "npy") is None
    # a second run replaces the first one's results
    rc, _, err = run_cli(["logits", files["model"], "--tokens", "1", "--out", str(npy)])
    assert rc == 0, err
    assert np.load(npy).shape == (1, cli_files.spec.V)


def test_events_are_appended_never_truncated_and_a_bad_path_is_refused_before_the_run(files, tmp_path):
    events = tmp_path / "events.jsonl"
    command = "train {model} {data} --out {tmp}/a.gguf --steps 2 --ctx 32 --rank 2 --events {events}"
    argv = _argv(command, **files, tmp=str(tmp_path), events=str(events))
    assert run_cli(argv)[0] == 0
    first = events.read_text().splitlines()
    assert json.loads(first[0])["event"] == "Started" and json.loads(first[-1])["event"] == "Finished"
    assert run_cli(argv)[0] == 0
    both = events.read_text().splitlines()
    assert both[: len(first)] == first and len(both) == 2 * len(first)  # the first run's events are kept


def test_append_log_starts_a_line_of_its_own_and_opens_nothing_before_the_first_record(tmp_path):
    path = tmp_path / "log.jsonl"
    log = AppendLog(path)
    assert not path.exists()  # nothing happens to the file before a record
    path.write_bytes(b'{"event": "cut sh')  # a record cut short by a crash
    log.write(b'{"event": "x"}\n')
    log.close()
    assert path.read_bytes() == b'{"event": "cut sh\n{"event": "x"}\n'
