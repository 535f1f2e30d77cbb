"""Export: adapter GGUFs as llama.cpp reads them, merged models, failures that change nothing, the CLI."""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

from engine.cli.tools import add_commands
from engine.errors import ExportError
from engine.export import write as export_mod
from engine.export.write import (
    MergeReport,
    adapter_tensor_types,
    export_adapter,
    export_merged,
    training_metadata,
)
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_write import LazyTensor, write_gguf
from engine.io.quantize import quantize
from engine.model.lora import LoraAdapter
from engine.model.model import Model
from engine.testing import SynthSpec, random_adapter, write_model
from tests.conftest import GOLDEN_MODELS

TOKENS = np.array([1, 280, 290, 270, 299, 7, 260, 265, 3, 300 - 2])


def _q8(x: np.ndarray) -> np.ndarray:
    """What Q8_0 storage gives back for x."""
    x = np.asarray(x, np.float32)
    return dequantize(quantize(x, "Q8_0"), GGMLQuantizationType.Q8_0).reshape(x.shape)


def _adapter(model: Model, targets, rank: int, alpha: float = 8.0, seed: int = 0) -> LoraAdapter:
    pairs = random_adapter(model, targets, rank=rank, seed=seed, std=0.1)
    return LoraAdapter(alpha, pairs, model.config.arch)


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _golden_logits(model: Model, adapter_path: Path, cases: str, scale: float = 1.0):
    """Yield (ours, llama.cpp's) logits for the three golden sequences, with the adapter at `scale`."""
    adapter = LoraAdapter.load(adapter_path, model)
    z = np.load(GOLDEN_MODELS / cases)
    for i in range(3):
        yield model.forward(z[f"tokens_{i}"], lora=adapter.terms(scale)), z[f"logits_{i}"]


# --- adapter export ---------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0"])
def test_adapter_round_trip_pairs_metadata_and_logits(qtype, synth_model, tmp_path):
    model = Model.load(synth_model("llama"))
    targets = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.1.ffn_down.weight", "output.weight"]
    adapter = _adapter(model, targets, rank=32)  # rows of 32: Q8_0 for every tensor
    path = export_adapter(adapter, tmp_path / "a.gguf", qtype=qtype)
    back = LoraAdapter.load(path, model)
    assert list(back.pairs) == sorted(targets) and back.alpha == 8.0
    for name, (A, B) in adapter.pairs.items():
        A2, B2 = back.pairs[name]
        if qtype == "F32":
            np.testing.assert_array_equal(A2, A)
            np.testing.assert_array_equal(B2, B)
        elif qtype == "F16":
            np.testing.assert_array_equal(A2, A.astype(np.float16).astype(np.float32))
            np.testing.assert_array_equal(B2, B.astype(np.float16).astype(np.float32))
        else:
            np.testing.assert_array_equal(A2, _q8(A))
            np.testing.assert_array_equal(B2, _q8(B))
    f = GGUFFile(path)
    assert {n: t.qtype for n, t in f.tensors.items()} == {
        n + s: qtype for n in targets for s in (".lora_a", ".lora_b")
    }
    assert f.metadata["general.type"] == "adapter" and f.metadata["adapter.type"] == "lora"
    assert f.metadata["general.architecture"] == "llama"
    assert f.metadata["adapter.lora.alpha"] == 8.0
    assert f.metadata_types["adapter.lora.alpha"] == (GGUFValueType.FLOAT32, None)
    assert f.metadata_types["general.type"] == (GGUFValueType.STRING, None)
    assert f.metadata_types["adapter.type"] == (GGUFValueType.STRING, None)
    assert not any(k.startswith("training.") for k in f.metadata)  # none given, none invented
    # ggml order as llama.cpp checks it: lora_a ne = [n_in, r], lora_b ne = [r, n_out]
    ref = {t.name: t for t in GGUFReader(path).tensors}
    assert ref["blk.1.ffn_down.weight.lora_a"].shape.tolist() == [128, 32]
    assert ref["blk.1.ffn_down.weight.lora_b"].shape.tolist() == [32, 64]
    assert ref["output.weight.lora_b"].tensor_type.name == qtype
    mine = model.forward(TOKENS, lora=adapter.terms())
    theirs = model.forward(TOKENS, lora=back.terms())
    if qtype == "F32":
        np.testing.assert_array_equal(theirs, mine)
    else:
        assert np.abs(theirs - mine).max() < {"F16": 2e-3, "Q8_0": 2e-2}[qtype]
        assert np.abs(mine - model.forward(TOKENS)).max() > 0.1  # the adapter matters at this size


def test_q8_0_writes_f16_for_rows_that_are_not_whole_blocks(synth_model, tmp_path, caplog):
    model = Model.load(synth_model("qwen3moe"))
    targets = ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight"]
    adapter = _adapter(model, targets, rank=4)
    plan = adapter_tensor_types(adapter, "Q8_0")
    # lora_a rows are n_in (64): Q8_0; lora_b rows are r (4): F16; token_embd A (V, r) and B (C, r): F16
    assert plan == {
        "token_embd.weight.lora_a": "F16",
        "token_embd.weight.lora_b": "F16",
        "blk.0.attn_q.weight.lora_a": "Q8_0",
        "blk.0.attn_q.weight.lora_b": "F16",
        "blk.1.ffn_up_exps.weight.lora_a": "Q8_0",
        "blk.1.ffn_up_exps.weight.lora_b": "F16",
    }
    with caplog.at_level(logging.WARNING, logger="engine.export.write"):
        path = export_adapter(adapter, tmp_path / "a.gguf", qtype="Q8_0")
    assert "blk.0.attn_q.weight.lora_b" in caplog.text and "F16" in caplog.text
    assert {n: t.qtype for n, t in GGUFFile(path).tensors.items()} == plan
    back = LoraAdapter.load(path, model)
    np.testing.assert_array_equal(
        back.pairs["blk.1.ffn_up_exps.weight"][0], _q8(adapter.pairs[targets[2]][0])
    )
    assert adapter_tensor_types(adapter, "F16") == dict.fromkeys(plan, "F16")


# The golden adapters with llama.cpp's logits for them: (model, adapter, cases file, scale).
GOLDEN_ADAPTERS = [
    ("llama.gguf", "llama.lora.gguf", "llama.lora.cases.npz", 1.0),
    ("llama.gguf", "llama.lora.gguf", "llama.lora.scale0.5.cases.npz", 0.5),
    ("qwen3moe.gguf", "qwen3moe.lora.gguf", "qwen3moe.lora.cases.npz", 1.0),
]


@pytest.mark.parametrize("model_file, adapter_file, cases, scale", GOLDEN_ADAPTERS)
def test_golden_adapter_exported_and_reloaded_reproduces_llama_cpp(
    model_file, adapter_file, cases, scale, tmp_path
):
    model = Model.load(GOLDEN_MODELS / model_file)
    original = LoraAdapter.load(GOLDEN_MODELS / adapter_file, model)
    # only the pairs, alpha and architecture: nothing carried from the golden file
    fresh = LoraAdapter(original.alpha, dict(original.pairs), original.arch)
    path = export_adapter(fresh, tmp_path / "a.gguf")
    if "qwen3moe" in model_file:
        kinds = {n.split(".", 2)[2] for n in fresh.pairs}
        assert {"ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"} <= kinds
    for ours, theirs in _golden_logits(model, path, cases, scale):
        assert np.abs(ours - theirs).max() <= 1e-4


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_expert_token_embd_and_router_adapter_round_trip(qtype, synth_model, tmp_path):
    model = Model.load(synth_model("qwen3moe"))
    targets = [
        "token_embd.weight",
        "blk.0.ffn_gate_inp.weight",
        "blk.0.ffn_gate_exps.weight",
        "blk.1.ffn_down_exps.weight",
        "blk.1.attn_v.weight",
    ]
    adapter = _adapter(model, targets, rank=32, alpha=16.0)
    path = export_adapter(adapter, tmp_path / "moe.gguf", qtype=qtype)
    back = LoraAdapter.load(path, model)
    assert back.pairs["blk.0.ffn_gate_exps.weight"][0].shape == (4, 32, 64)
    assert back.pairs["token_embd.weight"][0].shape == (300, 32)
    mine = model.forward(TOKENS, lora=adapter.terms(0.5))
    theirs = model.forward(TOKENS, lora=back.terms(0.5))
    if qtype == "F32":
        np.testing.assert_array_equal(theirs, mine)
    else:
        assert np.abs(theirs - mine).max() < 2e-2
    assert np.abs(mine - model.forward(TOKENS)).max() > 0.1


def test_training_facts_are_typed_keys(synth_model, tmp_path):
    model = Model.load(synth_model("llama"))
    adapter = _adapter(model, ["blk.0.attn_q.weight"], rank=2)
    training = {
        "rank": 2,
        "targets": ["blk.0.attn_q.weight"],
        "steps": np.int64(120),
        "final_loss": 1.2345678901234,
        "dataset_sha256": "ab" * 32,
        "base_model": Path("/models/base.gguf"),
        "learning_rate": 3e-4,
        "loss_curve": [2.5, 2.0, 1.5],
        "layers": [0, 1],
        "seed": -1,
        "resumed": False,
        "empty": [],
        "optimizer": {"name": "adamw", "betas": (0.9, 0.999)},
        "notes": None,
    }
    path = export_adapter(adapter, tmp_path / "a.gguf", training=training)
    f = GGUFFile(path)
    md, types = f.metadata, f.metadata_types
    expect = {
        "training.rank": (2, GGUFValueType.UINT32, None),
        "training.targets": (["blk.0.attn_q.weight"], GGUFValueType.ARRAY, GGUFValueType.STRING),
        "training.steps": (120, GGUFValueType.UINT32, None),
        "training.final_loss": (1.2345678901234, GGUFValueType.FLOAT64, None),
        "training.dataset_sha256": ("ab" * 32, GGUFValueType.STRING, None),
        "training.base_model": ("/models/base.gguf", GGUFValueType.STRING, None),
        "training.learning_rate": (3e-4, GGUFValueType.FLOAT64, None),
        "training.loss_curve": ([2.5, 2.0, 1.5], GGUFValueType.ARRAY, GGUFValueType.FLOAT64),
        "training.layers": ([0, 1], GGUFValueType.ARRAY, GGUFValueType.UINT32),
        "training.seed": (-1, GGUFValueType.INT32, None),
        "training.resumed": (False, GGUFValueType.BOOL, None),
        "training.empty": ([], GGUFValueType.ARRAY, GGUFValueType.STRING),
        "training.optimizer.name": ("adamw", GGUFValueType.STRING, None),
        "training.optimizer.betas": ([0.9, 0.999], GGUFValueType.ARRAY, GGUFValueType.FLOAT64),
        "training.tool": ("tune-studio", GGUFValueType.STRING, None),
    }
    got = {k: (md[k], *types[k]) for k in md if k.startswith("training.")}
    assert got == expect  # floats exact (FLOAT64), None left out
    # gguf-py reads the same file, empty array included
    fields = GGUFReader(path).fields
    assert fields["training.final_loss"].contents() == 1.2345678901234
    assert fields["training.empty"].contents() == []
    # an adapter read back keeps its training keys, with their types, when exported again
    again = export_adapter(LoraAdapter.load(path), tmp_path / "b.gguf", qtype="F16")
    g = GGUFFile(again)
    assert {k: g.metadata[k] for k in md if k.startswith("training.")} == {
        k: v for k, v in md.items() if k.startswith("training.")
    }
    assert {k: g.metadata_types[k] for k in md} == dict(types)


def test_training_values_that_cannot_be_stored_are_named():
    with pytest.raises(ExportError, match=r"training\.when.*datetime|training\.when"):
        import datetime

        training_metadata({"when": datetime.date(2024, 1, 1)})
    with pytest.raises(ExportError, match=r"training\.mixed.*one kind"):
        training_metadata({"mixed": [1, "a"]})
    values, _ = training_metadata({"training.tool": "other", "x": 1})
    assert values == {"training.tool": "other", "training.x": 1}


def test_carried_metadata_keeps_name_and_drops_stale_file_facts(tmp_path):
    golden = LoraAdapter.load(GOLDEN_MODELS / "llama.lora.gguf")
    golden.metadata["general.file_type"] = 0  # as convert_lora_to_gguf writes it
    golden.metadata["general.alignment"] = 64
    path = export_adapter(golden, tmp_path / "a.gguf", qtype="F16")
    f = GGUFFile(path)
    assert f.metadata["general.name"] == "tiny-lora"
    assert "general.file_type" not in f.metadata and "general.alignment" not in f.metadata


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: setattr(a, "arch", ""), "no architecture"),
        (lambda a: setattr(a, "pairs", {}), "no tensors"),
        (lambda a: setattr(a, "alpha", float("nan")), "alpha"),
        (
            lambda a: a.pairs.update({"blk.0.attn_q.weight": (np.zeros((3, 64)), np.zeros((64, 2)))}),
            r"blk\.0\.attn_q\.weight.*\(3, 64\).*\(64, 2\)",
        ),
        (
            lambda a: a.pairs["blk.0.attn_k.weight"][1].__setitem__((0, 0), np.inf),
            r"blk\.0\.attn_k\.weight\.b.*infinity",
        ),
    ],
)
def test_bad_adapter_is_export_error_and_target_untouched(change, message, synth_model, tmp_path):
    model = Model.load(synth_model("llama"))
    adapter = _adapter(model, ["blk.0.attn_q.weight", "blk.0.attn_k.weight"], rank=2)
    change(adapter)
    target = tmp_path / "a.gguf"
    target.write_bytes(b"precious")
    with pytest.raises(ExportError, match=message):
        export_adapter(adapter, target)
    assert target.read_bytes() == b"precious" and _files(tmp_path) == ["a.gguf"]


def test_bad_type_and_bad_targets_are_export_errors(synth_model, tmp_path, monkeypatch):
    model = Model.load(synth_model("llama"))
    adapter = _adapter(model, ["blk.0.attn_q.weight"], rank=2)
    target = tmp_path / "a.gguf"
    target.write_bytes(b"precious")
    with pytest.raises(ExportError, match=r"'Q4_0'.*F32, F16, Q8_0"):
        export_adapter(adapter, target, qtype="Q4_0")
    with pytest.raises(ExportError, match="does not exist"):
        export_adapter(adapter, tmp_path / "no" / "a.gguf")
    with pytest.raises(ExportError, match="is a folder"):
        export_adapter(adapter, tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ExportError, match=r"could not be written \(Permission denied\); no file was changed"):
        export_adapter(adapter, target)
    monkeypatch.undo()
    assert target.read_bytes() == b"precious" and _files(tmp_path) == ["a.gguf"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes to read-only folders")
def test_read_only_folder_is_export_error(synth_model, tmp_path):
    model = Model.load(synth_model("llama"))
    adapter = _adapter(model, ["blk.0.attn_q.weight"], rank=2)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ExportError, match="not writable"):
            export_adapter(adapter, folder / "a.gguf")
    finally:
        folder.chmod(0o755)


# --- writing raw, lazy and aligned tensors -----------------------------------------------------------


def test_write_gguf_takes_raw_bytes_lazy_tensors_and_alignment(tmp_path, rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    made = []

    def make():
        made.append(1)
        return x * 2

    tensors = {
        "raw": (quantize(x, "Q8_0"), "Q8_0"),  # bytes written as they are
        "lazy": (LazyTensor((3, 64), make), "Q4_0"),  # quantized when its turn comes
        "odd": (np.arange(5, dtype=np.float32), "F32"),  # 20 bytes: padding before the next tensor
        "lazy_raw": (LazyTensor((3, 64), lambda: quantize(x, "Q8_0")), "Q8_0"),
    }
    done = []
    p = write_gguf(
        tmp_path / "t.gguf",
        "llama",
        {"general.alignment": 64},
        tensors,
        on_tensor=lambda d, t: done.append(d),
    )
    assert made == [1] and done == [1, 2, 3, 4]
    f = GGUFFile(p)
    assert f.raw("raw").tobytes() == quantize(x, "Q8_0").tobytes() == f.raw("lazy_raw").tobytes()
    np.testing.assert_array_equal(
        f.load("lazy"), dequantize(quantize(2 * x, "Q4_0"), GGMLQuantizationType.Q4_0).reshape(3, 64)
    )
    np.testing.assert_array_equal(f.load("odd"), np.arange(5))
    ref = GGUFReader(p)  # gguf-py honours general.alignment too
    assert ref.alignment == 64 and all(t.data_offset % 64 == 0 for t in ref.tensors)
    bad = {"w": (LazyTensor((3, 64), lambda: np.zeros((3, 32), np.float32)), "F32")}
    with pytest.raises(ExportError, match="made shape"):
        write_gguf(tmp_path / "bad.gguf", "llama", {}, bad)
    with pytest.raises(ExportError, match="unknown ggml type 'Q9_9'"):
        write_gguf(tmp_path / "bad.gguf", "llama", {}, {"w": (x, "Q9_9")})
    with pytest.raises(ExportError, match="cannot quantize float values to IQ4_NL"):
        write_gguf(tmp_path / "bad.gguf", "llama", {}, {"w": (x, "IQ4_NL")})

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_gguf(tmp_path / "bad.gguf", "llama", {}, {"w": (LazyTensor((3, 64), interrupt), "F32")})
    assert _files(tmp_path) == ["t.gguf"]


# --- merged model -----------------------------------------------------------------------------------


def _every_target(model: Model) -> list[str]:
    return sorted(n for n, a in model.weights.items() if a.ndim >= 2)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3moe"])
def test_merged_f32_model_equals_runtime_adapter(arch, synth_model, tmp_path):
    base = synth_model(arch)
    model = Model.load(base, dtype=np.float64)
    adapter = _adapter(model, _every_target(model), rank=3, alpha=6.0, seed=1)
    calls = []
    report = export_merged(
        base, adapter, tmp_path / "m.gguf", scale=0.7, on_progress=lambda d, t: calls.append((d, t))
    )
    assert isinstance(report, MergeReport)
    src = GGUFFile(base)
    assert report.merged == tuple(n for n in src.tensors if n in adapter.pairs)
    assert report.type_changes == {} and report.n_tensors == len(src.tensors)
    assert calls == [(i, len(src.tensors)) for i in range(1, len(src.tensors) + 1)]
    merged = Model.load(report.path, dtype=np.float64)
    want = model.forward(TOKENS, lora=adapter.terms(0.7))
    got = merged.forward(TOKENS)
    assert np.abs(want - model.forward(TOKENS)).max() > 0.1
    assert np.abs(got - want).max() < 1e-5
    assert os.path.getsize(report.path) == report.n_bytes == os.path.getsize(base)


def _iq4_nl_bytes(rows: int, cols: int, rng) -> np.ndarray:
    """Valid IQ4_NL blocks (engine.io.quantize cannot write them): fp16 scale + 16 bytes of 4-bit indices."""
    blocks = np.zeros((rows, cols // 32, 18), np.uint8)
    blocks[..., :2] = np.float16(0.01).reshape(1).view(np.uint8)
    blocks[..., 2:] = rng.integers(0, 256, (rows, cols // 32, 16), dtype=np.uint8)
    return blocks.reshape(rows, cols // 32 * 18)


@pytest.fixture(scope="module")
def q8_base(tmp_path_factory) -> str:
    """A Q8_0 llama with general.file_type = MOSTLY_Q8_0 and one IQ4_NL tensor (not re-quantizable)."""
    spec = SynthSpec.for_arch("llama", qtype="Q8_0")
    folder = tmp_path_factory.mktemp("q8")
    plain = write_model(folder / "plain.gguf", spec, metadata={"general.file_type": 7})
    f = GGUFFile(plain)
    tensors = {n: (f.raw(n), t.qtype) for n, t in f.tensors.items()}
    tensors["blk.1.ffn_up.weight"] = (_iq4_nl_bytes(128, 64, np.random.default_rng(3)), "IQ4_NL")
    return write_gguf(folder / "q8.gguf", "llama", f.metadata, tensors, f.metadata_types)


def test_merged_quantized_base_writes_adapted_tensors_as_f16_by_default(q8_base, tmp_path):
    """The default keeps the update: adapted tensors of a quantized base become F16 (W + s·ΔW exactly,
    up to F16 rounding); every other tensor keeps its type, byte for byte."""
    model = Model.load(q8_base)
    targets = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.ffn_up.weight", "token_embd.weight"]
    adapter = _adapter(model, targets, rank=4)
    report = export_merged(q8_base, adapter, tmp_path / "m.gguf")
    src, out = GGUFFile(q8_base), GGUFFile(report.path)
    assert report.type_changes == {n: (src.tensors[n].qtype, "F16") for n in targets}
    for name, info in src.tensors.items():
        if name in adapter.pairs:
            assert out.tensors[name].qtype == "F16"
        else:
            assert out.tensors[name].qtype == info.qtype
            assert out.raw(name).tobytes() == src.raw(name).tobytes(), name
    A, B = adapter.pairs["blk.0.attn_q.weight"]
    w = src.load("blk.0.attn_q.weight") + np.float32(8.0 / 4) * (B @ A)
    np.testing.assert_array_equal(out.load("blk.0.attn_q.weight"), w.astype(np.float16).astype(np.float32))
    assert report.file_type_dropped and "general.file_type" not in out.metadata
    want = model.forward(TOKENS, lora=adapter.terms())
    assert np.abs(Model.load(report.path).forward(TOKENS) - want).max() < 5e-3 * np.abs(want).max()


def test_merged_f16_overflow_is_an_export_error(synth_model, tmp_path):
    base = synth_model("llama", qtype="Q8_0")
    model = Model.load(base)
    A = np.full((1, 64), 300.0, np.float32)
    B = np.full((64, 1), 300.0, np.float32)
    adapter = LoraAdapter(1.0, {"blk.0.attn_q.weight": (A, B)}, "llama")  # 9e4 > F16's 65504
    with pytest.raises(ExportError, match="beyond F16's range"):
        export_merged(base, adapter, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    assert model.tensors  # (the model file is untouched)


def test_merged_q8_0_model_copies_bytes_and_requantizes(q8_base, tmp_path):
    """qtype "base": each adapted tensor re-quantized to the base's own type (IQ4_NL cannot be written)."""
    model = Model.load(q8_base)
    targets = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.ffn_up.weight", "token_embd.weight"]
    adapter = _adapter(model, targets, rank=4)
    report = export_merged(q8_base, adapter, tmp_path / "m.gguf", qtype="base")
    src, out = GGUFFile(q8_base), GGUFFile(report.path)
    assert list(out.tensors) == list(src.tensors)
    assert report.type_changes == {"blk.1.ffn_up.weight": ("IQ4_NL", "F16")}
    for name, info in src.tensors.items():
        if name in adapter.pairs:
            assert out.tensors[name].qtype == ("F16" if name == "blk.1.ffn_up.weight" else "Q8_0")
            continue
        assert out.tensors[name].qtype == info.qtype
        assert out.raw(name).tobytes() == src.raw(name).tobytes(), name
    # adapted: exactly W (dequantized) + s·ΔW, quantized again
    A, B = adapter.pairs["blk.0.attn_q.weight"]
    w = src.load("blk.0.attn_q.weight") + np.float32(8.0 / 4) * (B @ A)
    np.testing.assert_array_equal(out.load("blk.0.attn_q.weight"), _q8(w))
    # a type changed, so the stale "mostly Q8_0" is dropped; nothing else in the metadata changes
    assert report.file_type_dropped and report.file_type is None
    assert "general.file_type" not in out.metadata
    rest = {k: v for k, v in src.metadata.items() if k != "general.file_type"}
    assert out.metadata == rest
    assert out.metadata_types == {k: v for k, v in src.metadata_types.items() if k != "general.file_type"}
    merged = Model.load(report.path)
    want = model.forward(TOKENS, lora=adapter.terms())
    assert np.abs(merged.forward(TOKENS) - want).max() < 0.1  # Q8_0 re-quantization of the sums


def test_merged_keeps_file_type_when_no_type_changes(q8_base, tmp_path):
    model = Model.load(q8_base)
    adapter = _adapter(model, ["blk.0.attn_v.weight"], rank=2)
    report = export_merged(q8_base, adapter, tmp_path / "m.gguf", qtype="base")
    out, src = GGUFFile(report.path), GGUFFile(q8_base)
    assert report.file_type == 7 and not report.file_type_dropped
    assert out.metadata == src.metadata and out.metadata_types == src.metadata_types
    assert out.metadata["tokenizer.ggml.tokens"] == src.metadata["tokenizer.ggml.tokens"]
    assert out.metadata["tokenizer.chat_template"] == src.metadata["tokenizer.chat_template"]


@pytest.mark.parametrize("qtype, written", [("F16", "F16"), ("Q4_K", "F16"), ("Q8_0", "Q8_0")])
def test_merged_with_requested_type(qtype, written, q8_base, tmp_path):
    model = Model.load(q8_base)
    adapter = _adapter(model, ["blk.0.attn_q.weight", "blk.1.attn_output.weight"], rank=2)
    report = export_merged(q8_base, adapter, tmp_path / "m.gguf", qtype=qtype)
    out = GGUFFile(report.path)
    assert {n: out.tensors[n].qtype for n in adapter.pairs} == dict.fromkeys(adapter.pairs, written)
    # Q4_K needs rows of 256; these are 64 long, so they fall back to F16 (and say so)
    expect = {} if written == "Q8_0" else dict.fromkeys(adapter.pairs, ("Q8_0", written))
    assert report.type_changes == expect
    assert report.file_type_dropped == bool(expect)


@pytest.mark.parametrize("model_file, adapter_file, cases, scale", GOLDEN_ADAPTERS)
def test_golden_merged_model_reproduces_llama_cpp_adapter_logits(
    model_file, adapter_file, cases, scale, tmp_path
):
    adapter = LoraAdapter.load(GOLDEN_MODELS / adapter_file)
    report = export_merged(GOLDEN_MODELS / model_file, adapter, tmp_path / "m.gguf", scale=scale)
    assert len(report.merged) == len(adapter.pairs) and report.file_type == 0
    src, out = GGUFFile(GOLDEN_MODELS / model_file), GGUFFile(report.path)
    assert out.metadata == src.metadata and out.metadata_types == src.metadata_types
    merged = Model.load(report.path)
    z = np.load(GOLDEN_MODELS / cases)
    for i in range(3):
        assert np.abs(merged.forward(z[f"tokens_{i}"]) - z[f"logits_{i}"]).max() <= 1e-4


def test_merged_with_replaced_tensors(q8_base, tmp_path):
    """Weights trained in full stand in for the base's; the adapter is added on top where both apply."""
    model = Model.load(q8_base)
    adapter = _adapter(model, ["blk.0.attn_q.weight"], rank=2)
    rng = np.random.default_rng(5)
    norm = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    q = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    replace = {"blk.0.attn_norm.weight": norm, "blk.0.attn_q.weight": q}
    report = export_merged(q8_base, adapter, tmp_path / "m.gguf", qtype="Q8_0", replace_tensors=replace)
    assert report.merged == ("blk.0.attn_q.weight",)
    assert set(report.replaced) == set(replace) and report.type_changes == {}
    out = GGUFFile(report.path)
    assert out.tensors["blk.0.attn_norm.weight"].qtype == "F32"  # a vector never becomes Q8_0
    np.testing.assert_array_equal(out.load("blk.0.attn_norm.weight"), norm)
    A, B = adapter.pairs["blk.0.attn_q.weight"]
    np.testing.assert_array_equal(out.load("blk.0.attn_q.weight"), _q8(q + np.float32(8.0 / 2) * (B @ A)))
    src = GGUFFile(q8_base)
    assert out.raw("blk.1.attn_norm.weight").tobytes() == src.raw("blk.1.attn_norm.weight").tobytes()
    with pytest.raises(ExportError, match="shape"):
        export_merged(q8_base, adapter, tmp_path / "x.gguf", replace_tensors={"blk.0.attn_norm.weight": q})
    with pytest.raises(ExportError, match="'blk.9.attn_norm.weight' does not exist"):
        export_merged(q8_base, adapter, tmp_path / "x.gguf", replace_tensors={"blk.9.attn_norm.weight": norm})
    assert not (tmp_path / "x.gguf").exists()


def test_merged_file_reads_with_gguf_py(q8_base, tmp_path):
    model = Model.load(q8_base)
    adapter = _adapter(model, ["blk.0.attn_q.weight"], rank=2)
    report = export_merged(q8_base, adapter, tmp_path / "m.gguf", qtype="base")
    ref = GGUFReader(report.path)
    src = GGUFFile(q8_base)
    assert [t.name for t in ref.tensors] == list(src.tensors)
    assert ref.fields["general.file_type"].contents() == 7
    assert len(ref.fields["tokenizer.ggml.tokens"].contents()) == 300


def _merge_failure(tmp_path, monkeypatch, base, adapter, **kwargs):
    target = tmp_path / "out" / "m.gguf"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(b"precious")
    with pytest.raises(ExportError) as err:
        export_merged(base, adapter, kwargs.pop("path", target), **kwargs)
    assert target.read_bytes() == b"precious" and _files(target.parent) == ["m.gguf"]
    return str(err.value)


def test_merge_failures_are_export_errors_and_change_nothing(synth_model, tmp_path, monkeypatch):
    base = synth_model("llama")
    model = Model.load(base)
    adapter = _adapter(model, ["blk.0.attn_q.weight", "blk.1.ffn_up.weight"], rank=2)
    fail = _merge_failure
    assert "'IQ2_XXS'" in fail(tmp_path, monkeypatch, base, adapter, qtype="IQ2_XXS")
    other = _adapter(Model.load(synth_model("qwen3")), ["blk.0.attn_q.weight"], rank=2)
    assert "architecture 'qwen3'" in fail(tmp_path, monkeypatch, base, other)
    missing = LoraAdapter(8.0, {"blk.7.attn_q.weight": adapter.pairs["blk.0.attn_q.weight"]}, "llama")
    assert "'blk.7.attn_q.weight' does not exist" in fail(tmp_path, monkeypatch, base, missing)
    A, B = adapter.pairs["blk.1.ffn_up.weight"]  # (128, 64): A (2, 64), B (128, 2)
    transposed = LoraAdapter(8.0, {"blk.1.ffn_up.weight": (B.T.copy(), A.T.copy())}, "llama")
    assert "do not fit the base shape" in fail(tmp_path, monkeypatch, base, transposed)
    nan_a = A.copy()
    nan_a[0, 0] = np.nan
    nan = LoraAdapter(8.0, {"blk.1.ffn_up.weight": (nan_a, B)}, "llama")
    assert "NaN" in fail(tmp_path, monkeypatch, base, nan)
    assert "no such file" in fail(tmp_path, monkeypatch, tmp_path / "none.gguf", adapter)
    assert "is an adapter" in fail(tmp_path, monkeypatch, GOLDEN_MODELS / "llama.lora.gguf", adapter)
    assert "does not exist" in fail(tmp_path, monkeypatch, base, adapter, path=tmp_path / "x" / "m.gguf")
    assert "is the base model" in fail(tmp_path, monkeypatch, base, adapter, path=base)
    # cancelled half-way: nothing written
    assert "cancelled" in fail(tmp_path, monkeypatch, base, adapter, should_stop=lambda: True)

    class Full:
        free = 1000

    monkeypatch.setattr(export_mod.shutil, "disk_usage", lambda folder: Full())
    assert "not enough disk space" in fail(tmp_path, monkeypatch, base, adapter)


# --- CLI --------------------------------------------------------------------------------------------


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tune-engine")
    add_commands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_export_adapter_in_another_type(tmp_path, capsys):
    out = tmp_path / "a.q8.gguf"
    lora = str(GOLDEN_MODELS / "llama.lora.gguf")
    assert _run(["export", lora, "--out", str(out), "--type", "q8_0"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: 14 adapted tensors (14 F16, 14 Q8_0)" in text
    assert "blk.1.ffn_up.weight.lora_b" in text  # listed as an F16 fallback
    f = GGUFFile(out)
    assert (
        f.metadata["general.name"] == "tiny-lora" and f.tensors["blk.0.attn_q.weight.lora_a"].qtype == "Q8_0"
    )
    model = Model.load(GOLDEN_MODELS / "llama.gguf")
    assert _run(["export", lora, "--out", str(tmp_path / "b.gguf"), "--model", str(model.path)]) == 0
    with pytest.raises(ExportError, match="does not fit"):
        _run(
            [
                "export",
                lora,
                "--out",
                str(tmp_path / "c.gguf"),
                "--model",
                str(GOLDEN_MODELS / "qwen3moe.gguf"),
            ]
        )
    with pytest.raises(ExportError, match="--merge only"):
        _run(["export", lora, "--out", str(tmp_path / "c.gguf"), "--scale", "0.5"])


def test_cli_export_merged(tmp_path, capsys):
    out = tmp_path / "merged.gguf"
    base = str(GOLDEN_MODELS / "llama.gguf")
    lora = str(GOLDEN_MODELS / "llama.lora.gguf")
    argv = ["export", lora, "--model", base, "--merge", "--out", str(out), "--scale", "0.5"]
    assert _run(argv) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: 21 tensors" in text and "merged 14 adapted tensors at scale 0.5" in text
    z = np.load(GOLDEN_MODELS / "llama.lora.scale0.5.cases.npz")
    assert np.abs(Model.load(out).forward(z["tokens_1"]) - z["logits_1"]).max() <= 1e-4
    assert _run([*argv[:-2], "--out", str(tmp_path / "f16.gguf"), "--type", "F16"]) == 0
    text = capsys.readouterr().out
    assert "blk.0.attn_q.weight: F32 -> F16" in text and "general.file_type dropped" in text
    with pytest.raises(ExportError, match="--merge needs the base model"):
        _run(["export", lora, "--merge", "--out", str(tmp_path / "x.gguf")])


def test_export_size_estimate_is_close_to_the_written_file(tmp_path):
    from engine import LoraAdapter, Model, SynthSpec, export_size, write_model
    from engine.io.gguf_file import GGUFFile
    from engine.testing import random_adapter

    base_path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("qwen3moe", qtype="Q8_0"))
    model = Model.load(base_path)
    names = [n for n in model.tensors if n.endswith(("attn_q.weight", "ffn_up_exps.weight"))]
    adapter = LoraAdapter(2.0, random_adapter(model, names, rank=4), "qwen3moe")
    for qtype in ("F32", "F16", "Q8_0"):
        size = os.path.getsize(export_adapter(adapter, tmp_path / f"a-{qtype}.gguf", qtype=qtype))
        # used for the free-space check: never well below the real size, at most a header's slack above
        assert 0.95 * size <= export_size(adapter, qtype=qtype) <= 1.1 * size + 8192
    merged = export_merged(base_path, adapter, tmp_path / "merged.gguf").path
    estimate = export_size(adapter, qtype=None, base=GGUFFile(base_path))
    assert abs(estimate - os.path.getsize(merged)) < 0.02 * os.path.getsize(merged)


# --- what a merge keeps of the fine-tune --------------------------------------------------------------


@pytest.fixture(scope="module")
def q4_small_update(tmp_path_factory):
    """A Q4_0 llama and an adapter whose update is far below a Q4 step (as a real LoRA's is)."""
    from engine.testing import random_adapter

    folder = tmp_path_factory.mktemp("q4")
    base = write_model(folder / "q4.gguf", SynthSpec.for_arch("llama", qtype="Q4_0"))
    model = Model.load(base)
    names = [n for n in model.tensors if n.endswith(("attn_q.weight", "attn_v.weight", "ffn_up.weight"))]
    adapter = LoraAdapter(8.0, random_adapter(model, names, rank=4, std=0.01, seed=1), "llama")
    return base, model, adapter


def _verify(base, model, adapter, out, qtype):
    from engine import ExportRequest, verify_export

    request = ExportRequest(source="", out=str(out), base=str(base), merge=True, qtype=qtype)
    return verify_export(request, adapter, str(out), base=model)


def test_default_merge_keeps_the_fine_tune_and_re_quantizing_is_measured(q4_small_update, tmp_path):
    """Re-quantized to Q4_0, the merged model's logits stay within Q4's tolerance of base + adapter and
    yet keep a few percent of what the adapter does: the effect measure fails it; the default keeps it."""
    from engine import quarantine

    base, model, adapter = q4_small_update
    kept = _verify(base, model, adapter, export_merged(base, adapter, tmp_path / "m.gguf").path, None)
    assert kept.ok and kept.written_type == "F16" and kept.effect_kept == pytest.approx(1.0, abs=0.02)
    assert f"It keeps {kept.effect_kept:.1%} of the fine-tune's effect on the logits." in kept.verdict()
    lost_path = export_merged(base, adapter, tmp_path / "q4.gguf", qtype="base").path
    lost = _verify(base, model, adapter, lost_path, "base")
    assert lost.rel < 0.2 and lost.n_off == 0  # the logits alone would pass Q4's tolerance
    assert lost.effect_kept < 0.2 and not lost.ok
    assert "lost the fine-tune" in lost.verdict() and "Q4_0" in lost.verdict()
    quarantine(lost)
    assert lost.failed_path == str(tmp_path / "q4.failed.gguf")
    assert not (tmp_path / "q4.gguf").exists() and (tmp_path / "q4.failed.gguf").exists()
    assert "renamed to q4.failed.gguf" in lost.verdict()
    assert quarantine(kept).failed_path is None and (tmp_path / "m.gguf").exists()


def test_cli_merge_verifies_by_default_and_a_failed_file_is_renamed(q4_small_update, tmp_path, capsys):
    from engine import export_adapter

    base, _model, adapter = q4_small_update
    lora = export_adapter(adapter, tmp_path / "a.gguf")
    out = tmp_path / "m.gguf"
    assert _run(["export", lora, "--model", base, "--merge", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "were written as F16 to keep the fine-tune" in text and "within F16 tolerance" in text
    assert f"run it: llama-cli -m {out}" in text
    bad = tmp_path / "requant.gguf"
    assert _run(["export", lora, "--model", base, "--merge", "--out", str(bad), "--type", "base"]) == 2
    captured = capsys.readouterr()
    assert "lost the fine-tune" in captured.err and "llama-cli" not in captured.out
    assert not bad.exists() and (tmp_path / "requant.failed.gguf").exists()
    no_check = tmp_path / "unchecked.gguf"
    argv = [
        "export",
        lora,
        "--model",
        base,
        "--merge",
        "--out",
        str(no_check),
        "--type",
        "base",
        "--no-verify",
    ]
    assert _run(argv) == 0 and no_check.exists()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the answer?\n\nhello world\n")
    argv = ["export", lora, "--model", base, "--merge", "--out", str(out), "--prompts", str(prompts)]
    assert _run(argv) == 0 and "on 2 prompts" in capsys.readouterr().out
