"""Regenerate the Hugging Face transformers reference cases in this folder.

For each case a tiny model with random weights is made with our own generator
(`engine.testing`), written as `<case>.gguf`, and the same weights are loaded (strict)
into the transformers implementation of the architecture; the logits that
transformers computes for three token sequences are saved as `<case>.npz`
(`tokens_i` int32, `logits_i` float64 for i = 0..2), and `manifest.json` describes
every case. `tests/engine/test_hf_reference.py` compares `engine.model.model` against them.

This is an independent reference for architectures without llama.cpp golden data:
the GGUF side is only our writer, the computation side is transformers' modeling code.
It needs torch and transformers, which the project itself does not depend on:

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers numpy gguf
    /tmp/hfvenv/bin/python tests/data/hf_reference/make_reference.py

The model runs in float64 (`.double()`), with SDPA attention and the eager per-expert
loop, so that matmuls and the attention softmax are float64. transformers' modeling code
still computes some steps in float32 whatever the model dtype (RMSNorm, the RoPE angles,
the router softmax), which limits the reference to about 1e-6 relative (1e-5 absolute on
the qwen2 case, whose tied logits reach 60); the test tolerance is 1e-4. The manifest also
records how far transformers' own float32 run is from its float64 run.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from bench.hf_peer import build_hf_model  # noqa: E402
from engine.testing import SynthSpec, random_weights, write_model  # noqa: E402

LENGTHS = (1, 9, 20)
BOS = 1


@dataclass
class Case:
    name: str
    arch: str  # GGUF general.architecture
    hf_class: str  # transformers *ForCausalLM class
    spec_overrides: dict = field(default_factory=dict)
    seed: int = 0
    what: str = ""


CASES = [
    Case(
        "qwen2",
        "qwen2",
        "Qwen2ForCausalLM",
        seed=11,
        what="q/k/v biases, tied output = token_embd, NEOX RoPE base 1e6",
    ),
    Case(
        "qwen3",
        "qwen3",
        "Qwen3ForCausalLM",
        seed=12,
        what="per-head q/k RMSNorm, head_dim 32 (NH*HS != C), NEOX RoPE base 1e6",
    ),
    Case(
        "qwen2moe",
        "qwen2moe",
        "Qwen2MoeForCausalLM",
        seed=13,
        what="q/k/v biases, 4 experts top-2 without renormalisation, "
        "shared expert scaled by sigmoid(h . ffn_gate_inp_shexp)",
    ),
    Case(
        "olmoe",
        "olmoe",
        "OlmoeForCausalLM",
        seed=14,
        what="q/k RMSNorm over the whole projection, 4 experts top-2 without renormalisation",
    ),
    Case(
        "mixtral",
        "llama",
        "MixtralForCausalLM",
        dict(E=4, K=2, F=0),
        seed=15,
        what="llama with experts (Mixtral): adjacent-pair RoPE, 4 experts top-2 renormalised",
    ),
    Case(
        "qwen3moe",
        "qwen3moe",
        "Qwen3MoeForCausalLM",
        seed=16,
        what="sanity check of the method (llama.cpp golden data exists): per-head q/k norm, "
        "renormalised top-2",
    ),
]


@torch.no_grad()
def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    ids = torch.from_numpy(tokens.astype(np.int64))[None]
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0].double().numpy()


def token_sequences(V: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[BOS], rng.integers(3, V, n - 1)]).astype(np.int32) for n in LENGTHS]


# --- main -------------------------------------------------------------------------------------------


def make_case(case: Case) -> dict:
    spec = SynthSpec.for_arch(
        case.arch, seed=case.seed, name=f"hf-reference-{case.name}", **case.spec_overrides
    )
    weights = random_weights(spec)
    gguf_path = HERE / f"{case.name}.gguf"
    write_model(gguf_path, spec, weights)
    gguf_path.chmod(0o644)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}  # exactly the F32 values in the file
    model64 = build_hf_model(case.arch, case.hf_class, spec, w64, torch.float64)
    model32 = build_hf_model(case.arch, case.hf_class, spec, w64, torch.float32)
    seqs = token_sequences(spec.V, 1000 + case.seed)
    arrays, max_abs, f32_vs_f64 = {}, 0.0, 0.0
    for i, toks in enumerate(seqs):
        lg = hf_logits(model64, toks)
        arrays[f"tokens_{i}"] = toks
        arrays[f"logits_{i}"] = lg
        max_abs = max(max_abs, float(np.abs(lg).max()))
        f32_vs_f64 = max(f32_vs_f64, float(np.abs(hf_logits(model32, toks) - lg).max()))
    np.savez_compressed(HERE / f"{case.name}.npz", **arrays)
    return {
        "case": case.name,
        "arch": case.arch,
        "hf_class": case.hf_class,
        "what": case.what,
        "model_file": gguf_path.name,
        "cases_file": f"{case.name}.npz",
        "spec": {k: v for k, v in asdict(spec).items() if k != "name"},
        "lengths": [len(s) for s in seqs],
        "torch_dtype": "float64",
        "attn_implementation": "sdpa",
        "experts_implementation": "eager" if spec.E else None,
        "max_abs_logit": max_abs,
        "hf_float32_vs_float64_max_abs_diff": f32_vs_f64,
        "gguf_bytes": gguf_path.stat().st_size,
    }


def main() -> None:
    entries = [make_case(c) for c in CASES]
    manifest = {
        "description": "Hugging Face transformers logits for tiny random GGUF models (engine.testing)",
        "generator": "tests/data/hf_reference/make_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "tolerance_max_abs": 1e-4,
        "cases": entries,
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for e in entries:
        print(
            f"{e['case']:10s} {e['arch']:9s} {e['hf_class']:22s} max|logit| {e['max_abs_logit']:.3f} "
            f"hf f32-f64 {e['hf_float32_vs_float64_max_abs_diff']:.2e} {e['gguf_bytes']} bytes"
        )


if __name__ == "__main__":
    main()
