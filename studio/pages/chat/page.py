"""The Chat page: a conversation with the open model, with the base model or an adapter, and the
same prompt through both side by side.

Chat tab: type a message and send it (Ctrl+Enter); the answer streams in as it is generated
(`EngineSession.generate` with `on_token`), rendered with the model's chat template by the session;
Stop (Ctrl+. or Escape) ends it where it is. The conversation is kept until New chat (Ctrl+N while
the page has the focus); each answer says who gave it and has a Copy button (the last answer:
Ctrl+Shift+C). Side by side tab: one prompt, one seed, through the base model and through the
adapter, in two columns; with "Blind A/B" on, the two answers come as A and B in a random order, the
person chooses the better one (or a tie, or skips), and only then learns which was which: each
choice is appended to the preferences file (`<output folder>/preferences.jsonl`, flushed to disk at
once) as a {"messages", "chosen", "rejected"} pair, and "Train on choices" opens that file on the
Dataset page with the DPO objective (`sig_train_choices`).

On the right: which adapter (the base model, the live adapter of the current training run
`engine.RUN`, a run's adapter from the history, or any file), a Base / Adapter toggle (Ctrl+B), the
sampling settings, and "Export…" / "Rate answers", which hand the adapter to those pages
(`sig_export_requested`, `sig_rate_requested`; the window routes them). An adapter made for
another model is named before anything loads (its header against the model's tensors).

Generation is a job of the app's one engine worker (studio.worker) on the model it holds; tokens
are buffered by the worker and shown by a timer, so a fast model never floods the UI thread.
What this page is not: it trains nothing and keeps no conversation on disk.
"""

from __future__ import annotations

import html
import os

import numpy as np
from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QPlainTextEdit,
    QSizePolicy,
    QStackedWidget,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import RUN, EngineError, blind_pair

from ...project import ModelInfo
from ...widgets.blind_choice import BlindChoiceWidget, PreferenceRecorder, PreferencesFileRow
from ...widgets.buttons import action_button
from ...widgets.engine_page import RUNS_MOVED, JobPage
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import banner_over, splitter
from ...widgets.runs import RunChoiceWidget, load_runs
from ...widgets.side_panel import SidePanelWidget
from .conversation import AnswerColumnWidget, ConversationWidget, MessageWidget
from .settings import SamplingSettingsWidget

BASE = "base"  # the adapter list's "Base model" entry
STREAM_HZ = 20


def _keys(seq: str) -> str:
    return QKeySequence(seq).toString(QKeySequence.NativeText)


class ChatPage(JobPage):
    """Chat with the model; see the module docstring."""

    sig_export_requested = Signal(str)  # adapter path
    sig_rate_requested = Signal(str, str)  # adapter path ("" for the base model: a new adapter), prompt
    sig_answered = Signal(object)  # the engine Reply of each finished answer
    sig_compared = Signal(object, object)  # base Reply, adapter Reply
    sig_train_choices = Signal(str)  # the preferences file: train on the A/B choices (DPO)
    sig_chosen = Signal(str)  # a blind A/B choice was taken: "A", "B", "tie" or "skip"

    def __init__(self, *args, **kwargs):
        """EnginePage's arguments: project, engine, parent, settings."""
        super().__init__(*args, **kwargs)
        self.history: list[dict[str, str]] = []  # the conversation as the model sees it (no system)
        # busy: "", "chat" or "compare"
        self.use_adapter = False
        self._last_adapter: object = None  # the adapter entry to go back to when toggled on
        self._pieces: list[tuple[int, str]] = []  # (column, text) streamed by the worker
        self._targets: list[MessageWidget] = []  # where column i's pieces go
        self._cancelled = lambda: None  # the job in flight's "dropped before it started"
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(1000 // STREAM_HZ)
        self._flush_timer.timeout.connect(self._flush)
        self.preferences = PreferenceRecorder(self.project.output_folder)
        self._blind_context: dict | None = None  # the messages and facts of the pair being judged

        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_chat_tab(), "Chat")
        self.tabs.addTab(self._build_compare_tab(), "Side by side")
        self.tabs.setTabToolTip(0, "A conversation with the model (with the adapter, or the base model)")
        self.tabs.setTabToolTip(1, "One prompt and seed through the base model and through the adapter")
        self.tabs.currentChanged.connect(self._tab_changed)
        side = self._build_side()
        split = splitter(Qt.Horizontal, (self.tabs, side), stretch=(1, 0), sizes=(900, 320))
        self.splitter = split
        banner_over(self, self.banner, split)

        QShortcut(
            QKeySequence("Ctrl+Shift+C"), self, self.copy_last_answer, context=Qt.WidgetWithChildrenShortcut
        )
        QShortcut(QKeySequence("Ctrl+B"), self, self.toggle_adapter, context=Qt.WidgetWithChildrenShortcut)
        QShortcut(QKeySequence("Ctrl+."), self, self.stop, context=Qt.WidgetWithChildrenShortcut)

        self.refresh_adapters()
        self._set_busy("")
        self._update_placeholder()
        self._show_preferences()

    # --- building -----------------------------------------------------------------------------
    def _build_chat_tab(self) -> QWidget:
        self.conversation = ConversationWidget()
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText(f"Write a message… ({_keys('Ctrl+Return')} sends, Enter is a new line)")
        self.input.setTabChangesFocus(True)
        self.input.setMaximumHeight(90)
        self.input.setMinimumHeight(48)
        self.send_button = action_button(
            "Send", self.send, f"Send the message; the answer streams in ({_keys('Ctrl+Return')})"
        )
        self.stop_button = action_button(
            "Stop", self.stop, f"End the answer where it is ({_keys('Ctrl+.')} or Escape)"
        )
        self.new_button = action_button(
            "New chat",
            self.new_chat,
            f"Clear the conversation and start again ({_keys('Ctrl+N')} on this page)",
        )
        self.system_edit = QPlainTextEdit()
        self.system_edit.setPlaceholderText("System prompt (optional)")
        self.system_edit.setToolTip(
            "A system message before the conversation (how the model should behave). Default: none."
        )
        self.system_edit.setTabChangesFocus(True)
        self.system_edit.setMaximumHeight(44)
        self.status_label = FaintLabel(squeeze=True)
        buttons = QVBoxLayout()
        buttons.setSpacing(3)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.new_button)
        buttons.addStretch(1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.input, 1)
        bottom.addLayout(buttons)
        tab = QWidget()
        tl = QVBoxLayout(tab)
        tl.setContentsMargins(4, 4, 4, 4)
        tl.setSpacing(4)
        tl.addWidget(self.system_edit)
        tl.addWidget(self.conversation, 1)
        tl.addWidget(self.status_label)
        tl.addLayout(bottom)
        self._send_keys(tab, self.send)
        return tab

    @staticmethod
    def _send_keys(tab: QWidget, slot) -> None:
        """Ctrl+Enter anywhere in the tab (the hidden tab's keys are off)."""
        for key in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(key), tab, slot, context=Qt.WidgetWithChildrenShortcut)

    def _build_compare_tab(self) -> QWidget:
        self.compare_prompt = QPlainTextEdit()
        self.compare_prompt.setPlaceholderText(
            f"A prompt for both ({_keys('Ctrl+Return')} compares; empty: your last message in the chat)"
        )
        self.compare_prompt.setTabChangesFocus(True)
        self.compare_prompt.setMaximumHeight(70)
        self.compare_button = action_button(
            "Compare",
            self.compare,
            "Answer the prompt with the base model, then with the adapter: the same sampling and seed, so "
            f"the adapter is the only difference ({_keys('Ctrl+Return')})",
        )
        self.compare_stop_button = action_button(
            "Stop", self.stop, f"End the answers where they are ({_keys('Ctrl+.')})"
        )
        self.compare_status = FaintLabel(wrap=True, squeeze=True)
        row = QHBoxLayout()
        row.addWidget(self.compare_button)
        row.addWidget(self.compare_stop_button)
        row.addWidget(self.compare_status, 1)
        self.blind_check = QCheckBox("Blind A/B")
        self.blind_check.setToolTip(
            "Show the two answers as A and B in a random order, without saying which is the adapter's, and "
            "choose the better one: each choice is saved as a preference pair (for DPO or ORPO on the Train "
            "page). Default: off."
        )
        row.insertWidget(2, self.blind_check)
        self.base_column = AnswerColumnWidget("Base model", "The model file as it is, without an adapter")
        self.adapter_column = AnswerColumnWidget("With the adapter", "The model with the chosen adapter")
        columns = splitter(Qt.Horizontal, (self.base_column, self.adapter_column))
        self.blind = BlindChoiceWidget()
        self.blind.sig_chosen.connect(self._blind_chosen)
        self.compare_stack = QStackedWidget()
        self.compare_stack.addWidget(columns)
        self.compare_stack.addWidget(self.blind)
        self.blind_check.toggled.connect(lambda on: self.compare_stack.setCurrentIndex(1 if on else 0))
        self.preferences_row = PreferencesFileRow(self.preferences)
        self.preferences_row.sig_train_choices.connect(self.sig_train_choices)
        self.train_choices_button = self.preferences_row.train_button
        tab = QWidget()
        tl = QVBoxLayout(tab)
        tl.setContentsMargins(4, 4, 4, 4)
        tl.setSpacing(4)
        tl.addWidget(self.compare_prompt)
        tl.addLayout(row)
        tl.addWidget(self.compare_stack, 1)
        tl.addWidget(self.preferences_row)
        self._send_keys(tab, self.compare)
        return tab

    def _build_side(self) -> QWidget:
        box = QGroupBox("Adapter")
        self.adapter_choice = RunChoiceWidget(
            fixed=[
                ("Base model (no adapter)", BASE, "The model file as it is"),
                (
                    "Live adapter of the training run",
                    RUN,
                    "The adapter of the run on the Train page as trained so far (pause the run to chat with "
                    "it: answers wait while it takes steps)",
                ),
            ],  # fmt: skip
            placeholder="",
        )
        self.adapter_choice.sig_changed.connect(self._adapter_changed)
        self.base_toggle = QToolButton()
        self.base_toggle.setText("Base")
        self.adapter_toggle = QToolButton()
        self.adapter_toggle.setText("Adapter")
        self.toggle_group = QButtonGroup(self)
        self.toggle_group.setExclusive(True)
        for b, tip in (
            (self.base_toggle, "Answer with the base model, the adapter off"),
            (self.adapter_toggle, "Answer with the chosen adapter"),
        ):
            b.setCheckable(True)
            b.setToolTip(f"{tip} ({_keys('Ctrl+B')} switches)")
            b.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
            self.toggle_group.addButton(b)
        self.base_toggle.clicked.connect(lambda: self.set_use_adapter(False))
        self.adapter_toggle.clicked.connect(lambda: self.set_use_adapter(True))
        toggle = QHBoxLayout()
        toggle.setSpacing(0)
        toggle.addWidget(self.base_toggle)
        toggle.addWidget(self.adapter_toggle)
        self.adapter_note = FaintLabel(wrap=True, squeeze=True)
        self.export_button = action_button(
            "Export…",
            self.request_export,
            "Export this adapter for llama.cpp, or merge it into the model (Export page)",
        )
        self.rate_button = action_button(
            "Rate answers",
            self.request_rate,
            "Go on with rating rounds on the Rewards page: this adapter (or a new one for the base model) "
            "and your last prompt",
        )
        hand = QHBoxLayout()
        hand.addWidget(self.export_button)
        hand.addWidget(self.rate_button)
        bl = QVBoxLayout(box)
        bl.setContentsMargins(6, 4, 6, 6)
        bl.setSpacing(4)
        bl.addWidget(self.adapter_choice)
        bl.addLayout(toggle)
        bl.addWidget(self.adapter_note)
        bl.addLayout(hand)
        self.sampling = SamplingSettingsWidget()
        inner = QWidget()
        il = QVBoxLayout(inner)
        il.setContentsMargins(0, 0, 4, 0)
        il.setSpacing(6)
        il.addWidget(box)
        il.addWidget(self.sampling)
        il.addStretch(1)
        return SidePanelWidget(inner, minimum=220)  # never narrower than its controls: none is cut

    # --- public API ---------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The open model (None: none). The adapter list follows it (runs of other models are listed
        apart, not chosen)."""
        changed = (info.path if info else None) != (self.info.path if self.info else None)
        self.info = info
        if changed:
            self.refresh_adapters()
        self._update_placeholder()

    def set_adapter(self, path: str | None, label: str = "") -> None:
        """Chat with this adapter file from now on (None: the base model), e.g. when a run ends."""
        if path is None:
            self.adapter_choice.set_path(BASE)
        else:
            self.adapter_choice.set_path(path, label)
        self.set_use_adapter(path is not None)

    def refresh_adapters(self) -> None:
        """Read the run history again (the chosen entry is kept)."""
        self.adapter_choice.start_folder = self.project.output_folder()
        self.adapter_choice.set_runs(load_runs(self.project, self.settings), self.model_path())

    def adapter(self) -> str | None:
        """What answers now: None (base model), engine.RUN, or an adapter file."""
        data = self.adapter_choice.current_data()
        if not self.use_adapter or data in (None, BASE):
            return None
        return str(data)

    def adapter_label(self) -> str:
        a = self.adapter()
        if a is None:
            return "Base model"
        if a == RUN:
            return "Live adapter of the training run"
        return f"Adapter · {self._adapter_name()}"

    def _adapter_name(self) -> str:
        """The chosen adapter in a few words: its run's name (reward-tuned ones say so), or the file's."""
        run = self.adapter_choice.current_run()
        if run is not None:
            return f"{run.name} (reward-tuned)" if run.kind == "rewards" else run.name
        label = self.adapter_choice.current_label()
        return label.removeprefix("Latest finished: ").removeprefix("File · ")

    # --- the adapter ----------------------------------------------------------------------------
    def _adapter_changed(self, data: object, _label: str) -> None:
        if data in (None, BASE):
            self.use_adapter = False
        else:
            self._last_adapter = data
            self.use_adapter = True
        self._show_toggle()

    def set_use_adapter(self, on: bool) -> None:
        """The Base / Adapter toggle: on answers with the chosen adapter (or the last one chosen)."""
        if on and self.adapter_choice.current_data() in (None, BASE):
            if self._last_adapter is None:
                default = self.adapter_choice.default_run()
                self._last_adapter = default.adapter if default is not None else None
            if self._last_adapter is None:
                self.adapter_note.setText("Choose an adapter in the list first.")
                self._show_toggle()
                return
            self.adapter_choice.set_path(self._last_adapter)  # calls _adapter_changed
            return
        self.use_adapter = on
        self._show_toggle()

    def toggle_adapter(self) -> None:
        self.set_use_adapter(not self.use_adapter)

    def _show_toggle(self) -> None:
        self.base_toggle.setChecked(not self.use_adapter)
        self.adapter_toggle.setChecked(self.use_adapter)
        data = self.adapter_choice.current_data()
        path = self.adapter_choice.current_path()
        file = path if path not in (None, BASE, RUN) else None
        self.export_button.setEnabled(file is not None and not self.busy)
        self.rate_button.setEnabled(data != RUN and not self.busy)
        if data == RUN:
            self.adapter_note.setText(
                "The run's adapter as trained so far: answers wait while it takes steps."
            )
        elif file is not None and not self.use_adapter:
            self.adapter_note.setText("Answering with the base model; Adapter switches the adapter back on.")
        elif file is not None:
            self.adapter_note.setText(file)
        else:
            self.adapter_note.setText("")
        self.adapter_note.setToolTip(file or "")
        self._update_placeholder()

    def _check_adapter(self, adapter: str | None) -> bool:
        if adapter is None or adapter == RUN:
            return True
        return self.warn_fit(adapter, "error")

    def request_export(self) -> None:
        path = self.adapter_choice.current_path()
        if path not in (None, BASE, RUN):
            self.sig_export_requested.emit(path)

    def request_rate(self) -> None:
        data = self.adapter_choice.current_data()
        if data == RUN:
            return
        path = "" if data in (None, BASE) else str(data)
        self.sig_rate_requested.emit(path, self.last_prompt())

    def last_prompt(self) -> str:
        """The prompt to hand on: the last message sent, else what is typed."""
        for m in reversed(self.history):
            if m["role"] == "user":
                return m["content"]
        return self.input.toPlainText().strip() or self.compare_prompt.toPlainText().strip()

    # --- chatting -------------------------------------------------------------------------------
    def _check_model(self) -> str | None:
        return self.open_model("send again")

    def _sampling(self, seed: int | None = None):
        try:
            sampling = self.sampling.sampling(seed)
            self.project.chat_sampling = sampling  # what an export's Ollama Modelfile carries
            return sampling
        except EngineError as exc:
            self.show_error(f"A sampling setting is not valid: {exc}. Fix it on the right, then try again.")
            return None

    def system_prompt(self) -> str:
        return self.system_edit.toPlainText().strip()

    def messages_for(self, user: str) -> list[dict[str, str]]:
        """The conversation the model is given for the next answer: system, history, the new turn."""
        system = self.system_prompt()
        head = [{"role": "system", "content": system}] if system else []
        return [*head, *self.history, {"role": "user", "content": user}]

    def send(self) -> bool:
        """Send the typed message and stream the answer; False (and why, in the page) if it cannot."""
        if self.is_busy():
            return False
        text = self.input.toPlainText().strip()
        if not text:
            self.status_label.setText("Type a message first.")
            self.input.setFocus()
            return False
        model = self._check_model()
        adapter = self.adapter()
        sampling = self._sampling()
        if model is None or sampling is None or not self._check_adapter(adapter):
            return False
        self.banner.hide()
        messages = self.messages_for(text)
        user_msg = self.conversation.add("user", text, "You")
        answer = self.conversation.add("assistant", "", self.adapter_label())
        self.input.clear()
        self._start_stream([answer])

        def job(session, job):
            return session.generate(messages, sampling, adapter=adapter, n=1,
                                    on_token=lambda i, piece: self._pieces.append((0, piece)),
                                    should_stop=self._stop.is_set)[0]  # fmt: skip

        def done(reply) -> None:
            self._end_stream()
            answer.set_text(reply.text)
            answer.set_meta(len(reply.tokens), reply.stop_reason)
            self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply.text}]
            self.status_label.setText(self._seed_note(sampling))
            self.sig_answered.emit(reply)

        def take_back() -> None:
            self._end_stream()
            self.conversation.remove(answer)
            self.conversation.remove(user_msg)
            if not self.input.toPlainText().strip():
                self.input.setPlainText(text)
            self.status_label.setText("")

        def failed(message: str) -> None:
            take_back()
            self._chat_failed(message, adapter)

        def cancelled() -> None:
            take_back()
            self.status_label.setText(
                "Stopped before the model began to answer; your message is back in the box."
            )

        self._submit("chat", "chatting", job, done, failed, model, cancelled)
        return True

    def _seed_note(self, sampling) -> str:
        turns = sum(m["role"] == "user" for m in self.history)
        seed = f"seed {sampling.seed}" if sampling.seed is not None else "a random seed"
        return (
            f"{turns} turn{'s' if turns != 1 else ''} · last answer: {self.adapter_label().lower()}, {seed}"
        )

    def _chat_failed(self, message: str, adapter) -> None:
        if "context" in message and "fit" in message:
            hint = "The conversation is longer than the model's context: start a New chat (Ctrl+N)."
        elif adapter == RUN:
            hint = "Start (or pause) a training run on the Train page, or choose another adapter."
        elif adapter:
            hint = "Choose another adapter, or the base model."
        else:
            hint = "Check the model on the Model page and the sampling settings, then send again."
        self.show_error(f"Could not answer: {message}. {hint} Your message is back in the box.")

    def stop(self) -> None:
        """End the answer where it is; one still waiting for the engine is dropped."""
        if not self.busy:
            return
        self._stop.set()
        job = self.job
        if job is not None and job.state == "queued":
            self.engine.cancel(job)  # never runs: neither done nor failed comes back
            self.job = None
            self._set_busy("")
            self._cancelled()

    def new_chat(self) -> None:
        """Clear the conversation (an answer in progress is stopped first)."""
        self.stop()
        self.history = []
        self.conversation.clear()
        self.status_label.setText("")
        self._update_placeholder()
        self.input.setFocus()

    def copy_last_answer(self) -> str:
        for msg in reversed(self.conversation.messages):
            if msg.role == "assistant" and msg.text:
                msg.copy()
                self.status_label.setText("The last answer is on the clipboard.")
                return msg.text
        return ""

    def answers(self) -> list[str]:
        return [m["content"] for m in self.history if m["role"] == "assistant"]

    # --- side by side -------------------------------------------------------------------------
    def compare(self) -> bool:
        """The same prompt and seed through the base model and through the adapter, in two columns."""
        if self.is_busy():
            return False
        prompt = self.compare_prompt.toPlainText().strip() or self.last_prompt()
        if not prompt:
            self.compare_status.setText("Type a prompt first.")
            self.compare_prompt.setFocus()
            return False
        data = self.adapter_choice.current_data()
        adapter = None if data in (None, BASE) else str(data)
        if adapter is None:
            self.show_error("Choose an adapter on the right to compare with the base model.", "info")
            return False
        model = self._check_model()
        seed = self.sampling.seed()
        if seed is None:
            seed = int(np.random.default_rng().integers(0, 2**31 - 1))
        sampling = self._sampling(seed)
        if model is None or sampling is None or not self._check_adapter(adapter):
            return False
        self.banner.hide()
        system = self.system_prompt()
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        self.adapter_column.title.setText(f"<b>With the adapter</b> · {html.escape(self._adapter_name())}")
        for column in (self.base_column, self.adapter_column):
            column.clear()
        blind = self.blind_check.isChecked()
        if blind:  # nothing streams: the order of the answers would say which is which
            self.blind.clear("Answering… A and B are shown together, in a random order.")
            self._blind_context = {"messages": messages, "seed": seed, "adapter": self._adapter_name()}
            self._start_stream([])
        else:
            self._start_stream([self.base_column.message, self.adapter_column.message])
        stop = self._stop

        def job(session, job):
            replies = []
            for col, which in enumerate((None, adapter)):
                if stop.is_set():
                    break

                def on_token(i: int, piece: str, c: int = col) -> None:
                    self._pieces.append((c, piece))

                reply = session.generate(
                    messages, sampling, adapter=which, n=1, on_token=on_token, should_stop=stop.is_set
                )
                replies.append(reply[0])
            return replies

        def done(replies) -> None:
            self._end_stream()
            if blind and len(replies) == 2:
                sources = ("the base model", f"the adapter ({self._adapter_name()})")
                self.blind.set_pair(blind_pair(replies[0].text, replies[1].text, sources))
            for column, reply in zip((self.base_column, self.adapter_column), replies, strict=False):
                column.message.set_text(reply.text)
                column.message.set_meta(len(reply.tokens), reply.stop_reason)
            if len(replies) == 2:
                same = replies[0].text == replies[1].text
                what = (
                    "The same answer: the adapter does not change this one."
                    if same
                    else "The answers differ."
                )
                self.compare_status.setText(f"Seed {seed}, the same sampling for both. {what}")
                self.sig_compared.emit(replies[0], replies[1])
            else:
                self.compare_status.setText("Stopped.")

        def failed(message: str) -> None:
            self._end_stream()
            self.compare_status.setText("")
            self.show_error(
                f"Could not compare: {message}. Check the adapter and the prompt, then compare again."
            )

        def cancelled() -> None:
            self._end_stream()
            self.compare_status.setText("Stopped before it began.")

        self._submit("compare", "comparing answers", job, done, failed, model, cancelled)
        self.compare_status.setText(f"Seed {seed}: the base model first, then the adapter…")
        return True

    # --- blind A/B choices ----------------------------------------------------------------------
    def _blind_chosen(self, choice: str) -> None:
        pair, ctx = self.blind.pair, self._blind_context
        if pair is None or ctx is None:
            return
        extra = {
            "source": "chat side by side",
            "seed": ctx["seed"],
            "model": os.path.basename(self.model_path() or ""),
        }
        try:
            text = self.preferences.record(pair, choice, ctx["messages"], extra)
        except (EngineError, OSError) as exc:
            self.show_error(f"The choice was not saved: {exc}. Choose another file with Preferences file…, "
                            "then compare again.")  # fmt: skip
            return
        self.blind.status.setText(text + " Compare again for the next pair.")
        self._show_preferences()
        self.compare_prompt.setFocus()
        self.sig_chosen.emit(choice)

    def _show_preferences(self) -> None:
        self.preferences_row.refresh()

    # --- jobs and streaming ---------------------------------------------------------------------
    def _submit(self, kind: str, name: str, fn, done, failed, model: str, cancelled) -> None:
        """Run fn as an engine job: done(result) or failed(message) on the UI thread; cancelled() when
        Stop drops it before it started (the engine calls neither then)."""
        ahead = [j for j in self.engine.jobs if j.active]  # queued or running (the worker sets "running")
        self._cancelled = cancelled
        self._submit_job(kind, name, fn, done, failed, model)
        if ahead and self.job.state == "queued":
            running = next((j.name for j in ahead if j.state == "running"), ahead[0].name)
            text = f"Waiting for the engine ({running}): the answer starts when it is done or paused."
            (self.status_label if kind == "chat" else self.compare_status).setText(text)

    def _start_stream(self, targets: list[MessageWidget]) -> None:
        self._stop.clear()
        self._pieces = []
        self._targets = targets
        self._flush_timer.start()

    def _flush(self) -> None:
        pieces, self._pieces = self._pieces, []
        if not pieces:
            return
        joined: dict[int, list[str]] = {}
        for col, piece in pieces:
            joined.setdefault(col, []).append(piece)
        for col, parts in joined.items():
            if 0 <= col < len(self._targets):
                self._targets[col].append("".join(parts))
        if self.busy == "chat":
            self.status_label.setText("Answering…")

    def _end_stream(self) -> None:
        self._flush_timer.stop()
        self._flush()
        self._targets = []

    def _set_busy(self, busy: str) -> None:
        self.busy = busy  # read by what follows
        idle = not busy
        self.send_button.setEnabled(idle)
        self.compare_button.setEnabled(idle)
        self.stop_button.setEnabled(busy == "chat")
        self.compare_stop_button.setEnabled(busy == "compare")
        self.adapter_choice.setEnabled(idle)
        self.base_toggle.setEnabled(idle)
        self.adapter_toggle.setEnabled(idle)
        self._show_toggle()
        super()._set_busy(busy)

    def _update_placeholder(self) -> None:
        if not self.model_path():
            text = "No model is open: open one on the Model page, then chat with it here."
        else:
            who = self.adapter_label().lower() if self.adapter() is not None else "the base model"
            text = (
                f"Chat with {os.path.basename(self.model_path())} ({who}).\n\nType a message below and "
                f"press {_keys('Ctrl+Return')}. The conversation is kept until New chat ({_keys('Ctrl+N')})."
            )
        self.conversation.set_placeholder(text)

    def _tab_changed(self, index: int) -> None:
        if index == 1 and not self.compare_prompt.toPlainText().strip():
            self.compare_prompt.setPlainText(self.last_prompt())
        (self.compare_prompt if index == 1 else self.input).setFocus()

    def _project_changed(self, changed: set[str]) -> None:
        if changed & RUNS_MOVED:
            self.refresh_adapters()
            self._update_placeholder()
            self._show_preferences()

    # --- keys -----------------------------------------------------------------------------------
    def _is_new_chat(self, event: QKeyEvent) -> bool:
        return event.key() == Qt.Key_N and event.modifiers() == Qt.ControlModifier

    def event(self, event: QEvent) -> bool:
        # Ctrl+N is the window's New project elsewhere; while this page has the focus it is New chat
        if event.type() == QEvent.ShortcutOverride and self._is_new_chat(event):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if self._is_new_chat(event):
            self.new_chat()
        elif event.key() == Qt.Key_Escape and self.busy:
            self.stop()
        else:
            super().keyPressEvent(event)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self.refresh_adapters()
        # coming to the page (Ctrl+5, the navigation), typing goes straight into the message
        (self.compare_prompt if self.tabs.currentIndex() == 1 else self.input).setFocus()


__all__ = ["BASE", "ChatPage"]
