"""`tune-engine`: the headless command line, a thin layer over the engine's API.

Each subcommand parses its arguments, calls the engine, and prints. Errors the
engine reports (`EngineError`) and unreadable inputs become one line on stderr
and exit code 2, never a traceback. `train` lives in `engine.cli.train`, `norms`
and `export` in `engine.cli.tools`, `reward` in `engine.cli.reward`; the options and
the session every command that computes shares are in `engine.cli.common`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import EngineError
from ..export.modelfile import modelfile_path
from ..export.verify import failed_name
from ..io.files import atomic_write, check_outputs
from ..model.generate import GREEDY, SamplingConfig
from ..model.summary import human_bytes, human_count, summarize
from ..ranges import check_number
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from ..train.checkpoint import PREFIX as CHECKPOINT_PREFIX
from ..train.config import RESUMED, RUN_FOLDERS, resolve_checkpoint, run_kinds, run_outputs
from .common import CliError, add_runtime_options, open_session, read_text
from .train import add_command as add_train_command
from .train import train_config

EXIT_USAGE = 2


# --- the one rule for every command's values and paths ----------------------------------------------

# Numeric options (argparse dest) and their entry in engine.ranges, the table the app shares.
OPTION_RANGES = {
    "lora_scale": "adapter_scale", "scale": "adapter_scale", "temp": "temperature", "top_k": "top_k",
    "top_p": "top_p", "min_p": "min_p", "seed": "seed", "samples": "n_samples", "n": "max_new_tokens",
    "rank": "rank", "alpha": "alpha", "lr": "lr", "warmup": "warmup_steps", "weight_decay": "weight_decay",
    "gclip": "gclip", "max_grad_norm": "max_grad_norm", "epochs": "epochs", "steps": "steps",
    "ctx": "n_ctx", "batch": "batch_size", "grad_accum": "grad_accum", "val_split": "val_split",
    "eval_every": "eval_every", "kl": "kl_coef", "checkpoint_every": "checkpoint_every",
    "rank_timeout": "rank_timeout_s", "sample_every": "sample_every",
    "sample_from_validation": "sample_from_validation", "router_aux_coef": "router_aux_coef",
}  # fmt: skip
COMMAND_RANGES = {("generate", "seed"): "sampling_seed"}  # where a command's option means another thing


def check_options(args: argparse.Namespace) -> None:
    """ConfigError naming the option (--lr, -n) when a numeric option is NaN, infinite or out of range."""
    for dest, value in vars(args).items():
        name = COMMAND_RANGES.get((args.command, dest), OPTION_RANGES.get(dest))
        if name is None or value is None:
            continue
        label = ("-" if len(dest) == 1 else "--") + dest.replace("_", "-")
        check_number(name, value, label=label)


class CommandPaths(NamedTuple):
    """Every file a command reads and every path it writes, by what they are (for people)."""

    inputs: dict[str, str | None]
    outputs: dict[str, str | None]
    folders: dict[str, str] | None = None  # outputs that are folders -> prefix of the entries they replace
    continues: str | None = None  # the input a folder output may hold (a resumed checkpoint)
    kinds: dict[str, str] | None = None  # outputs -> what they write (engine.io.files.KINDS)


def command_paths(args: argparse.Namespace) -> CommandPaths:
    """The inputs and outputs of the command `args` runs (see engine.io.files.check_outputs)."""
    a = vars(args)
    cmd = args.command
    if cmd == "logits":
        return CommandPaths({"model": a["model"], "adapter": a["lora"]}, {"logits file": a["out"]},
                            kinds={"logits file": "npy"})  # fmt: skip
    if cmd == "export":
        kind = "model" if a["merge"] else "adapter"
        verified = a["verify"] if a["verify"] is not None else a["merge"]
        failed = failed_name(a["out"]) if verified and not a["check"] else None  # where a failed file goes
        modelfile = modelfile_path(a["out"]) if a["modelfile"] and a["out"] else None  # for Ollama
        return CommandPaths(
            {"adapter": a["adapter"], "base model": a["model"], "verification prompts": a["prompts"]},
            {"output": a["out"], "failed output": failed, "Modelfile": modelfile},
            kinds={"output": kind, "failed output": kind},
        )  # fmt: skip
    if cmd == "reward":
        return CommandPaths(
            {"model": a["model"], "adapter to continue": a["adapter"], "prompts file": a["prompts"]},
            {"adapter": a["out"], "ratings file": a["ratings"], "checkpoint folder": a["checkpoint_dir"]},
            {"checkpoint folder": CHECKPOINT_PREFIX},
            "adapter to continue",
            {"adapter": "adapter", "ratings file": "jsonl"},
        )
    if cmd == "train":
        resume = a["resume"]
        if resume:
            with contextlib.suppress(EngineError):  # the run names a checkpoint that cannot be used
                resume = resolve_checkpoint(resume)
        config, _ = train_config(args)
        return CommandPaths(
            {"model": a["model"], "dataset": a["data"], "adapter to continue": a["init_adapter"],
             RESUMED: resume, "chat template": a["template_file"], "settings file": a["settings"]},
            {**run_outputs(config), "events file": a["events"]},
            RUN_FOLDERS, RESUMED, {**run_kinds(config), "events file": "events"},
        )  # fmt: skip
    return CommandPaths({}, {})  # inspect, tokenize, chat-template, generate, norms: nothing is written


def check_paths(args: argparse.Namespace) -> None:
    """ConfigError, before any work, when an output of the command is one of its inputs (symbolic
    links followed, hard links caught), lies inside one, is another of its outputs, or is a file
    of another kind than it writes (a dataset where logits go)."""
    p = command_paths(args)
    check_outputs(p.outputs, p.inputs, folders=p.folders, continues=p.continues, kinds=p.kinds)


# --- inspect -------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    s = summarize(args.model)
    if args.json:
        print(json.dumps(s.to_dict(), indent=2))
        return 0
    c = s.config
    print(f"file          {s.path} ({human_bytes(s.file_bytes)})")
    print(f"architecture  {c.arch}" + (f" ({c.name})" if c.name else ""))
    print(
        f"parameters    {human_count(s.n_params)} ({s.n_params}) in {s.n_tensors} tensors, "
        f"mostly {s.file_type}"
    )
    print(f"layers        {c.L}")
    print(f"embedding     {c.C}")
    print(f"attention     {s.attention_text}")
    print(f"feed-forward  {s.ffn_text}")
    for line in s.features:
        print(f"              {line}")
    print(f"context       {c.n_ctx_train} (RoPE {c.rope}, base {c.rope_base:g})")
    pre = f", pre-tokenizer {s.tokenizer_pre}" if s.tokenizer_pre else ""
    print(f"tokenizer     {s.tokenizer_model}{pre}, {s.vocab_size} tokens")
    print(f"chat template {'yes' if s.has_chat_template else 'no (a default is used)'}")
    print("tensor kinds:")
    width = max(len(k.kind) for k in s.kinds)
    for k in sorted(s.kinds, key=lambda k: k.kind):
        types = ", ".join(f"{t}" + (f" x{n}" if n > 1 else "") for t, n in sorted(k.types.items()))
        shape = "x".join(str(d) for d in k.shape)
        note = "  (llama.cpp: no LoRA)" if k.ignored_by_llamacpp else ""
        print(
            f"  {k.kind:<{width}}  {k.count:3d} x ({shape:>14})  {types:<14} {human_bytes(k.n_bytes):>10}"
            f"  {k.role}{note}"
        )
    return 0


# --- tokenize ------------------------------------------------------------------------------------


def cmd_tokenize(args: argparse.Namespace) -> int:
    text = args.text if args.text is not None else read_text(args.file)
    tok = Tokenizer.from_gguf(args.model)
    ids = tok.encode(text, add_special=not args.no_bos, parse_special=not args.no_parse_special)
    print(" ".join(str(i) for i in ids))
    return 0


# --- logits --------------------------------------------------------------------------------------


def _parse_tokens(text: str) -> np.ndarray:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError as exc:
        raise CliError(f"--tokens must be integers separated by spaces: {exc}") from exc
    if not ids:
        raise CliError("--tokens is empty")
    return np.asarray(ids, dtype=np.int64)


def cmd_logits(args: argparse.Namespace) -> int:
    tokens = _parse_tokens(args.tokens)
    session = open_session(args)
    logits = session.logits(tokens, adapter=args.lora, scale=args.lora_scale)  # (T, V) float32
    out = args.out
    try:
        with atomic_write(out, "wb") as f:
            np.save(f, logits)
    except OSError as exc:
        hint = "; free some disk space" if exc.errno == errno.ENOSPC else ""
        raise CliError(f"{out}: cannot be written ({exc.strerror or exc}){hint}") from exc
    print(f"wrote {out}: float32 {logits.shape[0]} x {logits.shape[1]}")
    return 0


# --- chat-template -------------------------------------------------------------------------------


def _template(model_metadata: dict, template_file: str | None) -> ChatTemplate:
    base = ChatTemplate.from_metadata(model_metadata)
    if not template_file:
        return base
    return ChatTemplate(
        read_text(template_file), bos_token=base.bos_token, eos_token=base.eos_token, name=template_file
    )


def _load_messages(path: str) -> list[dict]:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if not isinstance(data, list) or not all(isinstance(m, dict) and "role" in m for m in data):
        raise CliError(f'{path}: expected a list of {{"role", "content"}} objects (or {{"messages": [...]}})')
    return data


def cmd_chat_template(args: argparse.Namespace) -> int:
    from ..io.gguf_file import GGUFFile

    tpl = _template(GGUFFile(args.model).metadata, args.template_file)
    text = tpl.render(_load_messages(args.messages), add_generation_prompt=args.add_generation_prompt)
    sys.stdout.write(text)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    return 0


# --- generate ------------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    session = open_session(args)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
    else:
        messages = [{"role": "user", "content": args.prompt}]
    if args.temp <= 0:
        sampling = SamplingConfig(**{**GREEDY.__dict__, "max_new_tokens": args.n})
    else:
        sampling = SamplingConfig(args.temp, args.top_k, args.top_p, args.min_p, args.seed, args.n)
    stream = args.samples == 1 and sys.stdout.isatty()

    def on_token(sample: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    replies = session.generate(
        messages,
        sampling,
        adapter=args.lora,
        adapter_scale=args.lora_scale,
        n=args.samples,
        chat=args.chat,
        on_token=on_token if stream else None,
    )
    for i, reply in enumerate(replies):
        if stream:
            sys.stdout.write("\n")
        else:
            if args.samples > 1:
                print(f"--- sample {i + 1} ({len(reply.tokens)} tokens, stop: {reply.stop_reason}) ---")
            print(session.tokenizer.decode(list(reply.tokens), skip_special=False))
    return 0


# --- main ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tune-engine", description="Tune Studio's engine: GGUF models on the command line."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log engine warnings and progress to stderr")
    p.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error (for bug reports)"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("inspect", help="architecture, sizes, tensor kinds and tokenizer of a model")
    s.add_argument("model")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("tokenize", help="token ids of a text, space separated (as llama-tokenize --ids)")
    s.add_argument("model")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--file")
    s.add_argument(
        "--no-bos", action="store_true", help="do not add BOS (or EOS) even if the model asks for it"
    )
    s.add_argument(
        "--no-parse-special", action="store_true", help="treat text like <|im_start|> as plain text"
    )
    s.set_defaults(func=cmd_tokenize)

    s = sub.add_parser("logits", help="logits at every position, saved as a float32 (T, n_vocab) .npy")
    s.add_argument("model")
    s.add_argument("--tokens", required=True, help='token ids, e.g. "1 5 7"')
    s.add_argument("--lora", help="LoRA adapter GGUF to apply")
    s.add_argument("--lora-scale", type=float, default=1.0, help="adapter scale (default 1.0)")
    s.add_argument("--out", required=True)
    add_runtime_options(s)
    s.set_defaults(func=cmd_logits)

    s = sub.add_parser("chat-template", help="render a conversation with the model's chat template")
    s.add_argument("model")
    s.add_argument("--messages", required=True, help='JSON file: [{"role": ..., "content": ...}, ...]')
    s.add_argument(
        "--template-file", help="Jinja template overriding the model's (as llama.cpp --chat-template-file)"
    )
    s.add_argument("--add-generation-prompt", action="store_true")
    s.set_defaults(func=cmd_chat_template)

    s = sub.add_parser("generate", help="continue a prompt, or answer it as a chat")
    s.add_argument("model")
    s.add_argument("--prompt", required=True)
    s.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user turn with the chat template"
    )
    s.add_argument("--system", help="system message (with --chat)")
    s.add_argument("--template-file", help="Jinja template overriding the model's")
    s.add_argument("-n", type=int, default=128, help="maximum new tokens (default 128)")
    s.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    s.add_argument("--top-k", type=int, default=40, help="0 = off (default 40)")
    s.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
    s.add_argument("--min-p", type=float, default=0.05, help="0 = off (default 0.05)")
    s.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    s.add_argument("--samples", type=int, default=1, help="answers to generate, as one batch (default 1)")
    s.add_argument("--lora", help="LoRA adapter GGUF to apply")
    s.add_argument("--lora-scale", type=float, default=1.0)
    add_runtime_options(s)
    s.set_defaults(func=cmd_generate)

    add_train_command(sub)

    from .reward import add_command as add_reward_command
    from .tools import add_commands

    add_reward_command(sub)
    add_commands(sub)
    from .convert import add_command as add_convert_command

    add_convert_command(sub)
    from .census import add_command as add_census_command

    add_census_command(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s"
    )
    code = _run(args)
    comm = getattr(args, "comm", None)
    if comm is not None and comm.size > 1 and code != 0 and not getattr(args, "ranks_agree", False):
        comm.abort(code)  # this rank failed alone: end every rank now, none waits for it
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        check_options(args)
        check_paths(args)
        return args.func(args)
    except (EngineError, CliError) as exc:
        comm = getattr(args, "comm", None)
        if comm is None or comm.size == 1:
            print(f"error: {exc}", file=sys.stderr)
        elif comm.is_root or not getattr(args, "ranks_agree", False):  # an agreed failure: said once
            who = "" if getattr(args, "ranks_agree", False) else f"rank {comm.rank} ({comm.host}): "
            print(f"error: {who}{exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        if args.debug:
            raise
        print("error: out of memory: try a smaller --ctx or --batch, --checkpoint-layers, or a lower "
              "--cache-budget", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    except OSError as exc:
        if args.debug:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        hint = "; free some disk space" if exc.errno == errno.ENOSPC else ""
        print(f"error: {exc.strerror or exc}{where}{hint}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if args.debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (this is a bug in Tune Studio; run again with --debug "
              "for the traceback)", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
