"""The collective seam of data-parallel training: all the trainer sees of other processes.

`Collective` is one process's view of a run spread over `size` processes ("ranks"): its `rank`,
the ranks on its own machine (`local_rank`, `local_size`), and the collective operations the
trainer needs, each of which every rank calls in the same order:

- `allreduce(arrays)`: sums a list of arrays over the ranks, in place. Arrays are packed into
  buckets of at most `bucket_bytes` (one dtype per bucket), so a step's hundreds of LoRA factor
  gradients travel as a few large messages; every bucket is in flight before the first is waited
  for. Every rank ends with the same bits (MPI's and NCCL's all-reduce give one result to all).
- `broadcast(arrays, root)`, `broadcast_object(obj, root)`, `allgather_object(obj)`, `any(flag)`,
  `barrier()`; `abort(code)` ends the run on every rank at once (MPI_Abort).

Backends, all over existing engines (nothing here moves bytes itself):
- `single`: one process, the default; every operation is the identity and no dependency is needed.
- `mpi`: mpi4py over an MPI library (`pip install 'tune-studio[mpi]'` brings mpi4py and MPICH's
  wheel with its `mpiexec`): processes on the CPU of one machine or several. Device arrays are
  staged through the host.
- `nccl`: CuPy's NCCL binding (`cupy.cuda.nccl`, `pip install 'tune-studio[nccl]'`), one GPU per
  process; the processes are started by MPI, which also hands out NCCL's unique id and carries the
  small host messages (objects, barriers). With one process it runs without MPI.

Waiting is bounded: every operation raises `RankTimeout` when another rank has not answered
within its timeout (a process that stopped, a machine that went away), so a run never hangs. While
waiting for slower ranks a process sleeps (MPI's own blocking calls spin a core each, which on a
machine running several ranks takes cores from the ranks still computing); once every rank has
arrived the transfer is polled without sleeping.

`stats` counts what went through: calls, payload bytes, the bytes this rank sent by a
bandwidth-optimal all-reduce (2 (N-1)/N of the payload: reduce-scatter then all-gather, what MPICH
and NCCL do for large messages), seconds waiting for other ranks to arrive and seconds moving
data. This module is not a launcher (the CLI starts processes through `mpiexec`) and holds no
training logic.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import pickle
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from ..backend import array_module, to_host
from ..errors import EngineError

log = logging.getLogger(__name__)

KINDS = ("auto", "single", "mpi", "nccl")
DEFAULT_BUCKET_BYTES = 32 << 20  # all-reduce message size: large enough for full bandwidth
DEFAULT_TIMEOUT_S = 300.0  # a rank that has not answered a step's collective in this long is gone
SETUP_TIMEOUT_S = 3600.0  # before step 1 (loading, hashing a large model file on a slow disk)
_PATIENT_AFTER_S = 200e-6  # spin this long before sleeping between polls
_MAX_SLEEP_S = 2e-3  # longest sleep between two polls while waiting for slower ranks
# environment variables an MPI launcher sets in every process it starts (MPICH/Hydra, Open MPI, PMIx)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class CollectiveError(EngineError):
    """A collective backend cannot be used (not installed, no launcher) or failed."""


class RankTimeout(CollectiveError):
    """Another rank did not answer within the timeout: it died, stopped, or lost the network."""


@dataclass
class CommStats:
    """What went through the collective since the last `reset`."""

    calls: int = 0  # collective operations
    payload_bytes: int = 0  # bytes of the arrays given to all-reduce and broadcast
    sent_bytes: int = 0  # bytes this rank sent (all-reduce: 2 (N-1)/N of its payload; see module doc)
    wait_s: float = 0.0  # seconds waiting for the other ranks to arrive (their compute, not the network)
    transfer_s: float = 0.0  # seconds from every rank's arrival to the data being in place

    @property
    def seconds(self) -> float:
        return self.wait_s + self.transfer_s

    def reset(self) -> None:
        self.calls = self.payload_bytes = self.sent_bytes = 0
        self.wait_s = self.transfer_s = 0.0


def bucket_plan(arrays: Sequence[Any], bucket_bytes: int) -> list[list[int]]:
    """Consecutive runs of array indices, one dtype each, of at most `bucket_bytes` (an array larger
    than that is a bucket alone). The order is the arrays' own, so every rank plans the same."""
    buckets: list[list[int]] = []
    size = 0
    dtype = None
    for i, a in enumerate(arrays):
        n = int(a.nbytes)
        if not buckets or a.dtype != dtype or size + n > bucket_bytes:
            buckets.append([])
            size, dtype = 0, a.dtype
        buckets[-1].append(i)
        size += n
    return buckets


def launched_size() -> int:
    """How many processes an MPI launcher started this one among (1 when none did)."""
    for var in _SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launched_rank() -> int:
    """This process's rank as the MPI launcher's environment says (0 when none did)."""
    for var in _RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def find_mpiexec() -> str | None:
    """The `mpiexec` beside this Python (the MPI wheel puts it in the environment's bin folder),
    else the first on PATH; None when there is none."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


class Collective:
    """One process alone (`kind` "single"): rank 0 of 1; every operation is the identity."""

    kind = "single"

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT_S, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if timeout <= 0:
            raise CollectiveError(f"the rank timeout must be a positive number of seconds, got {timeout!r}")
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.timeout = float(timeout)
        self.bucket_bytes = int(bucket_bytes)
        self.host = socket.gethostname()
        self.stats = CommStats()

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        """Whether training goes through the data-parallel path (every backend but single, even with
        one rank: a one-process MPI or NCCL run checks the same code a larger one runs)."""
        return self.kind != "single"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank {self.rank} of {self.size} on {self.host})"

    # every rank calls these in the same order
    def allreduce(self, arrays: Sequence[Any], *, timeout: float | None = None) -> None:
        """Sum `arrays` over the ranks, in place."""
        self.stats.calls += 1
        self.stats.payload_bytes += sum(int(a.nbytes) for a in arrays)

    def broadcast(self, arrays: Sequence[Any], root: int = 0, *, timeout: float | None = None) -> None:
        """Rank `root`'s values of `arrays` into every rank's, in place."""
        self.stats.calls += 1

    def broadcast_object(self, obj: Any = None, root: int = 0, *, timeout: float | None = None) -> Any:
        """Rank `root`'s `obj` (pickled) on every rank."""
        return obj

    def allgather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        return [obj]

    def any(self, flag: bool, *, timeout: float | None = None) -> bool:
        """True on every rank when `flag` is true on at least one."""
        return bool(flag)

    def barrier(self, *, timeout: float | None = None) -> None:
        """Returns when every rank has called it."""

    def abort(self, code: int = 1) -> NoReturn:
        """End this process and every other rank of the run now, with exit status `code`."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def close(self) -> None:
        """Release the backend's resources (the process keeps running)."""


# --- MPI -----------------------------------------------------------------------------------------


def _import_mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise CollectiveError(
            "the mpi collective needs mpi4py and an MPI library: pip install 'tune-studio[mpi]' "
            f"(mpi4py and MPICH's wheel) ({exc})"
        ) from exc
    except RuntimeError as exc:  # mpi4py found no MPI library to load
        raise CollectiveError(
            f"mpi4py cannot load an MPI library ({exc}): pip install 'tune-studio[mpi]' brings MPICH's wheel"
        ) from exc
    return MPI


_MPI_TYPES = {
    np.dtype(np.float32): "FLOAT",
    np.dtype(np.float64): "DOUBLE",
    np.dtype(np.int32): "INT32_T",
    np.dtype(np.int64): "INT64_T",
    np.dtype(np.uint8): "UINT8_T",
}


class MpiCollective(Collective):
    """Processes started by an MPI launcher (`mpiexec`), over mpi4py."""

    kind = "mpi"

    def __init__(
        self, comm=None, *, timeout: float = DEFAULT_TIMEOUT_S, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ):
        super().__init__(timeout=timeout, bucket_bytes=bucket_bytes)
        MPI = _import_mpi()
        self.MPI = MPI
        self.comm = (comm or MPI.COMM_WORLD).Dup()  # our own context: no clash with other MPI users
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self._buffers: dict[tuple[int, np.dtype], np.ndarray] = {}  # bucket buffers, reused every step

    # waiting ------------------------------------------------------------------------------------
    def _wait(self, requests: list, timeout: float | None, what: str, *, patient: bool) -> float:
        """Poll `requests` until all complete; sleeping between polls when `patient` (other ranks may
        still be computing). Seconds waited; RankTimeout after `timeout`."""
        limit = self.timeout if timeout is None else timeout
        t0 = time.perf_counter()
        delay = 20e-6
        polls = 0
        while not self.MPI.Request.Testall(requests):
            polls += 1
            now = time.perf_counter()
            if now - t0 > limit:
                raise RankTimeout(
                    f"rank {self.rank} ({self.host}) waited {limit:.0f} s for the other ranks to {what}: "
                    "a rank died, stopped or lost the network; the run is ended on every rank"
                )
            if patient and now - t0 > _PATIENT_AFTER_S:
                time.sleep(delay)
                delay = min(delay * 2, _MAX_SLEEP_S)
            elif polls % 64 == 0:
                time.sleep(0)  # let a rank sharing this core compute
        return time.perf_counter() - t0

    def _arrive(self, timeout: float | None, what: str) -> None:
        """Wait, sleeping, until every rank has reached this operation."""
        self.stats.wait_s += self._wait([self.comm.Ibarrier()], timeout, what, patient=True)

    # arrays -------------------------------------------------------------------------------------
    def _buffer(self, slot: int, dtype: np.dtype, n: int) -> np.ndarray:
        buf = self._buffers.get((slot, dtype))
        if buf is None or buf.size < n:
            buf = self._buffers[(slot, dtype)] = np.empty(n, dtype)
        return buf[:n]

    def _pack(self, arrays: Sequence[Any], bucket: list[int], slot: int) -> np.ndarray:
        dtype = np.dtype(arrays[bucket[0]].dtype)
        buf = self._buffer(slot, dtype, sum(int(arrays[i].size) for i in bucket))
        o = 0
        for i in bucket:
            a = arrays[i]
            buf[o : o + a.size] = to_host(a).reshape(-1)
            o += a.size
        return buf

    @staticmethod
    def _unpack(arrays: Sequence[Any], bucket: list[int], buf: np.ndarray) -> None:
        o = 0
        for i in bucket:
            a = arrays[i]
            part = buf[o : o + a.size].reshape(a.shape)
            if isinstance(a, np.ndarray):
                np.copyto(a, part)
            else:  # a device array, staged through the host
                a[...] = array_module(a).asarray(part)
            o += a.size

    def _typed(self, buf: np.ndarray):
        name = _MPI_TYPES.get(buf.dtype)
        if name is None:
            raise CollectiveError(f"cannot send arrays of {buf.dtype} over MPI")
        return [buf, getattr(self.MPI, name)]

    def _buckets(self, arrays: Sequence[Any], timeout: float | None, what: str, start, unpack: bool) -> int:
        """Every rank arrived, each bucket packed and `start(buffer)`ed (all in flight at once), the
        requests waited for, the results unpacked; the payload's bytes."""
        self._arrive(timeout, f"reach {what}")
        t0 = time.perf_counter()
        plan = bucket_plan(arrays, self.bucket_bytes)
        bufs = [self._pack(arrays, bucket, slot) for slot, bucket in enumerate(plan)]
        self._wait([start(self._typed(buf)) for buf in bufs], timeout, f"finish {what}", patient=False)
        if unpack:
            for bucket, buf in zip(plan, bufs, strict=True):
                self._unpack(arrays, bucket, buf)
        payload = sum(b.nbytes for b in bufs)
        self.stats.calls += 1
        self.stats.payload_bytes += payload
        self.stats.transfer_s += time.perf_counter() - t0
        return payload

    def allreduce(self, arrays: Sequence[Any], *, timeout: float | None = None) -> None:
        if not arrays:
            return
        MPI = self.MPI
        start = lambda b: self.comm.Iallreduce(MPI.IN_PLACE, b, op=MPI.SUM)  # noqa: E731
        payload = self._buckets(arrays, timeout, "the gradient all-reduce", start, unpack=True)
        self.stats.sent_bytes += payload * 2 * (self.size - 1) // self.size

    def broadcast(self, arrays: Sequence[Any], root: int = 0, *, timeout: float | None = None) -> None:
        if not arrays:
            return
        start = lambda b: self.comm.Ibcast(b, root=root)  # noqa: E731
        payload = self._buckets(arrays, timeout, "a broadcast", start, unpack=self.rank != root)
        self.stats.sent_bytes += payload * (self.size - 1) if self.rank == root else 0

    # small host messages ------------------------------------------------------------------------
    def broadcast_object(self, obj: Any = None, root: int = 0, *, timeout: float | None = None) -> Any:
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        n = np.array([data.size if self.rank == root else 0], np.int64)
        self._arrive(timeout, "reach a broadcast")
        self._wait([self.comm.Ibcast([n, self.MPI.INT64_T], root=root)], timeout, "broadcast", patient=True)
        buf = np.array(data, copy=True) if self.rank == root else np.empty(int(n[0]), np.uint8)
        self._wait([self.comm.Ibcast([buf, self.MPI.UINT8_T], root=root)], timeout, "broadcast", patient=True)
        self.stats.calls += 1
        return obj if self.rank == root else pickle.loads(buf.tobytes())  # noqa: S301 - our own ranks

    def allgather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8).copy()
        counts = np.zeros(self.size, np.int64)
        self._arrive(timeout, "exchange their facts")
        mine = np.array([data.size], np.int64)
        req = self.comm.Iallgather([mine, self.MPI.INT64_T], [counts, self.MPI.INT64_T])
        self._wait([req], timeout, "exchange their facts", patient=True)
        out = np.empty(int(counts.sum()), np.uint8)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        req = self.comm.Iallgatherv([data, self.MPI.UINT8_T], [out, (counts, displs), self.MPI.UINT8_T])
        self._wait([req], timeout, "exchange their facts", patient=True)
        self.stats.calls += 1
        return [pickle.loads(out[d : d + c].tobytes()) for d, c in zip(displs, counts, strict=True)]  # noqa: S301

    def any(self, flag: bool, *, timeout: float | None = None) -> bool:
        buf = np.array([1 if flag else 0], np.int32)
        self._arrive(timeout, "agree whether to stop")
        req = self.comm.Iallreduce(self.MPI.IN_PLACE, [buf, self.MPI.INT32_T], op=self.MPI.MAX)
        self._wait([req], timeout, "agree whether to stop", patient=False)
        self.stats.calls += 1
        return bool(buf[0])

    def barrier(self, *, timeout: float | None = None) -> None:
        self._arrive(timeout, "reach a barrier")
        self.stats.calls += 1

    def abort(self, code: int = 1) -> NoReturn:
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)
        os._exit(code)  # not reached: MPI_Abort ends the process

    def close(self) -> None:
        try:
            self.comm.Free()
        except Exception:  # noqa: BLE001 - already freed or MPI finalized
            pass


# --- NCCL ----------------------------------------------------------------------------------------


def _preload_nccl() -> None:
    """Load NCCL from its pip wheel (nvidia-nccl-cu12/-cu13, which torch also brings) before CuPy
    looks for it by name, for a CuPy that does not find the wheel itself."""
    for root in sys.path:
        for path in glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnccl.so.2")) + glob.glob(
            os.path.join(root, "nvidia", "nccl", "lib", "libnccl.so*")
        ):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def _import_nccl():
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - a broken CUDA install can raise anything at import
        raise CollectiveError(
            f"the nccl collective needs CuPy on a CUDA GPU: pip install 'tune-studio[nccl]' ({exc})"
        ) from exc
    _preload_nccl()
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001
        raise CollectiveError(f"CuPy's NCCL binding cannot be imported ({exc})") from exc
    if not getattr(nccl, "available", True):
        raise CollectiveError(
            "CuPy finds no NCCL library: pip install 'tune-studio[nccl]' (NCCL's wheel), or set "
            "LD_LIBRARY_PATH to a folder holding libnccl.so.2"
        )
    return cupy, nccl


def nccl_available() -> tuple[bool, str]:
    """(True, "") when the nccl collective can be used here, else (False, why)."""
    try:
        cupy, _ = _import_nccl()
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any failure means: not here, and why
        return False, str(exc)
    return True, ""


class NcclCollective(Collective):
    """One GPU per process over NCCL; `host` (MPI, or `Collective` for one process) carries NCCL's
    unique id and the small host messages."""

    kind = "nccl"

    def __init__(
        self,
        host: Collective,
        device_index: int,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ):
        super().__init__(timeout=timeout, bucket_bytes=bucket_bytes)
        cupy, nccl = _import_nccl()
        self.cupy, self.nccl = cupy, nccl
        self.host_comm = host
        self.rank, self.size = host.rank, host.size
        self.local_rank, self.local_size = host.local_rank, host.local_size
        self.device_index = device_index
        uid = host.broadcast_object(nccl.get_unique_id() if host.is_root else None, timeout=SETUP_TIMEOUT_S)
        with cupy.cuda.Device(device_index):
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._types = {
            np.dtype(np.float32): nccl.NCCL_FLOAT32,
            np.dtype(np.float64): nccl.NCCL_FLOAT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16,
            np.dtype(np.int32): nccl.NCCL_INT32,
            np.dtype(np.int64): nccl.NCCL_INT64,
            np.dtype(np.uint8): nccl.NCCL_UINT8,
        }
        self._buffers: dict[tuple[int, np.dtype], Any] = {}

    def _buffer(self, slot: int, dtype: np.dtype, n: int):
        buf = self._buffers.get((slot, dtype))
        if buf is None or buf.size < n:
            with self.cupy.cuda.Device(self.device_index):
                buf = self._buffers[(slot, dtype)] = self.cupy.empty(n, dtype)
        return buf[:n]

    def _finish(self, stream, timeout: float | None, what: str) -> None:
        """Wait (sleeping) for the queued NCCL work; on timeout abort the communicator and raise."""
        limit = self.timeout if timeout is None else timeout
        event = self.cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        t0 = time.perf_counter()
        delay = 20e-6
        while not event.done:
            if time.perf_counter() - t0 > limit:
                self.comm.abort()
                raise RankTimeout(
                    f"rank {self.rank} ({self.host}) waited {limit:.0f} s for the other GPUs to {what}: "
                    "a rank died, stopped or lost the network; the run is ended on every rank"
                )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_SLEEP_S)
        self.stats.transfer_s += time.perf_counter() - t0

    def _run(self, arrays: Sequence[Any], timeout: float | None, what: str, op) -> int:
        """Pack each bucket on the device, run `op(buf, nccl_type, stream)` on it, unpack."""
        cupy = self.cupy
        payload = 0
        with cupy.cuda.Device(self.device_index):
            stream = cupy.cuda.get_current_stream()  # after the work that made the arrays
            staged = {i: cupy.asarray(a) for i, a in enumerate(arrays) if isinstance(a, np.ndarray)}
            work = [staged.get(i, a) for i, a in enumerate(arrays)]
            for slot, bucket in enumerate(bucket_plan(work, self.bucket_bytes)):
                dtype = np.dtype(work[bucket[0]].dtype)
                if dtype not in self._types:
                    raise CollectiveError(f"cannot send arrays of {dtype} over NCCL")
                buf = self._buffer(slot, dtype, sum(int(work[i].size) for i in bucket))
                o = 0
                for i in bucket:
                    buf[o : o + work[i].size] = work[i].reshape(-1)
                    o += work[i].size
                op(buf, self._types[dtype], stream.ptr)
                o = 0
                for i in bucket:
                    work[i][...] = buf[o : o + work[i].size].reshape(work[i].shape)
                    o += work[i].size
                payload += buf.nbytes
            self._finish(stream, timeout, what)
            for i, a in staged.items():
                np.copyto(arrays[i], cupy.asnumpy(a))
        return payload

    def allreduce(self, arrays: Sequence[Any], *, timeout: float | None = None) -> None:
        if not arrays:
            return

        def op(buf, dtype, stream):
            self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dtype, self.nccl.NCCL_SUM, stream)

        payload = self._run(arrays, timeout, "finish the gradient all-reduce", op)
        self.stats.calls += 1
        self.stats.payload_bytes += payload
        self.stats.sent_bytes += payload * 2 * (self.size - 1) // self.size

    def broadcast(self, arrays: Sequence[Any], root: int = 0, *, timeout: float | None = None) -> None:
        if not arrays:
            return

        def op(buf, dtype, stream):
            self.comm.broadcast(buf.data.ptr, buf.data.ptr, buf.size, dtype, root, stream)

        payload = self._run(arrays, timeout, "finish a broadcast", op)
        self.stats.calls += 1
        self.stats.payload_bytes += payload

    def broadcast_object(self, obj: Any = None, root: int = 0, *, timeout: float | None = None) -> Any:
        return self.host_comm.broadcast_object(obj, root, timeout=timeout)

    def allgather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        return self.host_comm.allgather_object(obj, timeout=timeout)

    def any(self, flag: bool, *, timeout: float | None = None) -> bool:
        return self.host_comm.any(flag, timeout=timeout)

    def barrier(self, *, timeout: float | None = None) -> None:
        self.host_comm.barrier(timeout=timeout)

    def abort(self, code: int = 1) -> NoReturn:
        try:
            self.comm.abort()
        finally:
            self.host_comm.abort(code)

    def close(self) -> None:
        self.comm.destroy()
        self.host_comm.close()


# --- choosing one --------------------------------------------------------------------------------


def resolve_kind(kind: str, device: str = "cpu") -> str:
    """The backend `kind` means here: "auto" is mpi when an MPI launcher started several processes
    (nccl instead on a GPU where NCCL can be used), else single."""
    if kind not in KINDS:
        raise CollectiveError(f"unknown collective {kind!r}; use {', '.join(KINDS)}")
    launched = launched_size()
    if kind == "single" and launched > 1:
        raise CollectiveError(
            f"this process is one of {launched} started by mpiexec, but the collective is 'single': "
            "every process would train alone and write the same files; use --collective mpi (or auto)"
        )
    if kind != "auto":
        return kind
    if launched == 1:
        return "single"
    if device != "cpu" and nccl_available()[0]:
        return "nccl"
    return "mpi"


def rank_device(device: str, local_rank: int) -> str:
    """The GPU a rank computes on: `cuda`/`auto` become cuda:<local rank modulo the GPUs>; an
    explicit cuda:N is kept (each machine's command line may name its own)."""
    d = (device or "auto").strip().lower()
    if d not in ("cuda", "gpu", "auto"):
        return device
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: the CPU, as `auto` would choose
        return device
    if n < 1:
        return device
    return f"cuda:{local_rank % n}"


def open_collective(
    kind: str = "auto",
    *,
    device: str = "cpu",
    timeout: float = DEFAULT_TIMEOUT_S,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> Collective:
    """The collective this process takes part in (see `resolve_kind`); for nccl, `device` is the
    rank's GPU (`rank_device`)."""
    kind = resolve_kind(kind, device)
    if kind == "single":
        return Collective(timeout=timeout, bucket_bytes=bucket_bytes)
    if kind == "mpi":
        return MpiCollective(timeout=timeout, bucket_bytes=bucket_bytes)
    host = MpiCollective(timeout=timeout) if launched_size() > 1 else Collective(timeout=timeout)
    d = rank_device(device, host.local_rank)
    if not d.startswith("cuda:"):
        raise CollectiveError(f"the nccl collective computes on a GPU: use --device cuda, not {device!r}")
    return NcclCollective(host, int(d.split(":")[1]), timeout=timeout, bucket_bytes=bucket_bytes)
