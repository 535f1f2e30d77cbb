"""Every CUDA kernel's parity check on this machine's GPU, in one table (op, max abs err, max rel err, pass).

Runs the same checks as the parity tests (tests/kernels/test_<op>_parity.py `checks()`), with real
model sizes added, on fresh random inputs (the seed is printed): each twin runs twice with every
device allocation filled with 0xFF bytes first (NaN), the two runs must agree bit for bit, and each
output is compared with the NumPy reference computed in float64 (fp32 paths: relative error 1e-5;
bf16 GEMM paths: 1e-2; AdamW: bit for bit). Also: dequantization (every GPU type, both output
dtypes, bit for bit), the MoE kernels (tests/kernels/moe_report.py, when present), and a check that
engine.model.ops sends CuPy arrays to the twins. A module that fails to import or a check that
raises is a FAIL row with the error, never a crash. Exit status 0 when everything passed.

On a device machine (Python 3.12 with cupy-cuda13x, the CUDA wheels, numpy, pytest, tokenizers,
jinja2 and pyyaml already there, no network), the engine's only missing dependency is gguf (pure
Python). Fetch its wheel here once, and carry it:

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: -d .whl gguf==0.19.0

then run there (carry: [".whl"]):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \\
      && PYTHONPATH=/tmp/site:. python3 bench/gpu_check.py

Writes the table and every row's details to $OUT/gpu_check.txt and $OUT/gpu_check.json when $OUT is
set. Fits one 10-minute device call (the float64 references on the host take most of it).

    python bench/gpu_check.py [--seed N] [--only norm attention ...] [--small]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

OPS = ("norm", "rope", "swiglu", "embedding", "linear", "attention", "cross_entropy", "adamw")


def _row(op: str, case: str, max_abs: float, max_rel: float, ok: bool, note: str = "") -> dict:
    return {"op": op, "case": case, "max_abs": max_abs, "max_rel": max_rel, "ok": bool(ok), "note": note}


def _fail(op: str, exc: BaseException) -> dict:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return _row(op, "(raised)", float("nan"), float("nan"), False, text[-2000:])


def dense_rows(be, rng, only: set[str] | None) -> list[dict]:
    """The dense ops' and AdamW's checks (tests/kernels/test_<op>_parity.py) on a twin.Backend."""
    rows = []
    for op in OPS:
        if only and op not in only:
            continue
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(f"tests.kernels.test_{op}_parity")
            for c in mod.checks(be, rng):
                note = "" if c.ok else c.message
                rows.append(_row(c.op, c.case, c.max_abs, c.max_rel, c.ok, note))
        except Exception as exc:  # noqa: BLE001 - a failing op is a row, not a crash
            rows.append(_fail(op, exc))
        print(f"  {op}: {time.perf_counter() - t0:.1f} s", flush=True)
    return rows


def dequant_rows(cp, rng, small: bool) -> list[dict]:
    """Every GPU type and output dtype against dequant_ref, bit for bit (float32) or the rounded
    reference (bf16)."""
    rows = []
    try:
        from engine.kernels.dequant import GPU_TYPES, OUT_DTYPES, dequant, dequant_ref
        from tests.kernels.dequant_cases import bf16_rne, bf16_to_f32, cases, random_raw
    except Exception as exc:  # noqa: BLE001
        return [_fail("dequant", exc)]
    for qtype in GPU_TYPES:
        for dtype in OUT_DTYPES:
            try:
                worst_abs = worst_rel = 0.0
                bad = 0
                for case in cases(qtype, large=not small):
                    raw = random_raw(qtype, case.shape, rng)
                    ref = dequant_ref(raw, qtype, rows=case.rows)
                    out = cp.full(ref.shape, np.nan, cp.float32) if dtype == "float32" else None
                    if out is None:
                        out = cp.full(ref.shape, 0xFFFF, cp.uint16)
                    dequant(cp.asarray(raw), qtype, out=out, dtype=dtype, rows=case.rows)
                    got = cp.asnumpy(out)
                    if dtype == "float32":
                        bad += int((got.view(np.uint32) != ref.view(np.uint32)).sum())
                        vals, want = got.astype(np.float64), ref.astype(np.float64)
                    else:
                        bad += int((got != bf16_rne(ref)).sum())
                        vals, want = bf16_to_f32(got).astype(np.float64), ref.astype(np.float64)
                    fin = np.isfinite(want)
                    diff = np.abs(vals[fin] - want[fin])
                    worst_abs = max(worst_abs, float(diff.max()) if diff.size else 0.0)
                    scale = float(np.abs(want[fin]).max()) if diff.size else 1.0
                    worst_rel = max(worst_rel, (float(diff.max()) / scale) if diff.size and scale else 0.0)
                note = "" if bad == 0 else f"{bad} values differ from the exact result"
                rows.append(_row("dequant", f"{qtype} -> {dtype}", worst_abs, worst_rel, bad == 0, note))
            except Exception as exc:  # noqa: BLE001
                rows.append(_fail(f"dequant {qtype} -> {dtype}", exc))
    return rows


def moe_rows(seed: int) -> list[dict]:
    """The MoE kernels' report, when the MoE module and its report exist."""
    try:
        from tests.kernels.moe_report import moe_parity_report
    except ImportError as exc:
        return [_row("moe", "(not present)", float("nan"), float("nan"), True, f"skipped: {exc}")]
    try:
        rows = []
        for r in moe_parity_report(seed=seed):
            note = "" if r.ok else (r.message or "failed")
            if not r.deterministic:
                note = (note + "; two runs differ").strip("; ")
            rows.append(_row("moe", r.case, float("nan"), float(r.worst), r.ok, note))
        return rows
    except Exception as exc:  # noqa: BLE001
        return [_fail("moe", exc)]


def dispatch_rows(cp) -> list[dict]:
    """engine.model.ops runs the CUDA twin for CuPy arrays (and its result stays on the device)."""
    try:
        from engine.model import ops

        x = cp.asarray(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
        y, _ = ops.rmsnorm_forward(x, cp.ones(64, cp.float32), 1e-6)
        h, _ = ops.swiglu_forward(x, x)
        ok = type(y).__module__.startswith("cupy") and type(h).__module__.startswith("cupy")
        return [
            _row("ops dispatch", "rmsnorm, swiglu on CuPy", 0.0, 0.0, ok, "" if ok else "ran on the host")
        ]
    except Exception as exc:  # noqa: BLE001
        return [_fail("ops dispatch", exc)]


def table(rows: list[dict]) -> str:
    head = f"{'op':<34} {'case':<58} {'max abs err':>12} {'max rel err':>12}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        case = r["case"] if len(r["case"]) <= 58 else r["case"][:55] + "..."
        verdict = "pass" if r["ok"] else "FAIL"
        lines.append(f"{r['op']:<34} {case:<58} {r['max_abs']:>12.3e} {r['max_rel']:>12.3e}  {verdict}")
    n_bad = sum(not r["ok"] for r in rows)
    lines.append(f"{len(rows) - n_bad} passed, {n_bad} failed")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="input seed (default: fresh)")
    ap.add_argument("--only", nargs="*", help=f"ops to check: {' '.join(OPS)} dequant moe")
    ap.add_argument("--small", action="store_true", help="test sizes only (no real-model shapes)")
    ap.add_argument("--emulate", action="store_true", help="no GPU: the dense checks on the g++ emulator")
    args = ap.parse_args()
    from tests.kernels.twin import Backend

    if args.emulate:
        seed = args.seed if args.seed is not None else 0
        rows = dense_rows(Backend("emulated"), np.random.default_rng(seed), set(args.only or ()))
        print(table(rows))
        return 0 if all(r["ok"] for r in rows) else 1
    try:
        import cupy as cp

        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        print(f"no usable CUDA GPU: {type(exc).__name__}: {exc}")
        return 2
    if n == 0:
        print("no CUDA GPU")
        return 2
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    from engine.kernels import cuda as kcuda

    print(f"device: {name}, CuPy {cp.__version__}, NVRTC {kcuda.nvrtc_version()}, seed {seed}", flush=True)
    only = set(args.only) if args.only else None
    t0 = time.perf_counter()
    rows = dispatch_rows(cp)
    rows += dense_rows(Backend("gpu", cp, large=not args.small), rng, only)
    if not only or "dequant" in only:
        rows += dequant_rows(cp, rng, args.small)
    if not only or "moe" in only:
        rows += moe_rows(seed)
    text = table(rows)
    failures = [r for r in rows if not r["ok"]]
    details = "\n".join(f"FAIL {r['op']} [{r['case']}]: {r['note']}" for r in failures)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_check.txt"), "w") as f:
            f.write(f"device {name}, seed {seed}\n{text}\n{details}\n")
        with open(os.path.join(out, "gpu_check.json"), "w") as f:
            json.dump({"device": name, "seed": seed, "rows": rows}, f, indent=1, default=str)
    print(details[-6000:] if details else "")
    print(f"({time.perf_counter() - t0:.0f} s)")
    print(text)
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
