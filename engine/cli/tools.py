"""`tune-engine norms` and `tune-engine export`: adapter norms, adapter re-typing, merged models.

`add_commands(subparsers)` registers both subcommands on the `tune-engine` parser
(engine/cli.py calls it). Each command parses nothing itself, calls the engine
(`engine.train.norms`, `engine.export.write`) and prints; `EngineError`s propagate to the
CLI's main, which turns them into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from ..errors import EngineError, ExportError
from ..export.check import ExportRequest, check_export, check_export_paths
from ..export.modelfile import plan_modelfile, write_modelfile
from ..export.verify import quarantine, verify_export
from ..export.write import (
    ADAPTER_TYPES,
    MERGE_BASE_TYPE,
    adapter_tensor_types,
    export_adapter,
    export_merged,
    fit_problems,
)
from ..io.gguf_file import GGUFFile
from ..io.quantize import quantizable_types
from ..model.generate import SamplingConfig
from ..model.lora import LoraAdapter
from ..train.norms import NormsReport, lora_norms


def _num(x: float | None, width: int = 10) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.4g}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


# --- norms ---------------------------------------------------------------------------------------


def format_norms(report: NormsReport, title: str = "") -> str:
    """The norms as a text table: every tensor, then per-kind and per-layer aggregates."""
    lines = [title] if title else []
    lines.append(f"alpha {report.alpha:g}, scale {report.scale:g}; dW = scale * alpha / r * B A")
    width = max([len("tensor")] + [len(t.name) for t in report.tensors])
    lines.append(
        f"{'tensor':<{width}}  {'rank':>4}  {'|A|':>10}  {'|B|':>10}  {'|dW|':>10}  {'|dW|/|W|':>10}"
    )
    for t in report.tensors:
        lines.append(
            f"{t.name:<{width}}  {t.rank:>4}  {_num(t.norm_a)}  {_num(t.norm_b)}  "
            f"{_num(t.norm_delta)}  {_num(t.ratio)}"
        )
        if t.per_expert_delta:
            e = t.per_expert_delta
            lines.append(
                f"{'':<{width}}  {len(e)} experts: |dW_e| min {min(e):.4g}, "
                f"mean {sum(e) / len(e):.4g}, max {max(e):.4g}"
            )
    has_ratio = bool(report.ratio_by_kind)
    head = f"{'|dW|':>10}" + (f"  {'mean |dW|/|W|':>14}" if has_ratio else "")
    kw = max([len("kind")] + [len(k) for k in report.by_kind])
    lines += ["", "by kind:", f"  {'kind':<{kw}}  {head}"]
    for k, v in report.by_kind.items():
        ratio = f"  {_num(report.ratio_by_kind.get(k), 14)}" if has_ratio else ""
        lines.append(f"  {k:<{kw}}  {_num(v)}{ratio}")
    if report.by_layer:
        lines += ["", "by layer:", f"  {'layer':<5}  {head}"]
        for layer, v in report.by_layer.items():
            ratio = f"  {_num(report.ratio_by_layer.get(layer), 14)}" if has_ratio else ""
            lines.append(f"  {layer:<5}  {_num(v)}{ratio}")
    lines += ["", f"total |dW| {report.total_delta:.4g}"]
    return "\n".join(lines)


def cmd_norms(args: argparse.Namespace) -> int:
    adapter = LoraAdapter.load(args.adapter)
    report = lora_norms(adapter, scale=args.scale, base=args.model)
    if args.json:
        out = {"adapter": adapter.path, "model": args.model, **report.to_dict()}
        print(json.dumps(out, indent=2))
        return 0
    title = f"adapter {adapter.path} ({adapter.arch or 'no architecture'})"
    if args.model:
        title += f", base {args.model}"
    print(format_norms(report, title))
    return 0


# --- export --------------------------------------------------------------------------------------


def _request(args: argparse.Namespace, qtype: str | None) -> ExportRequest:
    return ExportRequest(
        source=args.adapter,
        out=args.out,
        base=args.model,
        merge=args.merge,
        qtype=qtype if args.merge else (qtype or "F32"),
        scale=1.0 if args.scale is None else args.scale,
        modelfile=args.modelfile,
        sampling=_sampling(args),
    )


def _sampling(args: argparse.Namespace) -> SamplingConfig:
    """The Modelfile's sampling PARAMETERs: the options given, else the Chat page's defaults."""
    d = SamplingConfig()
    pick = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    return replace(d, **{k: v for k, v in pick.items() if v is not None})


def _merge_qtype(text: str | None) -> str | None:
    if not text:
        return None
    return MERGE_BASE_TYPE if text.lower() == MERGE_BASE_TYPE else text.upper()  # q8_0 as llama.cpp spells it


def _prompts(path: str | None) -> tuple[str, ...] | None:
    """The verification prompts of a --prompts file: one per line, blank lines skipped."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            prompts = tuple(line.strip() for line in f if line.strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"{path}: the prompts cannot be read ({exc})") from exc
    if not prompts:
        raise ExportError(f"{path}: holds no prompt (one per line)")
    return prompts


def cmd_export(args: argparse.Namespace) -> int:
    qtype = _merge_qtype(args.type) if args.merge else (args.type.upper() if args.type else None)
    if args.check:
        report = check_export(_request(args, qtype))
        for item in report.items:
            print(f"{item.text()}: {item.detail}")
        for note in report.notes:
            print(f"  note: {note}")
        print(report.summary())
        return 0 if report.ok else 2
    if args.merge and not args.model:
        raise ExportError("--merge needs the base model: --model BASE.gguf")
    verify = args.merge if args.verify is None else args.verify  # on by default for --merge
    if verify and not args.model:
        raise ExportError("--verify compares logits on the base model: give --model BASE.gguf")
    prompts = _prompts(args.prompts)
    request = _request(args, qtype)
    plan = None
    if args.modelfile:
        if not args.model:
            raise ExportError("--modelfile names the base model in FROM: give --model BASE.gguf")
        check_export_paths(request)  # another export's Modelfile is never written over (nothing written)
        try:
            plan = plan_modelfile(GGUFFile(args.model).metadata, request.sampling)
        except EngineError as exc:
            print(f"note: no Ollama Modelfile will be written: {exc}", file=sys.stderr)
    adapter = LoraAdapter.load(args.adapter)
    code = _write(args, adapter, qtype)
    if verify:
        kwargs = {"prompts": prompts} if prompts else {}
        report = quarantine(verify_export(_request(args, qtype), adapter, args.out, **kwargs))
        if not report.ok:
            print(f"error: {report.verdict()}", file=sys.stderr)
            return 2
        print(report.verdict())
        if args.merge:
            print(f"run it: llama-cli -m {args.out}")
    if plan is not None:
        path = write_modelfile(plan, args.out, merged=args.merge, base=args.model)
        print(f"wrote {path} ({plan.format.family} template): ollama create NAME -f {path}")
    return code


def _write(args: argparse.Namespace, adapter: LoraAdapter, qtype: str | None) -> int:
    if args.merge:
        if not args.model:
            raise ExportError("--merge needs the base model: --model BASE.gguf")
        scale = 1.0 if args.scale is None else args.scale

        def progress(done: int, total: int) -> None:
            if sys.stderr.isatty():
                print(f"\rwriting tensor {done}/{total}", end="" if done < total else "\n", file=sys.stderr)

        rep = export_merged(args.model, adapter, args.out, scale=scale, qtype=qtype, on_progress=progress)
        print(
            f"wrote {rep.path}: {rep.n_tensors} tensors, {_mib(rep.n_bytes)} (the base: "
            f"{_mib(os.path.getsize(args.model))}); merged {len(rep.merged)} adapted tensors at scale "
            f"{rep.scale:g}"
        )
        if qtype is None and rep.type_changes:
            stored = sorted({old for old, _ in rep.type_changes.values()})
            print(
                f"  {len(rep.type_changes)} adapted tensors stored as {'/'.join(stored)} were written as "
                "F16 to keep the fine-tune (--type base re-quantizes them to the base's type: the file is "
                "smaller, and the update is mostly rounded away)"
            )
        changes = list(rep.type_changes.items())
        for name, (old, new) in changes[: 8 if len(changes) > 10 else 10]:
            print(f"  {name}: {old} -> {new}")
        if len(changes) > 10:
            print(f"  ... and {len(changes) - 8} more")
        if rep.file_type_dropped:
            print("  general.file_type dropped (tensor types changed; llama.cpp guesses it from the tensors)")
        return 0
    if args.scale is not None:
        raise ExportError("--scale applies to --merge only (an adapter's scale is chosen when it is loaded)")
    qtype = qtype or "F32"
    if args.model:
        problems = fit_problems(adapter, GGUFFile(args.model))
        if problems:
            raise ExportError(f"the adapter does not fit {args.model}: {problems[0]}")
    types = adapter_tensor_types(adapter, qtype)
    path = export_adapter(adapter, args.out, qtype=qtype)
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    summary = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    print(f"wrote {path}: {len(adapter.pairs)} adapted tensors ({summary}), {_mib(os.path.getsize(path))}")
    fallback = [n for n, t in types.items() if t != qtype]
    if fallback:
        print(f"  {len(fallback)} tensors have rows that are not a multiple of 32 and were written as F16:")
        for n in fallback:
            print(f"    {n}")
    return 0


# --- registration --------------------------------------------------------------------------------


def add_commands(subparsers) -> None:
    """Register `norms` and `export` on the `tune-engine` subparsers."""
    s = subparsers.add_parser("norms", help="norms of a LoRA adapter: |A|, |B|, |dW|, |dW|/|W| per tensor")
    s.add_argument("adapter", help="LoRA adapter GGUF")
    s.add_argument("--model", help="base model GGUF, for |W| and the relative update |dW|/|W|")
    s.add_argument("--scale", type=float, default=1.0, help="adapter scale (default 1.0)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_norms)

    s = subparsers.add_parser(
        "export",
        help="write an adapter in another type, or merge it into its base model",
        description=(
            "ADAPTER --out OUT [--type F32|F16|Q8_0]: the adapter in another tensor type. "
            "ADAPTER --model BASE --merge --out OUT [--type T] [--scale S]: a full model with the "
            "adapter folded in (adapted tensors in a type that keeps the update, the others as they are), "
            "reloaded and compared with base + adapter."
        ),
    )
    s.add_argument("adapter", help="LoRA adapter GGUF")
    s.add_argument("--out", required=True, help="file to write (replaced atomically)")
    s.add_argument("--model", help="base model GGUF (needed by --merge; otherwise checked against)")
    s.add_argument("--merge", action="store_true", help="write the base model with the adapter merged in")
    s.add_argument(
        "--type",
        help=f"adapter: {', '.join(ADAPTER_TYPES)} (default F32); adapted tensors of a merged model: "
        "by default a type that keeps the fine-tune (F16 where the base is quantized, else the base's "
        f"own float type); '{MERGE_BASE_TYPE}' re-quantizes each to the base's own type, or one of "
        f"{', '.join(quantizable_types())} (re-quantizing is measured after writing: --verify)",
    )
    s.add_argument("--scale", type=float, default=None, help="adapter scale for --merge (default 1.0)")
    s.add_argument(
        "--check",
        action="store_true",
        help="only check (adapter, base model, architecture, tensors, folder, disk space, name); exit 2 "
        "when a check fails; nothing is written",
    )
    s.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="after writing, reload the file and compare its logits with the base model + adapter "
        "(needs --model); a merged file is also measured against the adapter's effect. A file that "
        "fails is renamed NAME.failed.gguf and the exit code is 2. Default: on for --merge, off otherwise",
    )
    s.add_argument("--prompts", help="verification prompts, one per line (default: three short chat prompts)")
    s.add_argument(
        "--modelfile",
        action="store_true",
        help="also write an Ollama Modelfile beside OUT (FROM, ADAPTER, the chat template as a Go TEMPLATE, "
        "stop tokens, sampling); needs --model. A template of no known family is named and skipped",
    )
    s.add_argument("--temp", type=float, default=None, help="Modelfile temperature (default 0.8)")
    s.add_argument("--top-k", type=int, default=None, help="Modelfile top_k (default 40)")
    s.add_argument("--top-p", type=float, default=None, help="Modelfile top_p (default 0.95)")
    s.add_argument("--min-p", type=float, default=None, help="Modelfile min_p (default 0.05)")
    s.set_defaults(func=cmd_export)
