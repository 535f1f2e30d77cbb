"""`tune-engine convert`: CSV, TSV, JSON arrays (Alpaca, ShareGPT, preference pairs) or JSON Lines
into the project's JSON Lines (engine.train.convert), with the problems by line on stderr."""

from __future__ import annotations

import argparse
import sys

from ..train.convert import FORMATS, convert_file, parse_map

_MAX_SHOWN = 20  # problems printed one a line; the rest are counted


def add_command(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "convert",
        help="import CSV/TSV, ShareGPT, Alpaca or preference data as a JSONL dataset",
        description="Convert a dataset into JSON Lines samples. The input is only read; the output "
        "is written by temporary name and renamed, so a failure leaves no half-written file.",
    )
    s.add_argument("input", help="a .csv, .tsv, .json (array) or .jsonl file")
    s.add_argument("--out", required=True, help="the JSON Lines file to write")
    s.add_argument(
        "--map",
        default=None,
        help="which column is which: ROLE=COLUMN,... with roles prompt, response, system, reward, "
        "chosen, rejected, text (default: guessed from the column names)",
    )
    s.add_argument("--format", choices=FORMATS, default=None, help="the input's format (default: guessed)")
    s.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    mapping = parse_map(args.map) if args.map else None
    result = convert_file(args.input, args.out, mapping, args.format)
    for p in result.problems[:_MAX_SHOWN]:
        print(p, file=sys.stderr)
    if len(result.problems) > _MAX_SHOWN:
        print(f"... and {len(result.problems) - _MAX_SHOWN} more problems", file=sys.stderr)
    how = ", ".join(f"{role}={col}" for role, col in result.mapping.items()) or "fields as they are"
    skipped = result.rows - len(result.samples)
    print(
        f"{args.out}: {len(result.samples)} samples from {result.rows} {result.format.upper()} rows "
        f"({how}); {skipped} skipped, {len(result.problems)} problems"
    )
    return 0
