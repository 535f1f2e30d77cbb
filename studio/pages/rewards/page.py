"""The Rewards page: sample answers to a prompt, rate them from the keyboard, train on the ratings.

A round: type a prompt (or take one from the dataset) and press Generate (Ctrl+Enter): N answers
are sampled with the adapter being trained and shown as cards. Rate each card with keys 1-5
(stars), U / D (thumbs), [ ] (fine values) or 0 / S (skip); Edit… turns an answer into a better
one. Every rating is written to the ratings file the moment it is given. The diagnostics panel
says what the step will do (mean, spread, the advantage or weight of each answer, "no signal"
when all ratings are equal), and Apply (Ctrl+Shift+Enter) takes one optimizer step; the round
joins the history table and the plots of mean reward and loss. The Side by side tab sends one
prompt and seed through the base model and through the adapter. Save adapter… writes a LoRA GGUF.
The A/B tab shows two answers of the adapter blind and saves the person's choice as a preference pair
(rewards/ab.py); the Unattended tab runs rounds of sample, score with checks, step, with nobody
rating (rewards/auto.py).

The adapter the rounds continue, the ratings file and saving the adapter are the "Adapter and
files" box (rewards/files.py). The decisions (what a control offers while a job runs, what a click
asks, what a failure says) are the Qt-free controller's (rewards/controller.py).

The engine's `RewardSession` does the work, on the model the app's engine session holds (no second
copy). It is made on the first Generate with the project's targets, rank and alpha, the ratings
file `<output folder>/ratings.jsonl` (or one the person chose) and checkpoints in
`<output folder>/reward-checkpoints`. Generation, Apply, Compare and saving are jobs of the app's
one engine worker (studio.worker), one at a time: the controls are disabled while one runs.
Ratings and corrections are quick appends to a file and are recorded on the UI thread between jobs.

What this page is not: it does not judge answers or keep ratings itself (the session and the
ratings file do), and it takes one step per round.

A little over 600 lines on purpose: its widgets are rewards/layout.py's and its decisions the
controller's, and what remains is the wiring of the page's jobs to its one reward session, which
reads best in one place.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QCoreApplication, Qt, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QTabWidget, QWidget

from engine import Answer, EngineError, RewardConfig, RewardSession, RoundResult, Scorer, load_jsonl

from ...project import ModelInfo
from ...widgets.engine_page import RUNS_MOVED, JobPage
from ...widgets.page_layout import banner_over, splitter
from ..generation import StreamBuffer, invalid_setting
from . import controller as rewards
from .ab import ABTabWidget
from .auto import AutoRoundsWidget, prompts_of_samples
from .cards import AnswerCardWidget
from .controller import CHECKPOINT_FOLDER, NEW_ADAPTER, RATINGS_FILE, RewardsController
from .layout import ApplyColumnWidget, RateTabWidget, RewardsSideWidget
from .panels import PromptPickerDialog, dataset_prompts
from .side_by_side import SideBySideWidget

STREAM_HZ = 10
# the blocks' widgets, named on the page as on their blocks
# fmt: off
SIDE_WIDGETS = ("reward_settings", "files", "settings_box")
FILES_WIDGETS = ("ratings_label", "adapter_label", "adapter_choice", "new_adapter_button", "save_button")
RATE_WIDGETS = ("prompt_edit", "system_edit", "dataset_button", "generate_button", "stop_button",
                "status_label", "grid", "keys_label", "checks_box")
APPLY_WIDGETS = ("diagnostics", "apply_button", "history")
# fmt: on


def _state_field(name: str) -> property:
    """The page's attribute `name`, kept by its controller."""
    return property(lambda self: getattr(self.ctrl, name), lambda self, v: setattr(self.ctrl, name, v))


class RewardsPage(JobPage):
    """Rate sampled answers and train on the ratings; see the module docstring."""

    sig_round_applied = Signal(object)  # engine RoundResult of each Apply
    sig_adapter_saved = Signal(str)  # path of the adapter GGUF written by Save adapter…
    sig_generated = Signal(object)  # list[Answer] of a new round (its cards are shown)
    sig_compared = Signal(object, object)  # base Answer, adapter Answer
    sig_train_choices = Signal(str)  # the preferences file of the A/B tab: train on it (DPO)

    # the session's bookkeeping, kept by the page's RewardsController (self.ctrl)
    session = _state_field("session")
    session_model = _state_field("session_model")
    start_adapter = _state_field("start_adapter")
    session_start = _state_field("session_start")
    custom_ratings_path = _state_field("custom_ratings_path")

    def __init__(self, *args, **kwargs):
        """EnginePage's arguments: project, engine, parent, settings."""
        super().__init__(*args, **kwargs)
        self.ctrl = RewardsController()
        self.samples: list | None = None  # from set_dataset_samples; None = read the dataset file
        self.cards: list[AnswerCardWidget] = []
        self.confirm = self._ask  # (title, text) -> bool; replaced in tests
        self._stream = StreamBuffer()  # tokens streamed per answer (appended by the worker)
        self._stream_timer = QTimer(self)
        self._stream_timer.setInterval(1000 // STREAM_HZ)
        self._stream_timer.timeout.connect(self._show_stream)

        side = RewardsSideWidget(self)
        rate_tab = RateTabWidget(self.choose_dataset_prompt, self.generate, self.stop)
        right = ApplyColumnWidget(self.apply)
        blocks = ((side, SIDE_WIDGETS), (side.files, FILES_WIDGETS), (rate_tab, RATE_WIDGETS),
                  (right, APPLY_WIDGETS))  # fmt: skip
        for block, names in blocks:
            for name in names:
                setattr(self, name, getattr(block, name))
        self.reward_settings.sig_mode_changed.connect(self._mode_changed)
        self.checks_box.toggled.connect(lambda on: self._score_round() if on else None)
        self.side_by_side = SideBySideWidget(self)
        self.tabs = QTabWidget()
        self.tabs.addTab(rate_tab, "Rate answers")
        self.tabs.addTab(self.side_by_side, "Side by side")
        self.ab = ABTabWidget(self)
        self.ab.sig_train_choices.connect(self.sig_train_choices)
        self.tabs.addTab(self.ab, "A/B")
        self.auto = AutoRoundsWidget(self)
        self.tabs.addTab(self.auto, "Unattended")
        self.tabs.setTabToolTip(0, "Generate answers, rate them, apply a training step")
        self.tabs.setTabToolTip(1, "The same prompt and seed through the base model and through the adapter")
        self.tabs.setTabToolTip(
            2, "Two answers of the adapter, shown blind: choose the better one (a preference pair)"
        )
        self.tabs.setTabToolTip(
            3, "Rounds with nobody rating: sample answers, score them with checks, take a step"
        )
        self.tabs.currentChanged.connect(self._tab_changed)

        split = splitter(Qt.Horizontal, (side, self.tabs, right), stretch=(0, 1, 0), sizes=(215, 700, 290))
        self.splitter = split
        banner_over(self, self.banner, split)

        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self.refresh_runs()
        self._show_paths()
        self._set_busy("")

    # --- public API ---------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The open model (None: none). A different model ends the current session (it is made again on
        the next Generate) and resets the adapter to continue: the new model's latest finished run."""
        self.info = info
        path = info.path if info is not None else None
        if self.session is not None and path != self.session_model and not self.busy:
            self._drop_session()
        self.refresh_runs()
        self._show_paths()

    def refresh_runs(self) -> None:
        """Read the run history again (the adapters to continue); see AdapterFilesWidget.refresh_runs."""
        self.files.refresh_runs()

    def set_adapter(self, path: str | None) -> None:
        """Continue this adapter from the next new session on (None: a new one); see the files box."""
        self.files.set_adapter(path)

    def start_from(self, path: str) -> None:
        """Continue `path` now (asked first when the session took steps); see the files box."""
        self.files.start_from(path)

    def set_ratings_path(self, path: str) -> bool:
        """Append ratings to `path` from now on; False (and why, in the page) if it cannot be written."""
        return self.files.set_ratings_path(path)

    def save_adapter(self, path: str) -> bool:
        """Write the adapter (F32 LoRA GGUF) in the worker; sig_adapter_saved(path) when it is written."""
        return self.files.save_adapter(path)

    def _show_paths(self) -> None:
        self.files.show_paths()

    def set_dataset_samples(self, samples) -> None:
        """The dataset's samples (engine Sample), for "From dataset…"; None: read the dataset file."""
        self.samples = list(samples) if samples is not None else None
        self.auto.show_source()  # the Unattended tab counts the prompts it would take

    def ratings_path(self) -> str:
        return self.ctrl.ratings_path(self.project.output_folder())

    def reset(self) -> None:
        """A new project: no rating session, no prompt, a new adapter, the default ratings file."""
        self.shutdown()
        self._drop_session()
        self.prompt_edit.clear()
        self.custom_ratings_path = None
        self.set_adapter(None)
        self.banner.hide()
        self._show_paths()

    # --- state --------------------------------------------------------------------------------
    def _set_busy(self, busy: str) -> None:
        self.busy = busy  # read by what follows
        c = self._controls()
        for w in (
            self.generate_button,
            self.dataset_button,
            self.settings_box,
            self.side_by_side.compare_button,
        ):
            w.setEnabled(c.idle)
        self.stop_button.setEnabled(c.stop)
        self.save_button.setEnabled(c.session)
        self.new_adapter_button.setEnabled(c.session)
        if busy:
            self.grid.hold_focus()  # a disabled card would hand the focus (and the next key) to the window
        for card in self.cards:
            card.setEnabled(c.idle)
        self.adapter_choice.setEnabled(c.idle)
        self.ab.set_busy(bool(busy))
        self.auto.page_busy(busy)
        self.apply_button.setEnabled(c.apply)
        if busy:
            self.status_label.setText(rewards.busy_text(busy))
            self.side_by_side.status.setText(rewards.busy_text(busy))
        super()._set_busy(busy)

    def _controls(self) -> rewards.Controls:
        pending = rewards.round_pending(len(self.cards), [c.locked for c in self.cards])
        return rewards.controls(self.busy, self.session is not None, pending)

    def _update_apply_enabled(self) -> None:
        self.apply_button.setEnabled(self._controls().apply)

    def _run(self, kind: str, fn, on_done, *, needs_model: bool = True) -> None:
        """Run fn(engine session) as a job of the engine worker (the model it needs is opened first);
        on_done(result) or an error in the page, on the UI thread."""
        self._submit_job(
            kind,
            rewards.job_name(kind),
            lambda session, job: fn(session),
            on_done,
            lambda message: self._task_failed(kind, message),
            self.model_path() if needs_model else None,
            needs_session=needs_model,
        )

    def _task_failed(self, kind: str, message: str) -> None:
        self._stream_timer.stop()
        self.show_error(rewards.failure_text(kind, message))
        if kind in rewards.STREAMING:
            self._show_cards(self.session.answers if self.session is not None else [])
            self.status_label.setText("")
        self.side_by_side.status.setText("")

    def _drop_session(self) -> None:
        self.ctrl.drop()
        self._show_cards([])
        self.history.set_rounds([])
        self.diagnostics.set_empty(self.reward_settings.mode())
        self.status_label.setText("")
        self._set_busy(self.busy)
        self._show_paths()

    def _ask(self, title: str, text: str) -> bool:
        return QMessageBox.question(self, title, text) == QMessageBox.Yes

    # --- the project --------------------------------------------------------------------------
    def _project_changed(self, changed: set[str]) -> None:
        if changed & RUNS_MOVED:
            self.refresh_runs()
        if changed & (RUNS_MOVED | {"config"}):
            self._show_paths()
        if "dataset_path" in changed:
            self.auto.show_source()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if not self.busy:
            self.refresh_runs()

    # --- prompts ------------------------------------------------------------------------------
    def dataset_prompt_list(self) -> list[tuple[str, str | None]]:
        """(prompt, system) of the dataset's samples; the page's samples, else the dataset file."""
        samples = self.samples
        if samples is None and self.project.dataset_path:
            try:
                samples, _ = load_jsonl(self.project.dataset_path)
            except EngineError as exc:
                self.show_error(f"The dataset cannot be read: {exc}. Open it again on the Dataset page.")
                return []
        return dataset_prompts(samples or [])

    def choose_dataset_prompt(self) -> None:
        prompts = self.dataset_prompt_list()
        if not prompts:
            if self.banner_text() == "":
                self.show_error("The project has no dataset with prompts yet: open one on the Dataset page, "
                                "or type a prompt.", "info")  # fmt: skip
            return
        dialog = PromptPickerDialog(prompts, self)
        if dialog.exec() and dialog.chosen() is not None:
            self.set_prompt(*dialog.chosen())

    def set_prompt(self, prompt: str, system: str | None = None) -> None:
        self.prompt_edit.setPlainText(prompt)
        self.system_edit.setText(system or "")
        self.prompt_edit.setFocus()

    def _tab_changed(self, index: int) -> None:
        self.side_by_side.fallback_prompt = self.prompt_edit.toPlainText()
        if index == 1 and not self.side_by_side.prompt.toPlainText().strip():
            self.side_by_side.prompt.setPlainText(self.prompt_edit.toPlainText())

    # --- the session --------------------------------------------------------------------------
    def _check_ready(self) -> bool:
        """A task can start: a model, an adapter that fits it, a ratings file a new session can write."""
        if self.open_model("press Generate again") is None:
            return False
        if self.session is None and not self.warn_fit(self.start_adapter, "error"):
            return False
        problem = self.ctrl.new_session_problem(self.project.output_folder())
        if problem:
            self.show_error(problem)
        return problem is None

    def ready_config(self, button: str) -> RewardConfig | None:
        """The form's RewardConfig when a task can start (a model, an adapter that fits it, a ratings
        file that can be written); None, and why in the page, when it cannot (`button`: what to press
        again)."""
        if not self._check_ready():
            return None
        try:
            return self.reward_settings.reward_config()
        except EngineError as exc:
            self.show_error(invalid_setting(exc, "left", f"press {button}"))
            return None

    def ready_to_sample(self, prompt: str, edit: QWidget, missing: str, button: str) -> RewardConfig | None:
        """`ready_config` for sampling answers to `prompt`, the banner cleared; with no prompt, None,
        `missing` in the banner and the focus in `edit`."""
        if not prompt:
            self.show_error(missing, "info")
            edit.setFocus()
            return None
        config = self.ready_config(button)
        if config is not None:
            self.banner.hide()
        return config

    def _session_maker(self):
        """(model, maker): maker (run in the worker) makes the session, with everything read here."""
        template = self.info.template if self.info is not None and self.project.template_file else None
        config = self.reward_settings.reward_config()
        p = self.project
        return self.model_path(), self.ctrl.session_maker(p.config, config, p.output_folder(), template)

    def _configure(self, session: RewardSession, config: RewardConfig) -> None:
        """Give the session the form's settings (in the worker, before it samples or steps)."""
        session.set_config(config)

    def session_job(self, config: RewardConfig, work) -> tuple:
        """(job, model): a job for `_run` that does work(session) with the form's `config` on the
        page's session, or on one it makes first (`model`: the file it is made with, None when the
        page has a session); the job returns (session, result, None) or (session, None, why)."""
        model, maker = self._session_maker() if self.session is None else (None, None)
        return self.ctrl.session_job(maker, lambda s: self._configure(s, config), work), model

    def session_opener(self, config: RewardConfig) -> tuple:
        """(open, model): open(engine session) is the page's session, or one it makes first (`model`:
        the file it is made with, None when the page has a session), given the form's `config`."""
        model, maker = self._session_maker() if self.session is None else (None, None)
        return self.ctrl.opener(maker, lambda s: self._configure(s, config)), model

    # --- generate -----------------------------------------------------------------------------
    def generate(self) -> bool:
        """Start a new round: sample N answers in the worker; False (and why, in the page) if it cannot."""
        if self.busy:
            return False
        prompt = self.prompt_edit.toPlainText().strip()
        missing = "Type a prompt first (or take one from the dataset), then press Generate."
        config = self.ready_to_sample(prompt, self.prompt_edit, missing, "Generate")
        if config is None:
            return False
        system = self.system_edit.text().strip() or None
        n, seed = config.n_samples, int(self.reward_settings.seed_spin.value())
        stream = self._stream = StreamBuffer(n)
        self._stop.clear()
        stop = self._stop
        job, model = self.session_job(config, lambda s: s.generate(prompt, system=system, n=n, seed=seed,
                                      on_token=stream.append, should_stop=stop.is_set))  # fmt: skip
        self._show_placeholder_cards(n)
        self._stream_timer.start()
        self._run("loading" if model else "generating", job, lambda result: self._generated(result, model))
        if model:
            self.status_label.setText("Loading the model and generating…")
        return True

    def stop(self) -> None:
        if self.busy in rewards.STREAMING:
            self._stop.set()

    def _show_placeholder_cards(self, n: int) -> None:
        self.grid.hold_focus()
        cards = []
        for i in range(n):
            card = AnswerCardWidget(i, "…")
            card.set_locked(True)
            card.setEnabled(False)
            cards.append(card)
        self.cards = cards
        self.grid.set_cards(cards)

    def _show_stream(self) -> None:
        total = self._stream.total()
        if self.busy in rewards.STREAMING and total:
            self.status_label.setText(f"Generating… {total} tokens")
        tok = self.info.tokenizer if self.info is not None else None
        if tok is None:
            return
        for card, ids in zip(self.cards, self._stream, strict=False):
            if card.locked and ids:
                try:
                    card.set_text(tok.decode(list(ids)))
                except Exception:  # noqa: BLE001 - a partial token sequence may not decode; try next tick
                    pass

    def _adopt(self, session: RewardSession, model: str | None) -> None:
        """The session a task made (the model loaded in the worker) becomes the page's."""
        if self.ctrl.adopt(session, model):
            self.adapter_choice.chosen = True  # a refresh of the runs keeps the adapter of this session
            self._show_paths()
            self._set_busy(self.busy)

    def _generated(self, result, model: str | None) -> None:
        self._stream_timer.stop()
        session, answers, error = result
        self._adopt(session, model)
        if error is not None:
            self._task_failed("generating", error)
            return
        seed = self.reward_settings.seed_spin.value()
        self.status_label.setText(rewards.generated_status(session.round, len(answers), seed))
        self.reward_settings.next_seed()
        self._show_cards(answers)
        self.history.set_rounds(session.history)
        self._show_paths()
        self._set_busy("")
        self.grid.focus_card(0)
        if self.checks_box.isChecked():
            self._score_round()
        self.sig_generated.emit(list(answers))

    def _show_cards(self, answers: list[Answer]) -> None:
        cards = []
        for a in answers:
            card = AnswerCardWidget(a.index, a.text, len(a.tokens), a.stop_reason)
            card.sig_rated.connect(self._card_rated)
            card.sig_unskip.connect(self._card_unskipped)
            card.sig_corrected.connect(self._card_corrected)
            cards.append(card)
        # the session's round (shown again after a failed Generate): its ratings and corrections
        for card, shown in zip(cards, rewards.round_cards(answers, self.session) or [], strict=False):
            if shown.rating is not None:
                card.set_rating(shown.rating)
            if shown.corrected is not None:
                card.set_corrected(shown.corrected)
            card.set_locked(shown.locked)
        groups = rewards.same_answers([(card.index, card.text) for card in cards])
        for card in cards:
            card.set_same_as([i for g in groups if card.index in g for i in g if i != card.index])
        self.diagnostics.set_same_answers(groups, len(cards))
        self.cards = cards
        self.grid.set_cards(cards)
        if cards:
            self.refresh_preview()
        else:
            self.diagnostics.set_empty(self.reward_settings.mode())
        self._update_apply_enabled()

    # --- rating -------------------------------------------------------------------------------
    def _card_rated(self, index: int, value, advance: bool) -> None:
        if self.busy or self.session is None or not (0 <= index < len(self.cards)):
            return
        if not self._record(lambda: self.session.rate(index, value), "The rating", "rate again"):
            return
        self.cards[index].set_rating(value, skipped=value is None)
        if self.banner.level == "error" and "rating" in self.banner_text():
            self.banner.hide()
        self.refresh_preview()
        if advance:
            self.grid.next_card(index)

    def _record(self, write, what: str, again: str) -> bool:
        """write() appends a rating or a better answer to the ratings file; False, and why in the page,
        when it could not (`what` was not saved: choose another file, then `again`)."""
        try:
            write()
        except EngineError as exc:
            self.show_error(
                f"{what} was not saved: {exc}. Choose another file with Ratings file…, then {again}."
            )
            return False
        return True

    def _card_unskipped(self, index: int) -> None:
        if 0 <= index < len(self.cards):
            self.cards[index].set_rating(None, skipped=False)
            self.refresh_preview()

    def _card_corrected(self, index: int, text: str) -> None:
        if self.busy or self.session is None:
            return
        if not self._record(lambda: self.session.correct(index, text), "The better answer", "save it again"):
            return
        self.cards[index].set_corrected(text)
        self.refresh_preview()

    def rate(self, index: int, value: float | None) -> None:
        """Rate answer `index` as a card would (None = skip)."""
        self._card_rated(index, value, False)

    def refresh_preview(self) -> None:
        """Diagnostics and each card's weight/advantage, from the session's preview()."""
        s = self.session
        if s is None or not self.cards:
            self.diagnostics.set_empty(self.reward_settings.mode())
            return
        if self.cards[0].locked:  # the round was applied; the panel shows what it did
            return
        p = s.preview()
        mode = s.config.mode
        kind = "advantage" if mode == "group" else "weight"
        for card, w in zip(self.cards, p.weights, strict=False):
            card.set_weight(w, kind)
        self.diagnostics.set_preview(
            p, mode, [c.state for c in self.cards], [c.rating for c in self.cards],
            n_corrected=sum(c.corrected is not None for c in self.cards),
        )  # fmt: skip
        self._update_apply_enabled()

    def _mode_changed(self, mode: str) -> None:
        s = self.session
        if s is not None and not self.busy:
            try:
                s.config = replace(s.config, mode=mode)
            except EngineError:
                return
            self.refresh_preview()

    # --- checks beside the ratings ----------------------------------------------------------------
    def _score_round(self) -> bool:
        """Score the round's answers with the Unattended tab's checks, in the worker (a person's file
        runs there); the cards show the scores and the preview counts them beside the ratings."""
        s = self.session
        if s is None or not s.answers or self.busy or any(c.locked for c in self.cards):
            return False
        specs = self.auto.checks.specs()
        if not specs:
            self.show_error(
                "Tick at least one check on the Unattended tab to score the answers with.", "info"
            )
            return False
        weight = float(self.auto.checks.rating_weight.value())
        prompt = s.prompt
        items = prompts_of_samples(self.samples or [])
        sample = next((it.sample for it in items if it.prompt == prompt), {})

        def job(engine_session):
            return s.score_answers(Scorer(specs, rating_weight=weight), sample)

        def done(scores) -> None:
            for card, sc in zip(self.cards, scores, strict=False):
                card.set_check(sc)
            self.refresh_preview()

        self._run("scoring", job, done, needs_model=False)
        return True

    # --- apply --------------------------------------------------------------------------------
    def apply(self) -> bool:
        """One training step on the round's ratings, in the worker; False (and why) if it cannot."""
        if self.busy:
            return False
        s = self.session
        scored = s is not None and any(
            sc is not None and sc.total is not None for sc in getattr(s, "check_scores", [])
        )
        problem = rewards.apply_problem(s is not None, [c.state for c in self.cards],
                                        [c.corrected is not None for c in self.cards],
                                        [c.locked for c in self.cards], scored)  # fmt: skip
        if problem is not None:
            self.show_error(problem.text, problem.level)
            if problem.focus_cards:
                self.grid.focus_card(0)
            return False
        try:
            config = self.reward_settings.reward_config()
        except EngineError as exc:
            self.show_error(invalid_setting(exc, "left", "press Apply", "A setting"))
            return False
        self.banner.hide()

        def job(engine_session):
            self._configure(s, config)
            return s.apply()

        self._run("applying", job, self._applied)
        return True

    def _applied(self, result: RoundResult) -> None:
        s = self.session
        for card in self.cards:
            card.set_locked(True)
        self.history.set_rounds(s.history if s is not None else [result])
        status, warning = rewards.applied_status(result)
        self.status_label.setText(status)
        if warning:
            self.show_error(warning, "warning")
        self.refresh_runs()  # the reward-tuned adapter is a run of its own now
        self._show_paths()
        self._update_apply_enabled()
        self.side_by_side.set_answers(None, None)
        self.prompt_edit.setFocus()
        self.sig_round_applied.emit(result)


__all__ = ["CHECKPOINT_FOLDER", "NEW_ADAPTER", "RATINGS_FILE", "RewardsPage"]
