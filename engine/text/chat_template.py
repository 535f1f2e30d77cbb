"""Chat templates: turn a conversation into the text a model was trained on.

A GGUF file carries its chat template as Jinja source in `tokenizer.chat_template`.
`ChatTemplate` renders it the way Hugging Face transformers' `apply_chat_template`
does (same Jinja settings, filters, globals and variables; parity is checked
against transformers' own output in `tests/data/templates/expected.json`), but
inside jinja2's `ImmutableSandboxedEnvironment`, because a model file is untrusted
input. A syntax error, a `raise_exception(...)` in the template, a sandbox
violation or any other failure while rendering becomes a `TemplateError`.

Beyond the sandbox, a render has limits (engine.text.template_sandbox): a time limit (5 s
by default), checked at every attribute access, call, operator, loop iteration and
piece of output, so it works in any thread and leaves nothing running; a size limit
on what the template creates (32 Mi characters plus 16 per character of its input),
checked before every operation that can build a large value; and templates longer
than 128 KiB are refused. Crossing one is a `TemplateError` saying which.

`render_with_spans` also says where each assistant reply lies in the rendered
text, which is what loss masking needs (DESIGN.md §2.5). A conversation of many
replies is searched reply by reply in windows around each, in linear time.

What it is not: a tokenizer (the text goes to `engine.text.tokenizer`), a dataset
loader, or a complete copy of `apply_chat_template`: tools must already be JSON
schemas (no conversion of Python functions), and `continue_final_message` and
control-token sanitising are not offered.

One module (about 820 lines) on purpose: locating replies (`render_with_spans`) and measuring a
render against the size limit both re-render through the template's own sandboxed environment,
limits and cache of skeletons, so split off they would reach into its private state; the sandbox
itself is engine.text.template_sandbox already.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import re
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import jinja2.visitor

from ..errors import ModelError, TemplateError
from .content_flow import passes_contents_through
from .template_sandbox import (
    ACTIVE_BUDGET,
    BASE_CHARS,
    GUARDS,
    MAX_SOURCE_CHARS,
    TIME_LIMIT,
    TRACKER_VARIABLE,
    Budget,
    GenerationExtension,
    GenerationTracker,
    LimitExceeded,
    RaisedByTemplate,
    SandboxEnvironment,
    StoppedError,
    TemplateDict,
    TemplateNamespace,
    guarded_filter,
    plain_messages,
    plain_records,
    raise_exception,
    short_line,
    template_line,
    to_plain,
    tojson,
)

__all__ = ["CHATML_TEMPLATE", "GEMMA_TEMPLATE", "ChatTemplate"]

log = logging.getLogger(__name__)

#: The template used when a model has none: ChatML as transformers documents it.
CHATML_TEMPLATE: str = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: The template used when a model with Gemma's turn tokens has none (base Gemma 3 files): Gemma 3's own
#: (google/gemma-3-*-it), a system message prefixed to the first user turn, the assistant called "model".
GEMMA_TEMPLATE: str = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
_GEMMA_TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")

# transformers' test for templates that mark assistant output with {% generation %}.
_GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
# render_with_spans locates the replies of a conversation with more assistant messages than this
# one at a time in a window around each (linear in its length), fewer in the whole conversation
_EXACT_REPLIES = 8
# conversation structures whose skeleton render a template keeps (see "skeletons" below)
_MAX_SKELETONS = 4096
_PAD = 64  # characters added to each placeholder to measure what a content costs the size limit
# characters before a reply that must agree between its window and the whole conversation: back to
# the user message before it, at least this many, and this many when that message is not found
_MIN_WINDOW_CONTEXT = 16
_WINDOW_CONTEXT = 256


def _token_text(metadata: Mapping[str, Any], key: str) -> str:
    """The text of the special token whose id metadata[key] holds, or "" when the model names none."""
    if key not in metadata:
        return ""
    token_id = metadata[key]
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
        raise ModelError(f"{key} is {token_id!r} but the model has no tokenizer.ggml.tokens to look it up in")
    if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
        raise ModelError(f"{key} is {token_id!r}; expected a token id in 0..{len(tokens) - 1}")
    return str(tokens[token_id])


class ChatTemplate:
    """A compiled chat template with the special-token strings it is rendered with.

    Attributes:
        source: the Jinja source.
        bos_token, eos_token: the strings the template sees as `bos_token` / `eos_token` ("" when none).
        name: how error messages name the template, e.g. "chat template raised: ...".
        is_default: True when `from_metadata` fell back to ChatML because the model has no template.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        name: str = "chat template",
        is_default: bool = False,
        now: Callable[[], datetime] | None = None,
        time_limit: float = TIME_LIMIT,
        fast_spans: bool = True,
    ):
        """Compile `source`; `TemplateError` if it is not valid Jinja or longer than 128 KiB.

        `now` is the clock behind the template's `strftime_now(format)` (default `datetime.now`);
        pass a fixed one to make renders of date-stamping templates reproducible. `time_limit` is
        the seconds one `render` may take (`render_with_spans` gets 5 ms more per message) before
        it stops with a TemplateError. `fast_spans` False makes `render_with_spans` render every
        conversation it needs for real, as the reference that the fast way is tested against.
        """
        if not isinstance(source, str):
            raise TemplateError(f"{name} must be a string of Jinja source, got {type(source).__name__}")
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateError(
                f"{name} is {len(source):,} characters long; templates up to {MAX_SOURCE_CHARS:,} "
                "characters are accepted"
            )
        if not (isinstance(time_limit, (int, float)) and 0 < time_limit < math.inf):
            raise TemplateError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
        self.source = source
        self.time_limit = float(time_limit)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self.is_default = is_default
        clock = now if now is not None else datetime.now

        def strftime_now(format: str) -> str:
            return clock().strftime(format)

        env = SandboxEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[GenerationExtension, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = tojson
        for filter_name, func in list(env.filters.items()):
            env.filters[filter_name] = guarded_filter(filter_name, func)
        env.filters.update({key: jinja2.pass_context(guard) for key, guard in GUARDS.items()})
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        env.globals["dict"] = TemplateDict()
        env.globals["namespace"] = TemplateNamespace
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"{name} has a syntax error on line {exc.lineno}: {short_line(exc.message)}"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on absurd nesting
            raise TemplateError(
                f"{name} cannot be compiled: {type(exc).__name__}: {short_line(exc)}"
            ) from exc
        self._marks_generation = _GENERATION_TAG.search(source) is not None
        self.fast_spans = fast_spans
        self._now = clock
        self._reads_clock = "strftime_now" in source
        self._passes_through: bool | None = None  # passes_contents_through, once asked
        nonce = secrets.token_hex(6)
        self._placeholder = "\ue000" + nonce + "{}\ue001"
        self._placeholders = re.compile("\ue000" + nonce + "([0-9]+)\ue001")
        self._skeletons: dict[tuple, Any] = {}

    def recipe(self) -> dict[str, Any]:
        """The arguments that compile this template again (`ChatTemplate(**recipe)`); the clock is not
        one of them: a template made again reads the time where it is made."""
        return {
            "source": self.source,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "name": self.name,
            "is_default": self.is_default,
            "time_limit": self.time_limit,
            "fast_spans": self.fast_spans,
        }

    def __reduce__(self) -> tuple:
        """Pickled as its recipe (a compiled Jinja environment does not pickle): another process gets
        the same template, compiled there."""
        return (_from_recipe, (self.recipe(),))

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """The template of a model, from its GGUF metadata.

        Uses `tokenizer.chat_template`; when the model has none or an empty one (`is_default` True),
        Gemma 3's template (`GEMMA_TEMPLATE`) for a vocabulary with Gemma's turn tokens (base Gemma
        files have none), else `CHATML_TEMPLATE`. `bos_token`/`eos_token` are the texts of the tokens
        that `tokenizer.ggml.bos_token_id`/`eos_token_id` name, "" when absent.
        """
        bos = _token_text(metadata, "tokenizer.ggml.bos_token_id")
        eos = _token_text(metadata, "tokenizer.ggml.eos_token_id")
        source = metadata.get("tokenizer.chat_template")
        if source is None or (isinstance(source, str) and not source.strip()):
            tokens = metadata.get("tokenizer.ggml.tokens")
            if isinstance(tokens, Sequence) and all(t in tokens for t in _GEMMA_TURN_TOKENS):
                log.info("model has no chat template; its vocabulary has Gemma's turn tokens: using Gemma's")
                return cls(
                    GEMMA_TEMPLATE,
                    bos_token=bos,
                    eos_token=eos,
                    name="default Gemma template",
                    is_default=True,
                )
            log.info("model has no chat template; using ChatML")
            return cls(
                CHATML_TEMPLATE, bos_token=bos, eos_token=eos, name="default ChatML template", is_default=True
            )
        if not isinstance(source, str):
            raise TemplateError(f"tokenizer.chat_template is a {type(source).__name__}, expected a string")
        return cls(source, bos_token=bos, eos_token=eos)

    def __repr__(self) -> str:
        return (
            f"ChatTemplate({self.name!r}, {len(self.source)} chars, bos_token={self.bos_token!r}, "
            f"eos_token={self.eos_token!r}, is_default={self.is_default})"
        )

    # -- rendering ------------------------------------------------------------

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False, **extra: Any
    ) -> str:
        """The conversation as text, exactly as transformers' `apply_chat_template(..., tokenize=False)`.

        `extra` reaches the template as variables: `tools` and `documents` (lists of mappings),
        and anything else a template reads (`enable_thinking`, `date_string`, ...); it may also
        override `bos_token`/`eos_token`. `TemplateError` if the template raises or fails, or
        goes past the time limit or the size limit (what it may build: 32 Mi characters plus 16
        per character of the conversation).
        """
        with self._limits(self.time_limit):
            variables = self._variables(messages, add_generation_prompt, extra)
            return self._guarded(lambda: self._template.render(variables), variables)

    def render_with_spans(
        self, messages: Sequence[Mapping[str, Any]], **extra: Any
    ) -> tuple[str, list[tuple[int, int]]]:
        """The whole conversation (no generation prompt) and, per assistant message, its span [start, end).

        A span covers what the model must learn to produce: the reply as the template renders it
        and the end-of-turn marker after it ("<|im_end|>", "<|eot_id|>", "</s>", ...), without the
        turn's header or the whitespace after the marker. Templates that mark replies with
        `{% generation %}` blocks, one per assistant message, get those blocks (trailing
        whitespace trimmed), as transformers' `return_assistant_tokens_mask` uses them.

        Otherwise each span starts where `render(messages[:i], add_generation_prompt=True)` ends
        and stops at the end-of-turn marker of `render(messages[:i + 1])`. Text that a template
        appends only when a conversation ends there (Phi-3's trailing eos_token) is not part of
        any span. Where a template renders earlier turns differently once later ones follow
        (Qwen3 drops the <think> block of earlier replies, Mistral-Nemo writes the system prompt
        into a user turn only when that turn is the last message, DeepSeek-R1's generation prompt
        differs from its turn header), the reply is located by rendering the conversation with a
        probe string in its place. `TemplateError` naming the message if neither works.
        """
        if "add_generation_prompt" in extra:
            raise TypeError("render_with_spans renders a finished conversation: no add_generation_prompt")
        n = len(messages) if isinstance(messages, Sequence) else 0
        with self._limits(self.time_limit + 0.005 * n):
            return self._render_with_spans(messages, extra)

    def _render_with_spans(
        self, messages: Sequence[Mapping[str, Any]], extra: dict[str, Any]
    ) -> tuple[str, list[tuple[int, int]]]:
        rend = _Renders(self, extra)
        text = rend(messages)  # validates messages
        messages = list(messages)
        roles = [m.get("role") for m in messages]
        replies = [i for i, role in enumerate(roles) if role == "assistant"]
        if not replies:
            return text, []
        if self._marks_generation:
            marked = self._generation_spans(messages, rend.extra)
            if marked is not None and marked[0] == text and len(marked[1]) == len(replies):
                return marked
            log.debug("%s: {%% generation %%} blocks do not match the assistant messages", self.name)
        spans: list[tuple[int, int]] = []
        windowed = len(replies) > _EXACT_REPLIES
        for i in replies:
            span = None
            if windowed:
                span = self._span_in_window(messages, roles, i, text, rend, spans[-1][1] if spans else 0)
            if span is None:
                span = self._span_after_prompt(messages, i, text, rend)
            if span is None:
                span = self._span_by_probe(messages, i, text, rend)
            if span is None:
                raise TemplateError(
                    f"{self.name}: cannot locate assistant message {i} in the rendered conversation; "
                    "the template renders it differently depending on the messages around it"
                )
            span = _with_message_end(text, span)
            if spans and span[0] < spans[-1][1]:
                raise TemplateError(
                    f"{self.name}: assistant message {i} was located at {span}, overlapping the previous "
                    f"reply at {spans[-1]}"
                )
            spans.append(span)
        return text, spans

    def fingerprint(self) -> str:
        """A SHA-256 (hex) of what decides this template's renders: its source, its BOS/EOS token
        strings and its name (error messages carry it); for a template that reads the clock, the
        day too (a date-stamping template renders differently tomorrow)."""
        h = hashlib.sha256()
        parts = [self.source, self.bos_token, self.eos_token, self.name]
        if self._reads_clock:
            parts.append(self._now().strftime("%Y-%m-%d"))
        for part in parts:
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        return h.hexdigest()

    @property
    def passes_contents_through(self) -> bool:
        """The template writes message contents verbatim and looks at nothing else in them but
        their emptiness and type (`engine.text.content_flow`): `render_with_spans` then renders
        each conversation structure once (a "skeleton") and puts the contents into it."""
        if self._passes_through is None:
            self._passes_through = (
                not self._marks_generation
                and not self._reads_clock
                and passes_contents_through(self.source, _analysis_environment())
            )
        return self._passes_through

    # -- skeletons ------------------------------------------------------------
    #
    # For a template that passes contents through, the render of a conversation is the render of
    # its skeleton (the same messages with each non-empty content replaced by a placeholder) with
    # the placeholders replaced by the contents (engine.text.content_flow says why). A skeleton is
    # rendered once per structure (the roles, the other fields, which contents are empty, the
    # generation prompt) with the same sandbox and limits as any render, and kept. A failing render
    # fails the same way for every conversation of its structure, and is kept too. The size limit
    # is the one thing a content can change: the skeleton is rendered a second time with longer
    # placeholders to learn what each character of content costs, and a conversation whose contents
    # could reach the limit is rendered for real.

    def _substituted(
        self,
        messages: Any,
        add_generation_prompt: bool,
        known: dict[int, tuple[Any, str] | None] | None = None,
    ) -> str | None:
        """`render(messages, add_generation_prompt=...)` from the skeleton of its structure; None when
        the conversation must be rendered for real (not plain data, or contents that could reach
        the size limit). `TemplateError` as the render would raise it. `known`: each message's
        structure key and content, by id, kept across calls about the same messages."""
        if not isinstance(messages, (list, tuple)):
            return None
        if known is None:
            known = {}
        keys: list[Any] = [add_generation_prompt]
        contents: list[str] = []
        for m in messages:
            found = known.get(id(m), _UNKNOWN)
            if found is _UNKNOWN:
                found = known[id(m)] = _message_key(m)
            if found is None:
                return None
            keys.append(found[0])
            contents.append(found[1])
        skeleton = self._skeleton(tuple(keys), messages, add_generation_prompt)
        if skeleton is None:
            return None
        rendered, spent, per_char = skeleton
        if contents and spent + per_char * max(map(len, contents)) > BASE_CHARS:
            return None  # the contents might take the render past its size limit: render it for real
        if isinstance(rendered, TemplateError):
            raise TemplateError(str(rendered))
        parts = list(rendered)
        for j in range(1, len(parts), 2):
            parts[j] = contents[parts[j]]
        return "".join(parts)

    def _skeleton(self, key: tuple, messages: Sequence[dict], add_generation_prompt: bool) -> Any:
        """(pieces or the TemplateError, characters spent, characters spent per content character)
        of a structure; None when it cannot be used (a render stopped at a limit)."""
        found = self._skeletons.get(key)
        if found is not None:
            return found or None
        skeleton = [
            {**m, "content": self._placeholder.format(k) if m["content"] else ""}
            for k, m in enumerate(messages)
        ]
        padded = [{**m, "content": m["content"] + "\ue002" * _PAD if m["content"] else ""} for m in skeleton]
        try:
            rendered, spent = self._measured(skeleton, add_generation_prompt)
            again, spent_padded = self._measured(padded, add_generation_prompt)
        except StoppedError:
            return None
        per_char, rest = divmod(spent_padded - spent, _PAD)
        if rest or per_char < 0 or type(rendered) is not type(again):
            value: Any = False  # not linear in the contents' length: never substituted
        elif isinstance(rendered, TemplateError):
            value = (rendered, spent, per_char)
        else:
            parts = self._placeholders.split(rendered)
            value = (tuple(p if j % 2 == 0 else int(p) for j, p in enumerate(parts)), spent, per_char)
        if len(self._skeletons) >= _MAX_SKELETONS:
            self._skeletons.clear()
        self._skeletons[key] = value
        return value or None

    def _measured(self, messages: Sequence[dict], add_generation_prompt: bool) -> tuple[Any, int]:
        """(the render or the TemplateError it raised, the characters it spent against the size limit),
        in a budget of its own. `StoppedError` when it stops at a limit."""
        budget = Budget(self.time_limit)
        token = ACTIVE_BUDGET.set(budget)
        try:
            variables = self._variables(messages, add_generation_prompt, {})
            return self._guarded(lambda: self._template.render(variables), variables), budget.spent
        except StoppedError:
            raise
        except TemplateError as exc:
            return exc, budget.spent
        finally:
            ACTIVE_BUDGET.reset(token)

    # -- internals --------------------------------------------------------------

    @contextlib.contextmanager
    def _limits(self, seconds: float) -> Iterator[None]:
        """The budget of one public call: the renders inside it share its deadline."""
        if ACTIVE_BUDGET.get() is not None:  # render() called from render_with_spans
            yield
            return
        token = ACTIVE_BUDGET.set(Budget(seconds))
        try:
            yield
        finally:
            ACTIVE_BUDGET.reset(token)

    def _variables(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        extra = dict(extra)
        try:
            tools = plain_records(extra.pop("tools", None), "tools")
            documents = plain_records(extra.pop("documents", None), "documents")
            return {
                "bos_token": self.bos_token,
                "eos_token": self.eos_token,
                **{key: to_plain(value) for key, value in extra.items()},
                "messages": plain_messages(messages),
                "tools": tools,
                "documents": documents,
                "add_generation_prompt": add_generation_prompt,
            }
        except RecursionError:
            raise TemplateError(
                f"{self.name}: the messages or variables nest too deeply (lists and mappings inside each "
                "other, hundreds of levels)"
            ) from None

    def _guarded(self, run: Callable[[], str], variables: Mapping[str, Any]) -> str:
        """Run a render, turning whatever it raises into a TemplateError that says what happened."""
        budget = ACTIVE_BUDGET.get()
        if budget is not None:
            budget.begin(variables)
        try:
            return run()
        except RaisedByTemplate as exc:
            raise TemplateError(f"{self.name} raised: {short_line(exc)}") from None
        except LimitExceeded as exc:
            raise StoppedError(f"{self.name} was stopped{template_line(exc)}: {exc}") from None
        except jinja2.exceptions.SecurityError as exc:
            where = template_line(exc)
            raise TemplateError(f"{self.name} was stopped by the sandbox{where}: {short_line(exc)}") from exc
        except TemplateError:
            raise
        except Exception as exc:  # noqa: BLE001 - the template is untrusted code; anything it raises is its failure
            raise TemplateError(
                f"{self.name} failed{template_line(exc)}: {type(exc).__name__}: {short_line(exc)}"
            ) from exc

    def _generation_spans(
        self, messages: Sequence[Mapping[str, Any]], extra: dict[str, Any]
    ) -> tuple[str, list[tuple[int, int]]] | None:
        """The text and the `{% generation %}` block ranges (trailing whitespace trimmed) of one render."""
        tracker = GenerationTracker()
        variables = self._variables(messages, False, extra)
        variables[TRACKER_VARIABLE] = tracker

        def run() -> str:
            pieces = []
            for piece in self._template.generate(variables):
                pieces.append(piece)
                tracker._length += len(piece)
            return "".join(pieces)

        text = self._guarded(run, variables)
        spans = [(start, start + len(text[start:end].rstrip())) for start, end in tracker._blocks]
        if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)):
            return None
        return text, spans

    def _closed_turn(self, messages: Sequence[Mapping[str, Any]], rend: _Renders) -> str | None:
        """`render(messages)` up to the end-of-turn marker of its last message, or None if unclear.

        That is the render without trailing whitespace, unless the template closes a finished
        conversation with text a continuing one lacks: then the eos_token it appends is dropped.
        """
        closed = rend(messages).rstrip()
        continued = rend(messages, True)
        if continued.startswith(closed):
            return closed
        if self.eos_token and closed.endswith(self.eos_token):
            trimmed = closed[: -len(self.eos_token)].rstrip()
            if continued.startswith(trimmed):
                return trimmed
        return None

    def _span_after_prompt(
        self, messages: Sequence[Mapping[str, Any]], i: int, text: str, rend: _Renders
    ) -> tuple[int, int] | None:
        """Span of reply i as what `render(messages[:i + 1])` adds to the generation prompt before it."""
        try:
            prompt = rend(messages[:i], True)
            turn = self._closed_turn(messages[: i + 1], rend)
        except StoppedError:
            raise
        except TemplateError:
            return None
        if turn is None or len(turn) <= len(prompt):
            return None
        if not (turn.startswith(prompt) and text.startswith(turn)):
            return None
        return len(prompt), len(turn)

    def _span_in_window(
        self,
        messages: Sequence[Mapping[str, Any]],
        roles: Sequence[Any],
        i: int,
        text: str,
        rend: _Renders,
        after: int,
    ) -> tuple[int, int] | None:
        """Span of reply i located in a window of the conversation, found again in `text`; None if not.

        The window runs from the user message before the reply to the user message after it (with
        the system message first, if the conversation has one), so that rendering it costs the
        same wherever the reply is: a long conversation's spans take linear time, not quadratic.
        The reply's span is located in the window as in the whole conversation (generation prompt,
        else probe); its text must then occur in `text` at or after `after` (the previous span's
        end), preceded by the same characters as in the window back to the user message before
        it (its content, the turn headers, any tool turns between), or the caller falls back to
        the whole conversation.
        """
        j = next((k for k in range(i - 1, -1, -1) if roles[k] == "user"), 0)
        end = next((k + 1 for k in range(i + 1, len(messages)) if roles[k] == "user"), len(messages))
        head = [messages[0]] if j > 0 and roles[0] == "system" else []
        window = [*head, *messages[j:end]]
        w = len(head) + i - j
        try:
            wtext = rend(window)
        except StoppedError:
            raise
        except TemplateError:
            return None
        span = self._span_after_prompt(window, w, wtext, rend)
        if span is None:
            span = self._span_by_probe(window, w, wtext, rend)
        if span is None:
            return None
        a, b = span
        reply = wtext[a:b]
        # what must precede the reply in both: back to the user message before it, as rendered
        question = messages[j].get("content") if roles[j] == "user" else None
        start = -1
        if isinstance(question, str):  # as written, else as templates that trim it write it
            for q in dict.fromkeys((question, question.strip())):
                start = wtext.rfind(q, 0, a) if q else -1
                if start >= 0:
                    break
        need = a - start if start >= 0 else min(a, _WINDOW_CONTEXT)
        need = max(need, min(a, _MIN_WINDOW_CONTEXT))
        context = wtext[a - need : a]
        pos = text.find(reply, after)
        while pos >= 0:
            if pos >= need and text.startswith(context, pos - need):
                return pos, pos + len(reply)
            pos = text.find(reply, pos + 1)
        return None

    def _span_by_probe(
        self, messages: Sequence[Mapping[str, Any]], i: int, text: str, rend: _Renders
    ) -> tuple[int, int] | None:
        """Span of reply i found by rendering the conversation with a probe string as its content.

        The text before the probe must equal `text`; the end-of-turn marker is what follows the
        probe when the conversation ends at message i; what follows the marker is what the later
        messages render, which must end `text`. The span is what lies between, less trailing whitespace.
        """
        probe = f"\ue000tune-studio-probe-{i}\ue001"
        probed = list(messages)
        probed[i] = {**messages[i], "content": probe}
        try:
            full = rend(probed)
            turn = self._closed_turn(probed[: i + 1], rend)
        except StoppedError:
            raise
        except TemplateError:
            return None
        if turn is None or full.count(probe) != 1 or turn.count(probe) != 1:
            return None
        start = full.index(probe)
        marker = turn[turn.index(probe) + len(probe) :]
        if text[:start] != full[:start] or not full.startswith(marker, start + len(probe)):
            return None
        later = full[start + len(probe) + len(marker) :]
        end = len(text) - len(later)
        if end <= start or not text.endswith(later):
            return None
        # What lies between is the reply and its marker as rendered in context (a marker may itself
        # depend on the content, e.g. Qwen3 writes "\n" before a tool call only after non-empty content).
        end = start + len(text[start:end].rstrip())
        return (start, end) if end > start else None


class _Renders:
    """The renders that one `render_with_spans` call asks for: each conversation (the same message
    objects, with or without the generation prompt) rendered once, from its skeleton when the
    template passes contents through (`ChatTemplate._substituted`), else for real. With
    `fast_spans` False, every render is made for real, as the reference."""

    __slots__ = ("template", "extra", "_memo", "_keep", "_fast", "_memoise", "_known")

    def __init__(self, template: ChatTemplate, extra: dict[str, Any]):
        self.template = template
        self.extra = extra
        self._memo: dict[tuple, str] = {}
        self._keep: list[Any] = []  # the conversations rendered, alive so that their ids stay theirs
        self._memoise = template.fast_spans and not template._reads_clock
        self._fast = self._memoise and not extra and template.passes_contents_through
        self._known: dict[int, tuple[Any, str] | None] = {}  # each message's structure key, by id

    def __call__(self, messages: Any, add_generation_prompt: bool = False) -> str:
        key = None
        if self._memoise and isinstance(messages, (list, tuple)):
            self._keep.append(messages)  # alive for the whole call: ids in _memo and _known stay theirs
            key = (add_generation_prompt, *map(id, messages))
            text = self._memo.get(key)
            if text is not None:
                return text
        text = None
        if self._fast:
            text = self.template._substituted(messages, add_generation_prompt, self._known)
        if text is None:
            text = self.template.render(messages, add_generation_prompt=add_generation_prompt, **self.extra)
        if key is not None:
            self._memo[key] = text
        return text
        text = (
            self.template._substituted(messages, add_generation_prompt, self._known) if self._fast else None
        )
        if text is None:
            text = self.template.render(messages, add_generation_prompt=add_generation_prompt, **self.extra)
        if key is not None:
            self._memo[key] = text
            self._keep.append(messages)
        return text


_PLAIN_SCALARS = (str, int, float, bool, type(None))
_UNKNOWN = object()


def _message_key(m: Any) -> tuple[Any, str] | None:
    """(a hashable stand-in for everything in a message but its content's text, the content), or
    None when the message cannot be rendered from a skeleton (not a dict, content not a str, a
    field that is not plain data)."""
    if type(m) is not dict:
        return None
    content = m.get("content")
    if type(content) is not str:
        return None
    role = m.get("role")
    if len(m) == 2 and type(role) is str:
        return (role, not content, next(iter(m)) == "role"), content
    key = _structure_of(m)
    return None if key is None else (key, content)


def _structure_of(message: dict) -> tuple | None:
    """A hashable stand-in for a message's fields besides its content's text: their names, order
    and values, and whether the content is empty. None when a value is not plain data (a repr
    would not tell two of them apart)."""
    stack: list[Any] = [message]
    while stack:
        value = stack.pop()
        if type(value) in _PLAIN_SCALARS:
            continue
        if type(value) is dict:
            if not all(type(k) is str for k in value):
                return None
            stack.extend(value.values())
        elif type(value) in (list, tuple):
            stack.extend(value)
        else:
            return None
    fields = repr([(k, None if k == "content" else v) for k, v in message.items()])
    return ("fields", fields, not message["content"])


@functools.lru_cache(maxsize=1)
def _analysis_environment() -> jinja2.Environment:
    """An environment that parses templates as `ChatTemplate` does (its extensions), for reading only."""
    return jinja2.Environment(extensions=[GenerationExtension, jinja2.ext.loopcontrols])


# Markers that end a message and directly follow its content (gpt-oss's harmony format: <|end|> after
# a reply in the history, <|return|> after the last one, which is also the eos_token and so is not
# part of the closed turn render_with_spans locates first).
_MESSAGE_END_MARKERS = ("<|return|>", "<|end|>")


def _with_message_end(text: str, span: tuple[int, int]) -> tuple[int, int]:
    """The span extended over a message-end marker that directly follows it, so that it is learned."""
    start, end = span
    for marker in _MESSAGE_END_MARKERS:
        if text.startswith(marker, end):
            return start, end + len(marker)
    return span


def _from_recipe(recipe: dict[str, Any]) -> ChatTemplate:
    return ChatTemplate(**recipe)


def template_for(metadata: Mapping, template_file: str | os.PathLike[str] | None) -> ChatTemplate:
    """The model's chat template, or one read from a file (`TemplateError` when it cannot be read),
    with the model's BOS/EOS tokens either way."""
    base = ChatTemplate.from_metadata(metadata)
    if not template_file:
        return base
    try:
        source = Path(template_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"{template_file}: the chat template cannot be read ({exc})") from exc
    return ChatTemplate(
        source, bos_token=base.bos_token, eos_token=base.eos_token, name=os.fspath(template_file)
    )
