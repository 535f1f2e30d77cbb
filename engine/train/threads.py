"""How many BLAS threads a training step gets: the usable cores other programs leave free.

OpenBLAS splits a matmul over its threads and waits for the slowest. When another program keeps
a core busy, the thread on that core gets a fraction of it and every matmul waits for it: on the
2-core development machine the demo's 150 steps took 25.9 s with two BLAS threads and a busy
core, 9.7 s with one thread (10.3 s quiet with two). So before each training step, and at the
start of every other engine job (generation, logits, reward steps), the engine calls
`adjust_blas_threads()`: the process's one `BlasThreads` counts the runnable threads of other
processes (`procs_running` of /proc/stat, minus this process's runnable threads) and sets the
thread count to the usable cores minus that count (at least one), using the lower median of the
last three samples so that one busy moment does not flip it. Threads are set with threadpoolctl,
for every BLAS NumPy loaded. The same count is the number of Python workers that ops made of
independent pieces (MoE experts, the optimizer's chunks) run on, one BLAS thread each
(engine.kernels.cpu_workers).

A thread count the user chose (`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS` in the
environment) is left alone, as is everything on a system without /proc (the count stays as BLAS
chose it).
"""

from __future__ import annotations

import collections
import logging
import os
import time

from ..kernels.cpu_workers import set_workers

log = logging.getLogger(__name__)

USER_SETTINGS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
SAMPLES = 3  # the median of this many step-start samples decides
READS = 3  # a sample is the fewest runnable threads of other programs over this many reads...
READ_GAP_S = 2e-4  # ...this far apart


def usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def procs_running(stat: str = "/proc/stat") -> int | None:
    """Runnable threads on the whole system now (this process's included), or None without /proc."""
    try:
        with open(stat, encoding="ascii") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def own_running(task_dir: str = "/proc/self/task") -> int:
    """This process's runnable threads now (state R), BLAS threads spinning after a call included."""
    n = 0
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(os.path.join(task_dir, tid, "stat"), encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        state = text.rsplit(")", 1)[-1].split()[:1]  # the name may hold spaces and parentheses
        n += state == ["R"]
    return n


class BlasThreads:
    """Sets the BLAS thread count before each training step (see the module docstring)."""

    def __init__(
        self,
        cores: int | None = None,
        stat: str = "/proc/stat",
        task_dir: str = "/proc/self/task",
        publish: bool = False,
    ):
        self.cores = cores or usable_cores()
        self.publish = publish  # the process's controller: also sets engine.kernels.cpu_workers' count
        self.stat, self.task_dir = stat, task_dir
        self.user_set = next((k for k in USER_SETTINGS if os.environ.get(k)), None)
        self.samples: collections.deque[int] = collections.deque(maxlen=SAMPLES)
        self.threads: int | None = None  # the count last set, None until then
        self._controller = None

    def others_busy(self) -> int | None:
        """Runnable threads of other processes now, or None when /proc cannot tell.

        This process's runnable threads are counted just before and just after the system's, and
        the larger count is taken off: a thread of ours that is going to sleep in between (a CPU
        worker or BLAS thread just done with the last step) was counted by the system while it ran,
        and would otherwise pass for another program's. The fewest of `READS` such counts,
        `READ_GAP_S` apart, is the answer: a busy program is runnable at every read, a kernel
        thread's moment of work (kworker, kcompactd: runnable now and then in a quiet run) at one.
        Without it, two of five quiet runs dropped to one thread for 3-4 steps (bench/CPU_NOTES.md,
        change 9)."""
        counts = []
        for i in range(READS):
            if i:
                time.sleep(READ_GAP_S)
            before = own_running(self.task_dir)
            total = procs_running(self.stat)
            if total is None:
                return None
            counts.append(max(0, total - max(before, own_running(self.task_dir))))
        return min(counts)

    def choose(self) -> int | None:
        """The thread count for the next step from a new sample (None: leave BLAS as it is)."""
        if self.user_set or self.cores <= 1:
            return None
        busy = self.others_busy()
        if busy is None:
            return None
        self.samples.append(busy)
        median = sorted(self.samples)[(len(self.samples) - 1) // 2]  # the lower median: slow to take away
        return max(1, self.cores - median)

    def adjust(self) -> int | None:
        """Sample, choose and apply; returns the count in force (None when left alone)."""
        n = self.choose()
        if n is None or n == self.threads:
            return self.threads
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=n, user_api="blas")
        except Exception as exc:  # noqa: BLE001 - an unknown BLAS keeps its own count; training goes on
            log.info("BLAS threads cannot be set (%s); left as they are", exc)
            self.user_set = "unavailable"
            return None
        if self.threads is not None:
            busy = self.cores - n
            log.info("BLAS threads %d -> %d (other programs keep %d cores busy)", self.threads, n, busy)
        self.threads = n
        if self.publish:
            set_workers(n)  # ops that split into pieces run them on as many Python workers
        return n


_PROCESS: BlasThreads | None = None  # BLAS threads are process-wide, so is what sets them


def adjust_blas_threads() -> int | None:
    """`BlasThreads.adjust()` of the process's one controller (made on first use)."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = BlasThreads(publish=True)
    return _PROCESS.adjust()


__all__ = ["BlasThreads", "adjust_blas_threads", "own_running", "procs_running", "usable_cores"]
