"""Writes the bundled demo model, resources/demo/demo.gguf.

For now this is a small llama-architecture model with random weights (seeded, so the file is
reproducible) and the engine's synthetic SentencePiece vocabulary with ChatML tokens: enough to
open, inspect, tokenize and run every part of the pipeline, not to produce readable text. A model
trained from scratch on a generated corpus replaces it (issue: rewards, export and demo model).

    python resources/demo/make_demo.py
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from engine.synth import SynthSpec, write_model  # noqa: E402

DEMO_SPEC = SynthSpec.for_arch(
    "llama",
    V=320,
    C=128,
    L=4,
    NH=4,
    NKV=2,
    HS=32,
    F=256,
    qtype="F16",
    n_ctx=512,
    seed=2026,
    name="tune-studio-demo (random weights)",
)

if __name__ == "__main__":
    path = write_model(os.path.join(HERE, "demo.gguf"), DEMO_SPEC)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
