"""A parity report of the MoE CUDA kernels on this machine's GPU, for bench/gpu_check.py and people.

`moe_parity_report()` runs every GPU case of tests/kernels/moe_cases.py twice on fresh random inputs
(buffers poisoned), compares every output with the float64 NumPy reference and the two runs with
each other, and returns one `MoeParityRow` per case: whether it passed, the relative error of each
output, the worst of them, and whether the runs were bit-identical. It never raises on a mismatch
(the row says what failed); it raises only when no GPU can be used.

    python -m tests.kernels.moe_report            # prints the table; JSON to $OUT/moe_parity.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from tests.kernels import moe_cases as mc


@dataclass(frozen=True)
class MoeParityRow:
    case: str  # case name and stack dtype
    ok: bool  # every output within tolerance and both runs bit-identical
    worst: float  # largest relative error over the float outputs (inf: an integer output differs)
    tolerance: float  # the case's tolerance for its expert outputs
    deterministic: bool  # the second run gave the same bits
    seconds: float  # wall time of both runs and the reference
    errors: dict = field(default_factory=dict)  # output name -> relative error
    message: str = ""  # what failed, when something did


def moe_parity_report(seed: int | None = None, cases: list | None = None) -> list[MoeParityRow]:
    """Run the MoE parity cases on the current CUDA device; one row per case (see the module doc)."""

    from engine.kernels.moe_gemm import route
    from engine.kernels.runtime import cuda_runtime

    rt = cuda_runtime()

    seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed
    rng = np.random.default_rng(seed)
    rows = []
    for case in mc.cases(gpu=True) if cases is None else cases:
        t0 = time.perf_counter()
        inp = mc.make_inputs(case, rng)
        msg, errors, same = "", {}, False
        try:
            first = mc.run_case(case, inp, rt)
            second = mc.run_case(case, inp, rt)
            same = all(np.array_equal(first[k], second[k]) for k in first)
            try:
                errors = mc.check_case(case, inp, first, _route(case, route()))
            except AssertionError as exc:
                msg = str(exc)
                errors = _errors_anyway(case, inp, first, _route(case, route()))
            if not same:
                msg += (
                    (" " if msg else "")
                    + "two runs differ: "
                    + ", ".join(k for k in first if not np.array_equal(first[k], second[k]))
                )
        except Exception as exc:  # noqa: BLE001 - a report row, not a crash: the next case still runs
            msg = f"{type(exc).__name__}: {exc}"
        worst = max(errors.values(), default=float("nan"))
        rows.append(
            MoeParityRow(
                case=f"{case.name}/{case.dtype}/{_route(case, route())}",
                ok=not msg,
                worst=worst,
                tolerance=mc.tolerance(case, _route(case, route())),
                deterministic=same,
                seconds=time.perf_counter() - t0,
                errors=errors,
                message=msg if not msg else f"{msg} (seed {seed})",
            )
        )
    return rows


def _route(case, bf16_route: str) -> str:
    """The route a case's stacks take: float32 stacks always v1, bf16 stacks the engine's route."""
    return bf16_route if case.dtype == "bfloat16" else "v1"


def _errors_anyway(case, inp, got, route: str) -> dict:
    ref = mc.reference(case, inp, got, route)
    out = {}
    for k in ref:
        if k in mc.EXACT:
            out[k] = 0.0 if np.array_equal(got[k], ref[k]) else float("inf")
        elif got[k].shape == ref[k].shape:
            out[k] = mc.rel_err(got[k], ref[k])
    return out


def format_report(rows: list[MoeParityRow]) -> str:
    lines = [f"{'case':28s} {'ok':4s} {'worst rel err':>14s} {'tolerance':>10s} {'same bits':>9s} {'s':>6s}"]
    for r in rows:
        lines.append(
            f"{r.case:28s} {'yes' if r.ok else 'NO':4s} {r.worst:14.3g} {r.tolerance:10.2g} "
            f"{'yes' if r.deterministic else 'NO':>9s} {r.seconds:6.2f}"
        )
        if r.message:
            lines.append(f"    {r.message[:400]}")
    return "\n".join(lines)


def main() -> int:
    rows = moe_parity_report()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "moe_parity.json"), "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1, default=float)
    print(format_report(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
