"""An Ollama `Modelfile` beside an export: FROM/ADAPTER lines, the chat template as Ollama's Go
template, `PARAMETER stop` from the model's end-of-turn tokens and the Chat page's sampling settings.

Ollama renders a conversation with a Go `text/template` (its docs: `.System` is the system prompt,
`.Messages` the turns with `.Role` and `.Content`; a system message is in both). The GGUF carries a
Jinja template instead. This module does not translate Jinja in general: it knows the turn formats
of the common families (`FAMILIES`: ChatML, Llama 3, Gemma, Mistral [INST] with and without
spaces, DeepSeek R1), learns a model's variable parts (its default system prompt, the text before
a system prompt such as Llama 3.1's knowledge date, its generation prompt) by rendering probe
conversations with the model's own template, and accepts a family only when its Python rendering
(`TurnFormat.render`, the specification of the Go template `TurnFormat.go_template` emits) equals
the model's template on every probe. A template of no known family (gpt-oss's harmony format, a
custom Jinja template) is refused with `TemplateNotTranslatable`, and the export writes no Modelfile.

The Go template is checked in tests/engine/test_modelfile.py with a small interpreter of the subset
emitted here (Go is not available to the tests), against `ChatTemplate.render` on other conversations.

What it is not: tools, images and reasoning fields are not translated (Ollama's own library
templates handle those per model); a trailing assistant message is left open (Ollama continues it),
which the engine's templates have no equivalent for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import EngineError, TemplateError
from ..io.files import atomic_write
from ..model.generate import SamplingConfig
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer

MODELFILE_NAME = "Modelfile"

# Probe contents: unlikely in any template's own text, free of whitespace at their ends (Llama 3 and
# Gemma trim contents; Ollama's templates have no trim, so a content padded with spaces keeps them
# there) and of Go template delimiters.
_S, _U1, _A1, _U2, _A2, _U3 = ("SYSPROBE", "USERONE", "ASSTONE", "USERTWO", "ASSTTWO", "USERTHREE")


class TemplateNotTranslatable(EngineError):
    """The model's chat template is of no family this module translates to Ollama's Go template."""


@dataclass(frozen=True)
class TurnFormat:
    """One chat format: what surrounds each turn, and where the system prompt goes.

    system: "turn" (its own turn: sys_head + sys_prefix + content + sys_tail, or default_block when the
    conversation has none), "first_user" / "last_user" (content + sys_sep before that user message's
    content), "bare" (the content alone, first), "none" (the template refuses system messages).
    """

    family: str  # e.g. "ChatML"
    user_head: str
    user_tail: str
    asst_head: str
    asst_tail: str
    system: str = "turn"
    sys_head: str = ""
    sys_tail: str = ""
    sys_prefix: str = ""  # text the template puts before every system prompt (Llama 3.1's date lines)
    default_block: str = ""  # what the template writes when the conversation has no system message
    sys_sep: str = "\n\n"  # between the system prompt and the user message it joins
    bos: str = ""  # written first by the template itself (not added by the tokenizer)
    gen: str = ""  # the generation prompt (after the last user message)

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The conversation (ending with a user message) as Ollama renders `go_template()` on it, then
        the generation prompt; the specification of the Go template."""
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        out = [self.bos]
        if self.system == "turn":
            out.append(
                self.sys_head + self.sys_prefix + system + self.sys_tail if system else self.default_block
            )
        elif self.system == "bare":
            out.append(system)
        turns = [m for m in messages if m["role"] != "system"]
        offset = len(messages) - len(turns)
        for i, m in enumerate(turns):
            content = m["content"]
            last = i == len(turns) - 1
            if m["role"] == "user":
                joins = (self.system == "first_user" and i + offset == 1) or (
                    self.system == "last_user" and last
                )
                if system and joins:
                    content = system + self.sys_sep + content
                out.append(self.user_head + content + self.user_tail + (self.gen if last else ""))
            elif m["role"] == "assistant":
                out.append(self.asst_head + content + ("" if last else self.asst_tail))
        return "".join(out)

    def go_template(self) -> str:
        """The Ollama TEMPLATE text: Go text/template over `.System` and `.Messages`."""
        content, system = "{{ .Content }}", "{{ $.System }}"
        head = _lit(self.bos)
        if self.system == "turn":
            head += (
                "{{ if .System }}"
                + _lit(self.sys_head + self.sys_prefix)
                + "{{ .System }}"
                + _lit(self.sys_tail)
            )
            head += ("{{ else }}" + _lit(self.default_block) if self.default_block else "") + "{{ end }}"
        elif self.system == "bare":
            head += "{{ .System }}"
        join = ""
        if self.system == "first_user":
            join = "{{ if and $.System (eq $i 1) }}" + system + _lit(self.sys_sep) + "{{ end }}"
        elif self.system == "last_user":
            join = "{{ if and $.System $last }}" + system + _lit(self.sys_sep) + "{{ end }}"
        return (
            head
            + "{{- range $i, $_ := .Messages }}"
            + "{{- $last := eq (len (slice $.Messages $i)) 1 }}"
            + '{{- if eq .Role "user" }}'
            + _lit(self.user_head)
            + join
            + content
            + _lit(self.user_tail)
            + ("{{ if $last }}" + _lit(self.gen) + "{{ end }}" if self.gen else "")
            + '{{- else if eq .Role "assistant" }}'
            + _lit(self.asst_head)
            + content
            + ("{{ if not $last }}" + _lit(self.asst_tail) + "{{ end }}" if self.asst_tail else "")
            + "{{- end }}{{- end }}"
        )


def _lit(text: str) -> str:
    """Literal text in a Go template; delimiters (never in the known families) are refused."""
    if "{{" in text or "}}" in text:
        raise TemplateNotTranslatable(f"the template's text {text!r} holds Go template delimiters")
    return text


def _chatml() -> TurnFormat:
    h = "<|im_start|>{}\n".format
    return TurnFormat("ChatML", h("user"), "<|im_end|>\n", h("assistant"), "<|im_end|>\n", "turn",
                      h("system"), "<|im_end|>\n")  # fmt: skip


def _llama3() -> TurnFormat:
    h = "<|start_header_id|>{}<|end_header_id|>\n\n".format
    return TurnFormat("Llama 3", h("user"), "<|eot_id|>", h("assistant"), "<|eot_id|>", "turn",
                      h("system"), "<|eot_id|>")  # fmt: skip


def _gemma() -> TurnFormat:
    h = "<start_of_turn>{}\n".format
    return TurnFormat("Gemma", h("user"), "<end_of_turn>\n", h("model"), "<end_of_turn>\n", "first_user")


def _mistral(eos: str) -> TurnFormat:
    return TurnFormat("Mistral", "[INST]", "[/INST]", "", eos, "last_user")


def _mistral_spaced(eos: str) -> TurnFormat:
    return TurnFormat("Mistral (spaced)", "[INST] ", " [/INST]", "", eos, "last_user")


def _deepseek(eos: str) -> TurnFormat:
    return TurnFormat(
        "DeepSeek R1", "<｜User｜>", "", "<｜Assistant｜>", eos or "<｜end▁of▁sentence｜>", "bare"
    )


FAMILIES = ("ChatML", "Llama 3", "Gemma", "Mistral", "Mistral (spaced)", "DeepSeek R1")


def _candidates(eos: str) -> list[TurnFormat]:
    return [_chatml(), _llama3(), _gemma(), _mistral(eos), _mistral_spaced(eos), _deepseek(eos)]


def _probes() -> list[list[dict[str, str]]]:
    """Conversations a family must render exactly as the model's template does (all end with a user)."""

    def m(role: str, content: str) -> dict[str, str]:
        return {"role": role, "content": content}

    s, u1, a1, u2, a2, u3 = m("system", _S), m("user", _U1), m("assistant", _A1), m("user", _U2), \
        m("assistant", _A2), m("user", _U3)  # fmt: skip
    return [[u1], [s, u1], [u1, a1, u2], [s, u1, a1, u2], [s, u1, a1, u2, a2, u3], [u1, a1, u2, a2, u3]]


def _fitted(fmt: TurnFormat, template: ChatTemplate, bos: str, bos_added: bool) -> TurnFormat | None:
    """`fmt` with the model's variable parts learned from its template, which writes `bos` first;
    None when it does not fit."""
    try:
        one = template.render([{"role": "user", "content": _U1}], add_generation_prompt=True)
        closed = template.render([{"role": "user", "content": _U1}])
    except TemplateError:
        return None
    if not one.startswith(bos):
        return None
    if not (one.startswith(closed) and _U1 in closed):
        return None
    gen = one[len(closed) :]
    head_end = one.find(fmt.user_head)
    if head_end < 0:
        return None
    fmt = replace(fmt, bos=bos, gen=gen)
    if fmt.system == "turn":
        fmt = replace(fmt, default_block=one[len(bos) : head_end])
        try:
            with_sys = template.render(
                [{"role": "system", "content": _S}, {"role": "user", "content": _U1}],
                add_generation_prompt=True,
            )
        except TemplateError:
            return None
        start = len(bos) + len(fmt.sys_head)
        if not with_sys.startswith(bos + fmt.sys_head) or with_sys.find(_S) < start:
            return None
        fmt = replace(fmt, sys_prefix=with_sys[start : with_sys.find(_S)])
    try:
        template.render([{"role": "system", "content": _S}, {"role": "user", "content": _U1}])
    except TemplateError:
        fmt = replace(fmt, system="none")  # the template refuses system messages (Mistral v0.1)
    for conversation in _probes():
        if fmt.system == "none" and conversation[0]["role"] == "system":
            continue
        try:
            want = template.render(conversation, add_generation_prompt=True)
        except TemplateError:
            return None
        if fmt.render(conversation) != want:
            return None
    if bos and bos_added:  # the tokenizer writes BOS itself: the Go template must not write it again
        fmt = replace(fmt, bos="")
    return fmt


def translate(template: ChatTemplate, *, bos_added: bool = False) -> TurnFormat:
    """The family format that renders like `template` on every probe; TemplateNotTranslatable if none."""
    # a BOS text the template writes first, or none (SmolLM2's BOS is "<|im_start|>", a turn's start)
    for bos in dict.fromkeys((template.bos_token, "")):
        for fmt in _candidates(template.eos_token):
            fitted = _fitted(fmt, template, bos, bos_added)
            if fitted is not None:
                return fitted
    kind = "the default ChatML template" if template.is_default else template.name
    raise TemplateNotTranslatable(
        f"{kind} is of no chat-template family that can be written as an Ollama template "
        f"(known: {', '.join(FAMILIES)}); the export is written without a Modelfile"
    )


@dataclass(frozen=True)
class ModelfilePlan:
    """What a Modelfile will say: the format, the stop strings, the sampling parameters."""

    format: TurnFormat
    stops: tuple[str, ...]
    sampling: SamplingConfig

    def text(self, from_line: str, adapter_line: str | None = None) -> str:
        """The Modelfile. Sampling: temperature, top_k, top_p, min_p (the engine has no repeat
        penalty); the Chat page's seed and answer budget stay out (a fixed seed would make every
        Ollama answer the same; Ollama's own budget is "until a stop")."""
        lines = [
            "# Ollama Modelfile written by Tune Studio",
            f"# chat template: {self.format.family}",
            from_line,
        ]
        if adapter_line:
            lines.append(adapter_line)
        lines.append(f'TEMPLATE """{self.format.go_template()}"""')
        lines.extend(f"PARAMETER stop {_quoted(s)}" for s in self.stops)
        s = self.sampling
        lines.append(f"PARAMETER temperature {s.temperature:g}")
        lines.append(f"PARAMETER top_k {s.top_k}")
        lines.append(f"PARAMETER top_p {s.top_p:g}")
        lines.append(f"PARAMETER min_p {s.min_p:g}")
        return "\n".join(lines) + "\n"


def _quoted(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_modelfile(metadata: Mapping, sampling: SamplingConfig | None = None) -> ModelfilePlan:
    """The Modelfile's content for a model (its GGUF metadata); TemplateNotTranslatable (or a
    TemplateError / ModelError for a broken template or vocabulary) when none can be written."""
    template = ChatTemplate.from_metadata(metadata)
    tokenizer = Tokenizer.from_metadata(metadata)
    fmt = translate(template, bos_added=tokenizer.add_bos)
    if '"""' in fmt.go_template():
        raise TemplateNotTranslatable('the template holds """, which ends a Modelfile TEMPLATE')
    stops = tuple(sorted({tokenizer.token_text(i) for i in tokenizer.eot_ids}))
    return ModelfilePlan(fmt, stops, sampling if sampling is not None else SamplingConfig())


def modelfile_path(out: str) -> str:
    """Where the Modelfile of the export `out` goes: beside it, named after it (`run.merged.gguf` ->
    `run.merged.Modelfile`), so that every export in a folder keeps its own Modelfile (a merged
    model beside its adapter, two adapters of one run); `ollama create NAME -f run.merged.Modelfile`."""
    folder, name = os.path.split(os.path.abspath(out))
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    return os.path.join(folder, f"{stem}.{MODELFILE_NAME}")


_MAX_MODELFILE = 1 << 20  # bytes: a Modelfile is a page of text; a larger file is something else


def modelfile_owner(path: str) -> str | None:
    """The file a Modelfile builds from, as it is written there: its ADAPTER (an adapter's
    Modelfile), else its FROM; None when `path` is no Modelfile (no FROM line) or cannot be read."""
    try:
        if os.path.getsize(path) > _MAX_MODELFILE:
            return None
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    found: dict[str, str] = {}
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        if word.upper() in ("FROM", "ADAPTER") and rest.strip():
            found.setdefault(word.upper(), rest.strip())
    if "FROM" not in found:
        return None
    return found.get("ADAPTER", found["FROM"])


def modelfile_conflict(out: str) -> str | None:
    """Why the Modelfile of the export `out` must not be written over the file already at its path
    (another export's Modelfile, or a file that is no Modelfile), in words; None when there is no
    file there or it is the Modelfile of `out` itself (written again, replaced)."""
    path = modelfile_path(out)
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        return f"{path} is not a file"
    owner = modelfile_owner(path)
    if owner is None:
        return f"{path} exists and is not an Ollama Modelfile (no FROM line)"
    folder = os.path.dirname(path)
    target = os.path.normpath(os.path.join(folder, os.path.expanduser(owner)))
    if os.path.normcase(target) == os.path.normcase(os.path.abspath(out)):
        return None
    return f"{path} is the Modelfile of another file ({owner}, not ./{os.path.basename(out)})"


def write_modelfile(plan: ModelfilePlan, out: str, *, merged: bool, base: str) -> str:
    """Write the Modelfile beside `out` (temporary name, then rename); returns its path.

    merged: `FROM ./<out>`; adapter: `FROM <base>` (absolute) and `ADAPTER ./<out>`.
    """
    name = os.path.basename(out)
    if merged:
        text = plan.text(f"FROM ./{name}")
    else:
        text = plan.text(f"FROM {os.path.abspath(base)}", f"ADAPTER ./{name}")
    path = modelfile_path(out)
    with atomic_write(path) as f:
        f.write(text)
    return path
