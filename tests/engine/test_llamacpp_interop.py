"""Adapters trained and exported by Tune Studio compute, in the engine, the logits llama.cpp computed
for them (tests/data/llamacpp_interop, made with llama-cpp-python by make_interop.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine import LoraAdapter, Model, export_adapter
from tests.conftest import DATA

HERE = DATA / "llamacpp_interop"
CASES = json.loads((HERE / "manifest.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["case"])
def test_reexported_adapter_matches_llama_cpp(case, tmp_path):
    model = Model.load(HERE / case["model"])
    stored = LoraAdapter.load(HERE / case["adapter"], model)
    assert stored.metadata.get("training.tool") == "tune-studio"
    again = LoraAdapter.load(export_adapter(stored, tmp_path / "a.gguf"), model)
    z = np.load(HERE / case["cases"])
    for i in range(3):
        ours = model.forward(z[f"tokens_{i}"], lora=again.terms())
        err = np.abs(ours - z[f"logits_{i}"]).max()
        tol = case.get("tolerance", 1e-4)
        assert err < tol, f"{case['case']} sequence {i}: max |engine - llama.cpp| = {err:.2e}"
        base = model.forward(z[f"tokens_{i}"])
        assert np.abs(base - z[f"logits_{i}"]).max() > 0.05, "the adapter must matter in llama.cpp's logits"
