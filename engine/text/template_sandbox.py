"""The sandbox a chat template renders in: jinja2's immutable sandbox plus limits on time and size.

A chat template is untrusted code carried by a model file. `engine.text.chat_template` renders it
in `SandboxEnvironment`: jinja2's `ImmutableSandboxedEnvironment` (no Python internals), plus a
`Budget` per render (a deadline and a count of what the template creates, see "limits" below), the
`{% generation %}` tag transformers uses to mark assistant output, and the globals and filters
transformers gives a template (`raise_exception`, `namespace`, `dict`, `tojson`), each guarded.
What it is not: the template's rendering or span finding (engine.text.chat_template).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import jinja2.visitor
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError

# Names a message's reasoning may come under; transformers copies it to the first (and to "thinking").
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


# Context variable under which render_with_spans hands the {% generation %} tag its tracker.
TRACKER_VARIABLE = "__tune_studio_generation_tracker"
# Limits of a render (see "limits" below).
TIME_LIMIT = 5.0  # seconds a render (or a render_with_spans) may take, by default
MAX_SOURCE_CHARS = 128 * 1024  # template source (real ones are under 30k; compiling 128k takes ~2 s)
BASE_CHARS = 32 << 20  # characters (and list items) a render may create, whatever its input
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


class RaisedByTemplate(Exception):
    """What the template's `raise_exception(message)` raises; becomes a TemplateError carrying the message."""


class GenerationTracker:
    """Where each `{% generation %}` block landed in the output of one render.

    Only underscore names, so a template that finds it in its context cannot touch it through the sandbox.
    """

    __slots__ = ("_blocks", "_length")

    def __init__(self) -> None:
        self._length = 0  # characters output so far
        self._blocks: list[tuple[int, int]] = []  # [start, end) of each generation block


class GenerationExtension(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers' mark for text the assistant generates.

    Renders its body unchanged (as transformers' `AssistantTracker` does); when the render
    carries a `GenerationTracker`, records the block's character range.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation", [jinja2.nodes.ContextReference()])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation(self, context: jinja2.runtime.Context, caller: Callable[[], str]) -> str:
        text = caller()
        tracker = context.get(TRACKER_VARIABLE)
        if isinstance(tracker, GenerationTracker):
            tracker._blocks.append((tracker._length, tracker._length + len(text)))
        return text


# -- limits -------------------------------------------------------------------------------------
#
# A template is untrusted code. Besides the sandbox's refusal of Python internals, every render
# runs under a `Budget`: a deadline, checked at every attribute and item access, call, operator,
# loop iteration and output piece (so a loop that does nothing but spin is stopped too), and a
# count of the characters (and list items) the template creates, checked before each operation
# that can build a large value (`*`, `+`, `~`, `%`, join, replace, format, center, indent, ...)
# and after every other one. The budget lives in a ContextVar: renders in other threads (the
# studio renders in a worker thread) have their own, and nothing outlives the call.


class LimitExceeded(Exception):
    """A render went past its time or size limit; becomes a `StoppedError` saying which."""


class StoppedError(TemplateError):
    """A render stopped at a limit: not retried in another way (render_with_spans' fallbacks)."""


class Budget:
    """Time and size limits of one public call (`render`, `render_with_spans`), and what one render
    of it has spent so far (`begin` resets the count for each render)."""

    __slots__ = ("deadline", "seconds", "limit", "spent", "_ticks", "_inputs")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.limit = BASE_CHARS
        self.spent = 0
        self._ticks = 0
        self._inputs: Any = None  # the render's variables, until they are measured

    def begin(self, variables: Any) -> None:
        """A new render: it may create `BASE_CHARS` plus `_INPUT_FACTOR` x its input in characters
        (measured only when the base is not enough)."""
        self.limit = BASE_CHARS
        self.spent = 0
        self._inputs = variables

    def tick(self) -> None:
        self._ticks += 1
        if not self._ticks & 15 and time.monotonic() > self.deadline:
            raise LimitExceeded(
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
            raise LimitExceeded(
                f"{what} would make the template build more than {self.limit:,} characters (or items), "
                "the limit for this conversation"
            )
        self.spent += n


ACTIVE_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "chat_template_budget", default=None
)


def _budget() -> Budget:
    """The budget of the render running in this thread; outside one (Jinja folding constants while it
    compiles), a fresh budget with no deadline that still refuses a value over the base size."""
    budget = ACTIVE_BUDGET.get()
    return budget if budget is not None else Budget(math.inf)


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
        raise LimitExceeded(f"{what} was given more than {_MAX_ITEMS:,} items")
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
        raise LimitExceeded(
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


def _check_replace(budget: Budget, s: Any, old: Any, new: Any, count: Any = -1) -> None:
    if not (isinstance(s, (str, bytes)) and type(old) is type(s) and type(new) is type(s)):
        return
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    budget.spend(len(s) + n * max(len(new) - len(old), 0), "replace")


def _check_width(budget: Budget, width: Any, what: str) -> None:
    if isinstance(width, int) and not isinstance(width, bool):
        budget.spend(max(width, 0), what)


def _pre_filter(budget: Budget, name: str, value: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple]:
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
            raise LimitExceeded(f"wordwrap takes at most {_SLOW_FILTER_CHARS:,} characters, got {len(s):,}")
        width, wrap = arg(0, "width", 79), arg(2, "wrapstring") or "\n"
        lines = len(s) // max(width if isinstance(width, int) else 1, 1) + 1
        budget.spend(len(s) + lines * len(str(wrap)), "wordwrap")
    elif name in ("striptags", "urlize"):
        n = len(str(value))
        if n > _SLOW_FILTER_CHARS:
            raise LimitExceeded(f"{name} takes at most {_SLOW_FILTER_CHARS:,} characters, got {n:,}")
    elif name in ("batch", "slice"):
        count = arg(0, "linecount" if name == "batch" else "slices", 1)
        if isinstance(count, int) and count > _MAX_ITEMS:
            raise LimitExceeded(f"{name}({count}) asks for more than {_MAX_ITEMS:,} items")
    elif name == "sum":
        items = _materialized(value, "sum")
        start = arg(1, "start", 0)
        if isinstance(start, (str, list, tuple)) or any(isinstance(x, (str, list, tuple)) for x in items[:1]):
            seqs = [x for x in (start, *items) if isinstance(x, (str, list, tuple))]
            total = sum(map(len, seqs))
            budget.spend(total, "sum")
            if total * len(items) > _MAX_WORK:  # each step copies what was summed so far
                raise LimitExceeded(f"sum of {len(items):,} sequences ({total:,} items) is too much work")
        return items, args
    elif name == "tojson":
        indent = arg(1, "indent")
        size = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        if size > _MAX_INDENT:
            raise LimitExceeded(f"tojson indent {indent!r} is larger than {_MAX_INDENT}")
    return value, args


def guarded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
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


def _pre_call(budget: Budget, obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Refuse a method call on a string (or an int) whose result would exceed the budget."""
    target = getattr(obj, "__wrapped__", obj)  # the sandbox hands out str.format wrapped
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if obj is _LIPSUM:
        n = args[0] if args else kwargs.get("n", 5)
        mx = args[3] if len(args) > 3 else kwargs.get("max", 100)
        if isinstance(n, int) and isinstance(mx, int) and n * mx > _MAX_LIPSUM_WORDS:
            raise LimitExceeded(f"lipsum({n}, max={mx}) asks for more than {_MAX_LIPSUM_WORDS:,} words")
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

    def __init__(self, iterable: Any, budget: Budget) -> None:
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


GUARDS = {"__tune_iter": _tune_iter, "__tune_out": _tune_out, "__tune_concat": _tune_concat}


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


class SandboxEnvironment(ImmutableSandboxedEnvironment):
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
                raise LimitExceeded(
                    f"the {operator} operator would make a number of about {bits:,} bits; the sandbox allows "
                    f"{_MAX_POWER_BITS:,}"
                )
        return super().call_binop(context, operator, left, right)


class TemplateDict:
    """The `dict` global: builds dicts without handing the `dict` type itself to the template."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """The `namespace` global, refusing underscore-prefixed names (as transformers does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature, so namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for key in attrs:
            TemplateNamespace._check_name(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed names on a namespace (got {name!r})"
            )


def tojson(
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


def raise_exception(message: Any) -> None:
    raise RaisedByTemplate(str(message))


def to_plain(value: Any) -> Any:
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
        return {to_plain(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_plain(item) for item in value)
    if isinstance(value, np.generic):
        return to_plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: to_plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return to_plain(value.model_dump())
    return f"<{type(value).__name__}>"


def plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as fresh plain dicts, with reasoning aliased under the names templates read."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError(f"messages must be a list of mappings, got {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(
                f"message {i} is a {type(message).__name__}; expected a mapping with 'role' and 'content'"
            )
        plain = to_plain(message)
        reasoning = next((plain[key] for key in _REASONING_FIELDS if plain.get(key) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


def plain_records(value: Any, what: str) -> list[dict[str, Any]] | None:
    """`tools` or `documents`: None, or a list of mappings (JSON schemas, {'title', 'text'} documents)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TemplateError(f"{what} must be a list of mappings, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise TemplateError(f"{what}[{i}] is a {type(item).__name__}; expected a mapping")
    return [to_plain(item) for item in value]


def short_line(message: object, limit: int = 500) -> str:
    """`message` as one line of at most `limit` characters (a template may raise any text)."""
    text = str(message).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def template_line(exc: BaseException) -> str:
    """' on line N' for the innermost template frame in `exc`'s traceback, or ''."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" on line {line}" if line is not None else ""
