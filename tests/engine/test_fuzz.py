"""The fuzz harness of bench/fuzz.py at a small count: seeded hostile model files, vocabularies,
datasets, chat templates and sampling settings, and the command line's cases (outputs aimed at
inputs, numeric options out of range, unknown tensor type codes, non-finite adapters and
checkpoints) each end in the expected engine error or a checked result, within the time limit,
without changing an input file (`python bench/fuzz.py --n 10000` runs the same cases at scale)."""

from __future__ import annotations

import logging

import pytest

from bench.fuzz import CATEGORIES, Fuzzer

COUNTS = {
    "gguf": 160, "vocab": 100, "jsonl": 120, "template": 120, "sampling": 200,
    "outputs": 80, "values": 80, "types": 40, "adapters": 40,  # the command line's (bench/fuzz_cli.py)
}  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Jinja on a template's "\\-" escape
@pytest.mark.parametrize("category", CATEGORIES)
def test_hostile_inputs_end_in_clean_errors(tmp_path, category, caplog):
    caplog.set_level(logging.ERROR)
    fuzzer = Fuzzer(tmp_path, seed=7, case_seconds=8.0)
    report = fuzzer.run(COUNTS[category], (category,))
    failures = report.failures()
    assert not failures, "\n\n".join(f"{o.result}: {o.case}\n{o.detail}" for o in failures[:3])
    results = report.counts()[category]
    assert results["error"] > 0  # the cases do reach the engine's checks
    assert sum(results.values()) == COUNTS[category]
