"""The command line's cases of bench/fuzz.py: every `tune-engine` command run in this process through
its `main`, with outputs aimed at inputs, numeric options out of range, tensor type codes the engine
does not know and adapters or checkpoints holding NaN or infinity.

Four categories, each a method of `CliCases` (mixed into bench/fuzz.py's `Fuzzer`):

- ``outputs``: for `logits`, `train`, `export` and `reward`, one output option (`--out`, `--events`,
  `--checkpoint-dir`, `--ratings`) aimed at an input of the same command (the model, the dataset,
  the adapter, the chat template, the prompts, the checkpoint to resume), at a symbolic or a hard
  link to one, inside the checkpoint being resumed, at a checkpoint folder holding an input, at a
  file of another kind (a dataset where logits go), or at another output of the command; and
  controls with fresh paths. Every aimed case must be refused before any work, in one line.
- ``values``: one numeric option of any command (from the parser: `--lr`, `--lora-scale`, `-n`, ...)
  set to NaN, an infinity, a value just outside its range (engine.ranges), a huge one, or a value
  in range: out of range must be refused naming the option; in range must run or fail cleanly.
- ``types``: one tensor's ggml type code rewritten (any code 0..45, or a random 32-bit one) and
  the model read by `logits`, `generate`, `train`, `inspect`, `tokenize`, `norms` or `export --merge`:
  a code whose block size differs from the stored bytes, or that the engine does not know, must be
  refused; one of exactly the same size may be read.
- ``adapters``: an adapter with a NaN or an infinity in a factor (F32, F16, or the scale of a Q8_0
  block), a non-finite or non-numeric alpha, factors of 1e30 (finite, overflowing a forward pass),
  or a training checkpoint with a NaN in its state, used by `logits --lora`, `generate --lora`,
  `norms`, `export`, `export --merge`, `train --init-adapter`, `train --resume` or
  `reward --adapter`: non-finite ones must be refused; no command may exit 0 with non-finite logits.

Outcomes (as bench/fuzz.py counts them): a clean refusal (exit 2, one `error:` line) is "error"; a
run that finishes with its outputs checked is "ok"; exit 0 where a refusal was due, or non-finite
logits written, is "wrong"; a traceback, "this is a bug", or another exit status is "traceback";
any change to the case folder (every input lives there) is "changed".
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.cli.main import COMMAND_RANGES, OPTION_RANGES, build_parser
from engine.cli.main import main as cli_main
from engine.errors import EngineError
from engine.io.files import replace_problem
from engine.io.gguf_file import KNOWN_TYPES
from engine.io.gguf_write import write_gguf
from engine.model.model import Model
from engine.ranges import RANGES
from engine.testing import SynthSpec, random_adapter, write_adapter, write_model

CLI_CATEGORIES = ("outputs", "values", "types", "adapters")


class Wrong(Exception):
    """A case finished with a result that fails its check."""


class CliRefused(Exception):
    """The command refused cleanly: exit status 2 and one `error:` line (the "error" outcome)."""


class CliCrash(Exception):
    """The command crashed: a traceback, a "this is a bug" line, or an unexpected exit status."""


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `tune-engine argv` run in this process, stdin empty."""
    out, err = io.StringIO(), io.StringIO()
    stdin = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli_main(argv)
            except SystemExit as exc:  # argparse: a usage error (exit 2) with its one line
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin = stdin
    return rc, out.getvalue(), err.getvalue()


def settle(argv: list[str]) -> tuple[str, str]:
    """Run `argv`; CliRefused (one line) for a clean refusal, CliCrash for anything unclean; else
    (stdout, stderr) of a successful run."""
    rc, out, err = run_cli(argv)
    lines = err.strip().splitlines()
    if "Traceback" in err or "this is a bug" in err:
        raise CliCrash(f"{' '.join(argv)[:300]}\n{err[-3000:]}")
    if rc == 2:
        last = lines[-1] if lines else ""
        if not (last.startswith("error: ") or ": error: " in last):
            raise CliCrash(f"exit 2 without an error line: {' '.join(argv)[:300]}\n{err[-1000:]}")
        raise CliRefused(last)
    if rc != 0:
        raise CliCrash(f"exit {rc}: {' '.join(argv)[:300]}\n{err[-1000:]}")
    return out, err


def refused(argv: list[str], why: str, must_name: str | None = None) -> None:
    """The command must be refused: CliRefused when it is (naming `must_name` if given), Wrong when
    it exits 0."""
    try:
        settle(argv)
    except CliRefused as exc:
        if must_name is not None and must_name not in str(exc):
            raise Wrong(f"refused, but without naming {must_name}: {exc}") from None
        raise
    raise Wrong(f"exit 0 although {why}: {' '.join(argv)[:300]}")


def finite_outputs(paths: list[Path]) -> None:
    """Wrong when a written .npy holds a NaN or an infinity."""
    for p in paths:
        if p.suffix == ".npy" and p.is_file():
            if not np.isfinite(np.load(p)).all():
                raise Wrong(f"{p.name}: non-finite logits written with exit 0")


@dataclass
class Command:
    """A `tune-engine` command line: positional arguments and options (None: a flag)."""

    name: str
    positional: list[str]
    options: dict[str, str | None] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # what the command reads -> path
    outputs: list[str] = field(default_factory=list)  # its output options

    def argv(self) -> list[str]:
        out = [self.name, *self.positional]
        for k, v in self.options.items():
            out += [k] if v is None else [k, v]
        return out


def expect(desc: str, cmd: Command, refusal: str | None, must_name: str | None = None):
    """A case as the fuzzer takes it, (description, action, the exception that is a refusal): the
    action runs `cmd`, which must be refused (`refusal` says why, `must_name` what the message must
    name) or, with no refusal due, finish with finite outputs."""
    argv = cmd.argv()

    def action() -> None:
        if refusal is None:
            settle(argv)
            finite_outputs([Path(p) for p in cmd.options.values() if p])
        else:
            refused(argv, refusal, must_name)

    return desc, action, CliRefused


class CliFiles:
    """The files the cases start from, written once: a tiny model, its adapter, a dataset, a chat
    template, prompts, a conversation, a training checkpoint and its events log."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.spec = SynthSpec.for_arch("llama", V=300, C=32, NH=2, NKV=1, HS=16, F=64, n_ctx=64)
        self.model = write_model(folder / "model.gguf", self.spec)
        model = Model.load(self.model)
        self.targets = ["blk.0.attn_q.weight", "blk.1.attn_v.weight"]
        self.pairs = random_adapter(model, self.targets, rank=2, seed=1)
        write_adapter(folder / "adapter.gguf", "llama", self.pairs, alpha=4.0)
        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"what is {i}?"},
                    {"role": "assistant", "content": f"{i}"},
                ]
            }
            for i in range(4)
        ]
        (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        from engine.text.chat_template import CHATML_TEMPLATE

        (folder / "template.jinja").write_text(CHATML_TEMPLATE, encoding="utf-8")
        (folder / "prompts.txt").write_text("hello there\nwhat is two?\n", encoding="utf-8")
        (folder / "messages.json").write_text(json.dumps(rows[0]["messages"]), encoding="utf-8")
        from engine.train.trainer import TrainConfig

        settings = TrainConfig(steps=1, n_ctx=32, rank=2, alpha=4.0, data_cache="off").to_json()
        (folder / "settings.json").write_text(json.dumps(settings), encoding="utf-8")  # train --settings
        work = folder / "work"
        work.mkdir(exist_ok=True)
        argv = [
            "train",
            self.model,
            str(folder / "data.jsonl"),
            "--out",
            str(work / "run.gguf"),
            "--steps",
            "2",
            "--ctx",
            "32",
            "--rank",
            "2",
            "--checkpoint-every",
            "1",
            "--checkpoint-dir",
            str(folder / "run.checkpoints"),
            "--events",
            str(folder / "events.jsonl"),
        ]
        settle(argv)
        shutil.rmtree(work)
        self.names = [
            "model.gguf",
            "adapter.gguf",
            "data.jsonl",
            "template.jinja",
            "prompts.txt",
            "messages.json",
            "settings.json",
            "run.checkpoints",
        ]

    def copy_to(self, case: Path) -> dict[str, str]:
        """The files copied into `case` (every input of a case lives there): name -> path."""
        paths = {}
        for name in self.names:
            src, dst = self.folder / name, case / name
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                shutil.copyfile(src, dst)
            paths[name] = str(dst)
        return paths


def _command(rng: random.Random, name: str, f: dict[str, str], out: Path) -> Command:
    """A runnable command line of `name` on the case's files, outputs in `out`, a few options drawn."""
    M, A, D = f["model.gguf"], f["adapter.gguf"], f["data.jsonl"]
    if name == "logits":
        c = Command(
            "logits", [M], {"--tokens": "1 2 3", "--out": str(out / "logits.npy")}, {"model": M}, ["--out"]
        )
        if rng.random() < 0.5:
            c.options["--lora"], c.inputs["adapter"] = A, A
        return c
    if name == "train":
        c = Command(
            "train",
            [M, D],
            {"--out": str(out / "a.gguf"), "--steps": "1", "--ctx": "32", "--rank": "2"},
            {"model": M, "dataset": D},
            ["--out"],
        )
        if rng.random() < 0.5:
            c.options["--events"] = str(out / "events.jsonl")
            c.outputs.append("--events")
        if rng.random() < 0.4:
            c.options["--template-file"] = c.inputs["chat template"] = f["template.jinja"]
        r = rng.random()
        if r < 0.3:
            c.options["--init-adapter"] = c.inputs["adapter"] = A
        elif r < 0.5:
            c.options["--resume"] = c.inputs["checkpoint"] = f["run.checkpoints"]
            c.options["--steps"] = "3"
            c.options["--accept-changes"] = None  # 3 steps where the run planned 2: said, and accepted
        if rng.random() < 0.2:  # a run's settings as the studio writes them, in place of the options
            c.options["--settings"] = c.inputs["settings"] = f["settings.json"]
        if rng.random() < 0.4:
            c.options["--checkpoint-every"] = "1"
        if "--checkpoint-every" in c.options or "--resume" in c.options:
            # (a resumed run goes on in its own folder unless told another: here, one in `out`)
            c.options["--checkpoint-dir"] = str(out / "ck")
            c.outputs.append("--checkpoint-dir")
        return c
    if name == "export":
        if rng.random() < 0.5:
            c = Command(
                "export",
                [A],
                {"--model": M, "--merge": None, "--out": str(out / "merged.gguf")},
                {"adapter": A, "model": M},
                ["--out"],
            )
        else:
            c = Command(
                "export", [A], {"--out": str(out / "x.gguf"), "--type": "F16"}, {"adapter": A}, ["--out"]
            )
        if rng.random() < 0.3:  # the prompts the written file is verified on
            c.options["--prompts"] = c.inputs["prompts"] = f["prompts.txt"]
            if "--merge" not in c.options:
                c.options["--model"] = c.inputs["model"] = M
                c.options["--verify"] = None
        return c
    if name == "reward":
        c = Command(
            "reward",
            [M],
            {
                "--prompts": f["prompts.txt"],
                "--samples": "2",
                "-n": "3",
                "--rank": "2",
                "--ratings": str(out / "ratings.jsonl"),
                "--out": str(out / "r.gguf"),
            },
            {"model": M, "prompts": f["prompts.txt"]},
            ["--out", "--ratings"],
        )
        if rng.random() < 0.4:
            c.options["--adapter"] = c.inputs["adapter"] = A
        if rng.random() < 0.3:
            c.options["--checkpoint-dir"] = str(out / "rck")
            c.outputs.append("--checkpoint-dir")
        return c
    if name == "generate":
        c = Command("generate", [M], {"--prompt": "hello", "-n": "3", "--seed": "0"}, {"model": M})
        if rng.random() < 0.4:
            c.options["--lora"] = A
        return c
    if name == "norms":
        return Command("norms", [A], {"--model": M})
    if name == "inspect":
        return Command("inspect", [M])
    if name == "tokenize":
        return Command("tokenize", [M], {"--file": D})
    if name == "chat-template":
        return Command(
            "chat-template", [M], {"--messages": f["messages.json"], "--template-file": f["template.jinja"]}
        )
    raise ValueError(name)


def numeric_options() -> dict[str, list[tuple[str, str]]]:
    """command -> [(option string, engine.ranges name)] for every numeric option of the parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    found: dict[str, list[tuple[str, str]]] = {}
    for cmd, p in sub.choices.items():
        for action in p._actions:
            name = COMMAND_RANGES.get((cmd, action.dest), OPTION_RANGES.get(action.dest))
            if name is not None and action.option_strings:
                found.setdefault(cmd, []).append((action.option_strings[-1], name))
    return found


def _bad_values(rng: random.Random, name: str) -> list[str]:
    r = RANGES[name]
    if r.integer:
        return [str(int(r.lo) - 1), str(int(r.hi) + 1), str(2**70), "1.5", "nan", "-inf", "x"]
    below = r.lo if r.lo_open else (r.lo - 1e-3 if r.lo == 0 else r.lo * 1.5 - 1)
    return ["nan", "NaN", "inf", "-inf", "1e999", repr(below), repr(r.hi * 10 + 1), repr(-1e308), "abc"]


def _good_value(rng: random.Random, name: str) -> str:
    r = RANGES[name]
    if r.integer:
        return str(rng.choice([int(r.lo), int(r.lo) + 1, min(int(r.hi), int(r.lo) + 2)]))
    lo = r.lo + (1e-6 if r.lo_open else 0.0)
    return repr(rng.choice([lo, min(r.hi, lo + 0.5), min(r.hi, 1.0) if r.lo <= 1.0 else lo]))


def _patch_type(path: Path, fields: list, tensor_index: int, code: int) -> tuple[str, int]:
    """Set the ggml type code of the tensor_index-th tensor of the GGUF file at `path` (its header
    `fields`, as bench.fuzz.header_map reads them); (the tensor's name, its old code)."""
    data = bytearray(path.read_bytes())
    ttypes = [h for h in fields if h.kind == "ttype"]
    h = ttypes[tensor_index % len(ttypes)]
    old = int.from_bytes(data[h.offset : h.offset + 4], "little")
    data[h.offset : h.offset + 4] = struct.pack("<I", code % (1 << 32))
    Path(path).write_bytes(bytes(data))
    return h.name, old


class CliCases:
    """The command-line categories (mixed into bench/fuzz.py's Fuzzer: it provides `workdir` and
    `bases()`)."""

    workdir: Path
    _cli_files: CliFiles | None = None
    _numeric: dict[str, list[tuple[str, str]]] | None = None

    def cli_files(self) -> CliFiles:
        if self._cli_files is None:
            self._cli_files = CliFiles(Path(self.workdir) / "cli")
        return self._cli_files

    # -- outputs ----------------------------------------------------------------------------------
    def case_outputs(self, rng: random.Random, folder: Path, out: Path):
        f = self.cli_files().copy_to(folder)
        cmd = _command(rng, rng.choice(["logits", "train", "export", "reward"]), f, out)
        option = rng.choice(cmd.outputs)
        aim = rng.choice(
            ["input", "input", "symlink", "hardlink", "other output", "foreign", "inside", "control"]
        )
        files = [p for p in cmd.inputs.values() if os.path.isfile(p)]
        target: str | None = None
        if aim == "input":
            # (a run's checkpoint folder may be the one it resumes from: that is how a run goes on)
            roles = [
                r for r in sorted(cmd.inputs) if not (r == "checkpoint" and option == "--checkpoint-dir")
            ]
            role = rng.choice(roles)
            target = cmd.inputs[role]
            aim = f"input ({role})"
        elif aim in ("symlink", "hardlink"):
            src = rng.choice(files)
            target = str(out / f"{aim}-{Path(src).name}")
            (os.symlink if aim == "symlink" else os.link)(src, target)
            aim = f"{aim} to {Path(src).name}"
        elif aim == "other output" and len(cmd.outputs) > 1:
            other = rng.choice([o for o in cmd.outputs if o != option])
            target = cmd.options[other]
            if rng.random() < 0.3:
                link = out / "other-output-link"
                os.symlink(target, link)
                target = str(link)
            aim = f"the same path as {other}"
        elif aim == "foreign":
            # a file of the case that this command does not read, of another kind than it writes
            # (a file of the kind the option writes is replaced, as a second run replaces the first's)
            merge = "--merge" in cmd.options
            kind = {
                "--out": {"logits": "npy", "export": "model" if merge else "adapter"}.get(
                    cmd.name, "adapter"
                ),
                "--events": "events",
                "--ratings": "jsonl",
                "--checkpoint-dir": None,
            }[option]
            choices = [
                p
                for p in f.values()
                if p not in cmd.inputs.values() and os.path.isfile(p) and kind and replace_problem(p, kind)
            ]
            if not choices:
                aim = "control"
            else:
                target = rng.choice(choices)
                aim = f"foreign {Path(target).name}"
        elif aim == "inside":
            if cmd.name == "train" and "--resume" in cmd.options and option == "--out":
                ckpt = sorted(Path(f["run.checkpoints"]).glob("ckpt-*"))[-1]
                target = str(ckpt / "adapter.gguf")
                aim = "inside the checkpoint to resume"
            elif cmd.name == "train" and option == "--checkpoint-dir":
                held = folder / "held" / "ckpt-000001"
                held.mkdir(parents=True)
                shutil.copyfile(f["adapter.gguf"], held / "adapter.gguf")
                cmd.options.pop("--resume", None)
                cmd.options["--init-adapter"] = str(held / "adapter.gguf")
                target = str(folder / "held")
                aim = "a checkpoint folder holding the adapter to continue"
            else:
                aim = "control"
        if aim in ("other output", "control") or target is None:
            aim = "control"
        else:
            cmd.options[option] = target
        refusal = None if aim == "control" else f"{option} was aimed at {aim}"
        return expect(f"{cmd.name} {option} -> {aim}", cmd, refusal)

    # -- values -----------------------------------------------------------------------------------
    def case_values(self, rng: random.Random, folder: Path, out: Path):
        if self._numeric is None:
            self._numeric = numeric_options()
        f = self.cli_files().copy_to(folder)
        name = rng.choice(sorted(self._numeric))
        option, table = rng.choice(self._numeric[name])
        cmd = _command(rng, name, f, out)
        if name == "train" and option == "--epochs":
            cmd.options.pop("--steps", None)
            cmd.options.pop("--resume", None)
        if name == "export" and option == "--scale" and "--merge" not in cmd.options:
            cmd = Command(
                "export",
                [f["adapter.gguf"]],
                {"--model": f["model.gguf"], "--merge": None, "--out": str(out / "merged.gguf")},
            )
        if name == "train" and option in ("--rank", "--alpha"):
            cmd.options.pop("--resume", None)
            cmd.options.pop("--init-adapter", None)
        bad = rng.random() < 0.65
        value = rng.choice(_bad_values(rng, table)) if bad else _good_value(rng, table)
        cmd.options[option] = value
        refusal = f"{option} {value} is out of range" if bad else None
        return expect(f"{name} {option} {value}", cmd, refusal, must_name=option)

    # -- types ------------------------------------------------------------------------------------
    def case_types(self, rng: random.Random, folder: Path, out: Path):
        name, spec, data, fields, end = rng.choice(self.bases())
        f = self.cli_files().copy_to(folder)
        model = folder / "patched.gguf"
        model.write_bytes(data)
        n_tensors = sum(1 for h in fields if h.kind == "ttype")
        code = rng.randrange(0, 46) if rng.random() < 0.9 else rng.getrandbits(32)
        tensor, old = _patch_type(model, fields, rng.randrange(n_tensors), code)
        f["model.gguf"] = str(model)  # the patched model in place of the fixture's
        which = rng.choice(["logits", "generate", "train", "inspect", "tokenize", "norms", "export"])
        if which in ("norms", "export"):  # the fixture adapter does not fit these models: any adapter
            cmd = Command(which, [f["adapter.gguf"]], {"--model": str(model)})
            if which == "export":
                cmd.options.update({"--merge": None, "--out": str(out / "m.gguf")})
        else:
            cmd = _command(rng, which, f, out)
            cmd.options.pop("--lora", None)
            cmd.options.pop("--init-adapter", None)
            cmd.options.pop("--resume", None)
        same = old in KNOWN_TYPES and code in KNOWN_TYPES and KNOWN_TYPES[old][1:] == KNOWN_TYPES[code][1:]
        # the same code, or one of the same block size: the bytes still mean a tensor of that size,
        # and reading them is fine
        refusal = None if code == old or same else f"tensor {tensor} has type code {code} (was {old})"
        return expect(f"{name}: {tensor} type {old} -> {code}, {which}", cmd, refusal)

    # -- adapters ---------------------------------------------------------------------------------
    def case_adapters(self, rng: random.Random, folder: Path, out: Path):
        files = self.cli_files()
        f = files.copy_to(folder)
        kind = rng.choice(["nan", "inf", "-inf", "huge", "alpha", "checkpoint"])
        storage = rng.choice(["F32", "F16", "Q8_0"])
        bad = folder / "bad.gguf"
        if kind == "checkpoint":
            ckpt = sorted(Path(f["run.checkpoints"]).glob("ckpt-*"))[-1]
            state = dict(np.load(ckpt / "state.npz"))
            key = rng.choice([k for k, v in state.items() if v.dtype.kind == "f" and v.size])
            arr = state[key].copy()
            arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice([np.nan, np.inf, -np.inf])
            state[key] = arr
            np.savez(ckpt / "state.npz", **state)
            cmd = Command(
                "train",
                [f["model.gguf"], f["data.jsonl"]],
                {
                    "--out": str(out / "a.gguf"),
                    "--steps": "4",
                    "--ctx": "32",
                    "--rank": "2",
                    "--resume": f["run.checkpoints"],
                },
            )
            desc = f"checkpoint: {key} poisoned, train --resume"
            return expect(desc, cmd, f"the checkpoint's {key} holds a non-finite value")
        pairs = {n: (a.copy(), b.copy()) for n, (a, b) in files.pairs.items()}
        victim = rng.choice(sorted(pairs))
        which = rng.randrange(2)
        alpha: object = 4.0
        if kind in ("nan", "inf", "-inf"):
            arr = pairs[victim][which]
            arr.reshape(-1)[rng.randrange(arr.size)] = float(kind)
        elif kind == "huge":
            pairs[victim][which][...] = 1e30 * np.sign(pairs[victim][which] + 1e-9)
            storage = "F32"
        else:
            alpha = rng.choice([math.nan, math.inf, -math.inf])
            storage = "F32"
        tensors = {}
        for n, (a, b) in pairs.items():
            tensors[n + ".lora_a"] = (a, "Q8_0" if storage == "Q8_0" else storage)  # A's rows: n_in values
            tensors[n + ".lora_b"] = (b, "F16" if storage == "Q8_0" else storage)  # B's rows: r values
        md = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": alpha}
        try:
            write_gguf(bad, "llama", md, tensors)
        except EngineError:  # a value the quantizer will not take: the same poison in F32
            storage = "F32"
            write_gguf(bad, "llama", md, {n: (a, "F32") for n, (a, _) in tensors.items()})
        use = rng.choice(["logits", "generate", "norms", "export", "merge", "train", "reward"])
        M = f["model.gguf"]
        cmd = {
            "logits": Command(
                "logits", [M], {"--tokens": "1 2 3", "--lora": str(bad), "--out": str(out / "l.npy")}
            ),
            "generate": Command(
                "generate", [M], {"--prompt": "hi", "-n": "3", "--seed": "0", "--lora": str(bad)}
            ),
            "norms": Command("norms", [str(bad)], {"--model": M}),
            "export": Command("export", [str(bad)], {"--out": str(out / "x.gguf")}),
            "merge": Command(
                "export", [str(bad)], {"--model": M, "--merge": None, "--out": str(out / "m.gguf")}
            ),
            "train": Command(
                "train",
                [M, f["data.jsonl"]],
                {"--out": str(out / "a.gguf"), "--steps": "1", "--ctx": "32", "--init-adapter": str(bad)},
            ),
            "reward": Command(
                "reward",
                [M],
                {
                    "--prompts": f["prompts.txt"],
                    "--samples": "2",
                    "-n": "3",
                    "--adapter": str(bad),
                    "--ratings": str(out / "r.jsonl"),
                    "--out": str(out / "r.gguf"),
                },
            ),
        }[use]
        desc = f"{storage} adapter, {kind} in {victim}{'.lora_b' if which else '.lora_a'}, {use}"
        # huge factors are finite: the adapter may load, but nothing non-finite may come out with exit 0
        if kind == "huge":
            return expect(desc, cmd, None)
        return expect(desc, cmd, f"the adapter holds {'a non-finite alpha' if kind == 'alpha' else kind}")
