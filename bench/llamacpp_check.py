"""Interoperability check: llama.cpp loads adapters (and merged models) that Tune Studio trained.

Needs llama-cpp-python (not a project dependency: it compiles llama.cpp). For each architecture, a
tiny model is written, a LoRA adapter is trained on every kind of tensor (attention, MLP, experts,
router) with the engine and exported as F32 and F16; llama.cpp then loads the model with the
adapter (as `llama-cli --lora`), and its logits at every position are compared with the engine's.
The merged model is compared the same way. F32 KV cache, flash attention off (as the golden data).

    pip install llama-cpp-python numpy   # in any environment that also sees this repository
    python bench/llamacpp_check.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import (  # noqa: E402
    LoraAdapter,
    Model,
    SynthSpec,
    TargetSpec,
    TrainConfig,
    Trainer,
    export_adapter,
    export_merged,
    write_model,
)

CHATS = [("hello", "the quick brown fox"), ("what is water", "water is one of the people")]


def llama_logits(model_path: str, tokens: list[int], lora: str | None = None) -> np.ndarray:
    from llama_cpp import Llama

    kwargs = dict(
        model_path=model_path,
        n_ctx=64,
        logits_all=True,
        verbose=False,
        n_threads=2,
        type_k=0,
        type_v=0,
        flash_attn=False,
        n_batch=64,
    )
    if lora:
        kwargs["lora_path"] = lora
    llm = Llama(**kwargs)
    llm.eval(tokens)
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    if hasattr(llm, "close"):  # older llama-cpp-python has no close()
        llm.close()
    return out


def main() -> None:
    import llama_cpp

    print(f"llama-cpp-python {llama_cpp.__version__}")
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "d.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for q, a in CHATS:
                f.write(
                    json.dumps(
                        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                    )
                    + "\n"
                )
        cases = [
            (a, SynthSpec.for_arch(a, seed=5))
            for a in ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "olmoe")
        ]
        cases.append(("mixtral", SynthSpec.for_arch("llama", E=4, K=2, F=0, seed=5)))
        for arch, spec in cases:
            preset = "all"
            path = write_model(os.path.join(d, f"{arch}.gguf"), spec)
            out = os.path.join(d, f"{arch}.lora.gguf")
            cfg = TrainConfig(
                targets=TargetSpec(preset=preset), rank=8, lr=1e-2, steps=8, n_ctx=64, batch_size=2, out=out
            )
            result = Trainer(path, data, cfg).run()
            model = Model.load(path)
            tokens = [1, 270, 280, 290, 271, 300 - 1, 262, 263]
            adapter = LoraAdapter.load(out, model)
            ours = model.forward(np.array(tokens), lora=adapter.terms())
            base = model.forward(np.array(tokens))
            theirs = llama_logits(path, tokens, out)
            f16 = export_adapter(adapter, os.path.join(d, f"{arch}.f16.gguf"), qtype="F16")
            theirs16 = llama_logits(path, tokens, f16)
            ours16 = model.forward(np.array(tokens), lora=LoraAdapter.load(f16, model).terms())
            merged = export_merged(path, adapter, os.path.join(d, f"{arch}.merged.gguf")).path
            theirs_m = llama_logits(merged, tokens)
            moved = np.abs(ours - base).max()
            d32 = np.abs(theirs - ours).max()
            d16 = np.abs(theirs16 - ours16).max()
            dm = np.abs(theirs_m - ours).max()
            print(
                f"{arch:9s} {len(adapter.pairs)} tensors adapted, {result.step} steps, logits moved by "
                f"{moved:.2f}; llama.cpp vs engine max |diff|: F32 adapter {d32:.2e}, F16 adapter {d16:.2e}, "
                f"merged model {dm:.2e}"
            )


if __name__ == "__main__":
    main()
