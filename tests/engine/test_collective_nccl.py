"""The NCCL collective on a real GPU (skipped where there is none, or no NCCL library).

One process holds one GPU, and NCCL will not put two ranks of a communicator on the same GPU, so on
a one-GPU machine these tests run one rank: the all-reduce and broadcast go through NCCL (device
buffers, buckets, dtypes, host arrays staged) and must give the reference's values, and training
with `--device cuda --collective nccl` (the whole data-parallel path: facts, broadcast, a sharded
step, all-reduce) must give what the single path gives on the same GPU.

On a device machine (see bench/gpu_check.py for the gguf wheel to carry):
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_collective_nccl.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.train.collective import Collective, NcclCollective, nccl_available
from tests.conftest import write_chats

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda(cuda):  # tests/conftest.py's GPU backend, where NCCL is there too
    ok, why = nccl_available()
    if not ok:
        pytest.skip(f"needs NCCL ({why})")
    return cuda


def test_nccl_allreduce_and_broadcast_equal_the_reference(cuda):
    cupy = cuda.xp
    comm = NcclCollective(Collective(), 0, bucket_bytes=1024)  # 1 KiB buckets: most arrays share one
    rng = np.random.default_rng(7)
    host = [
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.standard_normal(700).astype(np.float32),  # a bucket of its own
        rng.standard_normal((2, 2)).astype(np.float64),
        rng.integers(0, 9, 11).astype(np.int64),
        rng.standard_normal((4, 3)).astype(np.float32),
    ]
    arrays = [cupy.asarray(a) for a in host[:4]] + [host[4].copy()]  # the last stays on the host
    comm.allreduce(arrays)
    for got, want in zip(arrays, host, strict=True):  # one rank: the sum over ranks is its own arrays
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(cupy.asnumpy(got) if not isinstance(got, np.ndarray) else got, want)
    assert comm.stats.payload_bytes == sum(a.nbytes for a in host) and comm.stats.calls == 1
    before = [cupy.asarray(a) for a in host]
    comm.broadcast(before)
    for got, want in zip(before, host, strict=True):
        np.testing.assert_array_equal(cupy.asnumpy(got), want)
    assert comm.broadcast_object({"a": 1}) == {"a": 1} and comm.allgather_object(3) == [3]
    comm.close()


def test_cuda_with_one_nccl_rank_trains_what_the_single_path_trains(cuda, tmp_path, monkeypatch):
    from engine.cli.main import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the model-hash cache
    from engine.model.lora import LoraAdapter
    from engine.testing import SynthSpec, write_model

    model = write_model(tmp_path / "llama.gguf", SynthSpec.for_arch("llama", seed=11))
    data = write_chats(
        tmp_path / "chats.jsonl", ((f"what is {i} plus {i}", f"{i} plus {i} is {2 * i}") for i in range(16))
    )
    common = [model, data, "--preset", "all", "--rank", "4", "--lr", "1e-2", "--steps", "10",
              "--ctx", "48", "--batch", "4", "--grad-accum", "2", "--device", "cuda"]  # fmt: skip
    losses = {}
    for name, extra in (("single", ["--collective", "single"]), ("nccl", ["--collective", "nccl"])):
        events = tmp_path / f"{name}.jsonl"
        out = tmp_path / f"{name}.gguf"
        assert main(["train", *common, "--out", str(out), "--events", str(events), *extra]) == 0
        rows = [json.loads(line) for line in events.read_text().splitlines()]
        losses[name] = np.array([e["loss"] for e in rows if e["event"] == "Step"])
        if name == "nccl":
            assert rows[0]["plan"]["ranks"] == 1
    assert len(losses["nccl"]) == 10
    assert np.max(np.abs(losses["nccl"] - losses["single"]) / losses["single"]) <= 1e-5
    a, b = LoraAdapter.load(str(tmp_path / "single.gguf")), LoraAdapter.load(str(tmp_path / "nccl.gguf"))
    num = sum(float(np.sum((b.pairs[k][i] - a.pairs[k][i]) ** 2)) for k in a.pairs for i in (0, 1))
    den = sum(float(np.sum(a.pairs[k][i] ** 2)) for k in a.pairs for i in (0, 1))
    assert (num / den) ** 0.5 <= 1e-4
