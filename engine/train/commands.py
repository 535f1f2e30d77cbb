"""The command lines of a training run started outside this process: N processes on this machine
(`tune-engine train ... --ranks N`), or `mpiexec -n N -hosts a,b tune-engine train ...` across
machines, with the run's settings in a JSON file (`--settings`, what `TrainConfig.to_json` writes)
and its events in a file the app follows (engine.train.events.follow_events). The studio shows these
commands and runs the local one; this module only builds them (it starts nothing).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from collections.abc import Sequence

from .collective import find_mpiexec


def local_ranks_available() -> tuple[bool, str]:
    """(True, "") when `--ranks N` can start processes here (mpi4py and an mpiexec), else (False, why).
    Nothing is imported: MPI starts in the processes, never in the caller."""
    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed: pip install 'tune-studio[mpi]'"
    if find_mpiexec() is None:
        return False, "no mpiexec: pip install 'tune-studio[mpi]' (MPICH's wheel brings it)"
    return True, ""


def train_command(
    model: str,
    data: str,
    *,
    settings: str,
    out: str,
    checkpoint_dir: str | None = None,
    events: str | None = None,
    ranks: int = 1,
    hosts: Sequence[str] = (),
    template_file: str | None = None,
    device: str = "cpu",
    program: Sequence[str] | None = None,
    resume: str | None = None,
    accept_changes: bool = False,
) -> list[str]:
    """The command line of a training run: `ranks` processes on this machine (`--ranks`), or,
    with `hosts`, `mpiexec -n <ranks> -hosts a,b tune-engine train ...` across those machines.
    `program`: how to call tune-engine (default: this Python's `-m engine.cli` here, the
    `tune-engine` on each machine's PATH across machines). `resume`: a checkpoint the run continues
    (any number of ranks resumes it), `accept_changes` when the settings or data differ from its run's."""
    if hosts:
        prog = list(program or ["tune-engine"])
        head = ["mpiexec", "-n", str(ranks), "-hosts", ",".join(hosts), *prog]
    else:
        head = list(program or [sys.executable, "-m", "engine.cli"])
    args = [*head, "train", model, data, "--settings", settings, "--out", out]
    if checkpoint_dir:
        args += ["--checkpoint-dir", checkpoint_dir]
    if events:
        args += ["--events", events]
    if template_file:
        args += ["--template-file", template_file]
    if resume:
        args += ["--resume", resume] + (["--accept-changes"] if accept_changes else [])
    if device != "cpu":
        args += ["--device", device]
    if hosts:
        args += ["--collective", "mpi"] if device == "cpu" else []
    elif ranks > 1:
        args += ["--ranks", str(ranks)]
    return args


def shell_line(command: Sequence[str]) -> str:
    """A command as one line to paste into a shell."""
    return shlex.join(command)
