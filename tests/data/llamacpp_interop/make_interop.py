"""Writes the llama.cpp interop cases: models, adapters trained by Tune Studio, llama.cpp's logits.

For each case a tiny model is written, a LoRA adapter is trained on it by the engine (attention,
MLP, router and routed experts as the architecture has them) and exported, and llama.cpp
(llama-cpp-python, F32 KV cache, flash attention off) computes the logits with the adapter at
every position of three token sequences. tests/engine/test_llamacpp_interop.py checks that the
engine, after re-exporting the adapter, still computes the same logits. Run with an environment
that has llama-cpp-python:

    python tests/data/llamacpp_interop/make_interop.py              # every case
    python tests/data/llamacpp_interop/make_interop.py gemma3 ...   # these cases, the others kept
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from bench.llamacpp_check import llama_logits  # noqa: E402
from engine import SynthSpec, TargetSpec, TrainConfig, Trainer, write_model  # noqa: E402

CASES = {
    "qwen2": SynthSpec.for_arch("qwen2", seed=21),
    "qwen3moe": SynthSpec.for_arch("qwen3moe", seed=22),
    "olmoe": SynthSpec.for_arch("olmoe", seed=23),
    "deepseek": SynthSpec.for_arch("deepseek", seed=24),
    "deepseek2": SynthSpec.for_arch("deepseek2", seed=25),
    "gpt-oss": SynthSpec.for_arch("gpt-oss", seed=26),
    "gemma3": SynthSpec.for_arch("gemma3", seed=27),
}
# llama.cpp runs Gemma's GELU through an fp16 lookup table; the engine's float32 forward differs by
# up to this much there (tests/data/models-extra/README.md); every other case agrees within 1e-4
TOLERANCE = {"gemma3": 2e-3}
SEQUENCES = [[1], [1, 270, 280, 290, 271, 299, 262, 263], [1, *range(262, 290)]]


def main(names: list[str]) -> None:
    import llama_cpp

    path = os.path.join(HERE, "manifest.json")
    kept = []
    if names and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            kept = [c for c in json.load(f)["cases"] if c["case"] not in names]
    manifest = {"llama_cpp_python": llama_cpp.__version__, "cases": kept}
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "d.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for q, a in (("hello", "the quick brown fox"), ("what is water", "water is one of the people")):
                msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
                f.write(json.dumps({"messages": msgs}) + "\n")
        for name, spec in CASES.items():
            if names and name not in names:
                continue
            model = write_model(os.path.join(HERE, f"{name}.gguf"), spec)
            adapter = os.path.join(HERE, f"{name}.lora.gguf")
            cfg = TrainConfig(
                targets=TargetSpec(preset="all"),
                rank=4,
                alpha=8.0,
                lr=1e-2,
                steps=6,
                n_ctx=64,
                batch_size=2,
                out=adapter,
                seed=1,
            )
            Trainer(model, data, cfg).run()
            arrays = {}
            for i, seq in enumerate(SEQUENCES):
                arrays[f"tokens_{i}"] = np.array(seq, dtype=np.int32)
                arrays[f"logits_{i}"] = llama_logits(model, seq, adapter)
            np.savez(os.path.join(HERE, f"{name}.lora.cases.npz"), **arrays)
            manifest["cases"].append(
                {
                    "case": name,
                    "arch": spec.arch,
                    "model": f"{name}.gguf",
                    "adapter": f"{name}.lora.gguf",
                    "cases": f"{name}.lora.cases.npz",
                    "tolerance": TOLERANCE.get(name, 1e-4),
                }
            )
    order = list(CASES)
    manifest["cases"].sort(key=lambda c: order.index(c["case"]))
    with open(os.path.join(HERE, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
