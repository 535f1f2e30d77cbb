"""Shared fixtures: paths of the bundled golden data and tiny GGUF models written by the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Tests run tiny models, where a second BLAS thread costs more than it gives, and far more when the
# machine's other core is busy (CI): one thread, set before NumPy loads OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

DATA = Path(__file__).parent / "data"
GOLDEN_MODELS = DATA / "models"
GOLDEN_EXTRA = DATA / "models-extra"  # gemma3, deepseek, deepseek2, gpt-oss (issue 17)
ARCHS = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "olmoe")
EXTRA_ARCHS = ("deepseek", "deepseek2", "gpt-oss", "gemma3")  # tested in tests/engine/test_models_extra.py


def write_chats(path, pairs, rewards=None) -> str:
    """Write a JSONL file of one-turn chats, one (question, answer) pair a line, each with its reward when
    `rewards` is given; returns its path."""
    with open(path, "w", encoding="utf-8") as f:
        for i, (question, answer) in enumerate(pairs):
            turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            row = {"messages": turns}
            if rewards is not None:
                row["reward"] = rewards[i]
            f.write(json.dumps(row) + "\n")
    return str(path)


@contextmanager
def parsing_threads() -> Iterator[list[str]]:
    """The names of this process's threads, started inside the block, that call the dataset parser
    (`iter_jsonl`, `parse_sample`): one entry a call. A large file must be parsed in a child process,
    never by a thread that holds the interpreter from the UI thread."""
    names: list[str] = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("iter_jsonl", "parse_sample"):
            names.append(threading.current_thread().name)

    threading.setprofile(watch)  # every thread started from here on
    try:
        yield names
    finally:
        threading.setprofile(None)


def question_ids(model, question: str, add_special: bool = False):
    """The model's tokenizer and the ids of one user question rendered by the model's own chat template
    with the generation prompt (add_special: the tokenizer's BOS too)."""
    from engine.text.chat_template import ChatTemplate
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(model.metadata)
    tpl = ChatTemplate.from_metadata(model.metadata)
    ids = tok.encode(
        tpl.render([{"role": "user", "content": question}], add_generation_prompt=True),
        add_special=add_special,
        parse_special=True,
    )
    return tok, ids


def modules_loaded_by(module: str, packages: tuple[str, ...], then: str = "pass") -> list[str]:
    """The modules of `packages` that importing `module` (and running `then`) loads, in a fresh
    interpreter run from the repository root."""
    code = (
        f"import json, sys, {module}; {then}; "
        f"print(json.dumps([m for m in sys.modules if m.split('.')[0] in {packages!r}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=DATA.parents[1], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def golden_cases() -> list[dict]:
    return json.loads((GOLDEN_MODELS / "manifest.json").read_text())["cases"]


@pytest.fixture(scope="session", autouse=True)
def child_bytecode(tmp_path_factory) -> Iterator[None]:
    """The child processes the tests start (dataset readers, token counters, ranks, CLI runs) import
    the engine and the studio afresh; where the environment forbids bytecode files
    (PYTHONDONTWRITEBYTECODE, as on a clean CI checkout) each compiled every module again, about 0.5 s
    a process. There, their bytecode goes to one folder under the session's temporary root."""
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if not saved:
        yield
        return
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    try:
        yield
    finally:
        os.environ["PYTHONDONTWRITEBYTECODE"] = saved
        os.environ.pop("PYTHONPYCACHEPREFIX", None)


@pytest.fixture(autouse=True)
def app_data_folder(tmp_path_factory, monkeypatch) -> Path:
    """The app's data folder (runs homes, recovery) of each test: its own, under the test's tmp root,
    so that no test writes into the user's real data folder or sees another test's runs."""
    folder = tmp_path_factory.mktemp("app-data")
    monkeypatch.setenv("TUNE_STUDIO_DATA", str(folder))
    return folder


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="session")
def synth_model(synth_dir):
    """synth_model(arch, **spec_overrides) -> path of a tiny model written once per session."""
    from engine.testing import SynthSpec, write_model

    made: dict[tuple, str] = {}

    def make(arch: str, **overrides) -> str:
        key = (arch, tuple(sorted(overrides.items())))
        if key not in made:
            spec = SynthSpec.for_arch(arch, **overrides)
            name = "-".join([arch] + [f"{k}{v}" for k, v in sorted(overrides.items())]) + ".gguf"
            made[key] = write_model(synth_dir / name, spec)
        return made[key]

    return make


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def chats(tmp_path):
    """A JSONL file of 8 short chats (user question, assistant answer); modules may define their own."""
    return write_chats(
        tmp_path / "chats.jsonl", ((f"What is {i} plus {i}?", f"{i} plus {i} is {2 * i}.") for i in range(8))
    )


@pytest.fixture(scope="module")
def cuda():
    """The engine's CUDA backend on GPU 0; the test is skipped, saying why, where none can run."""
    from engine.backend import gpu_unavailable_reason, select_backend

    try:
        backend = select_backend("cuda:0")
    except Exception as exc:  # noqa: BLE001 - no CuPy, no driver, no GPU: say which
        pytest.skip(f"needs a usable CUDA GPU ({exc})")
    if gpu_unavailable_reason():
        pytest.skip(f"the GPU path cannot run here ({gpu_unavailable_reason()})")
    return backend
