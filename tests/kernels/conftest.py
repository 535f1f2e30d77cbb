"""Fixtures of the kernel tests: `gpu`, the CuPy module on the first usable CUDA device, else a skip."""

from __future__ import annotations

import numpy as np
import pytest


def usable_gpu() -> tuple[int | None, str]:
    """(index of the first usable CUDA device, "") or (None, why there is none)."""
    from engine.backend import available_devices

    devices = [d for d in available_devices() if d.name != "cpu"]
    for d in devices:
        if d.usable:
            return int(d.name.split(":")[1]), ""
    return None, "; ".join(f"{d.name}: {d.reason}" for d in devices) or "no CUDA device"


@pytest.fixture(scope="session")
def gpu():
    """CuPy, with the first usable CUDA device current; skips the test when there is none."""
    index, why = usable_gpu()
    if index is None:
        pytest.skip(f"needs a usable CUDA GPU ({why})")
    import cupy

    cupy.cuda.Device(index).use()
    return cupy


@pytest.fixture
def fresh_rng() -> np.random.Generator:
    """Unseeded: every run draws new inputs (the seed is in the test's output when it fails)."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(params=["emulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    """Where a CUDA twin runs in a parity test: the g++ emulator (any machine), or the GPU (skipped
    where there is none). See tests/kernels/twin.py."""
    from tests.kernels.emulate import compiler
    from tests.kernels.twin import Backend

    if request.param == "gpu":
        return Backend("gpu", request.getfixturevalue("gpu"))
    if compiler() is None:
        pytest.skip("the kernel emulator needs g++")
    return Backend("emulated")
