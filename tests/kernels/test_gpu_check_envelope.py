"""bench/gpu_check.py's CPU-vs-device training check widens its tolerance to what the CPU itself
moves when the model's matrices are rounded to bf16 (near routing ties fork on rounding alone): the
rounded twin holds exactly the bf16 roundings, and the envelope is the running maximum."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from bench.gpu_check import TRAIN_CE_TOL, TRAIN_GRAD_TOL, _bf16_twin, _envelope
from engine.io.device_weights import _bf16_bits
from engine.io.gguf_file import GGUFFile
from engine.testing import SynthSpec, write_model


def _bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 as the device's weights are (engine.io.device_weights), as float32."""
    return (_bf16_bits(x).astype(np.uint32) << 16).view(np.float32).reshape(x.shape)


def test_the_twin_holds_the_bf16_roundings_of_the_matrices_and_the_vectors_as_they_are(tmp_path):
    path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("qwen3moe", seed=3, qtype="Q8_0"))
    twin = _bf16_twin(path, str(tmp_path / "m-bf16.gguf"))
    a, b = GGUFFile(path), GGUFFile(twin)
    try:
        assert a.metadata == b.metadata and list(a.tensors) == list(b.tensors)
        for name, info in a.tensors.items():
            want = a.load(name)
            if len(info.shape) >= 2 and not name.endswith(".bias"):
                assert b.tensors[name].qtype == "BF16", name
                want = _bf16(want)
            else:
                assert b.tensors[name].qtype == "F32", name
            np.testing.assert_array_equal(b.load(name), want, err_msg=name)
    finally:
        a.close()
        b.close()


def test_the_envelope_is_twice_the_running_largest_difference_never_below_the_fixed_tolerances():
    def run(ces, gs):
        return [(SimpleNamespace(mean_ce=c, grad_norm=g), None) for c, g in zip(ces, gs, strict=True)]

    cpu = run([5.0, 4.0, 3.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    twin = run([5.0, 4.2, 3.0, 2.0], [1.0, 1.0, 1.3, 1.0])  # a fork at step 2 (ce), step 3 (|g|)
    ce_tol, g_tol = _envelope(cpu, twin, 4)
    assert ce_tol[0] == TRAIN_CE_TOL and np.allclose(ce_tol[1:], [0.1, 0.1, 0.1])
    assert g_tol[:2] == [TRAIN_GRAD_TOL, TRAIN_GRAD_TOL] and np.allclose(g_tol[2:], [0.6, 0.6])
