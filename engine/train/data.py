"""Training data: JSON Lines samples, their problems by line, and the validation split.

A dataset file holds one sample per line in one of three shapes (DESIGN.md §2.5)::

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    {"prompt": "...", "response": "..."}
    {"text": "..."}

each with an optional ``"reward"`` (or ``"score"``) number. Two common shapes are read too and
become ``"messages"`` samples: ShareGPT's ``{"conversations": [{"from", "value"}, ...]}`` and
Alpaca's ``{"instruction", "input", "output"}``. Where a line has keys of several shapes the
first in that order wins (messages, conversations, prompt/response, instruction/output, text);
other keys are ignored. A line with "chosen" and "rejected" is a preference pair (DPO, ORPO), read
by `engine.train.pref_data` into a "preference" sample.

`load_jsonl` (or `iter_jsonl`, a sample at a time) never stops at a bad line: it returns the
samples it could read and a `Problem` per line it could not (an "error": the sample is skipped)
or has doubts about (a "warning": the sample is kept). `DatasetError` only when the file cannot
be read at all. Duplicates are found by a 16-byte digest of each sample, never by keeping it.

Encoding them into tokens and trained-token masks is `engine.train.encode`; packing the encoded
samples into windows and batches is `engine.train.batches`; holding whole prompt groups out for
validation is `engine.train.val_split`.

Files are read a line at a time, after checking that they are regular files (a FIFO is refused,
not waited on) of at most `MAX_FILE_BYTES`; a line longer than `MAX_LINE_BYTES`, one that is not
UTF-8, and any value nested deeper than `MAX_NESTING`, holding an unpaired surrogate or a NaN,
is a problem on its line.

Reading and parsing are one module on purpose (about 870 lines): a line is checked as it is read
(its length, its encoding, the nesting, surrogates and NaNs of its values) and parsed in the same
pass, so the file reader and the sample parser share their limits and their problem texts.

What this module is not: it does not tokenize (engine.train.encode) and it does not decide reward
weights (see `engine.train.rewards`).
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import logging
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import DatasetError
from ..io.file_kind import file_kind
from ..io.files import atomic_write, durable_append

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

ERROR = "error"  # the sample is skipped
WARNING = "warning"  # the sample is kept

ROLES = ("system", "user", "assistant", "tool")
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user"}
_SHAREGPT_ROLES.update({"assistant": "assistant", "tool": "tool", "function_response": "tool"})
_SHAPES = (
    'the accepted shapes are {"messages": [{"role": ..., "content": ...}, ...]}, '
    '{"prompt": ..., "response": ...} and {"text": ...} (also ShareGPT {"conversations": [...]} '
    'and Alpaca {"instruction": ..., "input": ..., "output": ...})'
)
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}

MAX_FILE_BYTES = 1 << 30  # a dataset file larger than this is refused (with its size), not read
MAX_LINE_BYTES = 16 << 20  # a longer line is a problem, skipped without being held in memory
MAX_NESTING = 64  # objects and arrays nested deeper than this make a line a problem
_BINARY_SNIFF = 8192  # bytes at the start of a file checked for NUL (a binary file, or UTF-16)
_END = object()  # an exhausted iterator's next()
_NOT_UTF8 = "not UTF-8 text: "  # how the problem of a line that is not UTF-8 begins


# -- samples ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """Something wrong with one line (or in-memory sample) of a dataset."""

    line: int  # 1-based line in the file; 0 for a sample made in memory
    message: str  # what is wrong and what would be accepted
    severity: str  # "error" (the sample is skipped) or "warning" (it is kept)

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "sample"
        return f"{where}: {self.severity}: {self.message}"


def json_values(lines: Iterable[str], problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """(line number from 1, value) of each non-blank line that parses as JSON; a line that does not
    adds an error to `problems` (with the column where parsing stopped) and is skipped."""
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append(Problem(number, f"invalid JSON at column {exc.colno}: {exc.msg}", ERROR))
            continue
        yield number, value


@dataclass(frozen=True)
class Sample:
    """One training example, as read from a dataset line (comparable; not hashable: messages are dicts)."""

    line: int  # 1-based line in the file (0 if made in memory)
    kind: str  # "messages" | "prompt" | "text" | "preference"
    messages: tuple[dict, ...]  # role/content dicts; for "prompt" the derived user and assistant pair
    prompt: str | None  # "prompt" samples only
    response: str | None  # "prompt" samples only
    text: str | None  # "text" samples only
    reward: float | None  # from "reward" (or "score"); None when the line has none
    group: str  # samples answering the same prompt share it ("" for text samples)
    rejected: str | None = None  # "preference" samples only: the worse answer (messages end with the
    # chosen one, so a preference trains as a conversation on its chosen answer: engine.train.pref_data)


def _json_type(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 40, *, quote: bool = False) -> str:
    """A one-line excerpt of `value`: its repr (JSON quoting for a str with `quote`), cut to `limit`."""
    if isinstance(value, str) and len(value) > 4 * limit:
        value = value[: 4 * limit]  # repr of a huge string is not built only to be cut
    text = json.dumps(value, ensure_ascii=False) if quote and isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _group_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation before its last assistant message, as canonical JSON."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return _CANONICAL.encode(list(messages[:last]))


def _parse_messages(value: Any, key: str, problems: list[Problem], line: int) -> tuple[dict, ...] | None:
    """Validated copies of `messages`, or None (with error problems) if unusable."""
    if not isinstance(value, list):
        problems.append(Problem(line, f'"{key}" must be a list of messages, got {_json_type(value)}', ERROR))
        return None
    out: list[dict] = []
    ok = True
    for i, m in enumerate(value):
        if type(m) is dict and len(m) == 2 and m.get("role") in ROLES and type(m.get("content")) is str:
            # the common message, {"role", "content"}: what the checks below make of it
            if not m["content"].strip():
                problems.append(Problem(line, f"{key}[{i}] ({m['role']}) has empty content", WARNING))
            out.append(dict(m))
            continue
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            problems.append(Problem(line, f"{where} must be an object, got {_json_type(m)}", ERROR))
            ok = False
            continue
        role, content = m.get("role"), m.get("content")
        if "role" not in m:
            problems.append(Problem(line, f'{where} has no "role" (one of {", ".join(ROLES)})', ERROR))
            ok = False
            continue
        if role not in ROLES:
            problems.append(
                Problem(line, f"{where} has unknown role {_short(role)}; accepted: {', '.join(ROLES)}", ERROR)
            )
            ok = False
            continue
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            message = f'{where} ({role}): "tool_calls" must be a list of objects, got {_short(calls)}'
            problems.append(Problem(line, message, ERROR))
            ok = False
            continue
        if content is None and role == "assistant" and calls:
            content = ""  # an assistant turn that only calls tools
        elif "content" not in m:
            problems.append(Problem(line, f'{where} ({role}) has no "content"', ERROR))
            ok = False
            continue
        elif not isinstance(content, str):
            problems.append(
                Problem(
                    line, f'{where} ({role}): "content" must be a string, got {_json_type(content)}', ERROR
                )
            )
            ok = False
            continue
        if not content.strip() and not m.get("tool_calls"):
            problems.append(Problem(line, f"{where} ({role}) has empty content", WARNING))
        out.append({**m, "role": role, "content": content})
    if not ok:
        return None
    if not any(m["role"] == "assistant" for m in out):
        problems.append(Problem(line, f'"{key}" has no assistant message: nothing to learn', ERROR))
        return None
    return tuple(out)


def _parse_sharegpt(value: Any, problems: list[Problem], line: int) -> tuple[dict, ...] | None:
    """ShareGPT turns ({"from": "human"|"gpt"|"system", "value": ...}) as role/content messages."""
    if not isinstance(value, list):
        problems.append(
            Problem(line, f'"conversations" must be a list of turns, got {_json_type(value)}', ERROR)
        )
        return None
    converted: list[Any] = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            problems.append(
                Problem(line, f'conversations[{i}] must be an object with "from" and "value"', ERROR)
            )
            return None
        role = _SHAREGPT_ROLES.get(turn["from"]) if isinstance(turn["from"], str) else None
        if role is None:
            accepted = ", ".join(sorted(_SHAREGPT_ROLES))
            problems.append(
                Problem(
                    line,
                    f'conversations[{i}] has unknown "from" {_short(turn["from"])}; accepted: {accepted}',
                    ERROR,
                )
            )
            return None
        converted.append({"role": role, "content": turn["value"]})
    return _parse_messages(converted, "conversations", problems, line)


def _parse_alpaca(obj: Mapping[str, Any], problems: list[Problem], line: int) -> tuple[dict, ...] | None:
    """Alpaca's instruction (+ input) and output as a user and an assistant message."""
    fields = {k: obj.get(k) for k in ("instruction", "input", "output", "system")}
    for k, v in fields.items():
        if not isinstance(v, str) and (v is not None or k in ("instruction", "output")):
            problems.append(Problem(line, f'"{k}" must be a string, got {_json_type(v)}', ERROR))
            return None
    user = fields["instruction"] or ""
    if fields["input"]:
        user = f"{user}\n\n{fields['input']}" if user else fields["input"]
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": fields["output"] or ""}]
    if fields["system"]:
        messages.insert(0, {"role": "system", "content": fields["system"]})
    return _parse_messages(messages, "messages", problems, line)


def _parse_reward(obj: Mapping[str, Any], problems: list[Problem], line: int) -> tuple[bool, float | None]:
    """(ok, reward) from "reward", else "score"; null counts as no reward."""
    key = "reward" if "reward" in obj else "score" if "score" in obj else None
    if key is None or obj[key] is None:
        return True, None
    value = obj[key]
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except OverflowError:  # an integer too large for a float
        number = None
    if number is None or not math.isfinite(number):
        problems.append(Problem(line, f'"{key}" must be a finite number, got {_short(value)}', ERROR))
        return False, None
    return True, number


def parse_sample(obj: Any, line: int = 0) -> tuple[Sample | None, list[Problem]]:
    """A `Sample` from one decoded JSON value, or None and the reasons (error problems) why not.

    Warnings (an empty reply, ...) come back with a sample. `line` is recorded in the sample and
    the problems (0 for a sample made in memory).
    """
    sample, problems = _parse_sample(obj, line)
    return sample, _condensed(problems, line)


class _Decoder:
    """JSON decoding that notes what could make a value one `_value_problem` refuses, so that only
    such lines are walked: NaN and infinities (as literals, or numbers too large for a float), an
    escaped surrogate, or MAX_NESTING brackets (the line's count bounds the value's nesting)."""

    _SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

    def __init__(self) -> None:
        self.suspect = False
        self._decoder = json.JSONDecoder(parse_constant=self._constant, parse_float=self._float)

    def _constant(self, name: str) -> float:
        self.suspect = True
        return float(name)  # what json.loads makes of NaN, Infinity and -Infinity

    def _float(self, text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            self.suspect = True
        return value

    def decode(self, raw: str) -> tuple[Any, bool]:
        """(the value, whether it must be checked with `_value_problem`)."""
        self.suspect = raw.count("[") + raw.count("{") >= MAX_NESTING or (
            "\\u" in raw and self._SURROGATE_ESCAPE.search(raw) is not None
        )
        return self._decoder.decode(raw), self.suspect


def _condensed(problems: list[Problem], line: int) -> list[Problem]:
    """At most one error and one warning per line: the first, saying how many more there were."""
    out = []
    for severity in (ERROR, WARNING):
        found = [p for p in problems if p.severity == severity]
        if len(found) == 1:
            out.append(found[0])
        elif found:
            more = f" (and {len(found) - 1} more {severity}s on this line)"
            out.append(Problem(line, found[0].message + more, severity))
    return out if len(out) < len(problems) else problems


def _value_problem(obj: Any) -> str | None:
    """What makes a decoded JSON value unusable whatever its shape: nesting deeper than
    `MAX_NESTING` (the template and JSON writer recurse), a string holding an unpaired
    surrogate (a "\\ud800" escape: not Unicode text, it cannot be tokenized or saved), or a
    number that is NaN or infinite (1e999: not JSON, it could not be saved again).

    Walks the value with one iterator per level, so a line of a million numbers costs no more
    memory than the line itself."""
    stack: list[Iterator[Any]] = [iter((obj,))]
    while stack:
        value = next(stack[-1], _END)
        if value is _END:
            stack.pop()
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                return f"a number is {value} (NaN and infinities are not JSON numbers)"
        elif isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    return (
                        f"a string holds the unpaired surrogate \\u{ord(value[exc.start]):04x}, which is not "
                        "Unicode text (a surrogate escape must be one of a high/low pair)"
                    )
        elif isinstance(value, (dict, list)):
            if len(stack) >= MAX_NESTING:
                return f"nested more than {MAX_NESTING} levels deep (objects and arrays inside each other)"
            stack.append(
                itertools.chain.from_iterable(value.items()) if isinstance(value, dict) else iter(value)
            )
    return None


def _parse_sample(obj: Any, line: int, *, checked: bool = False) -> tuple[Sample | None, list[Problem]]:
    """`parse_sample` before condensing; `checked`: the value is known to pass `_value_problem`."""
    problems: list[Problem] = []
    if not isinstance(obj, dict):
        problems.append(Problem(line, f"expected a JSON object, got {_json_type(obj)}", ERROR))
        return None, problems
    trouble = (
        None if checked else _value_problem({k: v for k, v in obj.items() if k not in ("reward", "score")})
    )
    if trouble is not None:
        problems.append(Problem(line, trouble, ERROR))
        return None, problems
    ok, reward = _parse_reward(obj, problems, line)
    if "chosen" in obj or "rejected" in obj:  # a preference pair (DPO, ORPO: engine.train.pref_data)
        return parse_preference(obj, line, reward if ok else None, problems, ok)

    kind = "messages"
    prompt = response = text = None
    messages: tuple[dict, ...] | None = ()
    if "messages" in obj:
        messages = _parse_messages(obj["messages"], "messages", problems, line)
    elif "conversations" in obj:
        messages = _parse_sharegpt(obj["conversations"], problems, line)
    elif "prompt" in obj and "response" in obj:
        kind, prompt, response = "prompt", obj["prompt"], obj["response"]
        for key, value in (("prompt", prompt), ("response", response)):
            if not isinstance(value, str):
                problems.append(Problem(line, f'"{key}" must be a string, got {_json_type(value)}', ERROR))
                messages = None
        if messages is not None:
            assert isinstance(prompt, str) and isinstance(response, str)
            if not response.strip():
                problems.append(Problem(line, "the response is empty", WARNING))
            messages = ({"role": "user", "content": prompt}, {"role": "assistant", "content": response})
    elif "instruction" in obj and "output" in obj:
        messages = _parse_alpaca(obj, problems, line)
    elif "text" in obj:
        kind, text = "text", obj["text"]
        if not isinstance(text, str):
            problems.append(Problem(line, f'"text" must be a string, got {_json_type(text)}', ERROR))
            messages = None
        elif not text.strip():
            problems.append(Problem(line, '"text" is empty: nothing to learn', ERROR))
            messages = None
    else:
        keys = ", ".join(_short(k, quote=True) for k in list(obj)[:8]) or "none"
        if len(obj) > 8:
            keys += f" and {len(obj) - 8} more"
        hint = ""
        for have, need in (("prompt", "response"), ("response", "prompt"), ("instruction", "output")):
            if have in obj and need not in obj:
                hint = f' ("{have}" needs "{need}")'
                break
        problems.append(
            Problem(line, f"no recognised sample shape{hint}: keys found: {keys}; {_SHAPES}", ERROR)
        )
        return None, problems

    if messages is None or not ok:
        return None, problems
    if kind == "prompt":
        group = prompt
    elif kind == "text":
        group = ""
    else:
        group = _group_key(messages)
    assert group is not None
    return Sample(line, kind, messages, prompt, response, text, reward, group), problems


def sample_to_json(sample: Sample) -> dict[str, Any]:
    """The JSON object that `parse_sample` reads back as `sample` (line aside)."""
    if sample.kind == "text":
        obj: dict[str, Any] = {"text": sample.text}
    elif sample.kind == "prompt":
        obj = {"prompt": sample.prompt, "response": sample.response}
    elif sample.kind == "messages":
        obj = {"messages": [dict(m) for m in sample.messages]}
    elif sample.kind == PREFERENCE:
        obj = preference_to_json(sample)
    else:
        raise ValueError(f"sample kind {sample.kind!r} is not one of messages, prompt, text, preference")
    if sample.reward is not None:
        obj["reward"] = sample.reward
    return obj


# -- preference pairs ---------------------------------------------------------------------------
#
# A preference line has a prompt and two answers, "chosen" (better) and "rejected" (worse): {"prompt",
# "chosen", "rejected"} or {"messages", "chosen", "rejected"}; as other tools write them the prompt may
# also be a list of messages (TRL's conversational form), ShareGPT "conversations" or Alpaca
# "instruction"/"input"; an answer may be a string, an assistant message, a ShareGPT turn or a list of
# one of those; and with no prompt, "chosen" and "rejected" may be two whole conversations that differ
# only in their last assistant turn (TRL's implicit prompt). It becomes a "preference" Sample: its
# messages are the prompt and the chosen answer, `rejected` the other answer (engine.train.pref_data
# encodes pairs for training).

PREFERENCE = "preference"
_PLACEHOLDER = "x"  # an assistant turn appended so that a prompt can be validated as a conversation


def _answer(value: Any, key: str, problems: list[Problem], line: int) -> str | None:
    """The text of one answer: a string, an assistant message, a ShareGPT turn, or a list of one."""
    if isinstance(value, list):
        if len(value) != 1:
            problems.append(
                Problem(
                    line,
                    f'"{key}" must be one answer (a string or one assistant message), '
                    f"got a list of {len(value)}",
                    ERROR,
                )
            )
            return None
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and ("content" in value or "value" in value):
        role = value.get("role", value.get("from", "assistant"))
        text = value.get("content", value.get("value"))
        if role not in ("assistant", "gpt"):
            problems.append(Problem(line, f'"{key}" must be an assistant answer, got role {role!r}', ERROR))
            return None
        if not isinstance(text, str):
            problems.append(
                Problem(line, f'"{key}": the answer must be a string, got {_json_type(text)}', ERROR)
            )
            return None
        return text
    problems.append(
        Problem(line, f'"{key}" must be a string or an assistant message, got {_json_type(value)}', ERROR)
    )
    return None


def _prompt_messages(obj: Mapping[str, Any], problems: list[Problem], line: int) -> tuple | None:
    """The conversation before the answers, validated; None (with problems) when unusable."""
    end = {"role": "assistant", "content": _PLACEHOLDER}
    if "prompt" in obj and isinstance(obj["prompt"], str):
        messages: tuple | None = ({"role": "user", "content": obj["prompt"]}, end)
        if not obj["prompt"].strip():
            problems.append(Problem(line, "the prompt is empty", WARNING))
    elif "prompt" in obj or "messages" in obj:
        key = "prompt" if "prompt" in obj else "messages"
        value = obj[key]
        if not isinstance(value, list):
            problems.append(
                Problem(
                    line, f'"{key}" must be a string or a list of messages, got {_json_type(value)}', ERROR
                )
            )
            return None
        messages = _parse_messages([*value, end], key, problems, line)
    elif "conversations" in obj:
        value = obj["conversations"]
        turns = [*value, {"from": "gpt", "value": _PLACEHOLDER}] if isinstance(value, list) else value
        messages = _parse_sharegpt(turns, problems, line)
    elif "instruction" in obj:
        messages = _parse_alpaca({**obj, "output": _PLACEHOLDER}, problems, line)
    else:
        return None
    if messages is None:
        return None
    prompt = messages[:-1]
    if not prompt:
        problems.append(Problem(line, "the prompt is empty: no conversation comes before the answers", ERROR))
        return None
    if prompt[-1]["role"] == "assistant":
        problems.append(
            Problem(
                line,
                'the prompt ends with an assistant turn; "chosen" and "rejected" are '
                "the next assistant answer, after a user turn",
                ERROR,
            )
        )
        return None
    return prompt


def _implicit(obj: Mapping[str, Any], problems: list[Problem], line: int) -> tuple | None:
    """Two whole conversations sharing all but their last (assistant) turn: (prompt, chosen, rejected)."""
    chosen, rejected = obj["chosen"], obj["rejected"]
    if not (
        isinstance(chosen, list) and isinstance(rejected, list) and len(chosen) >= 2 and len(rejected) >= 2
    ):
        problems.append(
            Problem(
                line,
                'a preference needs a prompt: "prompt" (or "messages") with "chosen" and '
                '"rejected" answers, or "chosen" and "rejected" as two whole '
                "conversations that differ only in their last turn",
                ERROR,
            )
        )
        return None
    a = _parse_messages(chosen, "chosen", problems, line)
    b = _parse_messages(rejected, "rejected", problems, line)
    if a is None or b is None:
        return None
    if a[:-1] != b[:-1] or a[-1]["role"] != "assistant" or b[-1]["role"] != "assistant":
        problems.append(
            Problem(
                line,
                '"chosen" and "rejected" must be the same conversation up to their last '
                "turn, an assistant answer",
                ERROR,
            )
        )
        return None
    return a[:-1], a[-1]["content"], b[-1]["content"]


def parse_preference(
    obj: Mapping[str, Any], line: int, reward: float | None, problems: list[Problem], reward_ok: bool = True
) -> tuple[Sample | None, list[Problem]]:
    """A "preference" `Sample` from a decoded line with "chosen"/"rejected" (see the module docstring),
    or None and the reasons; `problems` holds what was found before (it is extended and returned)."""
    for key in ("chosen", "rejected"):
        if key not in obj:
            other = "rejected" if key == "chosen" else "chosen"
            problems.append(Problem(line, f'a preference pair needs "{key}" as well as "{other}"', ERROR))
            return None, problems
    has_prompt = any(k in obj for k in ("prompt", "messages", "conversations", "instruction"))
    if has_prompt:
        prompt = _prompt_messages(obj, problems, line)
        chosen = _answer(obj["chosen"], "chosen", problems, line)
        rejected = _answer(obj["rejected"], "rejected", problems, line)
        if prompt is None or chosen is None or rejected is None:
            return None, problems
    else:
        found = _implicit(obj, problems, line)
        if found is None:
            return None, problems
        prompt, chosen, rejected = found
    if not reward_ok:
        return None, problems
    for key, text in (("chosen", chosen), ("rejected", rejected)):
        if not text.strip():
            problems.append(Problem(line, f'the "{key}" answer is empty', WARNING))
    if chosen == rejected:
        problems.append(
            Problem(line, '"chosen" and "rejected" are the same answer: the pair teaches nothing', WARNING)
        )
    messages = (*prompt, {"role": "assistant", "content": chosen})
    text_prompt = obj["prompt"] if isinstance(obj.get("prompt"), str) else None
    group = _group_key(messages)
    return Sample(line, PREFERENCE, messages, text_prompt, None, None, reward, group, rejected), problems


def preference_to_json(sample: Sample) -> dict[str, Any]:
    """The JSON object of a "preference" sample ({"prompt" or "messages", "chosen", "rejected"})."""
    prompt = sample.messages[:-1]
    simple = sample.prompt is not None and len(prompt) == 1 and prompt[0].get("content") == sample.prompt
    obj: dict[str, Any] = {"prompt": sample.prompt} if simple else {"messages": [dict(m) for m in prompt]}
    obj["chosen"] = sample.messages[-1].get("content") if sample.messages else ""
    obj["rejected"] = sample.rejected if sample.rejected is not None else ""
    return obj


# -- files --------------------------------------------------------------------------------------


def _open_dataset(path: Path) -> BinaryIO:
    """The file opened for reading, after checking that it is a regular file of a sane size.

    Opened without blocking and checked with fstat, so a FIFO is refused rather than waited on
    and a device (/dev/zero) is refused rather than read forever.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DatasetError(f"{path} is a folder; expected a JSON Lines file (.jsonl)") from None
    except OSError as exc:
        raise DatasetError(f"{path} cannot be read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise DatasetError(f"{path} is a folder; expected a JSON Lines file (.jsonl)")
        if not stat.S_ISREG(st.st_mode):
            raise DatasetError(f"{path} is {file_kind(st.st_mode)}, not a file; expected a JSON Lines file")
        if st.st_size > MAX_FILE_BYTES:
            raise DatasetError(
                f"{path} is {st.st_size / 2**30:.1f} GiB ({st.st_size} bytes); dataset files up to "
                f"{MAX_FILE_BYTES / 2**30:g} GiB are read: split it into smaller files"
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _lines(path: Path, problems: list[Problem], read: list[int] | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a dataset file, read one line at a time; `read[0]`,
    when given, follows the bytes read so far.

    A line that is not UTF-8, or longer than MAX_LINE_BYTES (skipped without being kept in
    memory), becomes an error problem and is not yielded. `DatasetError` when the file cannot
    be read at all: missing, a folder, not a regular file, too large, UTF-16 or binary.
    """
    with _open_dataset(path) as f:
        try:
            head = f.read(_BINARY_SNIFF)
            f.seek(0)
        except OSError as exc:
            raise DatasetError(f"{path} cannot be read: {exc.strerror or exc}") from exc
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            raise DatasetError(f"{path} is UTF-16 text; save it as UTF-8 (JSON Lines files are UTF-8)")
        if b"\0" in head:
            raise DatasetError(
                f"{path} is not JSON Lines text: byte {head.index(0)} is a NUL byte (is it a binary file, "
                "or UTF-16 text without a byte order mark?); JSON Lines files are UTF-8 text"
            )
        total = 0
        number = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
                length = len(raw)
                if length > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raw = b""
                    while True:  # the rest of the long line, a block at a time
                        block = f.readline(1 << 20)
                        length += len(block)
                        if not block or block.endswith(b"\n"):
                            break
            except OSError as exc:
                raise DatasetError(f"{path} cannot be read: {exc.strerror or exc}") from exc
            if not length:
                return
            number += 1
            total += length
            if read is not None:
                read[0] = total
            if total > MAX_FILE_BYTES:
                raise DatasetError(f"{path} grew beyond {MAX_FILE_BYTES / 2**30:g} GiB while it was read")
            if not raw:
                limit = MAX_LINE_BYTES / 2**20
                message = f"the line is {length:,} bytes long; lines up to {limit:g} MiB are read"
                problems.append(Problem(number, message, ERROR))
                continue
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                message = (
                    f"{_NOT_UTF8}byte 0x{raw[exc.start]:02x} (byte {exc.start + 1} of the line) is "
                    "invalid (JSON Lines files are UTF-8; was the file saved in another encoding?)"
                )
                problems.append(Problem(number, message, ERROR))
                continue
            yield number, text


_CANONICAL = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _canonical(obj: Any) -> str:
    return _CANONICAL.encode(obj)


def digest(text: str) -> bytes:
    """A 128-bit fingerprint of a string: what samples are compared by (duplicates, groups) without
    keeping their text."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def load_jsonl(path: str | os.PathLike[str]) -> tuple[list[Sample], list[Problem]]:
    """The samples of a JSON Lines file and the problems found, in line order.

    Blank lines are skipped, a UTF-8 byte order mark is accepted, and a line repeating an
    earlier sample exactly is kept with a warning. A line that is not UTF-8 is a problem, but
    a file none of whose lines is UTF-8 is in another encoding. `DatasetError` only when the
    file cannot be read at all (missing, a folder, not a file, too large, binary, not UTF-8).
    """
    problems: list[Problem] = []
    samples = list(iter_jsonl(path, problems))
    return samples, problems


def iter_jsonl(
    path: str | os.PathLike[str], problems: list[Problem], read: list[int] | None = None
) -> Iterator[Sample]:
    """`load_jsonl` one sample at a time: yields the samples in line order and appends the problems
    to `problems` as they are found (those of a line before its sample); `read[0]`, when given,
    follows the bytes read. Keeps a 16-byte fingerprint per distinct sample (for the duplicate
    warning), never the samples."""
    path = Path(path)
    seen: dict[bytes, int] = {}
    decoder = _Decoder()
    text_lines = 0
    unreadable: list[Problem] = []  # what _lines finds, moved to `problems` line by line
    first_not_utf8: Problem | None = None
    # lines end at "\n" only: str.splitlines would also split at U+2028 and others, which JSON
    # allows unescaped inside strings
    for number, raw in _lines(path, unreadable, read):
        if unreadable:
            if first_not_utf8 is None:
                first_not_utf8 = next((p for p in unreadable if p.message.startswith(_NOT_UTF8)), None)
            problems.extend(unreadable)
            unreadable.clear()
        if not raw.strip():
            continue
        text_lines += 1
        try:
            obj, suspect = decoder.decode(raw)
        except json.JSONDecodeError as exc:
            problems.append(Problem(number, f"invalid JSON at column {exc.colno}: {exc.msg}", ERROR))
            continue
        except RecursionError:
            problems.append(
                Problem(number, f"invalid JSON: nested too deeply (at most {MAX_NESTING} levels)", ERROR)
            )
            continue
        except ValueError as exc:  # a number of more than 4300 digits (sys.get_int_max_str_digits)
            why = "a number has too many digits" if "digits" in str(exc) else str(exc).split(";")[0]
            problems.append(Problem(number, f"invalid JSON: {why}", ERROR))
            continue
        sample, found = _parse_sample(obj, number, checked=not suspect)
        problems.extend(_condensed(found, number))
        if sample is None:
            continue
        key = digest(_canonical(obj))
        if key in seen:
            problems.append(
                Problem(number, f"duplicate of line {seen[key]} (the same sample twice)", WARNING)
            )
        else:
            seen[key] = number
        yield sample
    if unreadable:  # on the lines after the last one read
        if first_not_utf8 is None:
            first_not_utf8 = next((p for p in unreadable if p.message.startswith(_NOT_UTF8)), None)
        problems.extend(unreadable)
    if not text_lines:
        first = first_not_utf8
        if first is not None:
            raise DatasetError(
                f"{path} is not UTF-8 text: on line {first.line}, {first.message[len(_NOT_UTF8) :]}"
            )


def _json_lines(samples: Sequence[Sample]) -> str:
    lines = []
    for i, s in enumerate(samples):
        try:
            line = json.dumps(sample_to_json(s), ensure_ascii=False, allow_nan=False)
            line.encode("utf-8")  # an unpaired surrogate cannot be written as UTF-8
        except (TypeError, ValueError, RecursionError) as exc:
            raise DatasetError(f"sample {i} (line {s.line}) cannot be written as JSON: {exc}") from exc
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def _writable_target(path: Path, what: str) -> Path:
    """The file to write for `path`: itself, or the file a symbolic link names (the link stays);
    DatasetError when it exists and is not a regular file (a folder, a FIFO, a device)."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise DatasetError(f"{path} cannot be {what}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(mode):
        raise DatasetError(f"{path} is a folder; expected a JSON Lines file (.jsonl)")
    if not stat.S_ISREG(mode):
        raise DatasetError(f"{path} is {file_kind(mode)}, not a file; it cannot be {what}")
    return target


def save_jsonl(path: str | os.PathLike[str], samples: Sequence[Sample]) -> None:
    """Write `samples` as JSON Lines, replacing `path` atomically.

    The lines go to a temporary file in the same folder, which then replaces `path`
    (engine.io.files.atomic_write), so a failure at any point leaves the previous file as it
    was. The file keeps its permissions. `load_jsonl` reads the samples back equal (line numbers aside);
    ShareGPT and Alpaca samples are written as "messages".
    """
    path = Path(path)
    content = _json_lines(samples)  # before touching the disk: an unserialisable sample changes nothing
    path = _writable_target(path, "written")
    try:
        with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(content)
    except OSError as exc:
        raise DatasetError(f"{path} cannot be written: {exc.strerror or exc}") from exc


def append_jsonl(path: str | os.PathLike[str], samples: Sequence[Sample]) -> None:
    """Append `samples` to a JSON Lines file (created if missing), flushed to disk before returning.

    For records that must not be lost (rated answers): earlier lines are never rewritten.
    """
    path = Path(path)
    content = _json_lines(samples)
    path = _writable_target(path, "appended to")
    try:
        durable_append(path, content.encode("utf-8"))
    except OSError as exc:
        raise DatasetError(f"{path} cannot be appended to: {exc.strerror or exc}") from exc
