"""`tune-engine`: the headless command line, a thin layer over the engine's API.

Each subcommand parses its arguments, calls the engine, and prints. Errors the
engine reports (`EngineError`) and unreadable inputs become one line on stderr
and exit code 2, never a traceback. Training, rewards, export and norms
subcommands join here as the engine grows them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

import numpy as np

from .chat_template import ChatTemplate
from .errors import EngineError
from .generate import GREEDY, SamplingConfig, generate
from .lora import LoraAdapter
from .model import Model
from .summary import summarize
from .tokenizer import Tokenizer

EXIT_USAGE = 2


class CliError(Exception):
    """A problem with the command's own inputs (a file that cannot be read, a bad value)."""


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _human_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


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
    print(f"file          {s.path} ({_human_bytes(s.file_bytes)})")
    print(f"architecture  {c.arch}" + (f" ({c.name})" if c.name else ""))
    print(
        f"parameters    {_human_count(s.n_params)} ({s.n_params}) in {s.n_tensors} tensors, "
        f"mostly {s.file_type}"
    )
    print(f"layers        {c.L}")
    print(f"embedding     {c.C}")
    print(f"heads         {c.NH} query, {c.NKV} key/value, head size {c.HS}")
    if c.is_moe:
        shared = f", shared expert width {c.F_shexp}" if c.F_shexp else ""
        renorm = "renormalised" if c.moe_renorm else "not renormalised"
        print(f"experts       {c.E}, {c.K} used per token ({renorm}), expert width {c.F_exp}{shared}")
    else:
        print(f"ffn width     {c.F}")
    print(f"context       {c.n_ctx_train} (RoPE {c.rope}, base {c.rope_base:g})")
    pre = f", pre-tokenizer {s.tokenizer_pre}" if s.tokenizer_pre else ""
    print(f"tokenizer     {s.tokenizer_model}{pre}, {s.vocab_size} tokens")
    print(f"chat template {'yes' if s.has_chat_template else 'no (ChatML is used)'}")
    print("tensor kinds:")
    width = max(len(k.kind) for k in s.kinds)
    for k in sorted(s.kinds, key=lambda k: k.kind):
        types = ", ".join(f"{t}" + (f" x{n}" if n > 1 else "") for t, n in sorted(k.types.items()))
        shape = "x".join(str(d) for d in k.shape)
        print(f"  {k.kind:<{width}}  {k.count:3d} x ({shape:>14})  {types:<14} {_human_bytes(k.n_bytes):>10}")
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
    model = Model.load(args.model)
    lora = LoraAdapter.load(args.lora, model).terms(args.lora_scale) if args.lora else None
    logits = model.forward(tokens, lora=lora).astype(np.float32)  # (T, V)
    out = args.out
    tmp = out + ".tmp.npy"
    try:
        np.save(tmp, logits)
        os.replace(tmp, out)
    except OSError as exc:
        raise CliError(f"{out}: cannot be written ({exc})") from exc
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
    from .gguf_file import GGUFFile

    tpl = _template(GGUFFile(args.model).metadata, args.template_file)
    text = tpl.render(_load_messages(args.messages), add_generation_prompt=args.add_generation_prompt)
    sys.stdout.write(text)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    return 0


# --- generate ------------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    model = Model.load(args.model)
    tok = Tokenizer.from_metadata(model.metadata, model.path)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        text = _template(model.metadata, args.template_file).render(messages, add_generation_prompt=True)
        # a rendered template carries its own BOS when the model wants one
        prompt = tok.encode(text, add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id is not None and (not prompt or prompt[0] != tok.bos_id):
            prompt = [tok.bos_id, *prompt]
    else:
        prompt = tok.encode(args.prompt, add_special=True, parse_special=True)
    lora = LoraAdapter.load(args.lora, model).terms(args.lora_scale) if args.lora else None
    if args.temp <= 0:
        sampling = SamplingConfig(**{**GREEDY.__dict__, "max_new_tokens": args.n})
    else:
        sampling = SamplingConfig(args.temp, args.top_k, args.top_p, args.min_p, args.seed, args.n)
    stream = args.samples == 1 and sys.stdout.isatty()
    pending = bytearray()

    def on_token(sample: int, token: int) -> None:
        pending.extend(tok.token_bytes(token))
        try:
            text = pending.decode("utf-8")
        except UnicodeDecodeError:
            return  # a multi-byte character is not complete yet
        pending.clear()
        sys.stdout.write(text)
        sys.stdout.flush()

    results = generate(
        model,
        prompt,
        n_samples=args.samples,
        sampling=sampling,
        stop_ids=tok.eot_ids,
        lora=lora,
        on_token=on_token if stream else None,
    )
    for i, g in enumerate(results):
        if stream:
            sys.stdout.write("\n")
        else:
            if args.samples > 1:
                print(f"--- sample {i + 1} ({len(g.tokens)} tokens, stop: {g.stop_reason}) ---")
            print(tok.decode(list(g.tokens), skip_special=False))
    return 0


# --- main ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tune-engine", description="Tune Studio's engine: GGUF models on the command line."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log engine warnings and progress to stderr")
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
    s.set_defaults(func=cmd_generate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except (EngineError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
