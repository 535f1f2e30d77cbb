"""An Ollama `Modelfile` beside an export, with the chat template translated to Go's text/template.

Ollama renders a prompt with a Go template over `.Messages` (each with `.Role` and `.Content`) and
`.System` (the system message), and the reply is generated after the text it makes; it tokenizes
that text with the model's BOS added. So the translation of a template is right when, for every
conversation ending in a user turn, the Go template's text equals the engine's rendering with
`add_generation_prompt=True`, less a leading BOS.

The families translated are ChatML (Qwen, SmolLM, ...), Llama 3 and Gemma: each has a Go template
written here with the literal parts the model's own template adds (a default system message, a
preamble such as Llama 3.1's knowledge date) taken from probe renders of that template. A family
is chosen only when its translation renders a set of probe conversations exactly as the engine
does; otherwise `translate` says the template cannot be translated (Mistral's, DeepSeek's and
gpt-oss harmony's are not, yet) and the export check reports it before anything is written.

`render_go` is a small interpreter of exactly the subset of text/template emitted here (text,
`{{ }}` actions with `-` trim markers, `.Field`, `$.Field`, `$var`, `:=`, `=`, `if`/`else if`/
`else`/`end`, `range`, and the functions `eq`, `ne`, `not`, `and`, `or`), used by the check and the
tests; it refuses anything else, so the emitted templates cannot drift outside what it checks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError, TemplateError
from ..io.files import atomic_write
from ..text.chat_template import ChatTemplate

MODELFILE = "Modelfile"

# -- the families -------------------------------------------------------------------------------

_CHATML = (
    "{{- if not .System }}{default}{{ end }}\n"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)
_LLAMA3 = (
    "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{preamble}{{ .System }}<|eot_id|>\n"
    "{{- else }}{default}{{ end }}\n"
    '{{- range .Messages }}{{ if ne .Role "system" }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n'
    "{{ .Content }}<|eot_id|>{{ end }}{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
)
_GEMMA = (
    "{{- $first := true }}\n"
    "{{- range .Messages }}\n"
    '{{- if eq .Role "user" }}<start_of_turn>user\n'
    "{{ if and $first $.System }}{{ $.System }}\n\n{{ end }}{{ .Content }}<end_of_turn>\n"
    "{{ $first = false }}\n"
    '{{- else if eq .Role "assistant" }}<start_of_turn>model\n'
    "{{ .Content }}<end_of_turn>\n"
    "{{ $first = false }}\n"
    "{{- end }}\n"
    "{{- end }}<start_of_turn>model\n"
)
FAMILIES = ("ChatML", "Llama 3", "Gemma")
_STOPS = {
    "ChatML": ("<|im_end|>", "<|im_start|>"),
    "Llama 3": ("<|eot_id|>", "<|start_header_id|>"),
    "Gemma": ("<end_of_turn>", "<start_of_turn>"),
}
_NOT_YET = (
    "Mistral [INST]",
    "DeepSeek",
    "gpt-oss harmony",
)

# probe conversations: every translation must render all of them as the engine does
PROBES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "Hello there."},),
    ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}),
    (
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ),
    (
        {"role": "system", "content": "You are Tuna."},
        {"role": "user", "content": "Hi!\nTwo lines."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye."},
    ),
)


@dataclass(frozen=True)
class Translation:
    """A chat template as Ollama's TEMPLATE, or why it could not be translated."""

    family: str | None  # one of FAMILIES, None when not translated
    template: str | None  # the Go template
    stops: tuple[str, ...]  # PARAMETER stop values
    reason: str = ""  # why not, when family is None


def _render(template: ChatTemplate, messages: Sequence[Mapping[str, str]]) -> str:
    text = template.render(list(messages), add_generation_prompt=True)
    bos = template.bos_token
    return text[len(bos) :] if bos and text.startswith(bos) else text


def _go_literal(text: str) -> str:
    """Text placed in a Go template as it is (it must not open an action)."""
    if "{{" in text:
        raise TemplateError("the template's literal text holds '{{'")
    return text


def _candidates(template: ChatTemplate) -> list[tuple[str, str]]:
    """(family, Go template) pairs whose literal parts come from probe renders of `template`."""
    alone = _render(template, PROBES[0])
    out: list[tuple[str, str]] = []
    # ChatML: what comes before the first user turn when there is no system message
    i = alone.find("<|im_start|>user\n")
    if i >= 0:
        out.append(("ChatML", _CHATML.replace("{default}", _go_literal(alone[:i]))))
    i = alone.find("<|start_header_id|>user<|end_header_id|>")
    if i >= 0:
        with_sys = _render(template, PROBES[1])
        head = "<|start_header_id|>system<|end_header_id|>\n\n"
        preamble = ""
        if with_sys.startswith(head) and "Be brief." in with_sys:
            preamble = with_sys[len(head) : with_sys.index("Be brief.")]
        llama = _LLAMA3.replace("{default}", _go_literal(alone[:i])).replace(
            "{preamble}", _go_literal(preamble)
        )
        out.append(("Llama 3", llama))
    if alone.startswith("<start_of_turn>user\n"):
        out.append(("Gemma", _GEMMA))
    return out


def translate(template: ChatTemplate, eos_text: str = "") -> Translation:
    """The model's template as a Go template, checked on `PROBES` against the engine's rendering."""
    try:
        candidates = _candidates(template)
    except TemplateError as exc:
        return Translation(None, None, (), f"the chat template cannot be rendered: {exc}")
    for family, go in candidates:
        try:
            same = all(render_go(go, probe) == _render(template, probe) for probe in PROBES)
        except TemplateError:
            same = False
        if same:
            stops = tuple(dict.fromkeys(s for s in (*_STOPS[family], eos_text) if s))
            return Translation(family, go, stops)
    tried = f" (it looks like {candidates[0][0]} but renders differently)" if candidates else ""
    return Translation(
        None,
        None,
        (),
        f"the chat template is not one Tune Studio translates to Ollama's TEMPLATE{tried}; translated: "
        f"{', '.join(FAMILIES)}; not yet: {', '.join(_NOT_YET)}",
    )


# -- the Modelfile ------------------------------------------------------------------------------

_SAMPLING_KEYS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p"}
_SAMPLING_KEYS["repeat_penalty"] = "repeat_penalty"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def modelfile_text(
    translation: Translation,
    *,
    gguf: str,
    base: str | None = None,
    sampling: Mapping[str, float] | None = None,
) -> str:
    """The Modelfile: `FROM ./merged.gguf`, or `FROM <base>` and `ADAPTER ./adapter.gguf`."""
    if translation.template is None:
        raise ExportError(f"no Modelfile: {translation.reason}")
    if '"""' in translation.template:
        raise ExportError('no Modelfile: the chat template holds """, which a Modelfile cannot quote')
    lines = [f"# written by Tune Studio; chat template: {translation.family}"]
    if base is None:
        lines.append(f"FROM ./{gguf}")
    else:
        lines += [f"FROM {base}", f"ADAPTER ./{gguf}"]
    lines.append(f'TEMPLATE """{translation.template}"""')
    lines += [f"PARAMETER stop {_quoted(s)}" for s in translation.stops]
    for key, value in (sampling or {}).items():
        if key in _SAMPLING_KEYS and value is not None:
            lines.append(f"PARAMETER {_SAMPLING_KEYS[key]} {float(value):g}")
    return "\n".join(lines) + "\n"


def write_modelfile(
    out_gguf: str | os.PathLike[str],
    template: ChatTemplate,
    *,
    base: str | os.PathLike[str] | None = None,
    sampling: Mapping[str, float] | None = None,
) -> Path:
    """Write `Modelfile` beside `out_gguf` (temporary name, then rename); ExportError, with nothing
    written, when the template cannot be translated. `base`: the base model of an adapter export."""
    out = Path(out_gguf)
    translation = translate(template, template.eos_token)
    base_text = None if base is None else os.path.abspath(os.fspath(base))
    text = modelfile_text(translation, gguf=out.name, base=base_text, sampling=sampling)
    path = out.parent / MODELFILE
    with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return path


# -- the interpreter of the emitted subset --------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\(|\)|\$\.[A-Za-z]+|\$[A-Za-z_]*|\.[A-Za-z]+|:=|=|[A-Za-z]+)')


def _parse(source: str) -> list:
    """A tree of ("text", s) / ("out", expr) / ("set", name, expr, declare) / ("if", [(cond, body)],
    else_body) / ("range", expr, body)."""
    pieces: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(source):
        text = source[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        pieces.append(("text", text))
        pieces.append(("action", m.group(2).strip()))
        pos = m.end()
        if m.group(3):
            rest = source[pos:]
            pos += len(rest) - len(rest.lstrip())
    pieces.append(("text", source[pos:]))
    tree, i = _block(pieces, 0, top=True)
    return tree


def _block(pieces: list, i: int, top: bool = False) -> tuple[list, int]:
    body: list = []
    while i < len(pieces):
        kind, value = pieces[i]
        if kind == "text":
            if value:
                body.append(("text", value))
            i += 1
            continue
        words = value.split(None, 1)
        head = words[0] if words else ""
        if head in ("end", "else"):
            if top:
                raise TemplateError(f"unexpected {{{{ {value} }}}}")
            return body, i
        if head == "if":
            branches = []
            cond = _expr(words[1])
            while True:
                sub, i = _block(pieces, i + 1)
                branches.append((cond, sub))
                action = pieces[i][1] if i < len(pieces) else ""
                if action.startswith("else if "):
                    cond = _expr(action[len("else if ") :])
                    continue
                if action == "else":
                    other, i = _block(pieces, i + 1)
                    if i >= len(pieces) or pieces[i][1] != "end":
                        raise TemplateError("an {{ else }} without {{ end }}")
                    body.append(("if", branches, other))
                    break
                if action == "end":
                    body.append(("if", branches, []))
                    break
                raise TemplateError("an {{ if }} without {{ end }}")
            i += 1
        elif head == "range":
            sub, i = _block(pieces, i + 1)
            if i >= len(pieces) or pieces[i][1] != "end":
                raise TemplateError("a {{ range }} without {{ end }}")
            body.append(("range", _expr(words[1]), sub))
            i += 1
        elif re.match(r"\$\w+\s*:?=", value):
            name, op, rest = re.match(r"(\$\w+)\s*(:?=)\s*(.*)", value, re.S).groups()
            body.append(("set", name, _expr(rest), op == ":="))
            i += 1
        else:
            body.append(("out", _expr(value)))
            i += 1
    if not top:
        raise TemplateError("a block without {{ end }}")
    return body, i


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if not m:
            raise TemplateError(f"not in the emitted subset of text/template: {text[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def _expr(text: str) -> Any:
    tokens = _tokens(text)
    expr, rest = _pipeline(tokens)
    if rest:
        raise TemplateError(f"unexpected {' '.join(rest)!r} in {text!r}")
    return expr


_FUNCS = {"eq": 2, "ne": 2, "not": 1, "and": 2, "or": 2}


def _pipeline(tokens: list[str]) -> tuple[Any, list[str]]:
    if tokens and tokens[0] in _FUNCS:
        name, rest = tokens[0], tokens[1:]
        args = []
        for _ in range(_FUNCS[name]):
            arg, rest = _operand(rest)
            args.append(arg)
        return ("call", name, args), rest
    return _operand(tokens)


def _operand(tokens: list[str]) -> tuple[Any, list[str]]:
    if not tokens:
        raise TemplateError("an expression ends too early")
    t, rest = tokens[0], tokens[1:]
    if t == "(":
        expr, rest = _pipeline(rest)
        if not rest or rest[0] != ")":
            raise TemplateError("a missing )")
        return expr, rest[1:]
    if t.startswith('"'):
        return ("lit", bytes(t[1:-1], "utf-8").decode("unicode_escape")), rest
    if t in ("true", "false"):
        return ("lit", t == "true"), rest
    if t.startswith("$.") or t.startswith(".") or t.startswith("$"):
        return ("ref", t), rest
    raise TemplateError(f"{t!r} is not in the emitted subset of text/template")


def _truth(value: Any) -> bool:
    return bool(value)


def _eval(expr: Any, dot: Any, root: Mapping, scope: dict) -> Any:
    kind = expr[0]
    if kind == "lit":
        return expr[1]
    if kind == "ref":
        ref = expr[1]
        if ref.startswith("$."):
            return root[ref[2:]]
        if ref.startswith("."):
            return dot[ref[1:]]
        if ref not in scope:
            raise TemplateError(f"undefined variable {ref}")
        return scope[ref]
    name, args = expr[1], [_eval(a, dot, root, scope) for a in expr[2]]
    if name == "eq":
        return args[0] == args[1]
    if name == "ne":
        return args[0] != args[1]
    if name == "not":
        return not _truth(args[0])
    if name == "and":
        return args[1] if _truth(args[0]) else args[0]
    return args[0] if _truth(args[0]) else args[1]


def _run(body: list, dot: Any, root: Mapping, scope: dict, out: list[str]) -> None:
    for node in body:
        kind = node[0]
        if kind == "text":
            out.append(node[1])
        elif kind == "out":
            out.append(str(_eval(node[1], dot, root, scope)))
        elif kind == "set":
            if not node[3] and node[1] not in scope:
                raise TemplateError(f"assignment to undeclared variable {node[1]}")
            scope[node[1]] = _eval(node[2], dot, root, scope)
        elif kind == "if":
            for cond, sub in node[1]:
                if _truth(_eval(cond, dot, root, scope)):
                    _run(sub, dot, root, scope, out)
                    break
            else:
                _run(node[2], dot, root, scope, out)
        else:  # range
            for item in _eval(node[1], dot, root, scope):
                _run(node[2], item, root, scope, out)


def render_go(source: str, messages: Sequence[Mapping[str, str]]) -> str:
    """`source` rendered as Ollama would for `messages` (Messages with Role/Content, and System:
    the last system message's content), by the interpreter of the emitted subset."""
    system = "".join(m["content"] for m in messages if m["role"] == "system")
    root = {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in messages], "System": system}
    out: list[str] = []
    _run(_parse(source), root, root, {}, out)
    return "".join(out)
