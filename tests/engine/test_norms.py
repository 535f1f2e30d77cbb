"""LoRA norms: Gram-matrix norms against ΔW formed explicitly, ratios to the base, aggregates, the CLI."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from engine.cli.tools import add_commands
from engine.errors import ModelError
from engine.export.write import export_adapter
from engine.io.gguf_file import GGUFFile
from engine.model.lora import LoraAdapter, effective_scale
from engine.model.model import Model
from engine.testing import SynthSpec, random_adapter, write_model
from engine.train.norms import delta_norms_squared, kind_and_layer, lora_norms
from tests.conftest import GOLDEN_MODELS


def _brute_delta(name: str, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """ΔW / s formed explicitly, float64."""
    A, B = A.astype(np.float64), B.astype(np.float64)
    return A @ B.T if name == "token_embd.weight" else np.matmul(B, A)


def _fro(x: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(x, np.float64).ravel()))


def _brute_check(adapter: LoraAdapter, report, scale: float, rtol: float = 1e-10) -> None:
    assert [t.name for t in report.tensors] == list(adapter.pairs)
    for t in report.tensors:
        A, B = adapter.pairs[t.name]
        s = abs(effective_scale(adapter.alpha, B.shape[-1], scale))
        delta = s * _brute_delta(t.name, A, B)
        assert t.rank == B.shape[-1]
        assert t.norm_a == pytest.approx(_fro(A), rel=rtol)
        assert t.norm_b == pytest.approx(_fro(B), rel=rtol)
        assert t.norm_delta == pytest.approx(_fro(delta), rel=rtol)
        if delta.ndim == 3:
            assert t.per_expert_delta == pytest.approx([_fro(d) for d in delta], rel=rtol)
        else:
            assert t.per_expert_delta is None


def test_two_d_expert_and_token_embd_norms_equal_brute_force(rng):
    pairs = {
        "blk.0.attn_q.weight": (rng.standard_normal((5, 48)), rng.standard_normal((80, 5))),
        "blk.2.ffn_down_exps.weight": (rng.standard_normal((4, 3, 40)), rng.standard_normal((4, 24, 3))),
        "token_embd.weight": (rng.standard_normal((100, 6)), rng.standard_normal((32, 6))),
        "output.weight": (rng.standard_normal((2, 32)), np.zeros((100, 2))),  # B = 0: ΔW = 0
    }
    adapter = LoraAdapter(12.0, pairs, "llama")
    for scale in (1.0, 0.25, -2.0):
        report = lora_norms(adapter, scale=scale)
        _brute_check(adapter, report, scale)
        assert report.scale == scale and report.alpha == 12.0
    exps = lora_norms(adapter).tensors[1]
    assert len(exps.per_expert_delta) == 4
    assert exps.norm_delta == pytest.approx(float(np.sqrt(np.sum(np.square(exps.per_expert_delta)))))
    assert lora_norms(adapter).tensors[3].norm_delta == 0.0
    # alpha 0: s is the scale alone, as llama.cpp
    zero = LoraAdapter(0.0, {"blk.0.attn_q.weight": pairs["blk.0.attn_q.weight"]}, "llama")
    _brute_check(zero, lora_norms(zero, scale=0.5), 0.5)


def test_delta_is_never_formed():
    # ΔW would be 200000 x 200000 float64 (320 GB); the Gram matrices are 4 x 4
    A = np.ones((4, 200_000), np.float32)
    B = np.ones((200_000, 4), np.float32)
    sq = delta_norms_squared("blk.0.ffn_up.weight", A, B)
    assert float(sq) == pytest.approx((4.0**2) * 200_000 * 200_000)


def test_kind_and_layer():
    assert kind_and_layer("blk.12.ffn_up_exps.weight") == ("ffn_up_exps.weight", 12)
    assert kind_and_layer("token_embd.weight") == ("token_embd.weight", None)
    assert kind_and_layer("output.weight") == ("output.weight", None)


def test_ratio_to_the_base_and_aggregates(synth_model):
    base = synth_model("qwen3moe")
    model = Model.load(base)
    targets = [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.1.attn_q.weight",
        "blk.0.ffn_up_exps.weight",
        "blk.1.ffn_gate_inp.weight",
    ]
    adapter = LoraAdapter(8.0, random_adapter(model, targets, rank=4, seed=2), "qwen3moe")
    report = lora_norms(adapter, scale=0.5, base=base)
    _brute_check(adapter, report, 0.5)
    f = GGUFFile(base)
    by_name = {t.name: t for t in report.tensors}
    for name, t in by_name.items():
        w = f.load(name, np.float64)
        assert t.norm_w == pytest.approx(_fro(w), rel=1e-10)
        assert t.ratio == pytest.approx(t.norm_delta / _fro(w), rel=1e-10)
    # aggregates: sqrt of summed squares of ‖ΔW‖, mean of the ratios
    q = [by_name["blk.0.attn_q.weight"], by_name["blk.1.attn_q.weight"]]
    assert report.by_kind["attn_q.weight"] == pytest.approx(np.hypot(q[0].norm_delta, q[1].norm_delta))
    assert report.ratio_by_kind["attn_q.weight"] == pytest.approx((q[0].ratio + q[1].ratio) / 2)
    layer0 = [by_name["blk.0.attn_q.weight"], by_name["blk.0.ffn_up_exps.weight"]]
    assert report.by_layer[0] == pytest.approx(np.hypot(*(t.norm_delta for t in layer0)))
    assert report.ratio_by_layer[0] == pytest.approx(np.mean([t.ratio for t in layer0]))
    assert set(report.by_layer) == {0, 1}  # token_embd belongs to no layer
    assert report.by_kind["token_embd.weight"] == pytest.approx(by_name["token_embd.weight"].norm_delta)
    assert report.total_delta == pytest.approx(np.sqrt(sum(t.norm_delta**2 for t in report.tensors)))
    plain = lora_norms(adapter, scale=0.5)
    assert all(t.norm_w is None and t.ratio is None for t in plain.tensors)
    assert plain.ratio_by_kind == {} and plain.by_kind == report.by_kind


def test_ratio_with_a_quantized_base(tmp_path):
    path = write_model(tmp_path / "q.gguf", SynthSpec.for_arch("llama", qtype="Q8_0"))
    model = Model.load(path)
    adapter = LoraAdapter(4.0, random_adapter(model, ["blk.1.attn_v.weight"], rank=2), "llama")
    t = lora_norms(adapter, base=GGUFFile(path)).tensors[0]
    assert t.norm_w == pytest.approx(_fro(model.weights["blk.1.attn_v.weight"]), rel=1e-6)


@pytest.mark.parametrize("case", ["llama", "qwen3moe"])
def test_every_tensor_of_the_golden_adapters_is_reported(case):
    adapter = LoraAdapter.load(GOLDEN_MODELS / f"{case}.lora.gguf")
    report = lora_norms(adapter, base=GOLDEN_MODELS / f"{case}.gguf")
    assert [t.name for t in report.tensors] == sorted(adapter.pairs)
    assert all(t.rank == 4 and t.norm_delta > 0 and t.ratio > 0 for t in report.tensors)
    _brute_check(adapter, report, 1.0)
    if case == "qwen3moe":
        assert len(report.by_layer) == 3
        exps = [t for t in report.tensors if t.kind == "ffn_down_exps.weight"]
        assert exps and all(len(t.per_expert_delta) == 4 for t in exps)


@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_f16_and_q8_0_adapters(qtype, tmp_path):
    golden = LoraAdapter.load(GOLDEN_MODELS / "qwen3moe.lora.gguf")
    path = export_adapter(golden, tmp_path / "a.gguf", qtype=qtype)
    loaded = LoraAdapter.load(path)
    assert GGUFFile(path).tensors["blk.0.ffn_up_exps.weight.lora_a"].qtype == qtype
    report = lora_norms(loaded, base=GOLDEN_MODELS / "qwen3moe.gguf")
    _brute_check(loaded, report, 1.0)  # exact for the values the file holds
    ref = {t.name: t for t in lora_norms(golden).tensors}
    for t in report.tensors:
        assert t.norm_delta == pytest.approx(ref[t.name].norm_delta, rel=1e-2)


def test_adapter_for_another_base_is_model_error(synth_model):
    adapter = LoraAdapter.load(GOLDEN_MODELS / "llama.lora.gguf")
    with pytest.raises(ModelError, match="architecture 'llama'"):
        lora_norms(adapter, base=GOLDEN_MODELS / "qwen3moe.gguf")
    with pytest.raises(ModelError, match="does not fit"):
        lora_norms(adapter, base=synth_model("llama", F=96))  # same arch, another FFN width


# --- CLI --------------------------------------------------------------------------------------------


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tune-engine")
    add_commands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_norms_table(capsys):
    lora = str(GOLDEN_MODELS / "qwen3moe.lora.gguf")
    assert _run(["norms", lora, "--model", str(GOLDEN_MODELS / "qwen3moe.gguf")]) == 0
    out = capsys.readouterr().out
    report = lora_norms(LoraAdapter.load(lora), base=GOLDEN_MODELS / "qwen3moe.gguf")
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("tensor"))
    assert "rank" in header and "|dW|/|W|" in header
    for t in report.tensors:
        row = next(line for line in lines if line.startswith(t.name + " "))
        assert row.split()[1:] == [str(t.rank)] + [
            f"{v:.4g}" for v in (t.norm_a, t.norm_b, t.norm_delta, t.ratio)
        ]
    assert "by kind:" in out and "by layer:" in out and "4 experts" in out
    assert f"ffn_down_exps.weight  {report.by_kind['ffn_down_exps.weight']:>10.4g}" in out
    assert _run(["norms", lora, "--scale", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "scale 0.5" in out and "mean |dW|/|W|" not in out


def test_cli_norms_json(capsys):
    lora = str(GOLDEN_MODELS / "llama.lora.gguf")
    assert _run(["norms", lora, "--model", str(GOLDEN_MODELS / "llama.gguf"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    report = lora_norms(LoraAdapter.load(lora), base=GOLDEN_MODELS / "llama.gguf")
    assert [t["name"] for t in data["tensors"]] == [t.name for t in report.tensors]
    assert data["tensors"][0]["norm_delta"] == report.tensors[0].norm_delta
    assert data["by_layer"] == {str(k): v for k, v in report.by_layer.items()}
    assert data["ratio_by_kind"] == report.ratio_by_kind and data["alpha"] == 8.0
