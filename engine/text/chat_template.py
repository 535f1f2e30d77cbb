"""Chat templates: turn a conversation into the text a model was trained on.

A GGUF file carries its chat template as Jinja source in `tokenizer.chat_template`.
`ChatTemplate` renders it the way Hugging Face transformers' `apply_chat_template`
does (same Jinja settings, filters, globals and variables; parity is checked
against transformers' own output in `tests/data/templates/expected.json`), but
inside jinja2's `ImmutableSandboxedEnvironment`, because a model file is untrusted
input. A syntax error, a `raise_exception(...)` in the template, a sandbox
violation or any other failure while rendering becomes a `TemplateError`.

Beyond the sandbox, a render has limits (see "limits" below): a time limit (5 s
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
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import jinja2.visitor
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelError, TemplateError
from .content_flow import passes_contents_through

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

# Names a message's reasoning may come under; transformers copies it to the first (and to "thinking").
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# transformers' test for templates that mark assistant output with {% generation %}.
_GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
# Context variable under which render_with_spans hands the {% generation %} tag its tracker.
_TRACKER_VARIABLE = "__tune_studio_generation_tracker"
# Limits of a render (see "limits" below).
_TIME_LIMIT = 5.0  # seconds a render (or a render_with_spans) may take, by default
_MAX_SOURCE_CHARS = 128 * 1024  # template source (real ones are under 30k; compiling 128k takes ~2 s)
_BASE_CHARS = 32 << 20  # characters (and list items) a render may create, whatever its input
_INPUT_FACTOR = 16  # ... plus this many per character of its input (messages, tools, variables)
_MAX_ITEMS = 1_000_000  # items a join, sum or batch may be given
_ITEM = 8  # what one item of a list, tuple or dict counts against the size limit, in characters
_MAX_POWER_BITS = 65_536  # bits of a number made with * or **
_MAX_WORK = 100_000_000  # item copies a sum of sequences may take (each step copies the total so far)
_MAX_INDENT = 64  # tojson indent
_MAX_FORMAT_CHARS = 100_000  # a format string (of %, |format, str.format)
# filters that make a list of (up to) as many items as their input has
_LIST_FILTERS = frozenset(
    {"list", "sort", "unique", "reverse", "map", "select", "reject", "selectattr", "rejectattr", "dictsort",
     "groupby", "items", "batch", "slice"}
)  # fmt: skip
_MAX_LIPSUM_WORDS = 100_000
_SLOW_FILTER_CHARS = 100_000  # input of wordwrap, striptags, urlize (slow, or quadratic, on long input)
_LIPSUM = jinja2.utils.generate_lorem_ipsum
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


# -- limits -------------------------------------------------------------------------------------
#
# A template is untrusted code. Besides the sandbox's refusal of Python internals, every render
# runs under a `_Budget`: a deadline, checked at every attribute and item access, call, operator,
# loop iteration and output piece (so a loop that does nothing but spin is stopped too), and a
# count of the characters (and list items) the template creates, checked before each operation
# that can build a large value (`*`, `+`, `~`, `%`, join, replace, format, center, indent, ...)
# and after every other one. The budget lives in a ContextVar: renders in other threads (the
# studio renders in a worker thread) have their own, and nothing outlives the call.


class _LimitExceeded(Exception):
    """A render went past its time or size limit; becomes a `_StoppedError` saying which."""


class _StoppedError(TemplateError):
    """A render stopped at a limit: not retried in another way (render_with_spans' fallbacks)."""


class _Budget:
    """Time and size limits of one public call (`render`, `render_with_spans`), and what one render
    of it has spent so far (`begin` resets the count for each render)."""

    __slots__ = ("deadline", "seconds", "limit", "spent", "_ticks", "_inputs")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.limit = _BASE_CHARS
        self.spent = 0
        self._ticks = 0
        self._inputs: Any = None  # the render's variables, until they are measured

    def begin(self, variables: Any) -> None:
        """A new render: it may create `_BASE_CHARS` plus `_INPUT_FACTOR` x its input in characters
        (measured only when the base is not enough)."""
        self.limit = _BASE_CHARS
        self.spent = 0
        self._inputs = variables

    def tick(self) -> None:
        self._ticks += 1
        if not self._ticks & 15 and time.monotonic() > self.deadline:
            raise _LimitExceeded(
                f"rendering took longer than the time limit of {self.seconds:g} s (a loop that does not end?)"
            )

    def room(self) -> int:
        return self.limit - self.spent

    def need(self, n: int, what: str) -> None:
        """Refuse `what`, about to build up to `n` (counted once it is built), if there is no room."""
        if n > self.room():
            self.spend(n, what)  # measures the input first, raises if still no room
            self.spent -= n

    def spend(self, n: int, what: str) -> None:
        """Count `n` characters (or items) about to be created by `what`; refuse past the limit."""
        if n > self.room() and self._inputs is not None:
            self.limit += _INPUT_FACTOR * _text_size(self._inputs)
            self._inputs = None
        if n > self.room():
            raise _LimitExceeded(
                f"{what} would make the template build more than {self.limit:,} characters (or items), "
                "the limit for this conversation"
            )
        self.spent += n


_ACTIVE: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def _budget() -> _Budget:
    """The budget of the render running in this thread; outside one (Jinja folding constants while it
    compiles), a fresh budget with no deadline that still refuses a value over the base size."""
    budget = _ACTIVE.get()
    return budget if budget is not None else _Budget(math.inf)


def _size(value: Any) -> int:
    """What a value a template made counts against the budget: its characters, or 8 per item of a
    container (a pointer each); 0 for numbers and lazy iterators."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return _ITEM * len(value)
    return 0


def _text_size(value: Any) -> int:
    """Characters and items in the variables a render gets (iteratively: inputs may nest deeply)."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, Mapping):
            total += len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            total += len(v)
            stack.extend(v)
    return total


def _materialized(value: Any, what: str) -> list:
    """`value` as a list, refusing one of more than `_MAX_ITEMS` items (an endless generator)."""
    if isinstance(value, list):
        return value
    if isinstance(value, (str, bytes, tuple, dict, set, frozenset, range)):
        items = list(value)
    else:
        items = list(itertools.islice(value, _MAX_ITEMS + 1))
    if len(items) > _MAX_ITEMS:
        raise _LimitExceeded(f"{what} was given more than {_MAX_ITEMS:,} items")
    return items


def _joined_size(items: list, sep: Any) -> int:
    n = sum(len(x) if isinstance(x, (str, bytes)) else len(str(x)) for x in items)
    return n + max(len(items) - 1, 0) * len(str(sep) if not isinstance(sep, (str, bytes)) else sep)


_DIGITS = re.compile(r"\d+")


def _format_size(fmt: str, values: Iterable[Any]) -> int:
    """An upper bound of the length of formatting `fmt` with `values` (what its fields may insert):
    the format, plus for each field that could insert something (each "%" or "{") the longest
    value, the widths and precisions written in the format, and (for "*" and nested fields) any
    number given."""
    if len(fmt) > _MAX_FORMAT_CHARS:
        raise _LimitExceeded(
            f"format strings are limited to {_MAX_FORMAT_CHARS:,} characters; got {len(fmt):,}"
        )
    fields = fmt.count("%") + fmt.count("{")
    widths = 0
    for run in _DIGITS.findall(fmt):
        widths += int(run) if len(run) < 10 else 1 << 40
    longest = 0
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and ("*" in fmt or "{" in fmt):
            widths += abs(v) if v.bit_length() < 40 else 1 << 40
        longest = max(longest, len(v) if isinstance(v, str) else len(str(v)))
    return len(fmt) + fields * longest + widths


def _percent_values(args: Any) -> list[Any]:
    """What `fmt % args` may insert: a tuple's items, a mapping's values, or `args` itself."""
    if isinstance(args, tuple):
        return list(args)
    if isinstance(args, Mapping):
        return list(args.values())
    return [args]


def _check_replace(budget: _Budget, s: Any, old: Any, new: Any, count: Any = -1) -> None:
    if not (isinstance(s, (str, bytes)) and type(old) is type(s) and type(new) is type(s)):
        return
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    budget.spend(len(s) + n * max(len(new) - len(old), 0), "replace")


def _check_width(budget: _Budget, width: Any, what: str) -> None:
    if isinstance(width, int) and not isinstance(width, bool):
        budget.spend(max(width, 0), what)


def _pre_filter(budget: _Budget, name: str, value: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple]:
    """Refuse a filter call whose result would exceed the budget, before it is built. Returns the
    value and arguments to call it with (an iterator is materialized once, to be measured)."""

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in _LIST_FILTERS and isinstance(value, (str, list, tuple, dict)):
        budget.need(_ITEM * len(value), name)  # a list of as many items
    if name == "join":
        items = _materialized(value, "join")
        if arg(1, "attribute") is None:
            budget.spend(_joined_size(items, arg(0, "d", "")), "join")
        return items, args
    if name == "replace":
        s = str(value) if not isinstance(value, str) else value
        _check_replace(budget, s, arg(0, "old"), arg(1, "new"), arg(2, "count"))
    elif name == "format":
        values = _percent_values(kwargs or args)  # the format filter: value % (kwargs or args)
        budget.spend(_format_size(str(value), values), "format")
    elif name == "center":
        _check_width(budget, arg(0, "width", 80), "center")
    elif name == "indent":
        width = arg(0, "width", 4)
        per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        budget.spend(len(str(value)) + (str(value).count("\n") + 1) * max(per_line, 0), "indent")
    elif name == "wordwrap":
        s = str(value)
        if len(s) > _SLOW_FILTER_CHARS:
            raise _LimitExceeded(f"wordwrap takes at most {_SLOW_FILTER_CHARS:,} characters, got {len(s):,}")
        width, wrap = arg(0, "width", 79), arg(2, "wrapstring") or "\n"
        lines = len(s) // max(width if isinstance(width, int) else 1, 1) + 1
        budget.spend(len(s) + lines * len(str(wrap)), "wordwrap")
    elif name in ("striptags", "urlize"):
        n = len(str(value))
        if n > _SLOW_FILTER_CHARS:
            raise _LimitExceeded(f"{name} takes at most {_SLOW_FILTER_CHARS:,} characters, got {n:,}")
    elif name in ("batch", "slice"):
        count = arg(0, "linecount" if name == "batch" else "slices", 1)
        if isinstance(count, int) and count > _MAX_ITEMS:
            raise _LimitExceeded(f"{name}({count}) asks for more than {_MAX_ITEMS:,} items")
    elif name == "sum":
        items = _materialized(value, "sum")
        start = arg(1, "start", 0)
        if isinstance(start, (str, list, tuple)) or any(isinstance(x, (str, list, tuple)) for x in items[:1]):
            seqs = [x for x in (start, *items) if isinstance(x, (str, list, tuple))]
            total = sum(map(len, seqs))
            budget.spend(total, "sum")
            if total * len(items) > _MAX_WORK:  # each step copies what was summed so far
                raise _LimitExceeded(f"sum of {len(items):,} sequences ({total:,} items) is too much work")
        return items, args
    elif name == "tojson":
        indent = arg(1, "indent")
        size = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        if size > _MAX_INDENT:
            raise _LimitExceeded(f"tojson indent {indent!r} is larger than {_MAX_INDENT}")
    return value, args


def _guarded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` (a Jinja filter) with the budget's deadline and size checks around it."""
    passes = hasattr(func, "jinja_pass_arg")  # pass_context & co.: Jinja passes that first

    @functools.wraps(func)
    def filter_(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        lead, rest = (args[:1], args[1:]) if passes else ((), args)
        if rest:
            value, extra = _pre_filter(budget, name, rest[0], rest[1:], kwargs)
            rest = (value, *extra)
        result = func(*lead, *rest, **kwargs)
        budget.spend(_size(result), f"the {name} filter")
        return result

    return filter_


def _pre_call(budget: _Budget, obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Refuse a method call on a string (or an int) whose result would exceed the budget."""
    target = getattr(obj, "__wrapped__", obj)  # the sandbox hands out str.format wrapped
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if obj is _LIPSUM:
        n = args[0] if args else kwargs.get("n", 5)
        mx = args[3] if len(args) > 3 else kwargs.get("max", 100)
        if isinstance(n, int) and isinstance(mx, int) and n * mx > _MAX_LIPSUM_WORDS:
            raise _LimitExceeded(f"lipsum({n}, max={mx}) asks for more than {_MAX_LIPSUM_WORDS:,} words")
        return args
    if isinstance(owner, int) and name == "to_bytes":
        _check_width(budget, args[0] if args else kwargs.get("length", 1), "to_bytes")
    if not isinstance(owner, (str, bytes, bytearray)):
        return args

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ("split", "rsplit", "splitlines"):
        budget.need(_ITEM * (len(owner) + 1), name)
    elif name in ("center", "ljust", "rjust", "zfill"):
        _check_width(budget, arg(0, "width", 0), name)
    elif name == "expandtabs":
        size = arg(0, "tabsize", 8)
        if isinstance(size, int):
            budget.spend(len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * size, name)
    elif name == "join" and args:
        items = _materialized(args[0], "join")
        budget.spend(_joined_size(items, owner), "join")
        return (items, *args[1:])
    elif name == "replace":
        _check_replace(budget, owner, arg(0, "old"), arg(1, "new"), arg(2, "count", -1))
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
        budget.spend(len(owner) * max(longest, 1), name)
    elif name == "format" and isinstance(owner, str):
        budget.spend(_format_size(owner, [*args, *kwargs.values()]), name)
    elif name == "format_map" and isinstance(owner, str) and args and isinstance(args[0], Mapping):
        budget.spend(_format_size(owner, args[0].values()), name)
    return args


def _binop_size(operator: str, left: Any, right: Any) -> int | None:
    """What `left <op> right` would create, in characters or items; None for numbers and the rest."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                return _size(seq) * max(n, 0)
    elif operator == "+":
        if isinstance(left, (str, bytes, list, tuple)) and isinstance(right, (str, bytes, list, tuple)):
            return _size(left) + _size(right)
    elif operator == "%" and isinstance(left, str):
        return _format_size(left, _percent_values(right))
    return None


def _tune_iter(context: jinja2.runtime.Context, iterable: Any) -> Iterable[Any]:
    """What every `{% for %}` loops over: the iterable, checking the deadline at each item."""
    return _TimedIterator(iterable, _budget())


class _TimedIterator:
    __slots__ = ("_it", "_len", "_budget")

    def __init__(self, iterable: Any, budget: _Budget) -> None:
        self._it = iter(iterable)
        self._budget = budget
        try:
            self._len: int | None = len(iterable)
        except TypeError:
            self._len = None

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        self._budget.tick()
        return next(self._it)

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError("length unknown")
        return self._len


def _tune_out(context: jinja2.runtime.Context, value: Any) -> str:
    """What every piece of output goes through: counted against the budget (also in macros and
    `{% set %}` blocks, whose output is assembled before it is used)."""
    text = value if type(value) is str else str(value)
    budget = _budget()
    budget.tick()
    budget.spend(len(text), "the output")
    return text


def _tune_concat(context: jinja2.runtime.Context, first: Any, *rest: Any) -> str:
    """`a ~ b ~ c`, measured before it is joined."""
    parts = [p if type(p) is str else str(p) for p in (first, *rest)]
    budget = _budget()
    budget.tick()
    budget.spend(sum(map(len, parts)), "the ~ operator")
    return "".join(parts)


_GUARDS = {"__tune_iter": _tune_iter, "__tune_out": _tune_out, "__tune_concat": _tune_concat}


def _guard(node: jinja2.nodes.Expr, name: str, args: Sequence[jinja2.nodes.Expr] = ()) -> jinja2.nodes.Expr:
    return jinja2.nodes.Filter(node, name, list(args), [], None, None, lineno=node.lineno)


class _Instrument(jinja2.visitor.NodeTransformer):
    """Routes every loop, output piece and `~` of a parsed template through the guards above."""

    def visit_For(self, node: jinja2.nodes.For) -> jinja2.nodes.Node:
        node = self.generic_visit(node)
        node.iter = _guard(node.iter, "__tune_iter")
        return node

    def visit_Concat(self, node: jinja2.nodes.Concat) -> jinja2.nodes.Node:
        node = self.generic_visit(node)
        first, *rest = node.nodes
        return _guard(first, "__tune_concat", rest)

    def visit_Output(self, node: jinja2.nodes.Output) -> jinja2.nodes.Node:
        node = self.generic_visit(node)
        node.nodes = [
            _guard(
                jinja2.nodes.Const(child.data, lineno=child.lineno)
                if isinstance(child, jinja2.nodes.TemplateData)
                else child,
                "__tune_out",
            )
            for child in node.nodes
        ]
        return node


class _SandboxEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus the limits above: every attribute and item access, call,
    operator, loop iteration and output piece checks the deadline; every operation that can build
    a large value is measured first."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        return _Instrument().visit(super()._parse(source, name, filename))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget().tick()
        return super().getitem(obj, argument)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _budget()
        budget.tick()
        args = _pre_call(budget, __obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.spend(_size(result), f"calling {getattr(__obj, '__name__', type(__obj).__name__)}")
        return result

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        size = _binop_size(operator, left, right)
        if size is not None:
            budget.spend(size, f"the {operator} operator")
        elif operator in ("*", "**") and isinstance(left, int) and isinstance(right, int):
            bits = (
                abs(left).bit_length() + abs(right).bit_length()
                if operator == "*"
                else abs(left).bit_length() * max(right, 0)
                if abs(left) > 1
                else 0
            )
            if bits > _MAX_POWER_BITS:
                raise _LimitExceeded(
                    f"the {operator} operator would make a number of about {bits:,} bits; the sandbox allows "
                    f"{_MAX_POWER_BITS:,}"
                )
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


def _line(message: object, limit: int = 500) -> str:
    """`message` as one line of at most `limit` characters (a template may raise any text)."""
    text = str(message).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        time_limit: float = _TIME_LIMIT,
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
        if len(source) > _MAX_SOURCE_CHARS:
            raise TemplateError(
                f"{name} is {len(source):,} characters long; templates up to {_MAX_SOURCE_CHARS:,} "
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

        env = _SandboxEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationExtension, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        for filter_name, func in list(env.filters.items()):
            env.filters[filter_name] = _guarded_filter(filter_name, func)
        env.filters.update({key: jinja2.pass_context(guard) for key, guard in _GUARDS.items()})
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = strftime_now
        env.globals["dict"] = _TemplateDict()
        env.globals["namespace"] = _TemplateNamespace
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"{name} has a syntax error on line {exc.lineno}: {_line(exc.message)}"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on absurd nesting
            raise TemplateError(f"{name} cannot be compiled: {type(exc).__name__}: {_line(exc)}") from exc
        self._marks_generation = _GENERATION_TAG.search(source) is not None
        self.fast_spans = fast_spans
        self._now = clock
        self._reads_clock = "strftime_now" in source
        self._passes_through: bool | None = None  # passes_contents_through, once asked
        nonce = secrets.token_hex(6)
        self._placeholder = "\ue000" + nonce + "{}\ue001"
        self._placeholders = re.compile("\ue000" + nonce + "([0-9]+)\ue001")
        self._skeletons: dict[tuple, Any] = {}

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
        if contents and spent + per_char * max(map(len, contents)) > _BASE_CHARS:
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
        except _StoppedError:
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
        in a budget of its own. `_StoppedError` when it stops at a limit."""
        budget = _Budget(self.time_limit)
        token = _ACTIVE.set(budget)
        try:
            variables = self._variables(messages, add_generation_prompt, {})
            return self._guarded(lambda: self._template.render(variables), variables), budget.spent
        except _StoppedError:
            raise
        except TemplateError as exc:
            return exc, budget.spent
        finally:
            _ACTIVE.reset(token)

    # -- internals --------------------------------------------------------------

    @contextlib.contextmanager
    def _limits(self, seconds: float) -> Iterator[None]:
        """The budget of one public call: the renders inside it share its deadline."""
        if _ACTIVE.get() is not None:  # render() called from render_with_spans
            yield
            return
        token = _ACTIVE.set(_Budget(seconds))
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def _variables(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        extra = dict(extra)
        try:
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
        except RecursionError:
            raise TemplateError(
                f"{self.name}: the messages or variables nest too deeply (lists and mappings inside each "
                "other, hundreds of levels)"
            ) from None

    def _guarded(self, run: Callable[[], str], variables: Mapping[str, Any]) -> str:
        """Run a render, turning whatever it raises into a TemplateError that says what happened."""
        budget = _ACTIVE.get()
        if budget is not None:
            budget.begin(variables)
        try:
            return run()
        except _RaisedByTemplate as exc:
            raise TemplateError(f"{self.name} raised: {_line(exc)}") from None
        except _LimitExceeded as exc:
            raise _StoppedError(f"{self.name} was stopped{_template_line(exc)}: {exc}") from None
        except jinja2.exceptions.SecurityError as exc:
            where = _template_line(exc)
            raise TemplateError(f"{self.name} was stopped by the sandbox{where}: {_line(exc)}") from exc
        except TemplateError:
            raise
        except Exception as exc:  # noqa: BLE001 - the template is untrusted code; anything it raises is its failure
            raise TemplateError(
                f"{self.name} failed{_template_line(exc)}: {type(exc).__name__}: {_line(exc)}"
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
        except _StoppedError:
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
        except _StoppedError:
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
        except _StoppedError:
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
    return jinja2.Environment(extensions=[_GenerationExtension, jinja2.ext.loopcontrols])


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
