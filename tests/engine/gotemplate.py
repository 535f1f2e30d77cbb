"""A small interpreter of the Go `text/template` subset that engine.export.modelfile emits.

Go's text/template is not here (no Go toolchain on the test machines), so this is the stand-in that
the Modelfile tests render Ollama TEMPLATEs with. It follows Go's rules for exactly what is used:
text; actions `{{ ... }}` with the trim markers `{{-` / `-}}` (which drop the whitespace next to
them); fields `.Role`, `.Content`, `.System`, `$.Messages`; variables `$i`, `$_`, `$last` declared
with `:=`; `range $i, $_ := PIPE` ... `end` (the dot becomes the element; `$` stays the root);
`if` / `else if` / `else` / `end`; the functions `eq`, `ne`, `and`, `not`, `len`, `slice` and
parenthesised calls; string (double-quoted, Go escapes \\n \\" \\\\) and integer literals. Truth is
Go's: empty string, 0, false, nil and empty lists are false. Anything else raises ValueError, so a
template using more than the subset fails the test instead of rendering wrongly.

`render(template, messages)` executes it on Ollama's values: `System` (the system messages joined
with blank lines) and `Messages` (every message, system ones included, consecutive messages of one
role merged), as Ollama's template/template.go (`Execute`, `collate`) does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|-?\d+|\$[A-Za-z0-9_]*(?:\.[A-Za-z]+)*|\.[A-Za-z]+|[A-Za-z_]+|:=|=|,)'
)


def _parse_actions(src: str) -> list[tuple[str, str]]:
    """[("text", s) | ("act", body)] with trim markers applied."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(src):
        text = src[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("act", m.group(2).strip()))
        pos = m.end()
        if m.group(3):
            rest = src[pos:]
            pos += len(rest) - len(rest.lstrip())
    out.append(("text", src[pos:]))
    if "{{" in src[pos:]:
        raise ValueError("unclosed action")
    return out


def _tokens(expr: str) -> list[str]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot parse {expr[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


class _Node:
    pass


class _Text(_Node):
    def __init__(self, text: str):
        self.text = text


class _Out(_Node):
    def __init__(self, expr: list[str]):
        self.expr = expr


class _Assign(_Node):
    def __init__(self, name: str, expr: list[str]):
        self.name, self.expr = name, expr


class _If(_Node):
    def __init__(self) -> None:
        self.branches: list[tuple[list[str] | None, list[_Node]]] = []


class _Range(_Node):
    def __init__(self, names: list[str], expr: list[str]):
        self.names, self.expr, self.body = names, expr, []


def _build(items: list[tuple[str, str]]) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_Node | None, list[_Node]]] = [(None, root)]
    for kind, body in items:
        target = stack[-1][1]
        if kind == "text":
            if body:
                target.append(_Text(body))
            continue
        toks = _tokens(body)
        if not toks:
            raise ValueError("empty action")
        head = toks[0]
        if head == "if":
            node = _If()
            node.branches.append((toks[1:], []))
            target.append(node)
            stack.append((node, node.branches[-1][1]))
        elif head == "else":
            node, _ = stack.pop()
            if not isinstance(node, _If):
                raise ValueError("else outside if")
            cond = toks[2:] if len(toks) > 1 and toks[1] == "if" else None
            if len(toks) > 1 and toks[1] != "if":
                raise ValueError(f"unsupported else: {body!r}")
            node.branches.append((cond, []))
            stack.append((node, node.branches[-1][1]))
        elif head == "range":
            if ":=" not in toks:
                raise ValueError("range without variables is not in the subset")
            k = toks.index(":=")
            names = [t for t in toks[1:k] if t.startswith("$")]
            node = _Range(names, toks[k + 1 :])
            target.append(node)
            stack.append((node, node.body))
        elif head == "end":
            if len(stack) == 1:
                raise ValueError("end without a block")
            stack.pop()
        elif head.startswith("$") and len(toks) > 1 and toks[1] in (":=", "="):
            target.append(_Assign(head, toks[2:]))
        else:
            target.append(_Out(toks))
    if len(stack) != 1:
        raise ValueError("block without end")
    return root


def _truth(v: Any) -> bool:
    return bool(v) if v is not None else False


class _Scope:
    def __init__(self, root: Mapping[str, Any]):
        self.root = root
        self.vars: list[dict[str, Any]] = [{"$": root}]

    def get(self, name: str) -> Any:
        for frame in reversed(self.vars):
            if name in frame:
                return frame[name]
        raise ValueError(f"undefined variable {name}")


def _field(obj: Any, name: str) -> Any:
    if not isinstance(obj, Mapping) or name not in obj:
        raise ValueError(f"no field {name} in {obj!r}"[:200])
    return obj[name]


def _eval(toks: list[str], scope: _Scope, dot: Any) -> Any:
    value, rest = _call(toks, scope, dot)
    if rest:
        raise ValueError(f"unexpected {rest}")
    return value


_FUNCS = {
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": lambda a, b: a != b,
    "not": lambda a: not _truth(a),
    "len": lambda a: len(a),
    "slice": lambda a, *ix: (
        a[ix[0] : ix[1] if len(ix) == 2 else None] if len(ix) in (1, 2) else _bad("slice")
    ),
}


def _bad(what: str) -> Any:
    raise ValueError(what)


def _call(toks: list[str], scope: _Scope, dot: Any) -> tuple[Any, list[str]]:
    """Evaluate a command (function and arguments, or one operand) up to a ')' or the end."""
    args: list[Any] = []
    head = toks[0] if toks else None
    i = 0
    if head in _FUNCS or head == "and":
        i = 1
    while i < len(toks) and toks[i] != ")":
        arg, used = _operand(toks[i:], scope, dot)
        args.append(arg)
        i += used
    rest = toks[i:]
    if head == "and":
        result: Any = True
        for a in args:  # Go returns the first false argument, else the last
            result = a
            if not _truth(a):
                break
        return result, rest
    if head in _FUNCS:
        return _FUNCS[head](*args), rest
    if len(args) != 1:
        raise ValueError(f"{toks!r} is not a function call in the subset")
    return args[0], rest


def _operand(toks: list[str], scope: _Scope, dot: Any) -> tuple[Any, int]:
    t = toks[0]
    if t == "(":
        value, rest = _call(toks[1:], scope, dot)
        if not rest or rest[0] != ")":
            raise ValueError("unclosed (")
        return value, len(toks) - len(rest) + 1
    if t.startswith('"'):
        escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}
        return re.sub(r"\\(.)", lambda e: escapes.get(e.group(1)) or _bad(f"escape {e.group(0)}"), t[1:-1]), 1
    if re.fullmatch(r"-?\d+", t):
        return int(t), 1
    if t.startswith("$"):
        name, *fields = t.split(".")
        value = scope.get(name)
        for f in fields:
            value = _field(value, f)
        return value, 1
    if t.startswith("."):
        return _field(dot, t[1:]), 1
    raise ValueError(f"{t!r} is not in the subset")


def _exec(nodes: list[_Node], scope: _Scope, dot: Any, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Out):
            value = _eval(node.expr, scope, dot)
            out.append("" if value is None else str(value))
        elif isinstance(node, _Assign):
            scope.vars[-1][node.name] = _eval(node.expr, scope, dot)
        elif isinstance(node, _If):
            for cond, body in node.branches:
                if cond is None or _truth(_eval(cond, scope, dot)):
                    scope.vars.append({})
                    _exec(body, scope, dot, out)
                    scope.vars.pop()
                    break
        elif isinstance(node, _Range):
            items = _eval(node.expr, scope, dot)
            for i, item in enumerate(items):
                frame = dict(zip(node.names, (i, item) if len(node.names) == 2 else (item,), strict=True))
                scope.vars.append(frame)
                _exec(node.body, scope, item, out)
                scope.vars.pop()


def execute(template: str, values: Mapping[str, Any]) -> str:
    """Run `template` with `values` as the dot (and `$`)."""
    nodes = _build(_parse_actions(template))
    out: list[str] = []
    _exec(nodes, _Scope(values), values, out)
    return "".join(out)


def render(template: str, messages: Sequence[Mapping[str, str]]) -> str:
    """What Ollama renders for a chat: `.System` (the system messages joined with a blank line) and
    `.Messages` (consecutive messages of one role, tools' excepted, merged the same way), as
    `Template.Execute` and `collate` in Ollama's template/template.go do."""
    msgs: list[dict[str, str]] = []
    for m in messages:
        if msgs and msgs[-1]["Role"] == m["role"] and m["role"] != "tool":
            msgs[-1]["Content"] += "\n\n" + m["content"]
        else:
            msgs.append({"Role": m["role"], "Content": m["content"]})
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    return execute(template, {"System": system, "Messages": msgs})
