"""Dequantization benchmark: `engine.io.quants.dequantize` against `gguf.quants.dequantize`.

For each type, a tensor of random blocks (random bytes with finite float16 scales, rows of 4096
values) is dequantized by gguf-py, by `engine.io.quants` on the calling thread only, and by
`engine.io.quants` on every usable core, into a reused output buffer. Prints millions of values
per second (best of --repeats interleaved rounds) and the speed-ups over gguf-py. It checks that
the results are equal, never how fast they are. gguf-py allocates its result and temporaries on
every call, so its figures swing with the allocator's state (page faults): up to 3x between runs.

    python bench/dequant.py                         # every fast type, 4M values each
    python bench/dequant.py --elements 16777216 --types Q4_K Q6_K Q8_0
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from engine.io.quants import _usable_cores, dequantize, fast_types  # noqa: E402
from engine.testing import F16_FIELDS  # noqa: E402

ROW = 4096  # values per row

ORDER = "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4".split()


def random_tensor(qtype: str, n_values: int, rng: np.random.Generator) -> np.ndarray:
    """Raw data of a (rows, ROW) tensor as GGUFFile.raw gives it, with finite scales."""
    rows = max(1, n_values // ROW)
    if qtype == "F32":
        return rng.standard_normal((rows, ROW), dtype=np.float32)
    if qtype == "F16":
        return rng.standard_normal((rows, ROW), dtype=np.float32).astype(np.float16)
    if qtype == "BF16":
        x = rng.standard_normal((rows, ROW), dtype=np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, ROW * 2)
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    nb = ROW // block_size
    raw = rng.integers(0, 256, size=(rows, nb, type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, ()):
        scale = (rng.standard_normal((rows, nb), dtype=np.float32) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    if qtype == "MXFP4":  # e8m0 exponents near 2^0
        raw[:, :, 0] = rng.integers(118, 130, size=(rows, nb), dtype=np.uint8)
    return raw.reshape(rows, nb * type_size)


def best_times(fns: list, repeats: int) -> list[float]:
    """Best wall time of each function, timed in interleaved rounds (on a shared machine a burst of
    someone else's load then hits every contender alike, not one of them)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()  # warm: page faults, the thread pool, caches
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elements", type=int, default=1 << 22, help="values per tensor (default 4194304)")
    p.add_argument("--types", nargs="+", default=None, help="ggml type names (default: every fast type)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds; the best of each counts")
    p.add_argument("--threads", type=int, default=None, help="threads of the parallel run (default: all)")
    args = p.parse_args(argv)

    types = args.types or [t for t in ORDER if t in fast_types()]
    n_threads = args.threads or _usable_cores()
    rng = np.random.default_rng(0)
    print(f"{args.elements} values per tensor, best of {args.repeats}, in Melem/s (millions of values/s)")
    print("(gguf-py returns F32 data as a view: its F32 figure is that view plus a copy)")
    head = ("type", "gguf", "ours 1T", f"ours {n_threads}T", "x 1T", f"x {n_threads}T")
    print(f"{head[0]:8s} {head[1]:>8s} {head[2]:>8s} {head[3]:>8s} {head[4]:>6s} {head[5]:>6s}")
    for qtype in types:
        raw = random_tensor(qtype, args.elements, rng)
        gtype = GGMLQuantizationType[qtype]
        copy = np.array if qtype == "F32" else np.asarray
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = gguf_quants.dequantize(raw, gtype)
            out = np.empty(ref.shape, np.float32)
            t_gguf, t_one, t_all = best_times(
                [
                    lambda: copy(gguf_quants.dequantize(raw, gtype)),  # noqa: B023
                    lambda: dequantize(raw, qtype, out, threads=1),  # noqa: B023
                    lambda: dequantize(raw, qtype, out, threads=n_threads),  # noqa: B023
                ],
                args.repeats,
            )
        same = np.array_equal(out.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32))
        n = ref.size / 1e6
        print(
            f"{qtype:8s} {n / t_gguf:8.0f} {n / t_one:8.0f} {n / t_all:8.0f} "
            f"{t_gguf / t_one:6.1f} {t_gguf / t_all:6.1f}" + ("" if same else "  RESULTS DIFFER")
        )


if __name__ == "__main__":
    main()
