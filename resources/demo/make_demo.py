"""Builds the bundled demo model, resources/demo/demo.gguf, from nothing.

1. A corpus of small facts and conversations is generated (resources/demo/corpus.py).
2. A byte-level BPE tokenizer is trained on it with the `tokenizers` library and stored in GGUF's
   "gpt2" tokenizer format with ChatML control tokens and a ChatML chat template.
3. A llama-architecture model (4 layers, 128 wide, about a million parameters) starts from random
   weights and is trained in full by Tune Studio's own engine (`Trainer` with every tensor trainable).
4. The trained weights are written as F16 (a little over 2 MB), and greedy answers to every fact of
   the world are checked; the share answered exactly is printed.

It takes several minutes on two CPU cores. The result is deterministic for a given seed.

    python resources/demo/make_demo.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from corpus import all_text_for_tokenizer, conversations, qa_pairs  # noqa: E402

from engine import (  # noqa: E402
    GREEDY,
    ChatTemplate,
    GGUFFile,
    Model,
    SamplingConfig,
    SynthSpec,
    TargetSpec,
    Tokenizer,
    TrainConfig,
    Trainer,
    generate,
    write_model,
)
from engine.io.gguf_write import write_gguf  # noqa: E402
from engine.testing import CHATML, random_weights  # noqa: E402

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SPEC = SynthSpec.for_arch(
    "llama",
    V=0,
    C=128,
    L=4,
    NH=4,
    NKV=2,
    HS=32,
    F=384,
    n_ctx=512,
    rope_base=10000.0,
    seed=2026,
    name="tune-studio-demo",
)


def train_tokenizer(vocab_size: int = 640) -> dict:
    """A byte-level BPE vocabulary (GGUF metadata keys) trained on every sentence of the corpus."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = all_text_for_tokenizer() + ["system", "user", "assistant", "\n"] * 20
    tok.train_from_iterator(texts, trainer)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.eot_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHATML,
    }


def initial_weights(spec: SynthSpec) -> dict[str, np.ndarray]:
    """GPT-2 style start: small embeddings, and the residual output projections scaled by 1/sqrt(2L)."""
    w = random_weights(spec)
    w["token_embd.weight"] *= 0.05
    for name in w:
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            w[name] *= 1.0 / np.sqrt(2 * spec.L)
        if name.endswith("norm.weight"):
            w[name][...] = 1.0
    return w


def answer(
    model: Model, tok: Tokenizer, tpl: ChatTemplate, question: str, lora=None, max_tokens: int = 32
) -> str:
    prompt = tok.encode(
        tpl.render([{"role": "user", "content": question}], add_generation_prompt=True),
        add_special=True,
        parse_special=True,
    )
    cfg = SamplingConfig(**{**GREEDY.__dict__, "max_new_tokens": max_tokens})
    [g] = generate(model, prompt, sampling=cfg, stop_ids=tok.eot_ids, lora=lora)
    return tok.decode(list(g.tokens)).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps of the from-scratch training")
    ap.add_argument("--out", default=os.path.join(HERE, "demo.gguf"))
    args = ap.parse_args()
    t0 = time.time()
    md = train_tokenizer()
    V = len(md["tokenizer.ggml.tokens"])
    spec = SynthSpec(**{**SPEC.__dict__, "V": V})
    with tempfile.TemporaryDirectory() as d:
        start = write_model(os.path.join(d, "init.gguf"), spec, weights=initial_weights(spec), metadata=md)
        data = os.path.join(d, "corpus.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for msgs in conversations(4000, seed=1):
                f.write(json.dumps({"messages": msgs}) + "\n")
        cfg = TrainConfig(
            targets=TargetSpec(preset="none"),
            full=("all",),
            lr=3e-3,
            schedule="cosine",
            warmup_steps=100,
            min_lr_ratio=0.05,
            steps=args.steps,
            n_ctx=128,
            batch_size=8,
            max_grad_norm=1.0,
            seed=0,
            norms_every=0,
            out=os.path.join(d, "trained.gguf"),
        )

        def on_event(e) -> None:
            name = type(e).__name__
            if name == "Step" and (e.step % 50 == 0 or e.step == 1):
                print(
                    f"step {e.step}/{e.total_steps} loss {e.mean_ce:.3f} lr {e.lr:.2e} "
                    f"{e.tokens_per_s:.0f} tok/s elapsed {e.elapsed_s:.0f}s",
                    flush=True,
                )
            elif name == "Failed":
                print("FAILED:", e.message, flush=True)
            elif name == "Started":
                print(
                    f"{e.plan.n_train} conversations, {e.plan.tokens_per_epoch} tokens per epoch, "
                    f"{e.plan.trainable_params} parameters",
                    flush=True,
                )

        result = Trainer(start, data, cfg).run(on_event)
        if type(result).__name__ != "Finished":
            raise SystemExit(1)
        trained = GGUFFile(result.merged_path)
        tensors = {
            n: (trained.load(n), "F16" if len(i.shape) >= 2 else "F32") for n, i in trained.tensors.items()
        }
        meta = {k: v for k, v in trained.metadata.items() if k != "general.file_type"}
        meta["general.name"] = "tune-studio-demo"
        meta["general.description"] = "Trained from scratch by Tune Studio on resources/demo/corpus.py"
        types = {k: v for k, v in trained.metadata_types.items() if k in meta}
        write_gguf(args.out, "llama", meta, tensors, types=types)
    model = Model.load(args.out)
    tok = Tokenizer.from_metadata(model.metadata)
    tpl = ChatTemplate.from_metadata(model.metadata)
    facts = qa_pairs(random.Random(123))
    right = sum(answer(model, tok, tpl, q) == a for q, a in facts)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) in {time.time() - t0:.0f} s")
    print(f"greedy answers exactly right: {right}/{len(facts)}")
    for q in ("What is the capital of France?", "What color is grass?", "What is 3 plus 4?", "Who are you?"):
        print(f"  {q} -> {answer(model, tok, tpl, q)}")


if __name__ == "__main__":
    main()
