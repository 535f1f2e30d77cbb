"""Independent pieces of a CPU op run side by side on Python worker threads, one BLAS thread each.

OpenBLAS splits each matmul over its threads and joins them at the end of the call. That pays for a
large product; an MoE expert's share of a batch (~32 rows) is too small to split well, and between
two such products the engine's Python (gathers, the SwiGLU, LoRA's small products) runs on one core
while the other waits. NumPy lets go of the GIL inside BLAS calls and element-wise loops, so N
Python threads, each taking whole pieces (one expert's rows, one chunk of the optimizer's update)
with BLAS set to one thread, keep N cores busy through both. Measured on the 2-core development
machine (bench/CPU_NOTES.md, change 7): one OLMoE-shaped layer's experts took 64-66 ms forward
and 72-73 ms backward on two workers, against 75-78 and 89-94 ms with two BLAS threads on one
Python thread; the whole MoE step 1134 against 1270 ms.

`run_each(fn, items)` returns `[fn(item) for item in items]`, in item order, whatever thread computed
each. Pieces must be independent: each writes only its own outputs (distinct rows, distinct
slices). Each piece is computed whole by one thread, the same arithmetic whichever thread runs it,
and callers add up per-piece results in item order; OpenBLAS's split of one product over threads
does not change its sums (bit for bit the same MoE layer and optimizer step either way,
tests/engine/test_cpu_workers.py).

How many workers: the BLAS thread count the engine chose for this step (engine.train.threads calls
`set_workers` each time it sets BLAS threads: the cores other programs leave free), provided the
BLAS is OpenBLAS and its idle threads sleep soon after a call (`OPENBLAS_THREAD_TIMEOUT` at most
`MAX_SPIN_LOG2`, which engine/_blas_env.py asks for): with OpenBLAS's default spin (0.1 s) the
thread of the 2-thread call just before a run spins on beside both workers, and the experts ran
30% slower than in line. In every other case (a long spin, another BLAS, a thread count the user
fixed with `OPENBLAS_NUM_THREADS` and friends, one core, before the first step) pieces run one
after another on the calling thread with BLAS as it is. A call made from inside a worker, or while
another thread's `run_each` is under way, also runs in line (never a deadlock, never more threads
than cores).

The worker count, the pool and the BLAS handle are process state on purpose: BLAS's thread count is
one setting for the whole process, and the pool mirrors it (as engine.train.threads does).
Not here: choosing the count (engine.train.threads), the ops themselves (engine.kernels.moe,
engine.train.optim).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)

MAX_SPIN_LOG2 = 24  # OPENBLAS_THREAD_TIMEOUT (log2 of the cycles idle threads spin) that allows workers
# Pieces smaller than this (float32 multiply-adds x 2, on average) run in line: a run_each's hand-off
# costs about 70 us (measured, two workers), and the tiny models' experts (a few microseconds each)
# trained 12-30% slower on workers; an OLMoE-shaped expert is ~100 MFLOP.
PIECE_MIN_FLOPS = 4e6

T = TypeVar("T")
R = TypeVar("R")


class CpuWorkers:
    """A pool of `count` Python threads and the BLAS thread count it runs pieces under."""

    def __init__(self) -> None:
        self.count = 1  # workers run_each uses; 1: in line
        self._pool: ThreadPoolExecutor | None = None
        self._busy = threading.Lock()  # held by the run_each under way
        self._inside = threading.local()  # set on worker threads while they run pieces
        self._blas: list[Any] | None = None  # threadpoolctl's BLAS library handles, once found

    def set_count(self, n: int | None) -> None:
        """Use `n` workers from the next `run_each` (None or < 2: run in line)."""
        n = 1 if n is None else max(1, int(n))
        if n == self.count:
            return
        with self._busy:  # never swap the pool under a running call
            old, self._pool, self.count = self._pool, None, n
        if old is not None:
            old.shutdown(wait=False)

    def _libs(self) -> list[Any]:
        """threadpoolctl's handles on the BLAS libraries loaded (found once)."""
        if self._blas is None:
            try:
                from threadpoolctl import ThreadpoolController

                self._blas = list(ThreadpoolController().select(user_api="blas").lib_controllers)
            except Exception as exc:  # noqa: BLE001 - an unknown BLAS: pieces run in line
                log.info("BLAS libraries cannot be listed (%s); pieces run in line", exc)
                self._blas = []
        return self._blas

    def blas_allows_workers(self) -> bool:
        """Whether the BLAS is OpenBLAS whose idle threads sleep soon (see the module docstring)."""
        libs = self._libs()
        return bool(libs) and all(lib.internal_api == "openblas" for lib in libs) and spin_is_short()

    def _one_blas_thread(self) -> list[tuple[Any, int]]:
        """Set every BLAS to one thread; returns what to restore."""
        was = [(lib, lib.num_threads) for lib in self._libs()]
        for lib, _ in was:
            lib.set_num_threads(1)
        return was

    def run_each(self, fn: Callable[[T], R], items: Sequence[T], *, in_line: bool = False) -> list[R]:
        """[fn(item) for item in items], the items shared out to the workers (see the module docstring).

        `in_line=True` runs them on the calling thread: the caller's verdict that its pieces are too
        small for the hand-off (waking a worker, the interpreter lock passed back and forth) to pay.
        The first exception a piece raises is raised here once every worker has stopped; pieces not
        yet started are then skipped."""
        n = 1 if in_line else min(self.count, len(items))
        if n < 2 or getattr(self._inside, "active", False) or not self._busy.acquire(blocking=False):
            return [fn(item) for item in items]
        try:
            if self._pool is None:  # the calling thread is one of the workers
                self._pool = ThreadPoolExecutor(max_workers=self.count - 1, thread_name_prefix="cpu-worker")
            results: list[Any] = [None] * len(items)
            next_index = itertools.count()  # next() on it is atomic under the GIL
            failed: list[BaseException] = []

            def work() -> None:
                was_inside = getattr(self._inside, "active", False)
                self._inside.active = True
                try:
                    while not failed:
                        i = next(next_index)
                        if i >= len(items):
                            return
                        results[i] = fn(items[i])
                except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                    failed.append(exc)
                finally:
                    self._inside.active = was_inside

            was = self._one_blas_thread()
            try:
                futures = [self._pool.submit(work) for _ in range(n - 1)]
                work()
                for f in futures:
                    f.result()
            finally:
                for lib, threads in was:
                    lib.set_num_threads(threads)
            if failed:
                raise failed[0]
            return results
        finally:
            self._busy.release()


def spin_is_short(environ: Any = os.environ) -> bool:
    """Whether OPENBLAS_THREAD_TIMEOUT asks for at most 2^MAX_SPIN_LOG2 cycles of spinning."""
    try:
        return int(environ.get("OPENBLAS_THREAD_TIMEOUT", "")) <= MAX_SPIN_LOG2
    except ValueError:
        return False


_PROCESS = CpuWorkers()  # one per process, as the BLAS thread count it follows


def set_workers(n: int | None) -> None:
    """The process's worker count: `n` (engine.train.threads passes the BLAS thread count it set)
    where the BLAS allows workers, else 1."""
    _PROCESS.set_count(n if n is not None and n > 1 and _PROCESS.blas_allows_workers() else 1)


def workers() -> int:
    """The process's worker count now (1: pieces run in line)."""
    return _PROCESS.count


def on_worker() -> bool:
    """Whether the calling thread runs a piece of a `run_each` shared out to CPU workers (each piece
    has one BLAS thread, and so should anything else it runs: the weight store's dequantization)."""
    return bool(getattr(_PROCESS._inside, "active", False))


def blas_threads() -> int:
    """The most threads any loaded BLAS runs a product on now (1 where none can be listed)."""
    return max((lib.num_threads for lib in _PROCESS._libs()), default=1)


def run_each(fn: Callable[[T], R], items: Sequence[T], *, in_line: bool = False) -> list[R]:
    """`CpuWorkers.run_each` on the process's workers."""
    return _PROCESS.run_each(fn, items, in_line=in_line)


__all__ = [
    "PIECE_MIN_FLOPS",
    "CpuWorkers",
    "blas_threads",
    "on_worker",
    "run_each",
    "set_workers",
    "spin_is_short",
    "workers",
]
