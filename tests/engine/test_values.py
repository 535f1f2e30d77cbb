"""Every bad value is refused: each numeric option of every command against the one table the CLI
and the app share (engine.ranges), adapters and checkpoints holding NaN or infinity refused at load
naming the tensor, non-finite logits never leaving `logits` or `generate`, and tensor type codes
the engine does not know (or that do not match the stored bytes) refused naming tensor and code."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from bench.fuzz import header_map
from bench.fuzz_cli import numeric_options, run_cli
from engine.errors import ConfigError, ModelError
from engine.io.gguf_file import KNOWN_TYPES, GGUFFile, dequantizable_types
from engine.model.generate import SamplingConfig
from engine.model.lora import LoraAdapter
from engine.model.model import Model
from engine.ranges import RANGES, check_number
from engine.session import EngineSession
from engine.testing import SynthSpec, random_adapter, write_adapter, write_model
from engine.train.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from engine.train.ratings import RewardError
from engine.train.reward_session import RewardConfig
from engine.train.trainer import TrainConfig

pytestmark = pytest.mark.timeout(60)

SPEC = SynthSpec.for_arch("llama", V=300, C=32, NH=2, NKV=1, HS=16, F=64, n_ctx=64)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return write_model(tmp_path_factory.mktemp("m") / "model.gguf", SPEC)


@pytest.fixture(scope="module")
def pairs(model):
    return random_adapter(Model.load(model), ["blk.0.attn_q.weight", "blk.1.attn_v.weight"], rank=2, seed=3)


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _error_line(argv: list[str]) -> str:
    rc, out, err = run_cli(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and lines, (rc, out, err)
    assert "Traceback" not in err and "bug in Tune Studio" not in err, err
    return lines[-1]


# --- values ----------------------------------------------------------------------------------------


def test_every_numeric_option_of_every_command_is_in_the_shared_table():
    found = numeric_options()
    assert set(found) >= {"logits", "generate", "train", "norms", "export", "reward"}
    names = {table for options in found.values() for _, table in options}
    assert names <= set(RANGES)
    assert ("--lora-scale", "adapter_scale") in found["logits"] and ("--kl", "kl_coef") in found["reward"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "1000"])
def test_logits_refuses_a_non_finite_or_out_of_range_adapter_scale(model, tmp_path, value):
    out = tmp_path / "l.npy"
    line = _error_line(["logits", model, "--tokens", "1 2", f"--lora-scale={value}", "--out", str(out)])
    assert line.startswith("error: --lora-scale must be") and "[-100, 100]" in line
    assert not out.exists()


def test_every_numeric_option_refuses_nan_naming_it(model, pairs, tmp_path):
    adapter = write_adapter(tmp_path / "a.gguf", "llama", pairs, alpha=4.0)
    (tmp_path / "d.jsonl").write_text('{"text": "hello world"}\n', encoding="utf-8")
    (tmp_path / "p.txt").write_text("hi\n", encoding="utf-8")
    base = {
        "logits": [model, "--tokens", "1", "--out", str(tmp_path / "l.npy")],
        "generate": [model, "--prompt", "hi"],
        "train": [model, str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o.gguf")],
        "norms": [adapter],
        "export": [adapter, "--out", str(tmp_path / "x.gguf")],
        "reward": [
            model,
            "--prompts",
            str(tmp_path / "p.txt"),
            "--ratings",
            str(tmp_path / "r.jsonl"),
            "--out",
            str(tmp_path / "r.gguf"),
        ],
    }
    for command, options in numeric_options().items():
        for option, table in options:
            value = "nan" if not RANGES[table].integer else str(int(RANGES[table].hi) + 1)
            line = _error_line([command, *base[command], option, value])
            assert line.startswith(f"error: {option} must be"), (command, option, line)


def test_the_configurations_share_the_table(tmp_path):
    with pytest.raises(ConfigError, match=r"lr must be in \(0, 10\], got 11"):
        TrainConfig(lr=11)
    with pytest.raises(ConfigError, match=r"sampling setting top_p must be a finite number in \(0, 1\]"):
        SamplingConfig(top_p=math.nan)
    with pytest.raises(RewardError, match=r"temperature must be a finite number in \[0, 100\]"):
        RewardConfig(temperature=math.inf)
    with pytest.raises(ConfigError, match="n_ctx must be in 2..1048576, got 1"):
        TrainConfig(n_ctx=1)  # a window holds a prompt token and one to learn (it crashed later before)
    assert check_number("adapter_scale", -2.5) == -2.5


# --- adapters, checkpoints and logits --------------------------------------------------------------


@pytest.mark.parametrize(("qtype", "poison"), [("F32", math.nan), ("F32", math.inf), ("F16", -math.inf)])
def test_an_adapter_holding_non_finite_values_is_refused_at_load_naming_the_tensor(
    model, pairs, tmp_path, qtype, poison
):
    bad = {n: (a.copy(), b.copy()) for n, (a, b) in pairs.items()}
    bad["blk.1.attn_v.weight"][1][3, 1] = poison
    path = write_adapter(tmp_path / "bad.gguf", "llama", bad, alpha=4.0, qtype=qtype)
    with pytest.raises(ModelError, match=r"tensor 'blk\.1\.attn_v\.weight\.lora_b' holds 1 non-finite value"):
        LoraAdapter.load(path)
    out = tmp_path / "l.npy"
    line = _error_line(["logits", model, "--tokens", "1 2 3", "--lora", path, "--out", str(out)])
    assert "blk.1.attn_v.weight.lora_b" in line and not out.exists()  # exit 0 and all-NaN logits before
    assert "non-finite" in _error_line(["generate", model, "--prompt", "hi", "-n", "2", "--lora", path])


def test_a_non_finite_alpha_is_refused(pairs, tmp_path):
    path = write_adapter(tmp_path / "a.gguf", "llama", pairs, alpha=math.nan)
    with pytest.raises(ModelError, match="adapter.lora.alpha is nan; expected a finite number"):
        LoraAdapter.load(path)


def test_a_checkpoint_holding_a_nan_is_refused_naming_the_array(tmp_path):
    params = {"blk.0.attn_q.weight.lora_a": np.ones((2, 4), np.float32)}
    optim = {"m.blk.0.attn_q.weight.lora_a": np.zeros((2, 4), np.float32), "step": np.asarray(3)}
    path = write_checkpoint(
        str(tmp_path), 3, params=params, optimizer=optim, meta={"step": 3}, meta_file="m.json"
    )
    read_checkpoint(path, "m.json")
    optim["m.blk.0.attn_q.weight.lora_a"][1, 2] = np.inf
    path = write_checkpoint(
        str(tmp_path), 4, params=params, optimizer=optim, meta={"step": 4}, meta_file="m.json"
    )
    with pytest.raises(
        CheckpointError, match=r"optim\.m\.blk\.0\.attn_q\.weight\.lora_a holds 1 non-finite value"
    ):
        read_checkpoint(path, "m.json")


def test_train_resume_refuses_a_poisoned_checkpoint(model, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"hello world {i}"}) + "\n" for i in range(4)), encoding="utf-8"
    )
    argv = [
        "train",
        model,
        str(data),
        "--out",
        str(tmp_path / "a.gguf"),
        "--steps",
        "2",
        "--ctx",
        "16",
        "--rank",
        "2",
        "--checkpoint-every",
        "1",
    ]
    assert run_cli(argv)[0] == 0
    ckpt = tmp_path / "a.checkpoints" / "ckpt-000001"  # step 1 of 2: resuming it has a step to take
    state = dict(np.load(ckpt / "state.npz"))
    key = next(k for k in state if k.startswith("param."))
    state[key].reshape(-1)[0] = np.nan
    np.savez(ckpt / "state.npz", **state)
    record = (tmp_path / "a.checkpoints" / "run.json").read_bytes()
    # the run as it was (its own settings, to its planned step), from the poisoned checkpoint
    line = _error_line(["train", model, str(data), "--resume", str(ckpt), "--out", str(tmp_path / "b.gguf")])
    assert key in line and "non-finite" in line
    assert (tmp_path / "a.checkpoints" / "run.json").read_bytes() == record  # the finished run stays finished


def test_logits_and_generate_never_hand_out_non_finite_logits(model, pairs, tmp_path):
    huge = {n: (a * 0 + 1e30, b * 0 + 1e30) for n, (a, b) in pairs.items()}  # finite, and overflows float32
    path = write_adapter(tmp_path / "huge.gguf", "llama", huge, alpha=4.0)
    session = EngineSession(model)
    with np.errstate(over="ignore", invalid="ignore"):  # the overflow is the point
        with pytest.raises(ModelError, match="non-finite values .* overflow float32"):
            session.logits([1, 2, 3], adapter=path)
        with pytest.raises(ModelError, match="the logits of generated token 1 hold"):
            session.generate("hi", adapter=path)
        out = tmp_path / "l.npy"
        line = _error_line(["logits", model, "--tokens", "1 2", "--lora", path, "--out", str(out)])
    assert "non-finite" in line and not out.exists()
    assert np.isfinite(session.logits([1, 2, 3])).all()  # the base model alone is fine


# --- tensor type codes -----------------------------------------------------------------------------


def test_the_known_type_codes_have_ggml_block_sizes():
    for code, (name, block, size) in KNOWN_TYPES.items():
        t = GGMLQuantizationType(code)
        assert t.name == name and GGML_QUANT_SIZES[t] == (block, size), name
    assert dequantizable_types() <= {name for name, _, _ in KNOWN_TYPES.values()}


def _retyped(model: str, tmp_path: Path, tensor: str, code: int) -> str:
    data = bytearray(Path(model).read_bytes())
    fields, _ = header_map(bytes(data))
    f = next(f for f in fields if f.kind == "ttype" and f.name == tensor)
    data[f.offset : f.offset + 4] = struct.pack("<I", code)
    out = tmp_path / f"t{code}.gguf"
    out.write_bytes(bytes(data))
    return str(out)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (2, "starts at data offset"),  # Q4_0: a known code of another size, the F32 bytes read as it
        (26, "type code 26 is I32, integers, not weights"),
        (31, "type code 31 is Q4_0_4_4, removed from ggml"),
        (99, "type code 99 is not a ggml type this engine knows"),
    ],
)
@pytest.mark.parametrize("command", ["logits", "generate", "train"])
def test_a_type_code_the_engine_does_not_know_or_of_another_size_is_refused(
    model, tmp_path, code, words, command
):
    path = _retyped(model, tmp_path, "blk.0.attn_q.weight", code)
    before = _digest(path)
    (tmp_path / "d.jsonl").write_text('{"text": "hello world"}\n', encoding="utf-8")
    argv = {
        "logits": ["logits", path, "--tokens", "1 2", "--out", str(tmp_path / "l.npy")],
        "generate": ["generate", path, "--prompt", "hi", "-n", "2"],
        "train": [
            "train",
            path,
            str(tmp_path / "d.jsonl"),
            "--out",
            str(tmp_path / "a.gguf"),
            "--steps",
            "1",
        ],
    }[command]
    line = _error_line(argv)
    assert words in line and ("blk.0.attn_q.weight" in line or "blk.0.attn_k.weight" in line), line
    assert _digest(path) == before


def test_the_last_tensor_retyped_is_caught_by_the_bytes_after_it(model, tmp_path):
    last = list(GGUFFile(model).tensors)[-1]
    path = _retyped(model, tmp_path, last, 8)  # Q8_0: 34 bytes per 32 values instead of 128
    with pytest.raises(ModelError, match=f"after the data of its last tensor '{last}'"):
        GGUFFile(path)
