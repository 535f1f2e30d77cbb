"""`tune-engine train` over several processes: `--ranks N` on this machine, or `mpiexec` across machines.

`--ranks N` starts N copies of the same command through MPI's launcher (`mpiexec -n N`, the one
beside this Python that MPICH's wheel installs, else the first on PATH), each with
`--collective mpi`, forwards Ctrl-C and termination to it once, and returns its exit status.
Started by `mpiexec` (here or across machines: `mpiexec -n 4 -hosts a,b tune-engine train ...`),
each process opens its collective (engine.train.collective), computes on its own GPU when the run
is on one (`cuda` becomes cuda:<local rank>), and only rank 0 prints progress and writes events.
A rank that fails alone (its model file missing, an error of its own, another rank gone silent)
ends every rank at once through MPI_Abort with a non-zero status; a failure every rank agreed on
(ranks that differ before step 1, a non-finite loss) ends each normally with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace

from ..train.collective import (
    DEFAULT_TIMEOUT_S,
    Collective,
    find_mpiexec,
    launched_size,
    open_collective,
    rank_device,
    resolve_kind,
)
from ..train.threads import usable_cores
from ..train.trainer import TrainConfig


def add_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="data-parallel processes on this machine, started through mpiexec (default 1); across "
        "machines run `mpiexec -n N -hosts a,b tune-engine train ...` instead",
    )
    s.add_argument(
        "--collective",
        default="auto",
        choices=("auto", "single", "mpi", "nccl"),
        help="how ranks exchange gradients: auto (mpi when started by mpiexec, nccl for GPUs where "
        "NCCL is installed; default), single, mpi, nccl",
    )
    s.add_argument(
        "--rank-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds a rank waits for the others during a step before the run is ended on every "
        f"rank (default {DEFAULT_TIMEOUT_S:g}; at least 4 times the slowest step)",
    )


def child_argv(argv: list[str]) -> list[str]:
    """`argv` without --ranks (the children are the ranks), with --collective mpi unless chosen."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--ranks":
            skip = True
            continue
        if a.startswith("--ranks="):
            continue
        out.append(a)
    if not any(a == "--collective" or a.startswith("--collective=") for a in out):
        out += ["--collective", "mpi"]
    return out


def launch_local(n: int, argv: list[str], error) -> int:
    """Run `argv` (a tune-engine command line) as `n` ranks on this machine; their exit status."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise error(
            "--ranks needs MPI's launcher (mpiexec): pip install 'tune-studio[mpi]' installs mpi4py "
            "and MPICH's wheel with it"
        )
    env = dict(os.environ)
    if not any(v in env for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        env["OPENBLAS_NUM_THREADS"] = str(max(1, usable_cores() // n))  # the cores shared, not fought over
    command = [mpiexec, "-n", str(n), sys.executable, "-m", "engine.cli", *child_argv(argv)]
    # its own session: a Ctrl-C in the terminal reaches the ranks once, forwarded below, not twice
    proc = subprocess.Popen(command, env=env, start_new_session=True)  # noqa: S603 - our own command

    def forward(signum, frame) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def open_ranks(args: argparse.Namespace) -> Collective:
    """This process's collective; `args.device` becomes the rank's own GPU when it computes on one."""
    kind = resolve_kind(args.collective, args.device)
    comm = open_collective(kind, device=args.device, timeout=args.rank_timeout)
    if comm.kind == "nccl":
        args.device = f"cuda:{comm.device_index}"
    elif comm.size > 1:
        args.device = rank_device(args.device, comm.local_rank)
    return comm


def several_ranks_wanted(args: argparse.Namespace) -> bool:
    """`--ranks N` (N > 1) in a process no launcher started: it must start the ranks itself."""
    return getattr(args, "ranks", 1) > 1 and launched_size() == 1


def settings_config(path: str, given: TrainConfig, checkpoint_dir: str | None, error) -> TrainConfig:
    """The TrainConfig of a settings file, with the command line's paths and runtime (`given`)."""
    try:
        with open(path, encoding="utf-8") as f:
            loaded = TrainConfig.from_json(json.load(f))
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    except (ValueError, TypeError) as exc:
        raise error(f"{path}: not a run's settings ({exc})") from exc
    out = given.out
    if checkpoint_dir is None and loaded.checkpoint_every and out:
        checkpoint_dir = os.path.splitext(out)[0] + ".checkpoints"
    return replace(
        loaded, out=out, checkpoint_dir=checkpoint_dir, device=given.device, cache_budget=given.cache_budget
    )
