"""The fused step with MoE layers on a real GPU (skipped where there is none): the tiny MoE models of
tests/engine/test_moe_step.py trained with the step captured as one CUDA graph must give the eager
fused step's bits after every replayed batch (losses, gradient norms, expert counts, every LoRA
factor and AdamW moment), and follow the generic op-by-op path (the reference) within the
emulator tests' tolerances.

On a device machine (see bench/gpu_check.py for the gguf wheel to carry):
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_moe_step_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.model.model import Model
from engine.model.targets import TargetSpec
from engine.testing import SynthSpec, write_model
from engine.train import events as ev
from engine.train.trainer import TrainConfig, Trainer
from tests.engine.test_dense_step import _samples
from tests.engine.test_moe_step import _run, _targets

pytestmark = pytest.mark.gpu


def _train(path, backend, arch: str, mode: str, steps: int):
    """(Step events, expert counts of each step, host copies of the factors and moments at the end)."""
    model = Model.load(path, backend=backend)
    cfg = TrainConfig(
        targets=TargetSpec(preset="none", patterns=_targets(arch)), rank=4, alpha=8, n_ctx=32, batch_size=2,
        steps=steps, norms_every=0, checkpoint_layers="off", lr=1e-2, schedule="constant", gpu_step=mode,
    )  # fmt: skip
    trainer = Trainer(model, _samples(), cfg)
    assert isinstance(trainer.start(), ev.Started)
    out, counts = _run(trainer, steps)
    assert (trainer._fused is None) == (mode == "generic")
    assert (trainer._graph is not None) == (mode == "graph"), "the capture was refused (see the log)"
    host = {k: np.asarray(backend.to_host(v)).copy() for k, v in trainer.trainable.params().items()}
    state = trainer.optimizer.state_dict()
    host.update(
        {k: np.asarray(backend.to_host(v)).copy() for k, v in state.items() if k.startswith(("m.", "v."))}
    )
    return out, counts, host


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe", "olmoe", "mixtral"])
def test_captured_moe_step_replays_the_eager_step_and_follows_the_generic_path(tmp_path, cuda, arch):
    extra = {"E": 4, "K": 2, "F": 0} if arch == "mixtral" else {}
    spec = SynthSpec.for_arch("llama" if arch == "mixtral" else arch, L=2, seed=7, qtype="Q8_0", **extra)
    path = write_model(tmp_path / f"{arch}.gguf", spec)
    e, ce, pe = _train(path, cuda, arch, "eager", 4)
    g, cg, pg = _train(path, cuda, arch, "graph", 4)
    r, cr, _ = _train(path, cuda, arch, "generic", 4)
    for x, y in zip(e, g, strict=True):
        assert (x.loss, x.grad_norm, x.mean_ce) == (y.loss, y.grad_norm, y.mean_ce), x.step
    assert all(np.array_equal(x, y) for x, y in zip(ce, cg, strict=True))
    assert sorted(pe) == sorted(pg)
    differ = [k for k in pe if not np.array_equal(pe[k], pg[k])]
    assert not differ, differ[:5]
    for x, y in zip(r, g, strict=True):
        assert abs(x.mean_ce - y.mean_ce) <= 5e-3 * x.mean_ce, (x.step, x.mean_ce, y.mean_ce)
        assert abs(x.grad_norm - y.grad_norm) <= 3e-2 * x.grad_norm, (x.step, x.grad_norm, y.grad_norm)
    for x, y, s in zip(cr, cg, g, strict=True):
        assert (y.sum(axis=1) == spec.K * s.tokens).all() and np.abs(x - y).sum() <= 8, (x, y)
