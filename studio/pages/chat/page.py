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

import numpy as np
from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QTabWidget, QVBoxLayout, QWidget

from engine import EngineError, blind_pair

from ...project import ModelInfo
from ...widgets.blind_choice import PreferenceRecorder
from ...widgets.buttons import action_button, shortcut_text
from ...widgets.engine_page import RUNS_MOVED, JobPage
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import banner_over, splitter
from ..generation import StreamBuffer, chat_messages, invalid_setting
from . import controller as chat
from .controller import BASE, ChatController
from .conversation import ConversationWidget, MessageWidget
from .panels import AdapterSideWidget, CompareTabWidget, send_keys

STREAM_HZ = 20
# the Side by side tab's and the adapter column's widgets, named on the page as on their blocks
COMPARE_WIDGETS = ("compare_prompt", "compare_button", "compare_stop_button", "compare_status", "blind_check",
                   "base_column", "adapter_column", "blind", "compare_stack", "preferences_row",
                   "train_choices_button")  # fmt: skip
SIDE_WIDGETS = ("adapter_choice", "base_toggle", "adapter_toggle", "adapter_note", "export_button",
                "rate_button", "sampling")  # fmt: skip


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
        self.ctrl = ChatController()  # busy: "", "chat" or "compare"
        self._targets: list[MessageWidget] = []  # where column i's pieces go
        self._cancelled = lambda: None  # the job in flight's "dropped before it started"
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(1000 // STREAM_HZ)
        self._flush_timer.timeout.connect(self._flush)
        self.preferences = PreferenceRecorder(self.project.output_folder)

        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_chat_tab(), "Chat")
        compare = CompareTabWidget(self.compare, self.stop, self.preferences)
        for name in COMPARE_WIDGETS:
            setattr(self, name, getattr(compare, name))
        self.blind.sig_chosen.connect(self._blind_chosen)
        self.preferences_row.sig_train_choices.connect(self.sig_train_choices)
        self.tabs.addTab(compare, "Side by side")
        self.tabs.setTabToolTip(0, "A conversation with the model (with the adapter, or the base model)")
        self.tabs.setTabToolTip(1, "One prompt and seed through the base model and through the adapter")
        self.tabs.currentChanged.connect(self._tab_changed)
        side = AdapterSideWidget(self.set_use_adapter, self.request_export, self.request_rate)
        for name in SIDE_WIDGETS:
            setattr(self, name, getattr(side, name))
        self.adapter_choice.sig_changed.connect(self._adapter_changed)
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

    @property
    def history(self) -> list[dict[str, str]]:
        """The conversation as the model sees it (no system message)."""
        return self.ctrl.history

    @property
    def use_adapter(self) -> bool:
        return self.ctrl.use_adapter

    # --- building -----------------------------------------------------------------------------
    def _build_chat_tab(self) -> QWidget:
        self.conversation = ConversationWidget()
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText(
            f"Write a message… ({shortcut_text('Ctrl+Return')} sends, Enter is a new line)"
        )
        self.input.setTabChangesFocus(True)
        self.input.setMaximumHeight(90)
        self.input.setMinimumHeight(48)
        self.send_button = action_button(
            "Send", self.send, f"Send the message; the answer streams in ({shortcut_text('Ctrl+Return')})"
        )
        self.stop_button = action_button(
            "Stop", self.stop, f"End the answer where it is ({shortcut_text('Ctrl+.')} or Escape)"
        )
        self.new_button = action_button(
            "New chat",
            self.new_chat,
            f"Clear the conversation and start again ({shortcut_text('Ctrl+N')} on this page)",
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
        send_keys(tab, self.send)
        return tab

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
        self.adapter_choice.refresh(self.project, self.settings, self.model_path())

    def adapter(self) -> str | None:
        """What answers now: None (base model), engine.RUN, or an adapter file."""
        return self.ctrl.adapter(self.adapter_choice.current_data())

    def adapter_label(self) -> str:
        return chat.adapter_label(self.adapter(), self._adapter_name())

    def _adapter_name(self) -> str:
        """The chosen adapter in a few words: its run's name (reward-tuned ones say so), or the file's."""
        run = self.adapter_choice.current_run()
        return chat.adapter_name(run.name if run else None, run.kind if run else None,
                                 self.adapter_choice.current_label())  # fmt: skip

    # --- the adapter ----------------------------------------------------------------------------
    def _adapter_changed(self, data: object, _label: str) -> None:
        self.ctrl.adapter_changed(data)
        self._show_toggle()

    def set_use_adapter(self, on: bool) -> None:
        """The Base / Adapter toggle: on answers with the chosen adapter (or the last one chosen)."""
        default = self.adapter_choice.default_run()
        entry = self.ctrl.toggle(on, self.adapter_choice.current_data(), default.adapter if default else None)
        if entry is not None:
            self.adapter_choice.set_path(entry)  # calls _adapter_changed
            return
        self._show_toggle()

    def toggle_adapter(self) -> None:
        self.set_use_adapter(not self.use_adapter)

    def _show_toggle(self) -> None:
        view = self.ctrl.adapter_view(
            self.adapter_choice.current_data(), self.adapter_choice.current_path(), self.busy
        )
        self.base_toggle.setChecked(not view.use_adapter)
        self.adapter_toggle.setChecked(view.use_adapter)
        self.export_button.setEnabled(view.export)
        self.rate_button.setEnabled(view.rate)
        self.adapter_note.setText(view.note)
        self.adapter_note.setToolTip(view.note_tip)
        self._update_placeholder()

    def _check_adapter(self, adapter: str | None) -> bool:
        return adapter is None or adapter == chat.RUN or self.warn_fit(adapter, "error")

    def request_export(self) -> None:
        path = chat.export_request(self.adapter_choice.current_path())
        if path is not None:
            self.sig_export_requested.emit(path)

    def request_rate(self) -> None:
        path = chat.rate_request(self.adapter_choice.current_data())
        if path is not None:
            self.sig_rate_requested.emit(path, self.last_prompt())

    def last_prompt(self) -> str:
        """The prompt to hand on: the last message sent, else what is typed."""
        return self.ctrl.last_prompt(self.input.toPlainText(), self.compare_prompt.toPlainText())

    # --- chatting -------------------------------------------------------------------------------
    def _sampling(self, seed: int | None = None):
        try:
            sampling = self.sampling.sampling(seed)
            self.project.chat_sampling = sampling  # what an export's Ollama Modelfile carries
            return sampling
        except EngineError as exc:
            self.show_error(invalid_setting(exc, "right", "try again"))
            return None

    def system_prompt(self) -> str:
        return self.system_edit.toPlainText().strip()

    def messages_for(self, user: str) -> list[dict[str, str]]:
        """The conversation the model is given for the next answer: system, history, the new turn."""
        return self.ctrl.messages_for(self.system_prompt(), user)

    def send(self) -> bool:
        """Send the typed message and stream the answer; False (and why, in the page) if it cannot."""
        if self.is_busy():
            return False
        text = self.input.toPlainText().strip()
        if not text:
            self.status_label.setText("Type a message first.")
            self.input.setFocus()
            return False
        model = self.open_model("send again")
        adapter = self.adapter()
        sampling = self._sampling()
        if model is None or sampling is None or not self._check_adapter(adapter):
            return False
        self.banner.hide()
        messages = self.messages_for(text)
        user_msg = self.conversation.add("user", text, "You")
        answer = self.conversation.add("assistant", "", self.adapter_label())
        self.input.clear()
        stream = self._start_stream([answer])

        def job(session, job):
            return session.generate(messages, sampling, adapter=adapter, n=1,
                                    on_token=lambda i, piece: stream.append(0, piece),
                                    should_stop=self._stop.is_set)[0]  # fmt: skip

        def done(reply) -> None:
            self._end_stream()
            answer.set_text(reply.text)
            answer.set_meta(len(reply.tokens), reply.stop_reason)
            self.ctrl.answered(text, reply.text)
            self.status_label.setText(chat.seed_note(self.ctrl.turns(), self.adapter_label(), sampling.seed))
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
            self.show_error(chat.failure_text(message, adapter))

        def cancelled() -> None:
            take_back()
            self.status_label.setText(
                "Stopped before the model began to answer; your message is back in the box."
            )

        self._submit("chat", "chatting", job, done, failed, model, cancelled)
        return True

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
        self.ctrl.history = []
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
        adapter = chat.compare_adapter(self.adapter_choice.current_data())
        if adapter is None:
            self.show_error("Choose an adapter on the right to compare with the base model.", "info")
            return False
        model = self.open_model("send again")
        seed = self.sampling.seed()
        if seed is None:
            seed = int(np.random.default_rng().integers(0, 2**31 - 1))
        sampling = self._sampling(seed)
        if model is None or sampling is None or not self._check_adapter(adapter):
            return False
        self.banner.hide()
        messages = chat_messages(self.system_prompt(), prompt)
        self.adapter_column.title.setText(f"<b>With the adapter</b> · {html.escape(self._adapter_name())}")
        for column in (self.base_column, self.adapter_column):
            column.clear()
        blind = self.blind_check.isChecked()
        if blind:  # nothing streams: the order of the answers would say which is which
            self.blind.clear("Answering… A and B are shown together, in a random order.")
            self.ctrl.blind_context = {"messages": messages, "seed": seed, "adapter": self._adapter_name()}
            stream = self._start_stream([], 2)
        else:
            stream = self._start_stream([self.base_column.message, self.adapter_column.message])
        stop = self._stop

        def job(session, job):
            replies = []
            for col, which in enumerate((None, adapter)):
                if stop.is_set():
                    break

                def on_token(i: int, piece: str, c: int = col) -> None:
                    stream.append(c, piece)

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
            self.compare_status.setText(chat.compare_status(seed, [r.text for r in replies]))
            if len(replies) == 2:
                self.sig_compared.emit(replies[0], replies[1])

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
        pair, ctx = self.blind.pair, self.ctrl.blind_context
        if pair is None or ctx is None:
            return
        try:
            text = self.preferences.record(
                pair, choice, ctx["messages"], chat.blind_extra(ctx["seed"], self.model_path())
            )
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
        ahead = [(j.name, j.state) for j in self.engine.jobs if j.active]  # the worker sets "running"
        self._cancelled = cancelled
        self._submit_job(kind, name, fn, done, failed, model)
        text = chat.waiting_text(ahead) if self.job.state == "queued" else None
        if text:
            (self.status_label if kind == "chat" else self.compare_status).setText(text)

    def _start_stream(self, targets: list[MessageWidget], n: int = 0) -> StreamBuffer:
        """A new stream of max(n, len(targets)) answers, column i shown in targets[i] (if any)."""
        self._stop.clear()
        self.ctrl.stream = StreamBuffer(max(n, len(targets)))
        self._targets = targets
        self._flush_timer.start()
        return self.ctrl.stream

    def _flush(self) -> None:
        new = self.ctrl.stream.take()
        if not new:
            return
        for col, parts in new.items():
            if col < len(self._targets):
                self._targets[col].append("".join(parts))
        if self.busy == "chat":
            self.status_label.setText("Answering…")

    def _end_stream(self) -> None:
        self._flush_timer.stop()
        self._flush()
        self._targets = []

    def _set_busy(self, busy: str) -> None:
        self.busy = busy  # read by what follows
        c = chat.controls(busy)
        self.send_button.setEnabled(c.send)
        self.compare_button.setEnabled(c.send)
        self.stop_button.setEnabled(c.stop)
        self.compare_stop_button.setEnabled(c.compare_stop)
        for w in (self.adapter_choice, self.base_toggle, self.adapter_toggle):
            w.setEnabled(c.adapter)
        self._show_toggle()
        super()._set_busy(busy)

    def _update_placeholder(self) -> None:
        who = self.adapter_label().lower() if self.adapter() is not None else "the base model"
        self.conversation.set_placeholder(
            chat.placeholder(self.model_path(), who, shortcut_text("Ctrl+Return"), shortcut_text("Ctrl+N"))
        )

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
