"""The Train page's run, as states and the moves between them, without Qt.

A run is `RunState.IDLE` until Start; `LOADING` while the engine opens the model and prepares the
data; `TRAINING` from its Started event; `PAUSING` after Pause until the step ends, then `PAUSED`
(in memory: Resume goes on, Stop ends it); `STOPPING` after Stop until the checkpoint is written;
and it ends `FINISHED` (complete or stopped) or `FAILED`. `RunStates` holds the state and refuses a
move the page must never make (`MOVES`), so a late event cannot undo a request: a Started event
that comes after Stop leaves the run STOPPING, not TRAINING. `controls` says which of the page's
buttons a state offers.

The page (studio.pages.train.page) does what a move means on screen: buttons, log, plots.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RunState(str, Enum):
    """A state of the Train page's run; equal to its name in lower case ("training")."""

    IDLE = "idle"
    LOADING = "loading"
    TRAINING = "training"
    PAUSING = "pausing"
    PAUSED = "paused"
    STOPPING = "stopping"
    FINISHED = "finished"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def active(self) -> bool:
        """The engine works on the run (a paused run is not active: it waits in memory)."""
        return self in ACTIVE


ACTIVE = frozenset({RunState.LOADING, RunState.TRAINING, RunState.PAUSING, RunState.STOPPING})
_ENDS = frozenset({RunState.PAUSED, RunState.FINISHED, RunState.FAILED})  # where a run segment ends

# Where each state may go (staying where it is is always allowed).
MOVES: dict[RunState, frozenset[RunState]] = {
    RunState.IDLE: frozenset({RunState.LOADING}),
    RunState.LOADING: frozenset({RunState.TRAINING, RunState.STOPPING}) | _ENDS,
    RunState.TRAINING: frozenset({RunState.PAUSING, RunState.STOPPING}) | _ENDS,
    RunState.PAUSING: _ENDS,
    # Resume goes on in memory; Stop ends it; a new model forgets it; ending it may fail
    RunState.PAUSED: frozenset(
        {RunState.TRAINING, RunState.STOPPING, RunState.IDLE, RunState.FINISHED, RunState.FAILED}
    ),  # fmt: skip
    RunState.STOPPING: _ENDS,
    RunState.FINISHED: frozenset({RunState.LOADING, RunState.IDLE}),
    RunState.FAILED: frozenset({RunState.LOADING, RunState.IDLE}),
}


class RunStates:
    """The run's state and its moves; see the module docstring."""

    def __init__(self) -> None:
        self.state = RunState.IDLE

    def move(self, new: RunState | str) -> bool:
        """Go to `new`; True when the state changed. ValueError for a move `MOVES` does not allow."""
        new = RunState(new)
        if new is self.state:
            return False
        if new not in MOVES[self.state]:
            raise ValueError(f"the run cannot go from {self.state} to {new}")
        self.state = new
        return True

    def reset(self) -> None:
        """A new project: no run (whatever the state was: the page has ended the run first)."""
        self.state = RunState.IDLE

    def started(self) -> bool:
        """The engine's Started event: TRAINING, unless a Stop came first (it stays STOPPING)."""
        if self.state is RunState.STOPPING:
            return False
        return self.move(RunState.TRAINING)

    def can_pause(self, in_process: bool) -> bool:
        """Pause waits for the step to end; only a run in this process can hold its state in memory."""
        return self.state is RunState.TRAINING and in_process

    def can_stop(self) -> bool:
        """Stop ends a loading, training or paused run (a pausing one first pauses, then can be ended)."""
        return self.state in (RunState.LOADING, RunState.TRAINING, RunState.PAUSED)


@dataclass(frozen=True)
class Controls:
    """What the page's buttons offer in a state."""

    pause: bool
    resume: bool
    stop: bool
    locked: bool  # settings, processes, output folder and "Resume from…" wait for the run


def controls(state: RunState, *, can_resume: bool, in_process: bool) -> Controls:
    """The buttons of `state`; can_resume: a paused run in memory or a checkpoint of this model's run
    with steps left (the page knows); in_process: the run is not on processes beside the app."""
    return Controls(
        pause=state is RunState.TRAINING and in_process,
        resume=state in (RunState.IDLE, RunState.PAUSED, RunState.FAILED, RunState.FINISHED) and can_resume,
        stop=state in (RunState.LOADING, RunState.TRAINING, RunState.PAUSED),
        locked=state.active,
    )
