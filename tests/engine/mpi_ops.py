"""The MPI collective's operations on every rank, for tests/engine/test_distributed.py.

    mpiexec -n N python -m tests.engine.mpi_ops OUT_DIR

Each rank all-reduces arrays of several dtypes and sizes (in buckets of 1 KiB, so most arrays
share a bucket and one spans several), broadcasts arrays and objects, gathers objects, agrees on a
flag, then waits for a collective that the last rank never joins; it writes what it got to
OUT_DIR/rank<R>.npz for the test to compare with NumPy. Exits 0 when the last wait timed out.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from engine.train.collective import MpiCollective, RankTimeout


def arrays_of(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    return [
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.standard_normal(700).astype(np.float32),  # 2.8 KB: a bucket of its own
        rng.standard_normal((2, 2)).astype(np.float64),
        rng.integers(0, 9, 11).astype(np.int64),
        rng.standard_normal(1).astype(np.float32),
    ]


def main(out_dir: str) -> int:
    comm = MpiCollective(timeout=20, bucket_bytes=1024)
    mine = arrays_of(comm.rank)
    comm.allreduce(mine)
    shared = [np.full(4, comm.rank, np.float32), np.arange(3, dtype=np.int64) * (comm.rank + 1)]
    comm.broadcast(shared, root=1)
    obj = comm.broadcast_object({"from": comm.rank, "text": "é" * 3000} if comm.rank == 1 else None, root=1)
    gathered = comm.allgather_object(("host", comm.rank, "x" * comm.rank * 500))
    flag = comm.any(comm.rank == comm.size - 1)
    none = comm.any(False)
    comm.barrier()
    stats = comm.stats
    np.savez(
        os.path.join(out_dir, f"rank{comm.rank}.npz"),
        *mine,
        shared0=shared[0],
        shared1=shared[1],
        obj_from=obj["from"],
        obj_len=len(obj["text"]),
        gathered=np.array([g[1] for g in gathered]),
        gathered_len=np.array([len(g[2]) for g in gathered]),
        flag=flag,
        none=none,
        sent=stats.sent_bytes,
        payload=stats.payload_bytes,
    )
    if comm.rank == comm.size - 1:  # never joins the next collective: the others must not hang
        time.sleep(30)
        return 0
    t0 = time.monotonic()
    try:
        comm.allreduce([np.zeros(3, np.float32)], timeout=1.0)
    except RankTimeout as exc:
        print(f"rank {comm.rank}: timed out after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
        comm.abort(3)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
