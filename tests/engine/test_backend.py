"""The backend seam: devices listed with the reason a GPU cannot be used, CPU by default, and never a
silent CPU run when a GPU was asked for."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from engine import EngineError, TrainConfig, Trainer, available_devices, select_backend
from engine import backend as backend_mod


def fake_cupy(monkeypatch, error: Exception | None = None, count: int = 0, cc=(9, 0)):
    """A CuPy that imports, whose runtime answers as a machine without driver/GPU (or with one)."""
    cupy = types.ModuleType("cupy")

    class Runtime:
        @staticmethod
        def getDeviceCount():  # noqa: N802 - CuPy's name
            if error is not None:
                raise error
            return count

        @staticmethod
        def getDeviceProperties(i):  # noqa: N802
            return {
                "name": b"NVIDIA H100 80GB HBM3",
                "major": cc[0],
                "minor": cc[1],
                "totalGlobalMem": 80 << 30,
            }

    cupy.cuda = types.SimpleNamespace(runtime=Runtime)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    backend_mod.available_devices.cache_clear()
    return cupy


@pytest.fixture(autouse=True)
def fresh_device_list():
    backend_mod.available_devices.cache_clear()
    yield
    backend_mod.available_devices.cache_clear()


def test_cpu_is_the_default_and_auto_says_why_not_a_gpu():
    assert select_backend().device == select_backend("cpu").device == "cpu"
    b = select_backend("auto")
    assert b.device == "cpu" and b.xp is np and b.reason  # the reason a GPU was not chosen
    assert available_devices()[0].name == "cpu" and available_devices()[0].usable


def test_cupy_without_a_driver_means_cpu_with_the_reason(monkeypatch):
    fake_cupy(monkeypatch, RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"))
    gpu = available_devices()[1]
    assert not gpu.usable and "driver" in gpu.reason
    assert select_backend("auto").device == "cpu"
    with pytest.raises(EngineError, match="cuda:0 cannot be used: .*driver"):
        select_backend("cuda:0")


def test_cupy_with_no_gpu_and_an_old_gpu(monkeypatch):
    fake_cupy(monkeypatch, count=0)
    assert "no CUDA GPU" in available_devices()[1].reason
    fake_cupy(monkeypatch, count=1, cc=(7, 5))
    old = available_devices()[1]
    assert not old.usable and "7.5" in old.reason and "H100" in old.label


def test_a_gpu_asked_for_is_never_a_silent_cpu_run(tmp_path, chats, synth_model):
    with pytest.raises(EngineError, match="cuda:0"):
        Trainer(synth_model("llama"), chats, TrainConfig(device="cuda:0", steps=1))
    with pytest.raises(EngineError, match="device"):
        select_backend("tpu:0")
    with pytest.raises(EngineError, match="cuda:0"):  # "gpu" means cuda:0, refused the same way
        select_backend("gpu")
