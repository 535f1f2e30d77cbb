"""The forward pass against Hugging Face transformers on architectures without llama.cpp golden data.

tests/data/hf_reference holds tiny random GGUF models written by engine.testing and the logits that
transformers' implementation of each architecture computes for the same weights (in float64); see
make_reference.py there for how they were made. Nothing here needs torch or transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.io.gguf_file import GGUFFile
from engine.model.model import Model

HF_REFERENCE = Path(__file__).resolve().parents[1] / "data" / "hf_reference"
TOLERANCE = 1e-4  # max |logit difference|; measured differences are about 1e-5 or less

EXPECTED_CASES = {"qwen2", "qwen3", "qwen2moe", "olmoe", "mixtral", "qwen3moe"}


def _manifest() -> dict:
    return json.loads((HF_REFERENCE / "manifest.json").read_text())


def _cases() -> list[dict]:
    return _manifest()["cases"]


def test_manifest_lists_every_case_with_its_files():
    cases = _cases()
    assert {c["case"] for c in cases} == EXPECTED_CASES
    for c in cases:
        assert (HF_REFERENCE / c["model_file"]).is_file(), c["model_file"]
        assert (HF_REFERENCE / c["cases_file"]).is_file(), c["cases_file"]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["case"])
def test_gguf_architecture_is_the_manifest_one(case):
    path = HF_REFERENCE / case["model_file"]
    assert GGUFFile(path).architecture == case["arch"]
    cfg = Model.load(path, dtype=np.float32).config
    assert cfg.arch == case["arch"]
    assert (cfg.E, cfg.K) == (case["spec"]["E"], case["spec"]["K"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["case"])
def test_logits_match_transformers(case, dtype):
    model = Model.load(HF_REFERENCE / case["model_file"], dtype=dtype)
    z = np.load(HF_REFERENCE / case["cases_file"])
    for i, length in enumerate(case["lengths"]):
        tokens = z[f"tokens_{i}"]
        assert tokens.shape == (length,) and tokens[0] == 1
        logits = model.forward(tokens)
        assert logits.dtype == dtype
        ref = z[f"logits_{i}"]
        assert logits.shape == ref.shape == (length, model.config.V)
        err = float(np.abs(logits.astype(np.float64) - ref).max())
        assert err <= TOLERANCE, (
            f"{case['case']} ({case['arch']} vs {case['hf_class']}) seq {i} (T={length}) "
            f"{np.dtype(dtype).name}: max |diff| {err:.3g} > {TOLERANCE:g}"
        )
