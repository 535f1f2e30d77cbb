"""How close the emulated parity tests come to their tolerances over many fresh draws.

The parity tests draw new inputs on every run (tests/kernels/conftest.py `fresh_rng`), so a check
whose error sits near its tolerance for some draws fails CI now and then with nothing wrong in the
kernel (three did before the references took the operands as the kernels round them). This runs
`pytest tests/kernels` several times, each run with fresh draws, and records every check's error
over its tolerance: the twins' checks as their test judged them (`twin.assert_checks`; `compare`'s
measure for a test that judges on its own), `moe_cases.check_case`'s relative error per output for
the MoE layer (its row check still fails a run when it fails).
Prints the checks that came closest, with their worst ratio and the runs that failed. Prints
figures; never passes or fails.

    python bench/parity_tails.py                          # 5 runs of tests/kernels
    python bench/parity_tails.py --runs 20 --top 30
    python bench/parity_tails.py --runs 10 -k attention   # one test file's checks (pytest's -k)

A ratio near 1 is a check that will fail CI now and then: find the draw (the test prints its seed)
and see whether the kernel or the measure is wrong. Also usable as a pytest plugin
(`-p bench.parity_tails`, writing one JSON line per session to $PARITY_TAILS_OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SEEN: dict[str, float] = {}  # worst error over tolerance per check, as `compare` measured it
_JUDGED: dict[str, float] = {}  # ... as the test judged it, where it did through `assert_checks`


def _keep(key: str, ratio: float, seen: dict[str, float] = _SEEN) -> None:
    if ratio > seen.get(key, -1.0):
        seen[key] = ratio


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    """As a plugin: wrap the parity helpers before the test modules import them."""
    from tests.kernels import moe_cases, twin

    compare = twin.compare

    def recorded_compare(op, case, out, ref, tol, *args, **kwargs):
        check = compare(op, case, out, ref, tol, *args, **kwargs)
        _keep(f"{op} [{case}]", check.rel / check.tol if check.tol else 0.0)
        return check

    twin.compare = recorded_compare
    assert_checks = twin.assert_checks

    def recorded_assert_checks(checks):
        checks = list(checks)  # as judged: a test may rescale a check after `compare` (attention's dsinks)
        for check in checks:
            _keep(f"{check.op} [{check.case}]", check.rel / check.tol if check.tol else 0.0, _JUDGED)
        assert_checks(checks)

    twin.assert_checks = recorded_assert_checks
    check_case = moe_cases.check_case

    def recorded_check_case(case, inp, got, route="v1"):
        try:
            errors = check_case(case, inp, got, route)
        except AssertionError:
            _keep(f"moe layer [{case} {route}] (failed)", float("inf"))
            raise
        tol = moe_cases.tolerance(case, route)
        for name, err in errors.items():
            routing = name in ("probs", "weights", "w_sel", "dlogits")
            _keep(f"moe layer.{name} [{case} {route}]", err / (2e-5 if routing else tol))
        return errors

    moe_cases.check_case = recorded_check_case


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001
    out = os.environ.get("PARITY_TAILS_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"failed": session.testsfailed, "ratios": {**_SEEN, **_JUDGED}}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of the tests, each with fresh draws")
    ap.add_argument("--top", type=int, default=20, help="checks to print, closest first")
    ap.add_argument("-k", dest="keyword", help="pytest's -k: only the tests it selects")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="parity-tails-") as tmp:
        out = Path(tmp) / "runs.jsonl"
        env = {**os.environ, "PARITY_TAILS_OUT": str(out), "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.parity_tails"]
        command += ["tests/kernels", *(["-k", args.keyword] if args.keyword else [])]
        for run in range(args.runs):
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"rc {done.returncode}"
            print(f"run {run + 1}/{args.runs}: {last}")
        runs = (
            [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
            if out.exists()
            else []
        )
    worst: dict[str, list[float]] = {}
    for r in runs:
        for key, ratio in r["ratios"].items():
            worst.setdefault(key, []).append(ratio)
    failed = sum(1 for r in runs if r["failed"])
    print(f"{len(runs)} runs, {failed} with a failing test; {len(worst)} checks; closest to their tolerance:")
    print(f"  {'worst':>7} {'median':>7}  check")
    for key, ratios in sorted(worst.items(), key=lambda kv: -max(kv[1]))[: args.top]:
        ratios.sort()
        print(f"  {ratios[-1]:7.2f} {ratios[(len(ratios) - 1) // 2]:7.2f}  {key[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
