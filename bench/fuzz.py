"""Hostile inputs at the engine's boundaries: every case must end in a clean, one-line error or a
correct result, within its time limit, and leave every input file as it was.

Nine categories of cases, each made from a seeded generator: five at the engine's readers,

- ``gguf``: tiny models written by `engine.testing` (F32, F16 and Q8_0 weights, dense and MoE),
  then truncated, bit-flipped, with header fields (counts, lengths, type ids, dimensions, tensor
  offsets, the alignment) set to extreme values, duplicate names, NaN/Inf weights, or rewritten
  with out-of-range hyperparameters and vocabularies; loaded as a model (then a forward pass and
  two generated tokens), a tokenizer, a summary and a chat template.
- ``vocab``: vocabulary metadata (SentencePiece and byte-level BPE) with bad special ids, NaN
  scores, token types of the wrong length, merges that are not pairs, empty and huge tokens.
- ``jsonl``: dataset files of hostile lines (any JSON value, lone surrogates, 5000-digit numbers,
  deep nesting, huge strings, wrong types, invalid UTF-8, NUL bytes), and paths that are not
  datasets (folders, a FIFO, /dev/zero, empty and sparse 2 GiB files); loaded, encoded with a
  tokenizer and a chat template, saved and read back.
- ``template``: chat templates that spin, build huge strings (every operator and filter that
  can), reach for Python internals, or are not Jinja at all; rendered with and without spans.
- ``sampling``: NaN/Inf logits and sampling settings in and out of range.

and four at the command line, every `tune-engine` command run through its `main` in this process
(bench/fuzz_cli.py has the details):

- ``outputs``: an output option of `logits`, `train`, `export` or `reward` aimed at an input of the
  same command, at a link (symbolic or hard) to one, inside the checkpoint being resumed, at a
  checkpoint folder holding an input, at a file of another kind, or at another output: refused.
- ``values``: every numeric option of every command set to NaN, an infinity or a value out of its
  range (refused, naming the option), or in range (runs, or fails cleanly).
- ``types``: a tensor's ggml type code rewritten to any other code: refused unless the code means
  exactly the same bytes.
- ``adapters``: adapters with NaN/Inf factors or alpha, or 1e30 factors, and checkpoints with a NaN
  in their state, used by every command that reads one: refused; no exit 0 with non-finite logits.

Each case runs in this process with a time limit (SIGALRM where available, and the elapsed time
in any case). The outcome is "ok" (a result, checked), "error" (the expected exception, its
message one line), or a failure: "traceback" (any other exception, or a multi-line message),
"wrong" (a result that fails its check), "hang" (past the time limit) or "changed" (an input
file's hash or the folder's listing changed: every input of a case lives in its folder, every
output the case means to write in another).

    python bench/fuzz.py --n 2500 --seed 1

prints the counts per category and the first few failures; the exit status is 1 if there was
any. tests/engine/test_fuzz.py runs the same cases at a small count.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fuzz_cli import CLI_CATEGORIES, CliCases, Wrong  # noqa: E402
from engine.errors import DatasetError, EngineError, ModelError, TemplateError, TokenizerError  # noqa: E402
from engine.io.gguf_file import GGUFFile  # noqa: E402
from engine.model.generate import SamplingConfig, generate, sample_next  # noqa: E402
from engine.model.model import Model  # noqa: E402
from engine.model.summary import summarize  # noqa: E402
from engine.testing import SynthSpec, model_metadata, random_weights, write_model  # noqa: E402
from engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402
from engine.train.data import load_jsonl, save_jsonl
from engine.train.encode import EncodeOptions, encode_samples

CATEGORIES = ("gguf", "vocab", "jsonl", "template", "sampling", *CLI_CATEGORIES)
SHARE = {"gguf": 0.26, "vocab": 0.08, "jsonl": 0.18, "template": 0.16, "sampling": 0.08, "outputs": 0.08,
         "values": 0.08, "types": 0.04, "adapters": 0.04}  # fmt: skip
FAILURES = ("traceback", "wrong", "hang", "changed")
TEMPLATE_SECONDS = 0.5  # the time limit templates get here (a spinning one costs this much)
REPO = Path(__file__).resolve().parents[1]


class _Hang(BaseException):
    """Raised by the alarm in a case past its time limit (a BaseException: `except Exception` in the
    code under test does not swallow it)."""


@dataclass
class Outcome:
    category: str
    case: str  # what the case did
    result: str  # "ok", "error", or one of FAILURES
    detail: str = ""  # the error message, or the traceback
    seconds: float = 0.0


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)

    def counts(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for o in self.outcomes:
            out.setdefault(o.category, Counter())[o.result] += 1
        return out

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result in FAILURES]


# -- files ----------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` with the sha256 of its bytes (regular files) or its kind."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file() and st.st_size < (64 << 20):
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = f"mode:{st.st_mode:o}:size:{st.st_size}"
    return out


# -- GGUF header map ------------------------------------------------------------------------------

_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass(frozen=True)
class HeaderField:
    offset: int  # byte offset in the file
    size: int  # 4 or 8 (or the value's size)
    kind: str  # "n_tensors", "n_kv", "key_len", "vtype", "str_len", "itype", "count", "value",
    # "name_len", "n_dims", "dim", "ttype", "toffset"
    name: str = ""  # the key or tensor it belongs to


def header_map(data: bytes) -> tuple[list[HeaderField], int]:
    """The fields of a well-formed GGUF header, and where the header ends."""
    fields: list[HeaderField] = []
    pos = 8

    def u32() -> int:
        nonlocal pos
        v = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        return v

    def u64() -> int:
        nonlocal pos
        v = struct.unpack_from("<Q", data, pos)[0]
        pos += 8
        return v

    fields.append(HeaderField(pos, 8, "n_tensors"))
    n_tensors = u64()
    fields.append(HeaderField(pos, 8, "n_kv"))
    n_kv = u64()

    def string(kind: str, name: str) -> str:
        nonlocal pos
        fields.append(HeaderField(pos, 8, kind, name))
        n = u64()
        s = data[pos : pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(vtype: int, name: str) -> None:
        nonlocal pos
        if vtype == 8:
            string("str_len", name)
        elif vtype == 9:
            fields.append(HeaderField(pos, 4, "itype", name))
            itype = u32()
            fields.append(HeaderField(pos, 8, "count", name))
            count = u64()
            for _ in range(count):
                value(itype, name)
        else:
            fields.append(HeaderField(pos, _SCALAR_SIZE[vtype], "value", name))
            pos += _SCALAR_SIZE[vtype]

    for _ in range(n_kv):
        key = string("key_len", "")
        fields.append(HeaderField(pos, 4, "vtype", key))
        value(u32(), key)
    for _ in range(n_tensors):
        name = string("name_len", "")
        fields.append(HeaderField(pos, 4, "n_dims", name))
        for _ in range(u32()):
            fields.append(HeaderField(pos, 8, "dim", name))
            pos += 8
        fields.append(HeaderField(pos, 4, "ttype", name))
        pos += 4
        fields.append(HeaderField(pos, 8, "toffset", name))
        pos += 8
    return fields, pos


_HYPERPARAMETERS = (
    "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "rope.dimension_count", "context_length",
    "feed_forward_length", "expert_count", "expert_used_count", "vocab_size", "rope.freq_base",
    "attention.layer_norm_rms_epsilon", "expert_feed_forward_length", "attention.scale",
    "rope.scaling.factor",
    "rope.scaling.type", "expert_gating_func",
)  # fmt: skip

EXTREMES = [0, 1, 2, 3, 7, 8, 31, 32, 33, 255, 256, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
            2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]  # fmt: skip


def _put(data: bytearray, f: HeaderField, value: int) -> None:
    data[f.offset : f.offset + f.size] = (value % (1 << (8 * f.size))).to_bytes(f.size, "little")


# -- the fuzzer -----------------------------------------------------------------------------------


class Fuzzer(CliCases):
    """Makes and runs cases; `workdir` holds the base models and one folder per case (the
    command-line categories are bench/fuzz_cli.py's)."""

    def __init__(self, workdir: str | os.PathLike[str], seed: int = 0, case_seconds: float = 10.0):
        self.workdir = Path(workdir)
        self.seed = seed
        self.case_seconds = case_seconds
        self.count = 0
        self._bases: list[tuple[str, SynthSpec, bytes, list[HeaderField], int]] | None = None
        self._tokenizer: Tokenizer | None = None
        self._templates: list[ChatTemplate] | None = None

    # -- fixtures ---------------------------------------------------------------------------------
    def bases(self) -> list[tuple[str, SynthSpec, bytes, list[HeaderField], int]]:
        """(name, spec, bytes, header fields, header end) of the valid models the cases start from."""
        if self._bases is None:
            folder = self.workdir / "base"
            folder.mkdir(parents=True, exist_ok=True)
            specs = {
                "llama-f32": SynthSpec.for_arch("llama", V=300, C=32, NH=2, NKV=1, HS=16, F=64, n_ctx=64),
                "qwen2-f16": SynthSpec.for_arch("qwen2", V=300, C=32, NH=2, NKV=1, HS=16, F=64, qtype="F16"),
                "qwen3moe-q8": SynthSpec.for_arch(
                    "qwen3moe", V=300, C=32, NH=2, NKV=1, HS=32, F_exp=32, qtype="Q8_0"
                ),
            }
            self._bases = []
            for name, spec in specs.items():
                md = {"general.alignment": 32}  # present, so that cases can corrupt it in place
                path = write_model(folder / f"{name}.gguf", spec, metadata=md)
                data = Path(path).read_bytes()
                fields, end = header_map(data)
                self._bases.append((name, spec, data, fields, end))
        return self._bases

    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self.bases()
            self._tokenizer = Tokenizer.from_gguf(self.workdir / "base" / "llama-f32.gguf")
        return self._tokenizer

    def templates(self) -> list[ChatTemplate]:
        if self._templates is None:
            folder = REPO / "tests" / "data" / "templates"
            sources = [CHATML_TEMPLATE] + [
                p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))
            ]
            self._templates = [ChatTemplate(s, bos_token="<s>", eos_token="</s>") for s in sources]
        return self._templates

    # -- running ----------------------------------------------------------------------------------
    def run(self, n: int, categories: tuple[str, ...] = CATEGORIES, on_outcome=None) -> Report:
        """n cases spread over `categories` (by SHARE), in a seeded order."""
        weights = [SHARE[c] for c in categories]
        total = sum(weights)
        plan: list[str] = []
        for c, w in zip(categories, weights, strict=True):
            plan += [c] * max(1, round(n * w / total))
        plan = plan[:n] if len(plan) >= n else plan + [categories[0]] * (n - len(plan))
        random.Random(self.seed).shuffle(plan)
        report = Report()
        self.bases()
        for category in plan:
            outcome = self.run_case(category)
            report.outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
        return report

    def run_case(self, category: str) -> Outcome:
        self.count += 1
        rng = random.Random(f"{self.seed}/{category}/{self.count}")
        folder = self.workdir / f"case{self.count:05d}"
        folder.mkdir(parents=True)
        out_dir = self.workdir / f"out{self.count:05d}"  # where a case may write (not an input)
        out_dir.mkdir()
        try:
            make = getattr(self, f"case_{category}")
            description, action, expected = make(rng, folder, out_dir)
        except Exception:  # noqa: BLE001 - a bug in the fuzzer itself is reported, not hidden
            return Outcome(category, "making the case", "traceback", traceback.format_exc())
        limit = self.case_seconds
        before = snapshot(folder)
        start = time.monotonic()
        result, detail = "ok", ""
        try:
            with _alarm(limit):
                action()
        except _Hang:
            result, detail = "hang", f"stopped after {limit:g} s"
        except Wrong as exc:
            result, detail = "wrong", str(exc)
        except expected as exc:
            result, detail = "error", f"{type(exc).__name__}: {exc}"
            if "\n" in str(exc) or not str(exc).strip():
                result, detail = "traceback", f"message not one line: {str(exc)!r}"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - anything else is what this harness looks for
            result, detail = "traceback", traceback.format_exc()
        seconds = time.monotonic() - start
        if seconds > limit and result != "hang":
            result, detail = "hang", f"took {seconds:.1f} s (limit {limit:g} s); {result}: {detail[:200]}"
        after = snapshot(folder)
        if after != before:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            result, detail = "changed", f"changed: {changed[:5]}; {result}: {detail[:200]}"
        _remove(folder)
        _remove(out_dir)
        return Outcome(category, description, result, detail, seconds)

    # -- gguf -------------------------------------------------------------------------------------
    def case_gguf(self, rng: random.Random, folder: Path, out: Path):
        name, spec, data, fields, end = rng.choice(self.bases())
        kind = rng.choice(
            ["truncate", "bitflip", "bytes", "field", "field", "type", "offset", "alignment", "duplicate",
             "meta", "meta", "meta", "vocab", "weights", "shape", "random"]
        )  # fmt: skip
        path = folder / "model.gguf"
        b = bytearray(data)
        desc = f"{name} {kind}"
        if kind == "truncate":
            cut = rng.randrange(0, end + 64) if rng.random() < 0.7 else rng.randrange(0, len(b))
            b = b[:cut]
            desc += f" at {cut}"
        elif kind == "bitflip":
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(4, end)
                b[i] ^= 1 << rng.randrange(8)
        elif kind == "bytes":
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(4, end)
                b[i] = rng.randrange(256)
        elif kind == "field":
            f = rng.choice([f for f in fields if f.kind != "value"])
            v = rng.choice(EXTREMES) if rng.random() < 0.8 else rng.getrandbits(8 * f.size)
            _put(b, f, v)
            desc += f" {f.kind} of {f.name!r} = {v}"
        elif kind == "type":
            f = rng.choice([f for f in fields if f.kind in ("vtype", "itype", "ttype")])
            v = rng.choice([rng.randrange(0, 45), rng.getrandbits(32)])
            _put(b, f, v)
            desc += f" {f.kind} of {f.name!r} = {v}"
        elif kind == "offset":
            offs = [f for f in fields if f.kind == "toffset"]
            f = rng.choice(offs)
            current = int.from_bytes(b[f.offset : f.offset + 8], "little")
            other = int.from_bytes(b[rng.choice(offs).offset :][:8], "little")
            v = rng.choice([current + 1, current + 16, current - 32, other, other + 32, 2**63, 2**64 - 32,
                            len(b), len(b) - end, 0])  # fmt: skip
            _put(b, f, v)
            desc += f" of {f.name!r} = {v}"
        elif kind == "alignment":
            f = next(f for f in fields if f.kind == "value" and f.name == "general.alignment")
            v = rng.choice([0, 1, 2, 3, 6, 24, 48, 64, 2**20, 2**31, 2**32 - 1])
            _put(b, f, v)
            desc += f" = {v}"
        elif kind == "duplicate":
            names = [f for f in fields if f.kind in ("name_len", "key_len")]
            a = rng.choice(names)
            la = int.from_bytes(b[a.offset : a.offset + 8], "little")
            same = [f for f in names if f is not a and f.kind == a.kind
                    and int.from_bytes(b[f.offset : f.offset + 8], "little") == la]  # fmt: skip
            if same:
                f = rng.choice(same)
                b[f.offset + 8 : f.offset + 8 + la] = b[a.offset + 8 : a.offset + 8 + la]
                desc += f" {a.kind} {bytes(b[a.offset + 8 : a.offset + 8 + la])!r}"
        elif kind in ("meta", "vocab", "shape"):
            b = bytearray(self._rewritten(rng, spec, kind, folder))
            desc += f" {self._last}"
        elif kind == "weights":
            desc += " " + self._poison(rng, b, name)
        elif kind == "random":
            b = bytearray(
                b"GGUF" + struct.pack("<I", rng.choice([2, 3])) + rng.randbytes(rng.randrange(16, 4096))
            )
        path.write_bytes(bytes(b))

        def action() -> None:
            _gguf_action(path)

        return desc, action, EngineError

    def _rewritten(self, rng: random.Random, spec: SynthSpec, kind: str, folder: Path) -> bytes:
        """A model written with one metadata value, vocabulary entry or tensor made hostile."""
        a = spec.arch
        md = model_metadata(spec)
        weights = random_weights(spec)
        bad_numbers = [0, -1, 1, 2, 3, 5, 7, 2**31, 2**40, 10**18, 1e30, math.nan, math.inf, -math.inf, 0.5,
                       "abc", "", [], [1, 2], [spec.L] * 3, True]  # fmt: skip
        if kind == "meta":
            keys = [f"{a}.{k}" for k in _HYPERPARAMETERS] + ["general.architecture", "general.type"]
            key = rng.choice(keys)
            related = [spec.L + 1, spec.L * 1000, spec.C * 2, spec.C + 1, spec.HS + 2, spec.HS - 1,
                       spec.NH + 1, spec.V + 1, spec.V - 1, spec.E + 1 if spec.E else 4]  # fmt: skip
            value = rng.choice(bad_numbers + related + ["gemma3", "adapter", "linear", "yarn"])
            if key == "rope.scaling.type":
                md[f"{a}.rope.scaling.type"] = "linear"
            md[key] = value
            self._last = f"{key} = {value!r}"
        elif kind == "vocab":
            n = spec.V
            choice = rng.randrange(9)
            if choice == 0:
                key = rng.choice(["bos", "eos", "unknown", "eot", "padding", "seperator", "mask"])
                md[f"tokenizer.ggml.{key}_token_id"] = rng.choice([n, n + 1, 2**31, -1, 2**32 - 1])
            elif choice == 1:
                md["tokenizer.ggml.scores"] = [math.nan if i == rng.randrange(n) else 0.0 for i in range(n)]
            elif choice == 2:
                md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.token_type"][: rng.randrange(n)] or [1]
            elif choice == 3:
                md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.token_type"] + [1, 1]
            elif choice == 4:
                md["tokenizer.ggml.scores"] = md["tokenizer.ggml.scores"][:-1]
            elif choice == 5:
                tokens = list(md["tokenizer.ggml.tokens"])
                tokens[rng.randrange(n)] = rng.choice(["", tokens[300 - 1], "x" * 5000, "\ud800"[:0] + "a b"])
                md["tokenizer.ggml.tokens"] = tokens
            elif choice == 6:
                md["tokenizer.ggml.model"] = rng.choice(["gpt2", "bert", "t5", "", "rwkv"])
                md["tokenizer.ggml.merges"] = rng.choice([["a"], ["a b c"], [" "], ["ab "], ["▁ t"], []])
            elif choice == 7:
                md["tokenizer.chat_template"] = rng.choice(
                    [
                        "{{",
                        "{% for %}",
                        "{{ ''.__class__ }}",
                        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                        "x" * 300_000,
                    ]  # fmt: skip
                )
            else:
                md["tokenizer.ggml.token_type"] = [rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 99])] * n
            self._last = f"vocab change {choice}"
        else:  # shape
            names = list(weights)
            victim = rng.choice(names)
            choice = rng.randrange(4)
            if choice == 0:
                del weights[victim]
            elif choice == 1:
                w = weights[victim]
                weights[victim] = w[: max(1, w.shape[0] // 2)]
            elif choice == 2:
                weights[f"blk.{rng.choice([spec.L, 50, 999999999])}.attn_norm.weight"] = np.ones(
                    spec.C, np.float32
                )
            else:
                w = weights[victim]
                weights[victim] = np.ones((*w.shape[:-1], w.shape[-1] * 2), np.float32)
            self._last = f"{victim} shape change {choice}"
        tmp = folder.parent / (folder.name + ".src.gguf")
        try:
            write_model(tmp, spec, weights=weights, metadata=md)
            return tmp.read_bytes()
        except EngineError:
            self._last += " (could not be written: the valid model instead)"
            return next(d for n, s, d, f, e in self.bases() if s == spec)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _poison(self, rng: random.Random, b: bytearray, base: str) -> str:
        """Write a NaN or an infinity into one tensor's stored values (its scale, for Q8_0)."""
        import gguf

        path = self.workdir / "base" / f"{base}.gguf"
        fields, end = header_map(path.read_bytes())
        g = GGUFFile(path)
        name = rng.choice(list(g.tensors))
        info = g.tensors[name]
        g.close()
        offset = next(f for f in fields if f.kind == "toffset" and f.name == name)
        start = -(-end // 32) * 32 + int.from_bytes(b[offset.offset : offset.offset + 8], "little")
        if info.qtype == "F32":
            where = start + 4 * rng.randrange(info.n_elements)
            b[where : where + 4] = struct.pack("<f", rng.choice([math.nan, math.inf, -math.inf]))
        elif info.qtype == "F16":
            where = start + 2 * rng.randrange(info.n_elements)
            b[where : where + 2] = rng.choice([b"\x00\x7e", b"\x00\x7c", b"\x00\xfc"])
        else:
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[info.qtype]][1]
            where = start + block * rng.randrange(info.n_bytes // block)
            b[where : where + 2] = rng.choice([b"\x00\x7e", b"\x00\x7c"])  # the block's f16 scale
        return f"{name} ({info.qtype}) poisoned"

    # -- vocab ------------------------------------------------------------------------------------
    def case_vocab(self, rng: random.Random, folder: Path, out: Path):
        if rng.random() < 0.5:
            md = dict(model_metadata(SynthSpec.for_arch("llama", V=300, C=32, NH=2, NKV=1, HS=16)))
        else:
            md = _bpe_metadata()
        n = len(md["tokenizer.ggml.tokens"])
        keys = [k for k in md if k.startswith("tokenizer.ggml.")]
        key = rng.choice(keys + ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id"])
        hostile: list[Any] = [n, n + 5, -1, 2**31, 2**64 - 1, None, "x", 1.5, True, [], [1] * (n + 1),
                              [math.nan] * n, [0.0] * (n - 1), ["a"] * n, ["a b c"], [" "], ["x "], [7] * n,
                              [""] * n, ["t"] * 3 + ["x" * 20000]]  # fmt: skip
        value = rng.choice(hostile)
        md[key] = value

        def action() -> None:
            tok = Tokenizer.from_metadata(md, "fuzz")
            for text in ("hello world", "<|im_start|>user\nhi", "😀 ü ñ", ""):
                ids = tok.encode(text, parse_special=True)
                if any(not 0 <= i < tok.n_vocab for i in ids):
                    raise Wrong(f"encode gave ids outside 0..{tok.n_vocab - 1}: {ids}")
                tok.decode(ids)
            try:
                tok.encode("a \ud800 lone surrogate")
            except TokenizerError:
                pass
            else:
                raise Wrong("a lone surrogate was tokenized")
            for name in ("bos_id", "eos_id", "unk_id", "pad_id"):
                i = getattr(tok, name)
                if i is not None and not 0 <= i < tok.n_vocab:
                    raise Wrong(f"{name} = {i} is outside the vocabulary of {tok.n_vocab}")

        return f"{key} = {_short(value)}", action, TokenizerError

    # -- jsonl ------------------------------------------------------------------------------------
    def case_jsonl(self, rng: random.Random, folder: Path, out: Path):
        special = rng.random()
        path = folder / "data.jsonl"
        if special < 0.12:
            what = rng.choice(["folder", "fifo", "devzero", "devnull", "empty", "missing", "sparse", "bom16",
                               "binary", "link"])  # fmt: skip
            if what == "folder":
                path.mkdir()
            elif what == "fifo":
                os.mkfifo(path)
            elif what == "devzero":
                path.symlink_to("/dev/zero")
            elif what == "devnull":
                path.symlink_to("/dev/null")
            elif what == "empty":
                path.write_bytes(b"")
            elif what == "sparse":
                with open(path, "wb") as f:
                    f.truncate((2 << 30) + 1)
            elif what == "bom16":
                path.write_bytes('{"text": "x"}\n'.encode("utf-16"))
            elif what == "binary":
                path.write_bytes(rng.randbytes(5000) + b"\0")
            elif what == "link":
                (folder / "real.jsonl").write_text('{"text": "linked"}\n', encoding="utf-8")
                path.symlink_to(folder / "real.jsonl")
            desc = f"path: {what}"
            n_lines = 2
        else:
            lines = [_hostile_line(rng) for _ in range(rng.randint(1, 12))]
            content = b"\n".join(lines) + rng.choice([b"", b"\n", b"\r\n"])
            if rng.random() < 0.05:
                content = b"\xef\xbb\xbf" + content
            path.write_bytes(content)
            n_lines = content.count(b"\n") + 1
            desc = f"{len(lines)} lines: " + " | ".join(
                _short(line.decode("utf-8", "replace"), 40) for line in lines[:3]
            )
        tok = self.tokenizer()
        template = rng.choice(self.templates())

        def action() -> None:
            samples, problems = load_jsonl(path)
            for p in problems:
                if "\n" in p.message or not 1 <= p.line <= n_lines:
                    raise Wrong(f"problem not on one line of the file: {p}")
            encoded, more = encode_samples(samples, tok, template, EncodeOptions(n_ctx=512))
            for p in more:
                if "\n" in p.message:
                    raise Wrong(f"problem message not one line: {p.message!r}")
            for e in encoded:
                if len(e.tokens) != len(e.trained) or (
                    len(e.tokens) and not 0 <= e.tokens.min() <= e.tokens.max() < tok.n_vocab
                ):
                    raise Wrong(f"sample {e.index}: tokens out of range or mask of the wrong length")
            if samples:
                copy = out / "copy.jsonl"
                save_jsonl(copy, samples)
                again, problems2 = load_jsonl(copy)
                if [(s.kind, s.messages, s.text, s.prompt, s.response, s.reward) for s in again] != [
                    (s.kind, s.messages, s.text, s.prompt, s.response, s.reward) for s in samples
                ]:
                    raise Wrong("saving and loading again changed the samples")

        return desc, action, DatasetError

    # -- template ---------------------------------------------------------------------------------
    def case_template(self, rng: random.Random, folder: Path, out: Path):
        source = _hostile_template(rng, self.templates())
        messages = _hostile_messages(rng)
        extra = rng.choice([{}, {"tools": [{"type": "function", "function": {"name": "f"}}]},
                            {"enable_thinking": False}, {"x": "y" * 1000}])  # fmt: skip
        spans = rng.random() < 0.5

        def action() -> None:
            t = ChatTemplate(source, bos_token="<s>", eos_token="</s>", time_limit=TEMPLATE_SECONDS)
            text = t.render(messages, add_generation_prompt=rng.random() < 0.5, **extra)
            if not isinstance(text, str):
                raise Wrong(f"render returned a {type(text).__name__}")
            if spans:
                text, found = t.render_with_spans(messages, **extra)
                last = 0
                for a, b in found:
                    if not last <= a < b <= len(text):
                        raise Wrong(f"spans out of order or outside the text: {found}")
                    last = b

        return f"{_short(source, 80)} with {len(messages)} messages", action, TemplateError

    # -- sampling ---------------------------------------------------------------------------------
    def case_sampling(self, rng: random.Random, folder: Path, out: Path):
        B, V = rng.randint(1, 3), rng.choice([1, 2, 5, 50])
        nprng = np.random.default_rng(rng.getrandbits(32))
        logits = nprng.standard_normal((B, V)) * rng.choice([1.0, 1e3, 1e30, 1e300])
        pattern = rng.choice(["none", "nan", "posinf", "neginf", "allnan", "allneginf", "mixed"])
        mask = nprng.random((B, V)) < 0.3
        if pattern == "nan":
            logits[mask] = np.nan
        elif pattern == "posinf":
            logits[mask] = np.inf
        elif pattern == "neginf":
            logits[mask] = -np.inf
        elif pattern == "allnan":
            logits[:] = np.nan
        elif pattern == "allneginf":
            logits[:] = -np.inf
        elif pattern == "mixed":
            logits[mask] = nprng.choice([np.nan, np.inf, -np.inf], size=int(mask.sum()))
        dtype = rng.choice([np.float32, np.float64, np.float16])
        with np.errstate(over="ignore"):
            logits = logits.astype(dtype)

        def pick(good: list, bad: list) -> Any:
            return rng.choice(good if rng.random() < 0.7 else bad)

        params = dict(
            temperature=pick([0.0, 0.1, 0.8, 1.0, 2.0, 1e-300, 1e300], [-1.0, math.nan, math.inf, "1", None]),
            top_k=pick([0, 1, 2, 40, 10**9], [-1, 1.5, True, "3"]),
            top_p=pick([1.0, 0.9, 0.5, 1e-9], [0.0, -0.1, 1.5, math.nan]),
            min_p=pick([0.0, 0.05, 0.5, 1.0], [-0.1, 1.1, math.nan]),
            seed=pick([None, 0, 1, 2**40], [-1, 1.5, "x"]),
            max_new_tokens=pick([1, 128], [0, -5, 2.0]),
        )

        def action() -> None:
            cfg = SamplingConfig(**params)
            out_ = sample_next(logits, cfg, np.random.default_rng(0))
            z = logits.astype(np.float64)
            for b, t in enumerate(np.asarray(out_).tolist()):
                if not 0 <= t < V:
                    raise Wrong(f"sampled token {t} outside 0..{V - 1}")
                if np.isnan(z[b, t]) or (np.isposinf(z[b]).any() and not np.isposinf(z[b, t])):
                    raise Wrong(f"sampled token {t} with logit {z[b, t]} from row {z[b].tolist()[:8]}")

        return f"{pattern} {dtype.__name__} B={B} V={V} {params}", action, EngineError


# -- case pieces ----------------------------------------------------------------------------------


def _short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _alarm(seconds: float):
    """Raise _Hang in this thread after `seconds` (main thread, POSIX); elsewhere a no-op."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def ring(signum, frame):
        raise _Hang()

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _gguf_action(path: Path) -> None:
    """Load the file every way the engine does. Each way may fail with its engine error; the first
    such error is raised at the end (the case's outcome), any other exception at once."""
    errors: list[EngineError] = []

    def attempt(run: Callable[[], Any], expected: tuple[type[EngineError], ...]) -> Any:
        try:
            return run()
        except expected as exc:
            errors.append(exc)
            return None

    model = attempt(lambda: Model.load(path, cache_budget="16M"), (ModelError,))
    if model is not None:
        tokens = np.array([1, 2, 3], dtype=np.int64) % model.config.V
        logits = attempt(lambda: model.forward(tokens), (ModelError,))
        if logits is not None and not np.isfinite(logits).all():
            raise Wrong("the model loaded and gave non-finite logits without an error")
        attempt(
            lambda: generate(model, [1 % model.config.V], sampling=SamplingConfig(max_new_tokens=2, seed=0)),
            (ModelError,),
        )
    attempt(lambda: summarize(path), (ModelError,))
    attempt(lambda: Tokenizer.from_gguf(path).encode("hello world"), (ModelError, TokenizerError))
    md = attempt(lambda: GGUFFile(path).metadata, (ModelError,))
    if md is not None:
        messages = [{"role": "user", "content": "hi"}]
        attempt(
            lambda: ChatTemplate.from_metadata(md).render(messages, add_generation_prompt=True),
            (ModelError, TemplateError),
        )
    if errors:
        raise errors[0]


def _bpe_metadata() -> dict:
    """A tiny byte-level BPE vocabulary: the 256 byte characters and a few merges."""
    from engine.text.llama_vocab import BYTE_TO_CHAR

    tokens = [BYTE_TO_CHAR[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    tokens += ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 3) + [3, 3, 3],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": len(tokens) - 1,
        "tokenizer.ggml.eos_token_id": len(tokens) - 2,
    }


def _json_value(rng: random.Random, depth: int = 0) -> str:
    """JSON text of a random, often hostile, value."""
    r = rng.random()
    if depth > 3 or r < 0.45:
        return rng.choice([
            "0", "-1", "1e999", "-1e999", "NaN", "Infinity", "1" * rng.choice([5, 400, 4301, 5000]),
            "1.5e-400",
            "true", "null", '""', '"hi"', '"\\ud800"', '"\\udfff x"', '"\\ud83d\\ude00"', '"\\u0000"',
            '"a\u2028b"', json.dumps("x" * rng.choice([10, 1000, 300_000])), '"\\n\\t"', '"<|im_end|>"',
            '"' + "é" * 50 + '"', '"\\"', "[", "{", "}", '"\xff"',
        ])  # fmt: skip
    if r < 0.6:
        n = rng.choice([1, 2, 30, 200, 2000])
        return "[" * n + "1" + "]" * (n if rng.random() < 0.9 else n - 1)
    if r < 0.8:
        return "[" + ", ".join(_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    keys = ['"role"', '"content"', '"messages"', '"text"', '"x"', '"reward"', '"\\ud800"', '"tool_calls"']
    return (
        "{"
        + ", ".join(f"{rng.choice(keys)}: {_json_value(rng, depth + 1)}" for _ in range(rng.randint(0, 4)))
        + "}"
    )


def _hostile_line(rng: random.Random) -> bytes:
    """One line of a dataset file: a valid sample, a sample with one hostile part, or junk."""
    good_messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello world"}]
    r = rng.random()
    if r < 0.2:
        line = json.dumps(rng.choice([
            {"messages": good_messages},
            {"prompt": "question", "response": "answer", "reward": 0.5},
            {"text": "the quick brown fox"},
            {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
            {"instruction": "add", "input": "2 and 2", "output": "4"},
            {"messages": good_messages * rng.choice([5, 60]), "score": 1},
        ]))  # fmt: skip
        return line.encode()
    if r < 0.65:
        v = _json_value(rng)
        shape = rng.choice([
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": %s}]}',
            '{"messages": [{"role": %s, "content": "q"}, {"role": "assistant", "content": "a"}]}',
            '{"messages": %s}',
            '{"messages": [%s, {"role": "assistant", "content": "a"}]}',
            '{"messages": [{"role": "assistant", "content": "", "tool_calls": %s}]}',
            '{"prompt": %s, "response": "r"}',
            '{"prompt": "p", "response": %s}',
            '{"text": %s}',
            '{"text": "t", "reward": %s}',
            '{"conversations": %s}',
            '{"instruction": %s, "output": "o"}',
            '{"messages": [{"role": "user", "content": "q"}, '
            '{"role": "assistant", "content": "a", "x": %s}]}',
            "%s",
        ])  # fmt: skip
        return (shape % v).encode("utf-8", "surrogatepass")
    if r < 0.75:
        return rng.choice([b"\xff\xfe{", b'{"text": "caf\xe9"}', b'{"text": "\xc3"}', b"\x80abc",
                           b"\xed\xa0\x80",
                           b'{"te\x01xt": 1}', b'{"text": "a\x1fb"}', b"   ", b"", b"\r"])  # fmt: skip
    if r < 0.85:
        return json.dumps({"messages": _hostile_messages(rng)}, ensure_ascii=rng.random() < 0.5).encode(
            "utf-8", "surrogatepass"
        )
    junk = rng.randbytes(rng.randrange(1, 200)).replace(b"\n", b" ")
    return junk if rng.random() < 0.1 else junk.replace(b"\0", b" ")  # NUL: the file is binary


def _hostile_messages(rng: random.Random) -> list:
    roles = ["user", "assistant", "system", "tool", "bot", "", None, 5]
    contents: list[Any] = ["hi", "", " ", "x" * rng.choice([1, 5000, 200_000]), "<|im_end|>",
                           "<think>a</think>b",
                           "[INST]", "\u2028", "😀", None, 7, ["a"], {"a": 1}]  # fmt: skip
    n = rng.choice([0, 1, 2, 3, 4, 20, 40])
    malformed = rng.random() < 0.15  # now and then a conversation with an item that is no message
    out = []
    for i in range(n):
        if not malformed or rng.random() < 0.8:
            m: Any = {"role": ["user", "assistant"][i % 2], "content": f"turn {i}"}
            if rng.random() < 0.2:
                m["content"] = rng.choice(contents)
            if rng.random() < 0.1:
                m["role"] = rng.choice(roles)
            if rng.random() < 0.05:
                m["tool_calls"] = rng.choice([[{"function": {"name": "f", "arguments": {}}}], "x", [1]])
            if rng.random() < 0.05:
                m["reasoning_content"] = rng.choice(["why", None, 5])
        else:
            m = rng.choice([{}, {"role": "user"}, {"content": "x"}, "text", 5, None, []])
        out.append(m)
    return out


def _doubling(seed: str, step: str) -> str:
    """A template that sets ns.s = `step` 80 times, from `seed`: each step doubles it, or more."""
    loop = f"{{% for i in range(80) %}}{{% set ns.s = {step} %}}{{% endfor %}}"
    return f"{{% set ns = namespace(s={seed}) %}}{loop}"


_TEMPLATE_PIECES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    _doubling("'ab'", "ns.s ~ ns.s"),
    _doubling("'ab'", "ns.s + ns.s"),
    _doubling("[1]", "ns.s + ns.s"),
    _doubling("'ab'", "[ns.s, ns.s]|join"),
    _doubling("'ab'", "ns.s|replace('a', ns.s)"),
    _doubling("'%s%s'", "ns.s|format(ns.s, ns.s)"),
    _doubling("'ab'", "ns.s * 2"),
    "{% set ns = namespace(x=3) %}{% for i in range(80) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    _doubling("'{0}{0}'", "ns.s.format(ns.s)"),
    _doubling("'ab'", "'%s%s' % (ns.s, ns.s)"),
    _doubling("'ab'", "'{0}{0}'.format(ns.s)"),
    _doubling("'a b'", "(ns.s ~ ' ' ~ ns.s).split()|join(' ')"),
    _doubling("'ab'", "(ns.s * 2)|list|join"),
    _doubling("'ab'", "ns.s|center(ns.s|length * 2)"),
    "{% set ns = namespace(d={}) %}{% for i in range(99999) %}{% set ns.d = dict(ns.d, **{i|string: i}) %}"
    "{% endfor %}",
    "{{ 'x' * 10 ** 12 }}", "{{ 9 ** 9 ** 9 }}", "{{ 'x'|center(2 ** 40) }}", "{{ 'x'.ljust(2 ** 40) }}",
    "{{ 'x'.rjust(10 ** 10) }}", "{{ 'x'.zfill(10 ** 10) }}", "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}", "{{ '{:{w}}'.format(1, w=10 ** 10) }}",
    "{{ '%*d'|format(10 ** 10, 1) }}",
    "{{ 'a'|indent(10 ** 10) }}", "{{ range(99999)|join('x' * 99999) }}", "{{ lipsum(10 ** 9) }}",
    "{{ (1).to_bytes(10 ** 10, 'big') }}", "{{ range(10)|batch(10 ** 10, 0)|list }}",
    "{{ range(10)|slice(10 ** 10)|list }}", "{{ {'a': [1]}|tojson(indent=10 ** 9) }}",
    "{{ ('\\t' * 99999).expandtabs(99999) }}", "{{ ('a' * 9999).translate({97: 'b' * 99999}) }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x') }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{% set x %}{% for i in range(99999) %}{{ 'y' * 99999 }}{% endfor %}{% endset %}",
    "{% filter upper %}{% for i in range(99999) %}{{ 'y' * 99999 }}{% endfor %}{% endfilter %}",
    "{{ messages * 10 ** 9 }}", "{{ (range(99999)|list) * 99999 }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}", "{{ cycler.__init__.__globals__.os }}",
    "{{ joiner.__init__.__globals__ }}", "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ '{0.__class__.__mro__}'.format('') }}", "{{ '{0.__globals__}'.format(raise_exception) }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}", "{{ self.__init__.__globals__ }}",
    "{{ (range(3)|map('string')).gi_frame.f_globals }}", "{{ messages.append(1) }}", "{{ messages.pop() }}",
    "{{ raise_exception('stop') }}", "{{ raise_exception('two\\nlines' * 999) }}",
    "{{ x.y.z }}", "{{ none.x() }}", "{{ 1 / 0 }}", "{{ [] | first | x }}",
    "{% include 'x' %}", "{% extends 'x' %}", "{% import 'x' as y %}", "{{ }}", "{% for %}", "{%", "{{",
    "{% if %}", "{% endfor %}", "{{ (" * 300 + "1" + ")" * 300 + " }}", "{% if 1 %}" * 2000,
    "{{ messages[0]['content'] * 1000 }}", "{{ messages|tojson }}", "{{ messages|string|length }}",
    "{{ '9' * 5000 | int }}", "{{ 2 ** 70000 }}", "{{ (2 ** 60000) | string }}", "{{ 1e308 * 10 }}",
    "{% for m in messages %}{{ m.content|wordwrap(1) }}{% endfor %}",
    "{% for m in messages %}{{ m.content|striptags|urlize }}{% endfor %}",
    "{% for m in messages %}{{ m['role'] + m['content'] }}{% endfor %}",
    "{{ bos_token }}{% for m in messages %}{{ m.role ~ ': ' ~ m.content ~ eos_token }}{% endfor %}",
]  # fmt: skip


def _hostile_template(rng: random.Random, templates: list[ChatTemplate]) -> str:
    r = rng.random()
    if r < 0.45:
        return "".join(rng.choice(_TEMPLATE_PIECES) for _ in range(rng.randint(1, 2)))
    if r < 0.75:  # a real template with a few characters changed
        source = list(rng.choice(templates).source)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(source))
            op = rng.randrange(3)
            if op == 0:
                del source[i]
            elif op == 1:
                source.insert(i, rng.choice("{}%#()[]|~*+'\"\\ \n-aZ0_."))
            else:
                source[i] = rng.choice("{}%()|~*'\"")
        return "".join(source)
    if r < 0.85:
        return rng.choice(templates).source + rng.choice(_TEMPLATE_PIECES)
    if r < 0.95:
        return "".join(
            rng.choice("{}%#()|~*+-'\" \nabcfor inendsetmacro") for _ in range(rng.randrange(1, 300))
        )
    return rng.choice(["x" * 300_000, "{{ x }}" * 40_000, "\x00\ud800", ""])


# -- command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=2500, help="number of cases (default 2500)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the case generators (default 1)")
    ap.add_argument("--only", choices=CATEGORIES, action="append", help="run only these categories")
    ap.add_argument("--case-seconds", type=float, default=10.0, help="time limit per case (default 10)")
    ap.add_argument("--show", type=int, default=5, help="failures shown in full (default 5)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # the engine's warnings about the files it is fed
    np.seterr(all="ignore")  # overflow in the forward pass of a model made of corrupt bytes
    categories = tuple(args.only) if args.only else CATEGORIES
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tune-fuzz-") as tmp:
        # train's prepared datasets go to the app's data folder: a throwaway one here, not the user's
        os.environ["TUNE_STUDIO_DATA"] = os.path.join(tmp, "app-data")
        fuzzer = Fuzzer(tmp, args.seed, args.case_seconds)
        done = 0

        def progress(o: Outcome) -> None:
            nonlocal done
            done += 1
            if o.result in FAILURES:
                print(f"  [{done}] {o.category}: {o.result}: {o.case[:100]}", flush=True)
            elif done % 250 == 0:
                print(f"  {done} cases, {time.monotonic() - start:.0f} s", flush=True)

        report = fuzzer.run(args.n, categories, on_outcome=progress)
    counts = report.counts()
    print(f"\n{len(report.outcomes)} cases in {time.monotonic() - start:.0f} s (seed {args.seed})")
    results = ("ok", "error", *FAILURES)
    print(f"{'category':10s}" + "".join(f"{r:>11s}" for r in results))
    total: Counter = Counter()
    for c in categories:
        total.update(counts.get(c, Counter()))
        print(f"{c:10s}" + "".join(f"{counts.get(c, Counter())[r]:>11d}" for r in results))
    print(f"{'all':10s}" + "".join(f"{total[r]:>11d}" for r in results))
    slowest = max(report.outcomes, key=lambda o: o.seconds)
    print(f"slowest case: {slowest.seconds:.2f} s ({slowest.category}: {slowest.case[:80]})")
    print(f"peak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    for o in report.failures()[: args.show]:
        print(f"\n--- {o.category}: {o.result}: {o.case}\n{o.detail}")
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
