"""An engine session: one opened model serving jobs, one at a time, for the app and the CLI.

`EngineSession(model_path, device=..., cache_budget=...)` opens the model once: the weight store
(quantized at rest), the backend, the tokenizer and the chat template. Every job then shares them:

- training: `new_run(data, config)` builds a run (the trainer); `train(on_event, should_stop,
  should_pause)` takes steps until the run ends, is stopped, or is paused; a paused run stays in
  memory, and the next `train` goes on from the step it paused at, with nothing reloaded.
  `stop_run` ends a paused run (a checkpoint and the adapter are written).
- generation and chat: `generate(messages, sampling, adapter=...)` with the base model, an adapter
  file, or the live adapter of the current run, streaming tokens through `on_token`.
- rewards: `open_rewards(...)` gives a `RewardSession` on the same model.
- adapters: `adapter(path)` reads and checks an adapter against the model (cached while the file
  is unchanged); `norms(path)`.
- export: `check_export`, `export` (atomic writes, cancellable), `verify_export` against the model
  in memory.

Long jobs take `on_event` / `should_stop` callables, like `Trainer.run`. A session never starts a
thread or a process; the studio runs its jobs on one worker thread, the CLI on the main thread.
Jobs must not overlap: a second job while one runs is an `EngineError` (the app's worker queues
them instead).
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .backend import Backend, select_backend
from .errors import DatasetError, EngineError
from .export.check import CheckReport, ExportRequest, check_export, write_export
from .export.verify import VerifyReport, verify_export
from .io.weights import AUTO
from .model.generate import GREEDY, SamplingConfig, check_logits
from .model.generate import generate as generate_tokens
from .model.lora import LoraAdapter
from .model.model import Model
from .model.ops import LoraTerm
from .model.summary import ModelSummary, summarize
from .ranges import check_number
from .text.chat_template import template_for
from .text.tokenizer import Tokenizer
from .train import events as ev
from .train.collective import Collective
from .train.data import Sample
from .train.norms import NormsReport, lora_norms
from .train.reward_session import RewardSession
from .train.threads import adjust_blas_threads
from .train.trainer import TrainConfig, Trainer

log = logging.getLogger(__name__)

RUN = "run"  # `adapter=RUN`: the live adapter of the session's current training run
ADAPTERS_KEPT = 4  # adapter files kept read (chat, side by side, rewards use one or two at a time)


@dataclass(frozen=True)
class Reply:
    """One generated answer."""

    text: str  # decoded, without the stop token
    tokens: tuple[int, ...]
    stop_reason: str  # "eos", "length", "context", "stopped"


class EngineSession:
    """One opened model and the jobs it serves (see the module docstring)."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        device: str = "cpu",
        cache_budget: str | int | None = AUTO,
        template_file: str | None = None,
    ):
        self.backend: Backend = select_backend(device)  # EngineError naming why a GPU cannot be used
        self.model = Model.load(model, cache_budget=cache_budget, backend=self.backend)
        self.path = self.model.path
        self.tokenizer = Tokenizer.from_metadata(self.model.metadata, self.path)
        self.template_file = template_file
        self.template = template_for(self.model.metadata, template_file)
        self.run: Trainer | None = None  # the current training run (running, paused, or over)
        self._busy = threading.Lock()
        # the adapters read last, newest last (at most ADAPTERS_KEPT: every run of a long session
        # leaves an adapter to chat with, and keeping them all grew the app by ~0.3 MiB a run)
        self._adapters: dict[str, tuple[float, int, LoraAdapter]] = {}
        self._summary: ModelSummary | None = None

    # --- facts -----------------------------------------------------------------------------------
    @property
    def summary(self) -> ModelSummary:
        if self._summary is None:
            self._summary = summarize(self.path)
        return self._summary

    @property
    def device(self) -> str:
        return self.backend.device

    def set_template_file(self, template_file: str | None) -> None:
        """Use another chat template (None: the model's own)."""
        self.template = template_for(self.model.metadata, template_file)
        self.template_file = template_file

    @contextlib.contextmanager
    def job(self, name: str) -> Iterator[None]:
        """Marks a job as running; a second one at the same time is refused."""
        if not self._busy.acquire(blocking=False):
            raise EngineError(f"the engine is busy; {name} has to wait until the running job ends")
        try:
            if not self.backend.is_gpu:
                adjust_blas_threads()  # generation, logits and reward steps too (training: every step)
            yield
        finally:
            self._busy.release()

    # --- training ---------------------------------------------------------------------------------
    def new_run(
        self,
        data: str | Sequence[Sample],
        config: TrainConfig,
        *,
        resume: str | None = None,
        init_adapter: str | None = None,
        collective: Collective | None = None,
    ) -> Trainer:
        """Set up a training run on this session's model (nothing is computed until `train`).

        A paused run still in the session is ended first (`stop_run`) by the caller; here it is
        simply replaced. `collective`: the ranks of a data-parallel run (engine.train.collective;
        every rank opens its own session and calls the same methods; pausing is for one process)."""
        if config.device != "cpu" and select_backend(config.device).device != self.device:
            raise EngineError(
                f"the run asks for device {config.device}, but the model is open on {self.device}; "
                "open it on that device"
            )
        self.forget_run()
        self.run = Trainer(
            self.model,
            list(data) if not isinstance(data, (str, os.PathLike)) else os.fspath(data),
            config,
            template=self.template,
            resume=resume,
            init_adapter=init_adapter,
            tokenizer=self.tokenizer,
            template_file=self.template_file,
            collective=collective,
        )
        return self.run

    def forget_run(self) -> None:
        """Drop the current run, giving back the device memory its training step held (a run that
        ended did already; one that was replaced or forgotten mid-way had not)."""
        run, self.run = self.run, None
        if run is not None:
            run.release_step()

    @property
    def paused(self) -> bool:
        """A run has started, has steps left and is not taking them."""
        run = self.run
        return run is not None and run.started and not run.done

    def train(
        self,
        on_event: Callable[[object], None] = lambda e: None,
        should_stop: Callable[[], bool] = lambda: False,
        should_pause: Callable[[], bool] = lambda: False,
    ) -> ev.Finished | ev.Failed | ev.Paused:
        """Take steps of the current run until it ends (`Finished`/`Failed`), `should_stop()` says
        stop (it finishes with a checkpoint) or `should_pause()` says pause (`Paused`: the run stays
        in memory; call `train` again to go on)."""
        run = self.run
        if run is None:
            raise EngineError("there is no training run: start one first")
        if run.ended:
            raise EngineError("this run has already ended: start a new one")
        with self.job("training"):
            if not run.started:
                started = run.start(on_event)
                if isinstance(started, ev.Failed):
                    return started
            while not run.done:
                if run.agree_stop(should_stop()):  # with several ranks: as soon as one asks
                    return run.finish(on_event, stopped=True)
                if should_pause():
                    run.note_paused()
                    paused = ev.Paused(run.step)
                    on_event(paused)
                    return paused
                result = run.train_step(on_event)
                if isinstance(result, ev.Failed):
                    return result
            return run.finish(on_event)

    def stop_run(self, on_event: Callable[[object], None] = lambda e: None) -> ev.Finished | ev.Failed:
        """End a paused run: checkpoint and adapter written, `Finished(stopped=True)`."""
        run = self.run
        if run is None or not self.paused:
            raise EngineError("there is no paused run to stop")
        with self.job("stopping the run"):
            return run.finish(on_event, stopped=True)

    # --- generation ---------------------------------------------------------------------------------
    def adapter(self, path: str | os.PathLike[str]) -> LoraAdapter:
        """An adapter file read and checked against this model; read again only when it changed."""
        path = os.fspath(path)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise EngineError(f"{path}: the adapter cannot be read ({exc.strerror or exc})") from exc
        cached = self._adapters.pop(path, None)
        if cached is not None and cached[:2] == (st.st_mtime, st.st_size):
            self._adapters[path] = cached  # the newest again
            return cached[2]
        adapter = LoraAdapter.load(path, self.model)
        self._adapters[path] = (st.st_mtime, st.st_size, adapter)
        while len(self._adapters) > ADAPTERS_KEPT:
            del self._adapters[next(iter(self._adapters))]  # the one used longest ago
        return adapter

    def lora_terms(self, adapter: str | LoraAdapter | None, scale: float = 1.0) -> dict[str, LoraTerm] | None:
        """LoRA terms for the forward pass: None (the base model), RUN (the current run's adapter
        as trained so far), an adapter file, or a loaded adapter."""
        if adapter is None:
            return None
        check_number("adapter_scale", scale, label="adapter scale")
        if isinstance(adapter, str) and adapter == RUN:
            if self.run is None or self.run.trainable is None:
                raise EngineError("no training run has an adapter yet: start training first")
            return self.run.trainable.terms(scale)
        if not isinstance(adapter, LoraAdapter):
            adapter = self.adapter(adapter)
        return adapter.terms(scale)

    def prompt_ids(self, messages: Sequence[Mapping[str, str]], *, chat: bool = True) -> list[int]:
        """Token ids of a conversation rendered with the chat template (ready for the assistant's
        turn), or of plain text (`chat=False`: the content of the messages joined)."""
        tok = self.tokenizer
        if not chat:
            text = "".join(m.get("content", "") for m in messages)
            return tok.encode(text, add_special=True, parse_special=True)
        text = self.template.render(list(messages), add_generation_prompt=True)
        ids = tok.encode(text, add_special=False, parse_special=True)  # the template writes its own BOS
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id, *ids]
        return ids

    def generate(
        self,
        messages: Sequence[Mapping[str, str]] | str,
        sampling: SamplingConfig = GREEDY,
        *,
        adapter: str | LoraAdapter | None = None,
        adapter_scale: float = 1.0,
        n: int = 1,
        chat: bool = True,
        on_token: Callable[[int, str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Reply]:
        """`n` answers (one batch sharing the prompt's KV cache). `messages`: a conversation, or a
        plain prompt string (a user turn with `chat`, raw text without). `on_token(i, text)` streams
        the new text of answer i as soon as it is whole UTF-8."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not messages:
            raise DatasetError("there is nothing to answer: the conversation is empty")
        ids = self.prompt_ids(messages, chat=chat)
        terms = self.lora_terms(adapter, adapter_scale)
        tok = self.tokenizer
        decoders: dict[int, codecs.IncrementalDecoder] = {}

        def stream(i: int, token: int) -> None:
            # a multi-byte character split over tokens waits for its last byte; bytes that can never
            # be UTF-8 become U+FFFD, as in the final decoded text
            if i not in decoders:
                decoders[i] = codecs.getincrementaldecoder("utf-8")(errors="replace")
            text = decoders[i].decode(tok.token_bytes(token))
            if text:
                on_token(i, text)

        with self.job("generation"):
            results = generate_tokens(
                self.model,
                ids,
                n_samples=n,
                sampling=sampling,
                stop_ids=tok.eot_ids,
                lora=terms,
                on_token=stream if on_token is not None else None,
                should_stop=should_stop,
            )
        for i, decoder in decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                on_token(i, rest)
        return [Reply(tok.decode(list(g.tokens)), tuple(g.tokens), g.stop_reason) for g in results]

    def logits(self, tokens: Sequence[int], *, adapter: str | LoraAdapter | None = None, scale: float = 1.0):
        """Logits (T, V) of a token sequence, as float32; ModelError when one is NaN or infinite
        (weights, an adapter or its scale overflowing float32): such logits never leave silently."""
        with self.job("logits"):
            z = self.model.forward(np.asarray(tokens, dtype=np.int64), lora=self.lora_terms(adapter, scale))
        z = self.backend.to_host(z).astype(np.float32)
        check_logits(z, "the logits")
        return z

    # --- rewards ----------------------------------------------------------------------------------
    def open_rewards(self, **kwargs) -> RewardSession:
        """A reward session on this model and chat template (the arguments of `RewardSession`)."""
        kwargs.setdefault("template", self.template)
        kwargs.setdefault("tokenizer", self.tokenizer)  # built once, with the session
        return RewardSession(self.model, **kwargs)

    # --- adapters and export ----------------------------------------------------------------------
    def norms(self, adapter: str | LoraAdapter, *, scale: float = 1.0, with_base: bool = True) -> NormsReport:
        if not isinstance(adapter, LoraAdapter):
            adapter = self.adapter(adapter)
        return lora_norms(adapter, scale=scale, base=self.model.weights.file if with_base else None)

    def check_export(self, request: ExportRequest) -> CheckReport:
        return check_export(request)

    def export(
        self,
        request: ExportRequest,
        adapter: LoraAdapter,
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> str:
        with self.job("export"):
            return write_export(request, adapter, on_progress, should_stop)

    def verify_export(
        self, request: ExportRequest, adapter: LoraAdapter, path: str, prompts: Sequence[str] | None = None
    ) -> VerifyReport:
        """Reload `path` and compare its logits with this model + `adapter` (see engine.export.verify)
        on `prompts` (default: `VERIFY_PROMPTS`)."""
        same = request.base and os.path.exists(request.base) and os.path.samefile(request.base, self.path)
        kwargs = {"prompts": tuple(prompts)} if prompts else {}
        with self.job("verifying the export"):
            if same:
                return verify_export(
                    request, adapter, path, base=self.model, tokenizer=self.tokenizer, template=self.template,
                    **kwargs,
                )  # fmt: skip
            return verify_export(request, adapter, path, template=self.template, **kwargs)
