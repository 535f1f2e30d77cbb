"""One rank of a data-parallel run, for tests/engine/test_distributed.py (started by mpiexec).

    mpiexec -n N python -m tests.engine.mpi_rank MODEL DATA OUT_DIR CONFIG_JSON [drift]

Trains with `Trainer` over the MPI collective and writes OUT_DIR/rank<R>.npz on every rank: the
losses and mean cross-entropies of every step and the final parameters, so the test can check
that every rank ends with the same adapter, and that it is the one a single process trains.
With `drift`, the last rank changes one of its parameters after step 1 (as a rank whose sums came
out differently would), for the check that gives every rank rank 0's parameters again.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from engine.backend import to_host
from engine.train import events as ev
from engine.train.collective import open_collective
from engine.train.trainer import TrainConfig, Trainer


def main(model: str, data: str, out_dir: str, config_json: str, drift: str = "") -> int:
    comm = open_collective("mpi", timeout=60)
    cfg = TrainConfig.from_json(json.loads(config_json))
    got = []
    tr = Trainer(model, data, cfg, collective=comm)

    def on_event(e) -> None:
        got.append(e)
        if drift and isinstance(e, ev.Step) and e.step == 1 and comm.rank == comm.size - 1:
            p = next(iter(tr.trainable.params().values()))
            p += 1e-3

    result = tr.run(on_event)
    if isinstance(result, ev.Failed):
        print(f"rank {comm.rank}: {result.message}", file=sys.stderr)
        return 2
    steps = [e for e in got if isinstance(e, ev.Step)]
    params = {k: to_host(v) for k, v in tr.trainable.params().items()}
    np.savez(
        os.path.join(out_dir, f"rank{comm.rank}.npz"),
        __loss=np.array([e.loss for e in steps]),
        __ce=np.array([e.mean_ce for e in steps]),
        __resyncs=np.array(tr.resyncs),
        **params,
    )
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
