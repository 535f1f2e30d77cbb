"""The Chat page's decisions and state, in plain Python without Qt.

`ChatController` holds the conversation as the model sees it (`history`), the Base / Adapter toggle
(`use_adapter`, and the adapter it goes back to), what streams (`stream`) and the blind pair being
judged; it says which adapter answers for an entry of the adapter list, what the toggle does, and
what the adapter box shows. The functions say what the page's buttons offer while a job runs
(`controls`), and the texts of a seed, a failure, a comparison and a wait.

The page (studio.pages.chat.page) lays the widgets out and wires them to these.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from engine import RUN

from ..generation import StreamBuffer, chat_messages

BASE = "base"  # the adapter list's "Base model" entry
RUN_LABEL = "Live adapter of the training run"


@dataclass(frozen=True)
class Controls:
    """What the page's controls offer while the page is `busy` ("", "chat" or "compare")."""

    send: bool  # Send and Compare
    stop: bool  # the Chat tab's Stop
    compare_stop: bool  # the Side by side tab's Stop
    adapter: bool  # the adapter list and the Base / Adapter toggle


def controls(busy: str) -> Controls:
    return Controls(send=not busy, stop=busy == "chat", compare_stop=busy == "compare", adapter=not busy)


@dataclass(frozen=True)
class AdapterView:
    """What the adapter box shows: the toggle, the hand-over buttons and the note under them."""

    use_adapter: bool
    export: bool  # Export… (an adapter file is chosen)
    rate: bool  # Rate answers (anything but the live adapter of a run)
    note: str
    note_tip: str


class ChatController:
    """The conversation, the adapter toggle and the stream; see the module docstring."""

    def __init__(self) -> None:
        self.history: list[dict[str, str]] = []  # the conversation as the model sees it (no system)
        self.use_adapter = False
        self.last_adapter: object = None  # the adapter entry the toggle goes back to
        self.none_to_turn_on = False  # Adapter was pressed with no adapter to turn on
        self.stream = StreamBuffer()
        self.blind_context: dict | None = None  # the messages and facts of the blind pair being judged

    # --- the conversation ---------------------------------------------------------------------
    def messages_for(self, system: str, user: str) -> list[dict[str, str]]:
        """The conversation the model is given for the next answer: system, history, the new turn."""
        return chat_messages(system, user, self.history)

    def answered(self, user: str, answer: str) -> None:
        """A turn finished: it joins the conversation."""
        self.history += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]

    def turns(self) -> int:
        return sum(m["role"] == "user" for m in self.history)

    def last_prompt(self, typed: str = "", compare_typed: str = "") -> str:
        """The prompt to hand on: the last message sent, else what is typed (message box, then the
        side by side prompt)."""
        for m in reversed(self.history):
            if m["role"] == "user":
                return m["content"]
        return typed.strip() or compare_typed.strip()

    # --- the adapter --------------------------------------------------------------------------
    def adapter(self, data: object) -> str | None:
        """What answers with the list at entry `data`: None (the base model), engine.RUN, or a file."""
        if not self.use_adapter or data in (None, BASE):
            return None
        return str(data)

    def adapter_changed(self, data: object) -> None:
        """An entry of the list was chosen: an adapter turns the toggle on, the base model off."""
        self.none_to_turn_on = False
        if data in (None, BASE):
            self.use_adapter = False
        else:
            self.last_adapter = data
            self.use_adapter = True

    def toggle(self, on: bool, data: object, default: object) -> object:
        """The Base / Adapter toggle set to `on` with the list at `data`; `default`: the list's default
        run's adapter (None: none). Returns the entry the list must select (its change comes back
        through `adapter_changed`), else None (the toggle is set, or there is nothing to turn on:
        `use_adapter` stays off and the note asks for one)."""
        self.none_to_turn_on = False
        if on and data in (None, BASE):
            if self.last_adapter is None:
                self.last_adapter = default
            self.none_to_turn_on = self.last_adapter is None
            return self.last_adapter
        self.use_adapter = on
        return None

    def adapter_view(self, data: object, path: str | None, busy: str) -> AdapterView:
        """The adapter box for the list at entry `data` (`path`: its file, when it has one)."""
        file = export_request(path)
        if data == RUN:
            note = "The run's adapter as trained so far: answers wait while it takes steps."
        elif file is not None and not self.use_adapter:
            note = "Answering with the base model; Adapter switches the adapter back on."
        elif file is not None:
            note = file
        elif self.none_to_turn_on:
            note = "Choose an adapter in the list first."
        else:
            note = ""
        return AdapterView(
            self.use_adapter, file is not None and not busy, data != RUN and not busy, note, file or ""
        )


def rate_request(data: object) -> str | None:
    """The adapter Rate answers hands to the Rewards page ("": a new one, for the base model); None
    for the live adapter of a run (it cannot be continued while it trains)."""
    if data == RUN:
        return None
    return "" if data in (None, BASE) else str(data)


def export_request(path: str | None) -> str | None:
    """The adapter file Export… hands on; None when the entry is not a file."""
    return path if path not in (None, BASE, RUN) else None


def compare_adapter(data: object) -> str | None:
    """The adapter Side by side compares with the base model (the toggle does not matter there)."""
    return None if data in (None, BASE) else str(data)


def adapter_name(run_name: str | None, run_kind: str | None, label: str) -> str:
    """The chosen adapter in a few words: its run's name (reward-tuned ones say so), or the list's
    label without its prefix."""
    if run_name is not None:
        return f"{run_name} (reward-tuned)" if run_kind == "rewards" else run_name
    return label.removeprefix("Latest finished: ").removeprefix("File · ")


def adapter_label(adapter: str | None, name: str) -> str:
    """Who answers, as an answer's header says it (`name`: `adapter_name`)."""
    if adapter is None:
        return "Base model"
    if adapter == RUN:
        return RUN_LABEL
    return f"Adapter · {name}"


def seed_note(turns: int, label: str, seed: int | None) -> str:
    """The status line after an answer: the turns, who answered, the seed."""
    said = f"seed {seed}" if seed is not None else "a random seed"
    return f"{turns} turn{'s' if turns != 1 else ''} · last answer: {label.lower()}, {said}"


def failure_text(message: str, adapter: str | None) -> str:
    """The banner of an answer that failed, with what to do next."""
    if "context" in message and "fit" in message:
        hint = "The conversation is longer than the model's context: start a New chat (Ctrl+N)."
    elif adapter == RUN:
        hint = "Start (or pause) a training run on the Train page, or choose another adapter."
    elif adapter:
        hint = "Choose another adapter, or the base model."
    else:
        hint = "Check the model on the Model page and the sampling settings, then send again."
    return f"Could not answer: {message}. {hint} Your message is back in the box."


def compare_status(seed: int, texts: Sequence[str]) -> str:
    """The Side by side status once the answers are in (`texts`: those that came, base first)."""
    if len(texts) != 2:
        return "Stopped."
    what = (
        "The same answer: the adapter does not change this one."
        if texts[0] == texts[1]
        else "The answers differ."
    )
    return f"Seed {seed}, the same sampling for both. {what}"


def waiting_text(ahead: Sequence[tuple[str, str]]) -> str | None:
    """What a job queued behind others waits for (`ahead`: (name, state) of the engine's active jobs,
    in order); None when none is ahead."""
    if not ahead:
        return None
    running = next((name for name, state in ahead if state == "running"), ahead[0][0])
    return f"Waiting for the engine ({running}): the answer starts when it is done or paused."


def placeholder(model: str | None, who: str, send_keys: str, new_keys: str) -> str:
    """The empty conversation's text: what to do first (`who`: "the base model" or the adapter)."""
    if not model:
        return "No model is open: open one on the Model page, then chat with it here."
    return (
        f"Chat with {os.path.basename(model)} ({who}).\n\nType a message below and press {send_keys}. "
        f"The conversation is kept until New chat ({new_keys})."
    )


def blind_extra(seed: int, model: str | None) -> dict:
    """What a blind choice of the side by side tab records beside the pair."""
    return {"source": "chat side by side", "seed": seed, "model": os.path.basename(model or "")}


__all__ = [
    "BASE",
    "AdapterView",
    "ChatController",
    "Controls",
    "adapter_label",
    "adapter_name",
    "blind_extra",
    "compare_adapter",
    "compare_status",
    "controls",
    "export_request",
    "failure_text",
    "placeholder",
    "rate_request",
    "seed_note",
    "waiting_text",
]
