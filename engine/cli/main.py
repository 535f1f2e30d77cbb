"""`tune-engine`: the headless command line, a thin layer over the engine's API.

Each subcommand parses its arguments, calls the engine, and prints. Errors the
engine reports (`EngineError`) and unreadable inputs become one line on stderr
and exit code 2, never a traceback. `norms` and `export` live in
`engine.cli.tools`, `reward` in `engine.cli.reward`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import EngineError
from ..io.files import AppendLog, atomic_write, check_outputs
from ..model.generate import GREEDY, SamplingConfig
from ..model.summary import human_bytes, human_count, summarize
from ..ranges import check_number
from ..session import EngineSession
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from ..train.checkpoint import PREFIX as CHECKPOINT_PREFIX
from ..train.trainer import RESUMED, RUN_FOLDERS, resolve_checkpoint, run_kinds, run_outputs

EXIT_USAGE = 2


class CliError(Exception):
    """A problem with the command's own inputs (a file that cannot be read, a bad value)."""


def add_runtime_options(s: argparse.ArgumentParser) -> None:
    """--device and --cache-budget, for every command that computes with the model."""
    s.add_argument("--device", default="cpu", help="cpu (default), cuda:N, or auto (a GPU when usable)")
    s.add_argument(
        "--cache-budget",
        default="auto",
        help="dequantized weights kept between uses: auto (what memory is free; default), off, or a "
        "size such as 2G; the weights themselves stay quantized as the file stores them",
    )


# --- the one rule for every command's values and paths ----------------------------------------------

# Numeric options (argparse dest) and their entry in engine.ranges, the table the app shares.
OPTION_RANGES = {
    "lora_scale": "adapter_scale", "scale": "adapter_scale", "temp": "temperature", "top_k": "top_k",
    "top_p": "top_p", "min_p": "min_p", "seed": "seed", "samples": "n_samples", "n": "max_new_tokens",
    "rank": "rank", "alpha": "alpha", "lr": "lr", "warmup": "warmup_steps", "weight_decay": "weight_decay",
    "gclip": "gclip", "max_grad_norm": "max_grad_norm", "epochs": "epochs", "steps": "steps",
    "ctx": "n_ctx", "batch": "batch_size", "grad_accum": "grad_accum", "val_split": "val_split",
    "eval_every": "eval_every", "kl": "kl_coef", "checkpoint_every": "checkpoint_every",
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
        return CommandPaths({"adapter": a["adapter"], "base model": a["model"]}, {"output": a["out"]},
                            kinds={"output": "model" if a["merge"] else "adapter"})  # fmt: skip
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
        config = train_config(args)
        return CommandPaths(
            {"model": a["model"], "dataset": a["data"], "adapter to continue": a["init_adapter"],
             RESUMED: resume, "chat template": a["template_file"]},
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


def open_session(args: argparse.Namespace) -> EngineSession:
    """The engine session of `args.model` on `args.device`, with the weight cache of
    `args.cache_budget` and the chat template of `args.template_file` when the command has one."""
    return EngineSession(
        args.model,
        device=args.device,
        cache_budget=args.cache_budget,
        template_file=getattr(args, "template_file", None),
    )


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot be read ({exc})") from exc


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
    text = args.text if args.text is not None else _read_text(args.file)
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
        _read_text(template_file), bos_token=base.bos_token, eos_token=base.eos_token, name=template_file
    )


def _load_messages(path: str) -> list[dict]:
    try:
        data = json.loads(_read_text(path))
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


# --- train -------------------------------------------------------------------------------------


def _fmt_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


def train_config(args: argparse.Namespace):
    """The TrainConfig of `tune-engine train`'s arguments (ConfigError naming a bad value)."""
    from ..model.targets import TargetSpec
    from ..train.trainer import TrainConfig

    if args.epochs is not None and args.steps is not None:
        raise CliError("give --epochs or --steps, not both")
    out = args.out
    ckpt_dir = args.checkpoint_dir or (
        os.path.splitext(out)[0] + ".checkpoints" if args.checkpoint_every else None
    )
    return TrainConfig(
        targets=TargetSpec(
            preset=args.preset or ("none" if args.targets and not args.preset else "attention"),
            patterns=tuple(p for p in (args.targets or "").split(",") if p),
            layers=args.layers,
        ),
        rank=args.rank, alpha=args.alpha if args.alpha is not None else 2.0 * args.rank,
        full=tuple(p for p in (args.full or "").split(",") if p),
        n_ctx=args.ctx, batch_size=args.batch, grad_accum=args.grad_accum,
        epochs=args.epochs if args.epochs is not None else 1.0, steps=args.steps or 0,
        val_split=args.val_split, train_on_prompt=args.train_on_prompt, seed=args.seed,
        lr=args.lr, schedule=args.schedule, warmup_steps=args.warmup, weight_decay=args.weight_decay,
        gclip=args.gclip, max_grad_norm=args.max_grad_norm,
        reward_mode=args.reward_mode, kl_coef=args.kl,
        checkpoint_layers=args.checkpoint_layers, checkpoint_every=args.checkpoint_every or 0,
        device=args.device, cache_budget=args.cache_budget,
        checkpoint_dir=ckpt_dir, eval_every=args.eval_every, out=out, out_type=args.out_type,
    )  # fmt: skip


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import events as ev

    config = train_config(args)
    tty = sys.stderr.isatty()
    # appended to, never truncated: a resumed run's events follow the first part's; each event is
    # flushed at once and synced to disk every second, at each checkpoint and at the end
    events_log = AppendLog(args.events) if args.events else None
    stop = {"requested": False}

    def log_event(e) -> None:
        nonlocal events_log
        try:
            events_log.write((ev.event_to_json(e) + "\n").encode("utf-8"))
            if isinstance(e, (ev.Checkpoint, ev.Finished, ev.Failed)):
                events_log.sync()
        except OSError as exc:  # the run goes on: its checkpoints and adapter matter more
            print(f"{chr(10) if tty else ''}warning: {args.events}: events are no longer written "
                  f"({exc.strerror or exc})", file=sys.stderr)  # fmt: skip
            with contextlib.suppress(OSError):
                events_log.close()
            events_log = None

    def on_event(e) -> None:
        if events_log is not None:
            log_event(e)
        if isinstance(e, ev.Started):
            p = e.plan
            m = p.memory_bytes
            print(f"training {len(p.lora_targets)} LoRA targets + {len(p.full_tensors)} full tensors "
                  f"({p.trainable_params:,} parameters) on {p.n_train} samples ({p.n_val} validation), "
                  f"{p.total_steps} steps; memory estimate {human_bytes(m['total'])} at peak (model file "
                  f"{human_bytes(m['stored'])}, weight cache {human_bytes(m['cache'])}, layer checkpointing "
                  f"{'on' if m['checkpoint'] else 'off'})", file=sys.stderr)  # fmt: skip
            for problem in p.problems[:20]:
                print(f"  {problem}", file=sys.stderr)
            if len(p.problems) > 20:
                print(f"  ... and {len(p.problems) - 20} more problems", file=sys.stderr)
        elif isinstance(e, ev.Step):
            line = (f"step {e.step}/{e.total_steps}  loss {e.mean_ce:.4f}  lr {e.lr:.2e}  "
                    f"grad {e.grad_norm:.3f}  {e.tokens_per_s:.0f} tok/s  elapsed {_fmt_time(e.elapsed_s)}  "
                    f"eta {_fmt_time(e.eta_s)}")  # fmt: skip
            if tty:
                width = 24
                done = int(width * e.step / e.total_steps)
                print(f"\r[{'#' * done}{'.' * (width - done)}] {line}", end="", file=sys.stderr, flush=True)
            elif e.step == e.total_steps or e.step % max(1, e.total_steps // 20) == 0 or e.step == 1:
                print(line, file=sys.stderr)
        elif isinstance(e, ev.Eval):
            print(f"{chr(10) if tty else ''}eval at step {e.step}: loss {e.mean_ce:.4f} "
                  f"(perplexity {e.perplexity:.2f}, {e.n_tokens} tokens)", file=sys.stderr)  # fmt: skip
        elif isinstance(e, ev.Checkpoint):
            print(f"{chr(10) if tty else ''}checkpoint: {e.path}", file=sys.stderr)
        elif isinstance(e, ev.RunWarning):
            print(f"{chr(10) if tty else ''}warning at step {e.step}: {e.message}", file=sys.stderr)

    import signal

    def on_sigint(signum, frame) -> None:
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        print("\nstopping after this step (Ctrl-C again to abort)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        session = open_session(args)
        session.new_run(args.data, config, resume=args.resume, init_adapter=args.init_adapter)
        result = session.train(on_event, lambda: stop["requested"])
    finally:
        signal.signal(signal.SIGINT, previous)
        if events_log is not None:
            with contextlib.suppress(OSError):
                events_log.close()
    if tty:
        print(file=sys.stderr)
    if isinstance(result, ev.Failed):
        raise CliError(result.message)
    what = "stopped" if result.stopped else "finished"
    loss = f", loss {result.final_loss:.4f}" if result.final_loss is not None else ""
    print(f"{what} after {result.step} steps{loss}")
    for label, path in (("adapter", result.adapter_path), ("model", result.merged_path),
                        ("checkpoint", result.checkpoint_path)):  # fmt: skip
        if path:
            print(f"{label}: {path}")
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

    s = sub.add_parser("train", help="fine-tune with LoRA (and/or full-weight tensors) on a JSONL dataset")
    s.add_argument("model")
    s.add_argument("data", help="JSONL: messages, prompt/response or text samples, optional reward")
    s.add_argument(
        "--out", required=True, help="adapter GGUF to write (runs with --full also write OUT.model.gguf)"
    )
    s.add_argument(
        "--out-type", default="F32", choices=("F32", "F16", "Q8_0"), help="adapter tensor type (F32)"
    )
    s.add_argument(
        "--preset",
        choices=("attention", "mlp", "experts", "router", "all", "none"),
        help="LoRA target preset (default attention)",
    )
    s.add_argument(
        "--targets", help="extra LoRA targets: comma-separated names, globs or kinds (output, attn_q, ...)"
    )
    s.add_argument("--layers", help="layer range of the targets, e.g. 0-11 or 0,2,4")
    s.add_argument("--rank", type=int, default=16, help="LoRA rank (default 16)")
    s.add_argument("--alpha", type=float, help="LoRA alpha (default 2 x rank)")
    s.add_argument("--full", help="tensors trained in full: comma-separated names/globs/kinds, or 'all'")
    s.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (default 2e-4)")
    s.add_argument(
        "--schedule", default="cosine", choices=("constant", "linear", "cosine"), help="default cosine"
    )
    s.add_argument("--warmup", type=int, default=0, help="warm-up steps (default 0)")
    s.add_argument("--weight-decay", type=float, default=0.0, help="decoupled weight decay (default 0)")
    s.add_argument("--gclip", type=float, default=0.0, help="element-wise gradient clipping; 0 = off")
    s.add_argument("--max-grad-norm", type=float, default=1.0, help="global gradient-norm clipping; 0 = off")
    s.add_argument("--epochs", type=float, help="passes over the data (default 1)")
    s.add_argument("--steps", type=int, help="optimizer steps (instead of --epochs)")
    s.add_argument("--ctx", type=int, default=512, help="packed window length in tokens (default 512)")
    s.add_argument("--batch", type=int, default=1, help="windows per micro-batch (default 1)")
    s.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default 1)")
    s.add_argument(
        "--val-split", type=float, default=0.0, help="fraction held out for validation (default 0)"
    )
    s.add_argument(
        "--eval-every", type=int, default=0, help="steps between validation passes; 0 = at the end"
    )
    s.add_argument("--train-on-prompt", action="store_true", help="loss on prompt tokens too")
    s.add_argument(
        "--reward-mode",
        default="none",
        choices=("none", "weighted", "group"),
        help="use sample rewards: reward-weighted SFT or group-relative (default none)",
    )
    s.add_argument(
        "--kl", type=float, default=0.0, help="group mode: KL penalty to the base model (default 0)"
    )
    s.add_argument(
        "--checkpoint-layers",
        nargs="?",
        const="on",
        default="auto",
        choices=("auto", "on", "off"),
        help="recompute layers in the backward pass (less memory); default auto: on when the memory "
        "estimate says activations would not fit",
    )
    s.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    s.add_argument("--checkpoint-dir", help="checkpoint folder (default OUT.checkpoints)")
    s.add_argument("--resume", help="checkpoint folder to continue from")
    s.add_argument("--init-adapter", help="adapter GGUF to continue training")
    s.add_argument("--template-file", help="Jinja chat template overriding the model's")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--events", help="append every event as one JSON line to this file (an events log; never truncated)"
    )
    add_runtime_options(s)
    s.set_defaults(func=cmd_train)

    from .reward import add_command as add_reward_command
    from .tools import add_commands

    add_reward_command(sub)
    add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        check_options(args)
        check_paths(args)
        return args.func(args)
    except (EngineError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
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
