"""Which chat templates write message contents verbatim: a static check of a template's Jinja tree.

A template "passes contents through" when the text of each message's ``content`` reaches the
output only by concatenation (``+``, ``~``, ``{{ }}``, ``{% set %}`` of such values, ``and``/``or``
and ``if``/``else`` choosing between them, the ``string`` filter) and is otherwise only asked
whether it is empty or what type it is (``{% if message.content %}``, ``is string``, ``is none``).
Everything else such a template does depends on the rest of the conversation: roles, the number
and order of messages, their other fields (tool calls, names, reasoning), and the variables.

For such a template, the render of a conversation equals the render of the same conversation with
each non-empty content replaced by a placeholder, with the placeholders then replaced by the
contents: nothing the template computes can tell a content from a placeholder except by its
emptiness and its type, which agree. `ChatTemplate` uses that to render a conversation's
structure once and reuse it for every conversation of that structure (a dataset of a hundred
thousand "user, assistant" samples renders once).

The check is conservative: a content that is compared, sliced, split, trimmed, measured, passed to a
call or a macro, iterated, or a message passed whole to a filter (``tojson``), a call or a macro,
makes the template fail the check, and `ChatTemplate` renders each conversation as it always did.
So do templates that read the clock (``strftime_now``), include or extend other templates, or use
``{% generation %}`` blocks.

What it is not: a general taint analysis of Jinja; it knows the names ``messages`` and ``loop``,
and gives up on anything it does not recognise.
"""

from __future__ import annotations

from collections.abc import Iterable

import jinja2
import jinja2.nodes as nodes

__all__ = ["passes_contents_through"]

CLEAN, TAINT, MSG, MSGS = 0, 1, 2, 3  # what an expression's value may be
_NAMES = {CLEAN: "clean", TAINT: "content", MSG: "a message", MSGS: "messages"}
# tests whose answer for a value built from contents depends only on which contents are empty
_SHAPE_TESTS = frozenset(
    {"string", "defined", "undefined", "none", "mapping", "iterable", "sequence", "number", "integer",
     "float", "boolean", "true", "false", "callable"}
)  # fmt: skip
# dict methods: `message.items()` & co. would hand the content over
_DICT_METHODS = frozenset(name for name in dir(dict) if not name.startswith("__")) - {"get"}
_MESSAGE_FILTERS = frozenset({"length", "count"})  # of a message (its keys) or the list: structure only
_MESSAGES_TO_MESSAGE = frozenset({"first", "last"})
_MESSAGES_TO_MESSAGES = frozenset({"reverse", "list", "selectattr", "rejectattr"})
_FORBIDDEN_CALLS = frozenset({"strftime_now"})  # the clock: a render is not a function of its input


class _NotPassedThrough(Exception):
    """The template does something with a content (or a whole message) that the check cannot follow."""


def passes_contents_through(source: str, environment: jinja2.Environment) -> bool:
    """True when `source` (parsed by `environment`) uses message contents only as described in the
    module docstring, so that its render is a function of the conversation's structure, the
    emptiness of each content, and the contents inserted verbatim."""
    try:
        tree = environment.parse(source)
    except Exception:  # noqa: BLE001 - not our job to report it: the template's compiler does
        return False
    flow = _Flow()
    try:
        for _ in range(16):  # names assigned later in the source: until what each may hold is stable
            before = dict(flow.env)
            flow.stmts(tree.body)
            if flow.env == before:
                return True
    except (_NotPassedThrough, RecursionError):
        return False
    return False


def _join(a: int, b: int) -> int:
    if a == CLEAN:
        return b
    if b == CLEAN or a == b:
        return a
    raise _NotPassedThrough(f"a name holds both {_NAMES[a]} and {_NAMES[b]}")


class _Flow:
    """One pass over a template tree: what each name may hold (`env`, joined over every assignment
    anywhere: loops and branches are not followed), and a `_NotPassedThrough` at the first use of a
    content or message that is not allowed."""

    def __init__(self) -> None:
        self.env: dict[str, int] = {"messages": MSGS}

    # -- statements ----------------------------------------------------------------------------
    def stmts(self, body: Iterable[nodes.Node]) -> None:
        for node in body:
            self.stmt(node)

    def assign(self, target: nodes.Node, kind: int) -> None:
        if isinstance(target, nodes.Name):
            self.env[target.name] = _join(self.env.get(target.name, CLEAN), kind)
        elif isinstance(target, nodes.NSRef):
            key = f"{target.name}.{target.attr}"
            self.env[key] = _join(self.env.get(key, CLEAN), kind)
        elif isinstance(target, nodes.Tuple) and kind == CLEAN:
            for item in target.items:
                self.assign(item, CLEAN)
        else:
            raise _NotPassedThrough(f"{_NAMES[kind]} unpacked into {type(target).__name__}")

    def stmt(self, node: nodes.Node) -> None:
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                if self.expr(child) in (MSG, MSGS):
                    raise _NotPassedThrough("a message written whole")
        elif isinstance(node, nodes.If):
            self.truth(node.test)
            self.stmts(node.body)
            for branch in node.elif_:
                self.stmt(branch)
            self.stmts(node.else_)
        elif isinstance(node, nodes.For):
            if node.recursive:
                raise _NotPassedThrough("a recursive loop")
            kind = self.expr(node.iter)
            if kind == TAINT:
                raise _NotPassedThrough("a loop over a content")
            self.assign(node.target, MSG if kind == MSGS else CLEAN)
            if node.test is not None:
                self.truth(node.test)
            self.stmts(node.body)
            self.stmts(node.else_)
        elif isinstance(node, nodes.Assign):
            self.assign(node.target, self.expr(node.node))
        elif isinstance(node, nodes.AssignBlock):
            if node.filter is not None:
                self.filter_block(node.body, node.filter)
            self.stmts(node.body)
            self.assign(node.target, TAINT if self.writes_content(node.body) else CLEAN)
        elif isinstance(node, nodes.With):
            for target, value in zip(node.targets, node.values, strict=True):
                self.assign(target, self.expr(value))
            self.stmts(node.body)
        elif isinstance(node, nodes.Macro):
            for default in node.defaults:
                self.clean(default, "a macro default")
            for arg in node.args:
                self.assign(arg, CLEAN)
            self.stmts(node.body)
        elif isinstance(node, nodes.CallBlock):
            if self.writes_content(node.body):
                raise _NotPassedThrough("a content handed to a macro as caller()")
            for arg in node.args:
                self.assign(arg, CLEAN)
            self.clean(node.call, "a call block")
            self.stmts(node.body)
        elif isinstance(node, nodes.FilterBlock):
            self.filter_block(node.body, node.filter)
            self.stmts(node.body)
        elif isinstance(node, nodes.ExprStmt):
            self.clean(node.node, "a {% do %} statement")
        elif isinstance(node, (nodes.Continue, nodes.Break)):
            pass
        elif isinstance(node, (nodes.Scope, nodes.OverlayScope, nodes.ScopedEvalContextModifier)):
            self.stmts(node.body)
        else:  # Extends, Include, Import, Block, EvalContextModifier, extensions' nodes
            raise _NotPassedThrough(f"a {type(node).__name__} statement")

    def filter_block(self, body: list[nodes.Node], filter_: nodes.Filter) -> None:
        if self.writes_content(body):
            raise _NotPassedThrough("a content inside a filter block")
        for arg in (*filter_.args, *(k.value for k in filter_.kwargs)):
            self.clean(arg, "a filter argument")

    def writes_content(self, body: Iterable[nodes.Node]) -> bool:
        """Some output in `body` (nested statements included) may hold a content."""
        for node in body:
            for output in node.find_all(nodes.Output):
                if any(self.expr(child) != CLEAN for child in output.nodes):
                    return True
            if isinstance(node, nodes.Output) and any(self.expr(c) != CLEAN for c in node.nodes):
                return True
        return False

    # -- expressions ---------------------------------------------------------------------------
    def clean(self, node: nodes.Node | None, what: str) -> None:
        if node is not None and self.expr(node) != CLEAN:
            raise _NotPassedThrough(f"a content or message in {what}")

    def truth(self, node: nodes.Node) -> None:
        """`node` is only asked whether it is true: a content's answer is its emptiness."""
        self.expr(node)

    def expr(self, node: nodes.Node) -> int:
        if isinstance(node, (nodes.Const, nodes.TemplateData)):
            return CLEAN
        if isinstance(node, nodes.Name):
            if node.name in _FORBIDDEN_CALLS:
                raise _NotPassedThrough(f"{node.name} is used")
            return self.env.get(node.name, CLEAN)
        if isinstance(node, nodes.Getattr):
            return self.member(node.node, node.attr, attribute=True)
        if isinstance(node, nodes.Getitem):
            base = self.expr(node.node) if not isinstance(node.node, nodes.Name) else None
            if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
                return self.member(node.node, node.arg.value, attribute=False)
            if isinstance(node.arg, nodes.Slice):
                for part in (node.arg.start, node.arg.stop, node.arg.step):
                    self.clean(part, "a slice")
                kind = base if base is not None else self.expr(node.node)
                if kind in (TAINT, MSG):
                    raise _NotPassedThrough("a content or message sliced")
                return kind
            self.clean(node.arg, "an index")
            kind = base if base is not None else self.expr(node.node)
            if kind == MSGS:
                return MSG
            if kind != CLEAN:
                raise _NotPassedThrough("a content or message indexed by a computed key")
            return CLEAN
        if isinstance(node, (nodes.Add, nodes.Concat)):
            parts = [node.left, node.right] if isinstance(node, nodes.Add) else node.nodes
            kinds = [self.expr(p) for p in parts]
            if any(k in (MSG, MSGS) for k in kinds):
                raise _NotPassedThrough("a message concatenated")
            return TAINT if TAINT in kinds else CLEAN
        if isinstance(node, (nodes.And, nodes.Or)):
            kinds = {self.expr(node.left), self.expr(node.right)}
            kinds.discard(CLEAN)
            if len(kinds) > 1:
                raise _NotPassedThrough("and/or between a content and a message")
            return kinds.pop() if kinds else CLEAN
        if isinstance(node, nodes.CondExpr):
            self.truth(node.test)
            a = self.expr(node.expr1)
            b = self.expr(node.expr2) if node.expr2 is not None else CLEAN
            return _join(a, b)
        if isinstance(node, nodes.Not):
            self.truth(node.node)
            return CLEAN
        if isinstance(node, nodes.Test):
            kind = self.expr(node.node)
            for arg in (*node.args, *(k.value for k in node.kwargs)):
                self.clean(arg, "a test argument")
            if kind != CLEAN and node.name not in _SHAPE_TESTS:
                raise _NotPassedThrough(f"a content or message tested with '{node.name}'")
            return CLEAN
        if isinstance(node, nodes.Compare):
            kinds = [self.expr(node.expr), *(self.expr(op.expr) for op in node.ops)]
            membership = all(op.op in ("in", "notin") for op in node.ops) and len(node.ops) == 1
            if membership and kinds[0] == CLEAN and kinds[1] == MSG:
                return CLEAN  # "'tool_calls' in message": which fields it has is structure
            if any(k != CLEAN for k in kinds):
                raise _NotPassedThrough("a content or message compared")
            return CLEAN
        if isinstance(node, nodes.Filter):
            return self.filter(node)
        if isinstance(node, nodes.Call):
            return self.call(node)
        if isinstance(node, (nodes.List, nodes.Tuple)):
            for item in node.items:
                self.clean(item, "a list")
            return CLEAN
        if isinstance(node, nodes.Dict):
            for pair in node.items:
                self.clean(pair.key, "a dict")
                self.clean(pair.value, "a dict")
            return CLEAN
        if isinstance(node, (nodes.BinExpr, nodes.UnaryExpr)):  # - * / // % ** and unary +/-
            for child in node.iter_child_nodes():
                self.clean(child, f"the {type(node).__name__} operator")
            return CLEAN
        if isinstance(node, (nodes.ContextReference, nodes.EnvironmentAttribute)):
            return CLEAN
        raise _NotPassedThrough(f"a {type(node).__name__} expression")

    def member(self, base: nodes.Node, key: str, *, attribute: bool) -> int:
        """`base.key` or `base['key']`."""
        if isinstance(base, nodes.Name):
            if base.name == "loop" and key in ("previtem", "nextitem"):
                raise _NotPassedThrough("loop.previtem / loop.nextitem")
            scoped = self.env.get(f"{base.name}.{key}")
            if scoped is not None:  # a namespace attribute
                return scoped
        kind = self.expr(base)
        if kind == MSG:
            if key in _DICT_METHODS:
                raise _NotPassedThrough(f"message.{key}")
            if key == "get" and attribute:
                return CLEAN  # `message.get(...)`: the call is checked in `call`
            return TAINT if key == "content" else CLEAN
        if kind == TAINT:
            raise _NotPassedThrough(f"a content's .{key}")
        if kind == MSGS:
            raise _NotPassedThrough(f"messages.{key}")
        return CLEAN

    def filter(self, node: nodes.Filter) -> int:
        kind = self.expr(node.node) if node.node is not None else CLEAN
        args = [*node.args, *(k.value for k in node.kwargs)]
        for extra in (node.dyn_args, node.dyn_kwargs):
            self.clean(extra, "a filter argument")
        if kind == TAINT:
            if node.name == "string" and not args:
                return TAINT
            raise _NotPassedThrough(f"a content filtered with '{node.name}'")
        if kind in (MSG, MSGS):
            if node.name in _MESSAGE_FILTERS and not args:
                return CLEAN
            if kind == MSGS and node.name in _MESSAGES_TO_MESSAGE and not args:
                return MSG
            if kind == MSGS and node.name in _MESSAGES_TO_MESSAGES:
                if node.name in ("selectattr", "rejectattr"):
                    first = node.args[0] if node.args else None
                    if not (isinstance(first, nodes.Const) and first.value != "content") or node.kwargs:
                        raise _NotPassedThrough(f"messages|{node.name} on a content")
                for arg in args:
                    self.clean(arg, "a filter argument")
                return MSGS
            raise _NotPassedThrough(f"{_NAMES[kind]} filtered with '{node.name}'")
        for arg in args:
            self.clean(arg, "a filter argument")
        return CLEAN

    def call(self, node: nodes.Call) -> int:
        args = [*node.args, *(k.value for k in node.kwargs)]
        callee = node.node
        if isinstance(callee, nodes.Getattr) and callee.attr == "get" and self.expr(callee.node) == MSG:
            key = node.args[0] if node.args else None
            if not (isinstance(key, nodes.Const) and isinstance(key.value, str)) or node.kwargs:
                raise _NotPassedThrough("message.get with a computed key")
            for arg in node.args[1:]:
                self.clean(arg, "message.get's default")
            return TAINT if key.value == "content" else CLEAN
        if isinstance(callee, nodes.Name) and callee.name in _FORBIDDEN_CALLS:
            raise _NotPassedThrough(f"{callee.name}() is called")
        self.clean(callee, "a call")
        for arg in (*args, node.dyn_args, node.dyn_kwargs):
            self.clean(arg, "a call's arguments")
        return CLEAN
