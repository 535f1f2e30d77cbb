"""What the tune-engine commands that compute with a model share: their runtime options and the session.

Also the error a command raises for its own inputs (`CliError`) and how it reads a text file. Used
by `engine.cli.main`, `engine.cli.train` and `engine.cli.reward` alike (apart from main, so that no
command module imports another).
"""

from __future__ import annotations

import argparse

from ..session import EngineSession


class CliError(Exception):
    """A problem with the command's own inputs (a file that cannot be read, a bad value)."""


def read_text(path: str) -> str:
    """The text of a file the command reads, or CliError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot be read ({exc})") from exc


def add_runtime_options(s: argparse.ArgumentParser) -> None:
    """--device and --cache-budget, for every command that computes with the model."""
    s.add_argument("--device", default="cpu", help="cpu (default), cuda:N, or auto (a GPU when usable)")
    s.add_argument(
        "--cache-budget",
        default="auto",
        help="dequantized weights kept between uses: auto (what memory is free; default), off, or a "
        "size such as 2G; the weights themselves stay quantized as the file stores them",
    )


def open_session(args: argparse.Namespace) -> EngineSession:
    """The engine session of `args.model` on `args.device`, with the weight cache of
    `args.cache_budget` and the chat template of `args.template_file` when the command has one."""
    return EngineSession(
        args.model,
        device=args.device,
        cache_budget=args.cache_budget,
        template_file=getattr(args, "template_file", None),
    )
