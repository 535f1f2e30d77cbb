"""Dataset preparation: time and peak memory for generated chat datasets, first run and cached.

Writes chat datasets of 10k, 100k and 1M samples (one user and one assistant turn each, about
570 bytes a line, as the issue's measurement), then prepares each the way a training run does
(`engine.train.prepared.prepare_data`: read, render, tokenize, mask, write the memory-mapped
token files) in a fresh process, twice: the first run with an empty cache, then again from the
cache. Each line says the seconds, the peak resident memory above what the process held before
preparing (model and tokenizer loaded), the samples and tokens per second, and how the time
split between the main thread and the tokenizer's threads. The reference path (the old
`load_jsonl` + `encode_samples_ref`, everything in memory) is timed beside it on the smallest
size. Prints figures; never passes or fails.

    python bench/data.py                                  # golden tiny llama (ChatML), 10k/100k/1M
    python bench/data.py --sizes 10000,100000             # fewer sizes
    python bench/data.py --model tests/data/vocab/ggml-vocab-llama-bpe.gguf   # a real vocabulary
    python bench/data.py --n-ctx 256 --keep /tmp/bench-data   # keep the generated files

The tiny llama's vocabulary has 379 tokens (about one token per character), so its samples are
~450 tokens where a real vocabulary makes ~130: tokenization is the larger part of the time, and
what the `tokenizers` library does on its threads is outside this project's hands.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import proc_status_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY_LLAMA = ROOT / "tests" / "data" / "models" / "llama.gguf"
WORDS = (
    "the model learns from data and each step updates weights gradient loss token sample attention "
    "layer matrix vector training adapter rank alpha prompt answer question reason because therefore "
    "which while during between value number result example simple"
).split()


def write_chats(path: Path, n: int, seed: int = 0) -> None:
    """n chat samples: a numbered question of 1-3 sentences, an answer of 2-6 (about 570 bytes)."""
    rng = random.Random(seed)

    def sentence(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."

    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            question = f"Question {i}: " + " ".join(
                sentence(rng.randint(6, 14)) for _ in range(rng.randint(1, 3))
            )
            answer = " ".join(sentence(rng.randint(8, 16)) for _ in range(rng.randint(2, 6)))
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": messages}) + "\n")


def _peak() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def child(args: argparse.Namespace) -> int:
    """One measurement in this process: prepare `args.data`; print a JSON line of figures."""
    import threading

    from engine import Tokenizer
    from engine.model.model import Model
    from engine.text.chat_template import template_for
    from engine.train.encode import EncodeOptions

    model = Model.load(args.model, cache_budget=0) if args.load_model else None
    md = model.metadata if model is not None else __import__("engine").GGUFFile(args.model).metadata
    tokenizer = Tokenizer.from_metadata(md, args.model)
    template = template_for(md, None)
    options = EncodeOptions(args.n_ctx)
    tokenizer.fingerprint  # noqa: B018 - computed once per tokenizer, not part of the data's time
    base = proc_status_bytes("VmRSS")
    cpu, main_cpu, t = time.process_time(), time.thread_time(), time.perf_counter()
    if args.reference:
        from engine.train.data import load_jsonl
        from engine.train.encode import encode_samples_ref

        samples, problems = load_jsonl(args.data)
        encoded, more = encode_samples_ref(samples, tokenizer, template, options)
        n, tokens, reused = len(samples), sum(len(e.tokens) for e in encoded), False
    else:
        from engine.train.prepared import prepare_data

        data = prepare_data(args.data, tokenizer, template, options, cache=args.cache)
        n, tokens, reused = len(data), len(data.tokens), data.reused
    seconds = time.perf_counter() - t
    figures = {
        "seconds": seconds,
        "cpu": time.process_time() - cpu,
        "main_cpu": time.thread_time() - main_cpu,
        "peak_above": max(0, _peak() - base),
        "base": base,
        "samples": n,
        "tokens": tokens,
        "reused": reused,
        "threads": threading.active_count(),
    }
    print(json.dumps(figures), flush=True)
    return 0


def run(data: Path, model: str, n_ctx: int, cache: Path | None, reference: bool, load_model: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--data", str(data), "--model", model, "--n-ctx", str(n_ctx)]
    if cache is not None:
        cmd += ["--cache", str(cache)]
    if reference:
        cmd.append("--reference")
    if load_model:
        cmd.append("--load-model")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"the measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(what: str, r: dict) -> str:
    per_s = max(r["seconds"], 1e-9)
    return (
        f"  {what:<22} {r['seconds']:7.2f} s  peak +{r['peak_above'] / 2**20:7.0f} MiB  "
        f"{r['samples'] / per_s:9,.0f} samples/s  {r['tokens'] / per_s:11,.0f} tokens/s  "
        f"cpu {r['cpu']:6.1f} s (main thread {r['main_cpu']:5.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="samples per dataset, comma-separated")
    ap.add_argument("--model", default=str(TINY_LLAMA), help="GGUF whose tokenizer and template are used")
    ap.add_argument(
        "--n-ctx", type=int, default=512, help="context length the samples are cut to (default 512)"
    )
    ap.add_argument(
        "--keep", help="folder for the generated datasets and caches (kept; default: a temporary one)"
    )
    ap.add_argument("--no-reference", action="store_true", help="skip the reference path's line")
    ap.add_argument(
        "--load-model", action="store_true", help="load the model's weights first (measured as base)"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tune-studio-bench-data-"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(
        f"model {args.model} (tokenizer and chat template), n_ctx {args.n_ctx}, {os.cpu_count()} cores, "
        f"load now {os.getloadavg()[0]:.2f} (a busy machine makes every figure an upper bound)",
        flush=True,
    )
    try:
        for n in sizes:
            data = work / f"chats-{n}.jsonl"
            if not data.exists():
                t = time.perf_counter()
                write_chats(data, n)
                print(
                    f"wrote {data} ({data.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s"
                )
            cache = work / f"cache-{n}"
            shutil.rmtree(cache, ignore_errors=True)
            print(f"{n:,} samples ({data.stat().st_size / 2**20:.0f} MiB):", flush=True)
            first = run(data, args.model, args.n_ctx, cache, False, args.load_model)
            print(line("first run", first), flush=True)
            cached = run(data, args.model, args.n_ctx, cache, False, args.load_model)
            assert cached["reused"], "the second run did not reuse the cache"
            print(line("cached", cached), flush=True)
            if not args.no_reference and n == min(sizes):
                print(
                    line("reference (old path)", run(data, args.model, args.n_ctx, None, True, False)),
                    flush=True,
                )
            if not args.keep:
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
