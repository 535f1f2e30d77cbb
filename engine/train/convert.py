"""Import: CSV, TSV, JSON arrays (Alpaca, ShareGPT, preference pairs) and JSON Lines into the
project's JSON Lines samples.

`read_source` reads a file of any of these formats into `Row`s: a line (or a CSV record's first
line, or the line where a JSON array's element begins), a dict of fields, and nothing else. A
`ColumnMap` says which field is the prompt, the response, the system message, the reward, the
chosen and rejected answers of a preference pair, or a whole text; `guess_map` proposes one from
the field names ("question" and "answer", "instruction" and "output", ...). `convert_rows` turns
each row into the JSON object of one sample and checks it with `parse_sample`, so a problem
names its line exactly as `load_jsonl` would; rows that already are samples (a "messages" or
"conversations" object, Alpaca's instruction/output, chosen/rejected) pass through unchanged
unless a mapping renames their fields.

`convert_file` is the whole import: read, convert, and write the samples with `save_jsonl`
(a temporary file in the destination's folder renamed over it, so a failure leaves nothing
half-written). The source is only read: writing onto it (the same path, a link to it, the same
file under another name) is refused before anything is written.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DatasetError
from ..io.files import check_outputs
from .data import (
    ERROR,
    MAX_FILE_BYTES,
    WARNING,
    Problem,
    Sample,
    _open_dataset,
    json_values,
    parse_sample,
    save_jsonl,
)

FORMATS = ("csv", "tsv", "json", "jsonl")
ROLES = ("prompt", "response", "system", "reward", "chosen", "rejected", "text")

# field names guessed for each role, lower case, best first
_GUESSES: dict[str, tuple[str, ...]] = {
    "prompt": ("prompt", "question", "instruction", "input", "query", "user", "q"),
    "response": ("response", "answer", "output", "completion", "assistant", "reply", "a"),
    "system": ("system", "system_prompt", "system prompt"),
    "reward": ("reward", "score", "rating"),
    "chosen": ("chosen",),
    "rejected": ("rejected",),
    "text": ("text", "content", "document"),
}
# shapes the reader of JSON Lines already knows: a row with these keys passes through unmapped
_SAMPLE_KEYS = ("messages", "conversations", "chosen", "rejected", "instruction")


@dataclass(frozen=True)
class Row:
    """One record of a source file: the 1-based line it starts on, and its fields."""

    line: int
    fields: dict[str, Any]


@dataclass(frozen=True)
class ColumnMap:
    """Which source field holds each part of a sample (None: none does)."""

    prompt: str | None = None
    response: str | None = None
    system: str | None = None
    reward: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    text: str | None = None

    def items(self) -> list[tuple[str, str]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name)]

    def is_empty(self) -> bool:
        return not self.items()

    def check(self, columns: Sequence[str] | None = None) -> None:
        """DatasetError when the mapping cannot make samples, or names a column the file lacks."""
        if columns is not None:
            missing = [f"{role}={col}" for role, col in self.items() if col not in columns]
            if missing:
                have = ", ".join(columns) or "none"
                raise DatasetError(f"no column {', '.join(missing)} in the file; its columns: {have}")
        if self.chosen or self.rejected:
            if not (self.chosen and self.rejected):
                raise DatasetError("a preference pair needs both chosen= and rejected= columns")
            if not self.prompt:
                raise DatasetError("a preference pair needs a prompt= column as well")
        elif self.text:
            if self.prompt or self.response:
                raise DatasetError("text= is a whole sample: map it alone, or map prompt= and response=")
        elif self.prompt or self.response:
            if not (self.prompt and self.response):
                raise DatasetError("map both prompt= and response= (or text=, or chosen= and rejected=)")
        elif not self.is_empty():
            raise DatasetError("map prompt= and response= (or text=, or prompt=, chosen= and rejected=)")


def parse_map(text: str) -> ColumnMap:
    """A ColumnMap from "prompt=Question,response=Answer" (roles as in `ROLES`)."""
    values: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        role, sep, column = part.partition("=")
        role = role.strip().lower()
        if not sep or not column.strip():
            raise DatasetError(f"--map entry {part!r} is not ROLE=COLUMN (for example prompt=Question)")
        if role not in ROLES:
            raise DatasetError(f"--map role {role!r} is not one of {', '.join(ROLES)}")
        if role in values:
            raise DatasetError(f"--map names {role} twice")
        values[role] = column.strip()
    return ColumnMap(**values)


def guess_map(columns: Sequence[str]) -> ColumnMap:
    """A mapping guessed from column names (case and surrounding spaces ignored); empty when the
    columns already are a sample shape the JSON Lines reader knows."""
    lower = {c.strip().lower(): c for c in columns}
    if any(k in lower for k in ("messages", "conversations")):
        return ColumnMap()
    found: dict[str, str] = {}
    used: set[str] = set()
    for role in ("chosen", "rejected", "system", "reward", "prompt", "response", "text"):
        for name in _GUESSES[role]:
            if name in lower and lower[name] not in used:
                found[role] = lower[name]
                used.add(lower[name])
                break
    if "chosen" in found and "rejected" in found:
        found.pop("text", None)
        found.pop("response", None)
    else:
        found.pop("chosen", None)
        found.pop("rejected", None)
        if "prompt" in found and "response" in found:
            found.pop("text", None)
        else:
            found.pop("prompt", None)
            found.pop("response", None)
    if "instruction" in lower and "output" in lower and "chosen" not in found:
        return ColumnMap()  # Alpaca: instruction + input + output are read as they are
    return ColumnMap(**found)


# -- reading ------------------------------------------------------------------------------------


def detect_format(path: str | os.PathLike[str], head: str | None = None) -> str:
    """ "csv", "tsv", "json" (an array) or "jsonl", from the name, else from the first characters."""
    suffix = Path(path).suffix.lower()
    by_name = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
    if suffix in by_name:
        return by_name[suffix]
    if head is None:
        head = _read_text(Path(path))[:4096]
    stripped = head.lstrip("\ufeff \t\r\n")
    if stripped.startswith("["):
        return "json"
    if stripped.startswith("{"):
        return "jsonl"
    first = stripped.split("\n", 1)[0]
    return "tsv" if first.count("\t") > first.count(",") else "csv"


def _read_text(path: Path) -> str:
    with _open_dataset(path) as f:  # a regular file of a sane size, or DatasetError
        raw = f.read(MAX_FILE_BYTES + 1)
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DatasetError(f"{path} is UTF-16 text; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DatasetError(
            f"{path} is not UTF-8 text: on line {line}, byte 0x{raw[exc.start]:02x} is invalid "
            "(save it as UTF-8)"
        ) from None


def _table_rows(text: str, delimiter: str, problems: list[Problem]) -> tuple[list[str], list[Row]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    rows: list[Row] = []
    start = 1
    while True:
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problems.append(
                Problem(start, f"unreadable {'TSV' if delimiter == chr(9) else 'CSV'}: {exc}", ERROR)
            )
            break
        line, start = start, reader.line_num + 1
        if not any(cell.strip() for cell in record):
            continue
        if header is None:
            header = [c.strip() for c in record]
            dupes = sorted({c for c in header if header.count(c) > 1})
            if dupes:
                raise DatasetError(f"line {line}: the header names {', '.join(map(repr, dupes))} twice")
            continue
        if len(record) != len(header):
            problems.append(
                Problem(line, f"{len(record)} columns where the header (line 1) has {len(header)}", ERROR)
            )
            continue
        rows.append(Row(line, dict(zip(header, record, strict=True))))
    if header is None:
        raise DatasetError("the file is empty: expected a header line naming the columns")
    return header, rows


def _json_rows(text: str, problems: list[Problem]) -> tuple[list[str], list[Row]]:
    """The elements of a JSON array, each with the line it begins on."""
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text[pos:].startswith("["):
        raise DatasetError("expected a JSON array ([ {...}, {...} ]) or JSON Lines")
    pos += 1
    rows: list[Row] = []
    columns: dict[str, None] = {}
    line, counted = 1, 0

    def line_at(p: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, p)
        counted = p
        return line

    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise DatasetError(f'line {line_at(pos)}: the JSON array is not closed (a missing "]")')
        if text[pos] == "]":
            break
        at = line_at(pos)
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"line {exc.lineno}: invalid JSON at column {exc.colno}: {exc.msg}; nothing was converted"
            ) from None
        if not isinstance(value, dict):
            problems.append(
                Problem(at, f"expected an object in the array, got {type(value).__name__}", ERROR)
            )
            continue
        columns.update(dict.fromkeys(value))
        rows.append(Row(at, value))
    return list(columns), rows


@dataclass
class Source:
    """A source file read into rows: its format, its field names, its rows and reading problems."""

    path: Path
    format: str
    columns: list[str]
    rows: list[Row]
    problems: list[Problem] = field(default_factory=list)


def read_source(path: str | os.PathLike[str], fmt: str | None = None) -> Source:
    """The rows of a CSV, TSV, JSON array or JSON Lines file (DatasetError when unreadable)."""
    path = Path(path)
    text = _read_text(path)
    fmt = fmt or detect_format(path, text[:4096])
    if fmt not in FORMATS:
        raise DatasetError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    problems: list[Problem] = []
    if fmt in ("csv", "tsv"):
        columns, rows = _table_rows(text, "," if fmt == "csv" else "\t", problems)
    elif fmt == "json":
        columns, rows = _json_rows(text, problems)
    else:
        columns, rows = _jsonl_rows(text, problems)
    return Source(path, fmt, columns, rows, problems)


def _jsonl_rows(text: str, problems: list[Problem]) -> tuple[list[str], list[Row]]:
    rows: list[Row] = []
    columns: dict[str, None] = {}
    for number, value in json_values(text.split("\n"), problems):
        if not isinstance(value, dict):
            problems.append(Problem(number, "expected a JSON object", ERROR))
            continue
        columns.update(dict.fromkeys(value))
        rows.append(Row(number, value))
    return list(columns), rows


# -- converting ---------------------------------------------------------------------------------


def _cell(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _reward(value: Any, column: str, line: int, problems: list[Problem]) -> tuple[bool, float | None]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return True, None
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        problems.append(Problem(line, f'reward column "{column}" must be a number, got {value!r}', ERROR))
        return False, None
    return True, number


def row_object(row: Row, mapping: ColumnMap, problems: list[Problem]) -> dict[str, Any] | None:
    """The JSON object of one sample from a row (None, with a problem, when a mapped cell is bad)."""
    if mapping.is_empty():
        return dict(row.fields)
    get = row.fields.get
    ok, reward = (True, None)
    if mapping.reward:
        ok, reward = _reward(get(mapping.reward), mapping.reward, row.line, problems)
    if not ok:
        return None
    obj: dict[str, Any]
    if mapping.text:
        obj = {"text": get(mapping.text)}
    else:
        prompt = get(mapping.prompt)
        if isinstance(prompt, str) and not prompt.strip():
            problems.append(Problem(row.line, f'the prompt ("{mapping.prompt}") is empty', WARNING))
        system = get(mapping.system) if mapping.system else None
        if system and isinstance(system, str) and system.strip():
            obj = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]}
        else:
            obj = {"prompt": prompt}
        if mapping.chosen:
            obj["chosen"] = get(mapping.chosen)
            obj["rejected"] = get(mapping.rejected)
        elif "messages" in obj:
            obj["messages"].append({"role": "assistant", "content": get(mapping.response)})
        else:
            obj["response"] = get(mapping.response)
    if reward is not None:
        obj["reward"] = reward
    return obj


def convert_rows(rows: Iterable[Row], mapping: ColumnMap) -> tuple[list[Sample], list[Problem]]:
    """The samples of the rows under a mapping, and a problem per row that cannot become one."""
    samples: list[Sample] = []
    problems: list[Problem] = []
    for row in rows:
        obj = row_object(row, mapping, problems)
        if obj is None:
            continue
        sample, found = parse_sample(obj, row.line)
        problems.extend(found)
        if sample is not None:
            samples.append(sample)
    return samples, problems


@dataclass(frozen=True)
class Conversion:
    """What an import made: the samples, every problem by line, and how the source was read."""

    samples: list[Sample]
    problems: list[Problem]
    format: str
    columns: list[str]
    mapping: ColumnMap
    rows: int

    @property
    def errors(self) -> int:
        return sum(p.severity == ERROR for p in self.problems)


def convert_source(source: Source, mapping: ColumnMap | None = None) -> Conversion:
    """Convert rows already read (the dialog's preview converts the first few, then all)."""
    if mapping is None:
        mapping = guess_map(source.columns) if source.format in ("csv", "tsv") else ColumnMap()
    if source.format in ("csv", "tsv") and mapping.is_empty():
        raise DatasetError(
            "which columns hold the samples? map them, for example --map prompt=Question,response=Answer "
            f"(columns: {', '.join(source.columns) or 'none'})"
        )
    mapping.check(source.columns if source.format in ("csv", "tsv") else None)
    samples, problems = convert_rows(source.rows, mapping)
    problems = sorted([*source.problems, *problems], key=lambda p: p.line)
    unread = sum(p.severity == ERROR for p in source.problems)  # records refused while reading
    return Conversion(samples, problems, source.format, source.columns, mapping, len(source.rows) + unread)


def convert_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    mapping: ColumnMap | None = None,
    fmt: str | None = None,
) -> Conversion:
    """Import `src` into the JSON Lines file `dst` (written by temporary name, then renamed).

    DatasetError, with nothing written, when `dst` is `src` (the one rule for outputs,
    `engine.io.files.check_outputs`: links resolved, hard links caught) or a file that is not JSON
    Lines, when the source cannot be read, or when no row becomes a sample."""
    src, dst = Path(src), Path(dst)
    try:
        check_outputs({"dataset": dst}, {"file being imported": src}, kinds={"dataset": "jsonl"})
    except ConfigError as exc:
        raise DatasetError(str(exc)) from None
    result = convert_source(read_source(src, fmt), mapping)
    if not result.samples:
        first = next((str(p) for p in result.problems if p.severity == ERROR), "the file has no rows")
        raise DatasetError(f"no sample could be made from {src}; nothing was written ({first})")
    save_jsonl(dst, result.samples)
    return result


def mapping_from_dict(values: Mapping[str, str | None]) -> ColumnMap:
    return ColumnMap(**{k: (v or None) for k, v in values.items() if k in ROLES})
