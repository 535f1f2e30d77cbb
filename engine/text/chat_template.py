"""Chat templates: turn a conversation into the text a model was trained on.

A GGUF file carries its chat template as Jinja source in `tokenizer.chat_template`.
`ChatTemplate` renders it the way Hugging Face transformers' `apply_chat_template`
does (same Jinja settings, filters, globals and variables; parity is checked
against transformers' own output in `tests/data/templates/expected.json`), but
inside jinja2's `ImmutableSandboxedEnvironment`, because a model file is untrusted
input. A syntax error, a `raise_exception(...)` in the template, a sandbox
violation or any other failure while rendering becomes a `TemplateError`.

`render_with_spans` also says where each assistant reply lies in the rendered
text, which is what loss masking needs (DESIGN.md §2.5).

What it is not: a tokenizer (the text goes to `engine.text.tokenizer`), a dataset
loader, or a complete copy of `apply_chat_template`: tools must already be JSON
schemas (no conversion of Python functions), and `continue_final_message` and
control-token sanitising are not offered. The sandbox stops templates from
reaching Python internals and from building huge strings with `*` and `**`; it
does not bound rendering time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelError, TemplateError

__all__ = ["CHATML_TEMPLATE", "ChatTemplate"]

log = logging.getLogger(__name__)

#: The template used when a model has none: ChatML as transformers documents it.
CHATML_TEMPLATE: str = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Names a message's reasoning may come under; transformers copies it to the first (and to "thinking").
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# transformers' test for templates that mark assistant output with {% generation %}.
_GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
# Context variable under which render_with_spans hands the {% generation %} tag its tracker.
_TRACKER_VARIABLE = "__tune_studio_generation_tracker"
# Largest string or list a template may build with `*`, and largest power (in bits) with `**`.
_MAX_REPEAT = 1_000_000
_MAX_POWER_BITS = 65_536


class _RaisedByTemplate(Exception):
    """What the template's `raise_exception(message)` raises; becomes a TemplateError carrying the message."""


class _GenerationTracker:
    """Where each `{% generation %}` block landed in the output of one render.

    Only underscore names, so a template that finds it in its context cannot touch it through the sandbox.
    """

    __slots__ = ("_blocks", "_length")

    def __init__(self) -> None:
        self._length = 0  # characters output so far
        self._blocks: list[tuple[int, int]] = []  # [start, end) of each generation block


class _GenerationExtension(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers' mark for text the assistant generates.

    Renders its body unchanged (as transformers' `AssistantTracker` does); when the render
    carries a `_GenerationTracker`, records the block's character range.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation", [jinja2.nodes.ContextReference()])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation(self, context: jinja2.runtime.Context, caller: Callable[[], str]) -> str:
        text = caller()
        tracker = context.get(_TRACKER_VARIABLE)
        if isinstance(tracker, _GenerationTracker):
            tracker._blocks.append((tracker._length, tracker._length + len(text)))
        return text


class _SandboxEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus limits on `*` and `**` so a template cannot exhaust memory in one step."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_REPEAT:
                    raise jinja2.exceptions.SecurityError(
                        f"repeating a {type(seq).__name__} of length {len(seq)} {n} times exceeds "
                        f"the sandbox limit of {_MAX_REPEAT}"
                    )
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right > 0 and abs(left).bit_length() * right > _MAX_POWER_BITS:
                raise jinja2.exceptions.SecurityError(f"{left} ** {right} exceeds the sandbox's size limit")
        return super().call_binop(context, operator, left, right)


class _TemplateDict:
    """The `dict` global: builds dicts without handing the `dict` type itself to the template."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """The `namespace` global, refusing underscore-prefixed names (as transformers does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature, so namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for key in attrs:
            _TemplateNamespace._check_name(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed names on a namespace (got {name!r})"
            )


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: Sequence[str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson` filter: plain `json.dumps`, non-ASCII kept, no HTML escaping."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: Any) -> None:
    raise _RaisedByTemplate(str(message))


def _plain(value: Any) -> Any:
    """Rebuild `value` from plain JSON-like types, as transformers does before the template sees it.

    Subclasses of str/int/float lose their extra methods; objects that are not data become "<TypeName>".
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as fresh plain dicts, with reasoning aliased under the names templates read."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError(f"messages must be a list of mappings, got {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(
                f"message {i} is a {type(message).__name__}; expected a mapping with 'role' and 'content'"
            )
        plain = _plain(message)
        reasoning = next((plain[key] for key in _REASONING_FIELDS if plain.get(key) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


def _plain_records(value: Any, what: str) -> list[dict[str, Any]] | None:
    """`tools` or `documents`: None, or a list of mappings (JSON schemas, {'title', 'text'} documents)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TemplateError(f"{what} must be a list of mappings, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise TemplateError(f"{what}[{i}] is a {type(item).__name__}; expected a mapping")
    return [_plain(item) for item in value]


def _template_line(exc: BaseException) -> str:
    """' on line N' for the innermost template frame in `exc`'s traceback, or ''."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" on line {line}" if line is not None else ""


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
    ):
        """Compile `source`; `TemplateError` if it is not valid Jinja.

        `now` is the clock behind the template's `strftime_now(format)` (default `datetime.now`);
        pass a fixed one to make renders of date-stamping templates reproducible.
        """
        if not isinstance(source, str):
            raise TemplateError(f"{name} must be a string of Jinja source, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self.is_default = is_default
        clock = now if now is not None else datetime.now

        def strftime_now(format: str) -> str:
            return clock().strftime(format)

        env = _SandboxEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationExtension, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = strftime_now
        env.globals["dict"] = _TemplateDict()
        env.globals["namespace"] = _TemplateNamespace
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{name} has a syntax error on line {exc.lineno}: {exc.message}") from exc
        except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on absurd nesting
            raise TemplateError(f"{name} cannot be compiled: {type(exc).__name__}: {exc}") from exc
        self._marks_generation = _GENERATION_TAG.search(source) is not None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """The template of a model, from its GGUF metadata.

        Uses `tokenizer.chat_template`, or `CHATML_TEMPLATE` (with `is_default` True) when the
        model has none or an empty one; `bos_token`/`eos_token` are the texts of the tokens that
        `tokenizer.ggml.bos_token_id`/`eos_token_id` name, "" when absent.
        """
        bos = _token_text(metadata, "tokenizer.ggml.bos_token_id")
        eos = _token_text(metadata, "tokenizer.ggml.eos_token_id")
        source = metadata.get("tokenizer.chat_template")
        if source is None or (isinstance(source, str) and not source.strip()):
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
        override `bos_token`/`eos_token`. `TemplateError` if the template raises or fails.
        """
        variables = self._variables(messages, add_generation_prompt, extra)
        return self._guarded(lambda: self._template.render(variables))

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
        text = self.render(messages, **extra)  # validates messages
        messages = list(messages)
        replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not replies:
            return text, []
        if self._marks_generation:
            marked = self._generation_spans(messages, extra)
            if marked is not None and marked[0] == text and len(marked[1]) == len(replies):
                return marked
            log.debug("%s: {%% generation %%} blocks do not match the assistant messages", self.name)
        spans: list[tuple[int, int]] = []
        for i in replies:
            span = self._span_after_prompt(messages, i, text, extra)
            if span is None:
                span = self._span_by_probe(messages, i, text, extra)
            if span is None:
                raise TemplateError(
                    f"{self.name}: cannot locate assistant message {i} in the rendered conversation; "
                    "the template renders it differently depending on the messages around it"
                )
            if spans and span[0] < spans[-1][1]:
                raise TemplateError(
                    f"{self.name}: assistant message {i} was located at {span}, overlapping the previous "
                    f"reply at {spans[-1]}"
                )
            spans.append(span)
        return text, spans

    # -- internals --------------------------------------------------------------

    def _variables(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        extra = dict(extra)
        tools = _plain_records(extra.pop("tools", None), "tools")
        documents = _plain_records(extra.pop("documents", None), "documents")
        return {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **{key: _plain(value) for key, value in extra.items()},
            "messages": _plain_messages(messages),
            "tools": tools,
            "documents": documents,
            "add_generation_prompt": add_generation_prompt,
        }

    def _guarded(self, run: Callable[[], str]) -> str:
        """Run a render, turning whatever it raises into a TemplateError that says what happened."""
        try:
            return run()
        except _RaisedByTemplate as exc:
            raise TemplateError(f"{self.name} raised: {exc}") from None
        except jinja2.exceptions.SecurityError as exc:
            where = _template_line(exc)
            raise TemplateError(f"{self.name} was stopped by the sandbox{where}: {exc}") from exc
        except TemplateError:
            raise
        except Exception as exc:  # noqa: BLE001 - the template is untrusted code; anything it raises is its failure
            raise TemplateError(
                f"{self.name} failed{_template_line(exc)}: {type(exc).__name__}: {exc}"
            ) from exc

    def _generation_spans(
        self, messages: Sequence[Mapping[str, Any]], extra: dict[str, Any]
    ) -> tuple[str, list[tuple[int, int]]] | None:
        """The text and the `{% generation %}` block ranges (trailing whitespace trimmed) of one render."""
        tracker = _GenerationTracker()
        variables = self._variables(messages, False, extra)
        variables[_TRACKER_VARIABLE] = tracker

        def run() -> str:
            pieces = []
            for piece in self._template.generate(variables):
                pieces.append(piece)
                tracker._length += len(piece)
            return "".join(pieces)

        text = self._guarded(run)
        spans = [(start, start + len(text[start:end].rstrip())) for start, end in tracker._blocks]
        if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)):
            return None
        return text, spans

    def _closed_turn(self, messages: Sequence[Mapping[str, Any]], extra: dict[str, Any]) -> str | None:
        """`render(messages)` up to the end-of-turn marker of its last message, or None if unclear.

        That is the render without trailing whitespace, unless the template closes a finished
        conversation with text a continuing one lacks: then the eos_token it appends is dropped.
        """
        closed = self.render(messages, **extra).rstrip()
        continued = self.render(messages, add_generation_prompt=True, **extra)
        if continued.startswith(closed):
            return closed
        if self.eos_token and closed.endswith(self.eos_token):
            trimmed = closed[: -len(self.eos_token)].rstrip()
            if continued.startswith(trimmed):
                return trimmed
        return None

    def _span_after_prompt(
        self, messages: Sequence[Mapping[str, Any]], i: int, text: str, extra: dict[str, Any]
    ) -> tuple[int, int] | None:
        """Span of reply i as what `render(messages[:i + 1])` adds to the generation prompt before it."""
        try:
            prompt = self.render(messages[:i], add_generation_prompt=True, **extra)
            turn = self._closed_turn(messages[: i + 1], extra)
        except TemplateError:
            return None
        if turn is None or len(turn) <= len(prompt):
            return None
        if not (turn.startswith(prompt) and text.startswith(turn)):
            return None
        return len(prompt), len(turn)

    def _span_by_probe(
        self, messages: Sequence[Mapping[str, Any]], i: int, text: str, extra: dict[str, Any]
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
            full = self.render(probed, **extra)
            turn = self._closed_turn(probed[: i + 1], extra)
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
