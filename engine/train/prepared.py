"""Prepared training data: a dataset's samples as tokens and trained masks in memory-mapped files,
kept in a cache folder and reused while nothing that shaped them changed.

`prepare_data(source, tokenizer, template, options, cache=folder)` reads a JSON Lines file (or
takes a list of samples), encodes every sample exactly as `encode_samples` does, and writes, as
it goes, one folder:

    tokens.bin     every kept sample's tokens, one after the other (uint16; int32 for vocabularies
                   of more than 65,536 tokens)
    trained.bin    one byte per token: 1 where the model learns that token
    samples.npy    one row per sample read (dropped ones too, `SAMPLE_DTYPE`): where its tokens
                   start, how many were kept, its trained tokens after the first, its line, reward
                   (NaN: none), group number (-1: a group of its own) and flags
    read.jsonl     what reading the file found, one JSON array per problem, in line order
    encode.jsonl   what encoding the samples found, in sample order
    meta.json      what shaped the data (SHA-256 of the dataset, the chat template, the tokenizer,
                   the settings and the code that prepares), counts, and the size and SHA-256 of
                   every other file; written last

Memory stays bounded whatever the size of the dataset: samples are read, rendered, tokenized (on
the library's threads, while the next ones are read) and written a few hundred at a time; what
stays in memory is one table row per sample and a 16-byte fingerprint per distinct sample
(duplicates) and per group. `PreparedData` maps the files back; `PackedBatches` builds one
epoch's batches from them on demand, the batches `batch_encoded` would make.

The cache is one folder per prepared dataset under the folder the caller gives (the project's runs
folder; `default_cache_folder()` under the app's data folder otherwise), named by a hash of what
shaped it. An entry is used only when its meta.json names the same dataset, template, tokenizer,
settings and code, and every file has the size and SHA-256 it lists: a stale or damaged entry is
prepared again, never trusted. Entries are written under a temporary name and renamed into
place; the least recently used beyond `MAX_ENTRIES` are removed.

For a preference objective (DPO, ORPO) `prepare_data(..., pairs=True)` prepares each preference
pair as two rows, its chosen answer then its rejected one (`engine.train.pref_data` reads them
back as pairs and batches them); that choice is part of the cache key.

What this module is not: it does not split, weight or shuffle samples (the trainer does, from
the group numbers and rewards here); samples given as a list are prepared into a temporary
folder, not cached.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError
from ..io.files import atomic_write, user_data_folder
from .batches import Batch, BatchesOnDemand, make_batches, pack_order
from .data import Problem, Sample, digest, iter_jsonl
from .encode import Encoded, EncodedChunk, EncodeOptions, encode_chunks
from .pref_data import pair_rows

if TYPE_CHECKING:
    from ..text.chat_template import ChatTemplate
    from ..text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT = "tune-studio prepared data 1"
MAX_ENTRIES = 8  # prepared datasets kept in a cache folder (least recently used removed first)
_STALE_TEMPORARY_S = 3600.0  # a temporary entry older than this was left by a process that died
_BLOCK = 1 << 20

KEPT, TRUNCATED = 1, 2  # flags of a sample: it has tokens; they were cut to n_ctx
SAMPLE_DTYPE = np.dtype(
    [
        ("start", "<i8"),  # first of its tokens in tokens.bin
        ("length", "<i4"),  # tokens kept (0: the sample was dropped)
        ("targets", "<i4"),  # trained tokens after its first: the loss terms it gives
        ("line", "<i8"),  # its line in the file (0: made in memory)
        ("reward", "<f8"),  # NaN: none
        ("group", "<i8"),  # samples answering the same prompt share it; -1: a group of its own
        ("flags", "u1"),  # KEPT | TRUNCATED
    ]
)
_FILES = ("tokens.bin", "trained.bin", "samples.npy", "read.jsonl", "encode.jsonl")
_PROBLEM_FILES = {"read": "read.jsonl", "encode": "encode.jsonl"}


@dataclass(frozen=True)
class PrepareProgress:
    """How far `prepare_data` is (sent every few hundred samples)."""

    phase: str  # "checking" (hashing the dataset, or a cached entry), "preparing", "done"
    done: int  # bytes of the dataset (or of the entry) handled so far
    total: int  # bytes in all (0 when unknown: samples given in memory)
    samples: int  # samples prepared so far


def default_cache_folder() -> str:
    """Where prepared datasets go when the caller names no folder: `prepared` in the app's data
    folder (`engine.io.files.user_data_folder`, the folder the studio keeps its runs in)."""
    return os.path.join(user_data_folder(), "prepared")


# -- what shaped the data ------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """SHA-256 of the code that turns samples into tokens (these modules and the libraries'
    versions): a changed encoder never reuses what an older one prepared."""
    import jinja2
    import tokenizers

    from ..text import chat_template, content_flow, tokenizer
    from . import data, pref_data

    h = hashlib.sha256(FORMAT.encode())
    for module in (data, pref_data, chat_template, content_flow, tokenizer, sys.modules[__name__]):
        try:
            h.update(Path(module.__file__ or "").read_bytes())
        except OSError:
            h.update((module.__name__ + "?").encode())
    h.update(f"jinja2 {jinja2.__version__} tokenizers {tokenizers.__version__}".encode())
    return h.hexdigest()


def _file_sha256(path: str, on_block: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            if on_block is not None:
                on_block(len(block))
    return h.hexdigest()


def _shaped_by(
    dataset_sha256: str,
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
    pairs: bool = False,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "dataset_sha256": dataset_sha256,
        "tokenizer": tokenizer.fingerprint,
        "template": template.fingerprint() if template is not None else None,
        "options": {
            "n_ctx": options.n_ctx,
            "train_on_prompt": options.train_on_prompt,
            "prompt_format": options.prompt_format,
        },
        "rows": "pairs" if pairs else "samples",  # pairs: each preference pair as two rows (DPO, ORPO)
        "code": _code_fingerprint(),
    }


def _key(shaped_by: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(shaped_by, sort_keys=True).encode()).hexdigest()[:40]


# -- the prepared data ---------------------------------------------------------------------------


class PreparedData:
    """A prepared dataset, its files memory-mapped (see the module docstring).

    `samples` is the table of every sample read (`SAMPLE_DTYPE`), in file order; `encoded(i)` is
    sample i's tokens and trained mask as `encode_samples` made them (views of the files, tokens
    copied to int32). `reused`: it came from the cache. `close()` (or losing the last reference)
    releases the files, and removes a temporary folder."""

    def __init__(
        self,
        folder: str | None,
        meta: dict[str, Any],
        *,
        reused: bool = False,
        temporary: bool = False,
        arrays: tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, bytes]] | None = None,
    ):
        """The data in `folder` (its files mapped), or in memory (`arrays`: the samples table, tokens,
        trained mask and the problem files' bytes)."""
        self.folder = folder
        self.meta = meta
        self.reused = reused
        self.dataset_sha256: str | None = meta["shaped_by"]["dataset_sha256"]
        self.n_read_problems = int(meta["n_read_problems"])
        self.n_encode_problems = int(meta["n_encode_problems"])
        self._problem_bytes: dict[str, bytes] | None = None
        if arrays is not None:
            self.samples, self.tokens, self.trained, self._problem_bytes = arrays
        else:
            assert folder is not None
            self.samples = np.load(os.path.join(folder, "samples.npy"), allow_pickle=False)
            n_tokens = int(meta["n_tokens"])
            self.tokens = _map(os.path.join(folder, "tokens.bin"), np.dtype(meta["token_dtype"]), n_tokens)
            self.trained = _map(os.path.join(folder, "trained.bin"), np.dtype(np.bool_), n_tokens)
        self._finalizer = (
            weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
            if temporary and folder is not None
            else None
        )

    def __len__(self) -> int:
        return len(self.samples)

    def encoded(self, i: int, index: int | None = None, weight: float = 1.0) -> Encoded:
        """Sample i as `Encoded` (index: what `Encoded.index` says, by default i). Dropped samples
        have no encoding (ValueError)."""
        row = self.samples[i]
        if not row["flags"] & KEPT:
            raise ValueError(f"sample {i} was dropped when it was encoded: it has no tokens")
        a, n = int(row["start"]), int(row["length"])
        return Encoded(
            i if index is None else index,
            np.asarray(self.tokens[a : a + n], dtype=np.int32),
            self.trained[a : a + n],
            weight,
            bool(row["flags"] & TRUNCATED),
        )

    def problems(self) -> Iterator[tuple[str, int, Problem]]:
        """(stage, sample, problem) of every problem: stage "read" (sample -1) in line order, then
        stage "encode" in sample order. An
        encoding problem of a sample made in memory (line 0) has no "sample N: " before its
        message: the position of the sample in the list it is encoded with goes there."""
        for stage, name in _PROBLEM_FILES.items():
            if self._problem_bytes is not None:
                text = self._problem_bytes[name].decode("utf-8", "surrogatepass")
                lines: Iterable[str] = text.split("\n")[:-1]
            else:
                assert self.folder is not None
                lines = open(os.path.join(self.folder, name), encoding="utf-8", errors="surrogatepass")  # noqa: SIM115
            try:
                for line_text in lines:
                    sample, line, severity, message = json.loads(line_text)
                    yield stage, sample, Problem(line, message, severity)
            finally:
                if hasattr(lines, "close"):
                    lines.close()

    def close(self) -> None:
        self.tokens = self.trained = np.zeros(0)
        if self._finalizer is not None:
            self._finalizer()

    def __repr__(self) -> str:
        kept = int(np.count_nonzero(self.samples["flags"] & KEPT))
        return (
            f"PreparedData({self.folder!r}, {len(self)} samples, {kept} kept, {len(self.tokens)} tokens, "
            f"reused={self.reused})"
        )


def _map(path: str, dtype: np.dtype, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


class PackedBatches(BatchesOnDemand):
    """One epoch's batches of some prepared samples, made when asked for: what `batch_encoded`
    gives for the same samples, weights and seed, without holding them all.

    rows: the samples (rows of `data.samples`, all kept) in the order `encode_samples` would list
    them; positions: their `Encoded.index`; weights: indexed by position (None: all 1)."""

    def __init__(
        self,
        data: PreparedData,
        rows: np.ndarray,
        positions: np.ndarray,
        weights: np.ndarray | None,
        n_ctx: int,
        batch_size: int,
        *,
        shuffle_seed: int | None = None,
        normalize: str = "tokens",
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.data, self.rows, self.positions, self.weights = data, rows, positions, weights
        self.n_ctx, self.batch_size, self.normalize = n_ctx, batch_size, normalize
        table = data.samples[rows]
        lengths = table["length"].astype(np.int64)
        if len(lengths) and lengths.max() > n_ctx:
            raise ValueError(f"a sample has {lengths.max()} tokens, more than n_ctx={n_ctx}")
        self._items, self._starts = pack_order(lengths, n_ctx, shuffle_seed=shuffle_seed)
        self.n_windows = len(self._starts) - 1
        self.n_tokens = int(lengths.sum())  # sample tokens per epoch (no padding)
        self.n_label_tokens = int(table["targets"].sum())  # tokens with a loss term per epoch

    def __len__(self) -> int:
        return math.ceil(self.n_windows / self.batch_size)

    def _make(self, i: int) -> Batch:
        first = i * self.batch_size
        last = min(first + self.batch_size, self.n_windows)
        windows = [
            [self._encoded(int(k)) for k in self._items[self._starts[w] : self._starts[w + 1]]]
            for w in range(first, last)
        ]
        return make_batches(windows, self.batch_size, self.n_ctx, normalize=self.normalize)[0]

    def _encoded(self, k: int) -> Encoded:
        position = int(self.positions[k])
        weight = float(self.weights[position]) if self.weights is not None else 1.0
        return self.data.encoded(int(self.rows[k]), position, weight)


# -- preparing -----------------------------------------------------------------------------------


def prepare_data(
    source: str | os.PathLike[str] | Iterable[Sample],
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
    *,
    cache: str | os.PathLike[str] | None = None,
    on_progress: Callable[[PrepareProgress], None] | None = None,
    pairs: bool = False,
) -> PreparedData:
    """A dataset prepared for training (see the module docstring).

    `pairs`: for a preference objective (DPO, ORPO): each preference pair becomes two rows, its
    chosen answer (row 2k) and its rejected one (row 2k + 1), and every other sample is left out
    with a warning among the reading problems (`engine.train.pref_data.pair_rows`; read the pairs
    back with `pref_data.PreparedPairs`). It is part of the cache key.

    `source`: a JSON Lines file, or samples in memory. `cache`: the folder that keeps prepared
    files of datasets read from files, reused while the dataset, template, tokenizer, settings
    and code are unchanged; None prepares into a temporary folder, removed when the result is
    closed. `DatasetError` when the file cannot be read (as `load_jsonl`), or the cache folder or
    a temporary one cannot be written (with the reason); nothing half-written is ever left
    looking usable.
    """
    report = on_progress or (lambda progress: None)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            total = os.path.getsize(path)
        except OSError:
            total = 0  # iter_jsonl says what is wrong with it
        done = [0]

        def hashed(n: int) -> None:
            done[0] += n
            report(PrepareProgress("checking", done[0], total, 0))

        try:
            dataset_sha256 = _file_sha256(path, hashed) if total else hashlib.sha256(b"").hexdigest()
        except OSError:
            dataset_sha256 = ""  # unreadable: reading it below raises the DatasetError that says why
        shaped_by = _shaped_by(dataset_sha256, tokenizer, template, options, pairs)
        if cache is not None and dataset_sha256:
            found = _open_cached(os.fspath(cache), shaped_by, report)
            if found is not None:
                return found
        read = [0]
        problems: list[Problem] = []
        samples: Iterable[Sample] = iter_jsonl(path, problems, read)
        if pairs:
            samples = pair_rows(samples, problems)
    else:  # samples in memory: prepared in memory
        shaped_by = _shaped_by("", tokenizer, template, options, pairs)
        shaped_by["dataset_sha256"] = None
        writer = _Writer(None, _token_dtype(tokenizer))
        found: list[Problem] = []
        rows = pair_rows(source, found) if pairs else source
        meta = _write(writer, rows, found, [0], 0, tokenizer, template, options, report)
        meta["shaped_by"] = shaped_by
        report(PrepareProgress("done", 0, 0, meta["n_samples"]))
        return PreparedData(None, meta, arrays=writer.arrays())
    folder, final = _new_folder(cache, shaped_by)
    try:
        writer = _Writer(folder, _token_dtype(tokenizer))
        meta = _write(writer, samples, problems, read, total, tokenizer, template, options, report)
        meta["shaped_by"] = shaped_by
        with atomic_write(os.path.join(folder, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        if final is not None:
            if not _publish(folder, final, shaped_by):  # another process wrote the same entry first
                shutil.rmtree(folder, ignore_errors=True)
            folder = final
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if final is not None:
        _prune(os.path.dirname(final), keep=final)
    report(PrepareProgress("done", total, total, meta["n_samples"]))
    return PreparedData(folder, meta, temporary=final is None)


def _publish(folder: str, final: str, shaped_by: dict[str, Any]) -> bool:
    """Rename the complete `folder` to the cache entry `final`: True when it was renamed, False when
    an intact entry of the same key is already there (another process, such as another rank of a
    data-parallel run, prepared the same data at the same time: its entry is used, never removed
    while that process maps its files). A damaged or stale entry is replaced."""
    for _ in range(3):
        try:
            os.rename(folder, final)  # fails when `final` exists and is not empty
            return True
        except OSError as exc:
            if not os.path.isdir(final):
                raise
            if _damage(final, shaped_by, lambda progress: None) is None:
                return False
            log.warning("%s: replacing the damaged prepared dataset (%s)", final, exc.strerror or exc)
            shutil.rmtree(final, ignore_errors=True)
    os.replace(folder, final)
    return True


def _token_dtype(tokenizer: Tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if tokenizer.n_vocab <= 1 << 16 else np.int32)


def _new_folder(cache: str | os.PathLike[str] | None, shaped_by: dict[str, Any]) -> tuple[str, str | None]:
    """(the folder to write into, where it goes when complete: None for a temporary one)."""
    try:
        if cache is None:
            return tempfile.mkdtemp(prefix="tune-studio-prepared-"), None
        root = os.fspath(cache)
        os.makedirs(root, exist_ok=True)
        _clean_temporaries(root)
        key = _key(shaped_by)
        return tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root), os.path.join(root, key)
    except OSError as exc:
        where = os.fspath(cache) if cache is not None else tempfile.gettempdir()
        raise DatasetError(
            f"the prepared dataset cannot be written in {where}: {exc.strerror or exc}; choose another "
            "folder, or free some disk space"
        ) from exc


def _write(
    writer: _Writer,
    samples: Iterable[Sample],
    problems: list[Problem],
    read: list[int],
    total: int,
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
    report: Callable[[PrepareProgress], None],
) -> dict[str, Any]:
    """Encode `samples` into `writer` (its files: all but meta.json); the facts for meta.json.
    `problems` is where reading the samples puts what it finds (drained as it fills)."""
    groups: dict[bytes, int] = {}
    next_report = time.monotonic()
    try:
        for chunk in encode_chunks(samples, tokenizer, template, options):
            if problems:  # what reading found so far (in line order)
                writer.read_problems(problems)
                problems.clear()
            group_ids = [
                -1 if not s.group else groups.setdefault(digest(s.group), len(groups)) for s in chunk.samples
            ]
            writer.add(chunk, group_ids)
            if time.monotonic() >= next_report:
                report(PrepareProgress("preparing", read[0], total, writer.n_samples))
                next_report = time.monotonic() + 0.1
        writer.read_problems(problems)  # on lines after the last sample
        return writer.finish()
    except OSError as exc:
        where = f" in {writer.folder}" if writer.folder else ""
        raise DatasetError(
            f"the prepared dataset cannot be written{where}: {exc.strerror or exc}; free some disk space"
        ) from exc
    finally:
        writer.close()


class _Writer:
    """The files of one prepared dataset (or their bytes in memory, `folder` None), appended to as
    samples are encoded, with their SHA-256."""

    def __init__(self, folder: str | None, token_dtype: np.dtype):
        self.folder, self.token_dtype = folder, token_dtype
        self._files: dict[str, IO[bytes]] = {}
        self._hashes: dict[str, Any] = {}
        for name in ("tokens.bin", "trained.bin", *_PROBLEM_FILES.values()):
            self._files[name] = open(os.path.join(folder, name), "wb") if folder else io.BytesIO()  # noqa: SIM115
            self._hashes[name] = hashlib.sha256()
        self._tables: list[np.ndarray] = []
        self.table: np.ndarray | None = None
        self.n_samples = 0
        self.n_tokens = 0
        self.n_read_problems = self.n_encode_problems = 0

    def _put(self, name: str, data: bytes) -> None:
        self._files[name].write(data)
        self._hashes[name].update(data)

    def add(self, chunk: EncodedChunk, groups: list[int]) -> None:
        """A chunk of encoded samples (numbered from `n_samples`) and their group numbers."""
        samples = chunk.samples
        table = np.zeros(len(samples), dtype=SAMPLE_DTYPE)
        kept = chunk.kept
        table["start"] = self.n_tokens + np.cumsum(kept) - kept
        table["length"] = kept
        table["targets"] = chunk.targets
        table["line"] = [s.line for s in samples]
        table["reward"] = [np.nan if s.reward is None else s.reward for s in samples]
        table["group"] = groups
        table["flags"] = np.where(kept > 0, KEPT, 0) | np.where(chunk.truncated, TRUNCATED, 0)
        self._tables.append(table)
        if kept.any():  # the kept part of each sample, one after another
            starts = chunk.starts[kept > 0]
            counts = kept[kept > 0]
            at = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            self._put("tokens.bin", chunk.tokens[at].astype(self.token_dtype).tobytes())
            self._put("trained.bin", chunk.trained[at].tobytes())
        self.n_tokens += int(kept.sum())
        for k, found in enumerate(chunk.problems):
            i = self.n_samples + k
            prefix = f"sample {i}: "
            for p in found:
                message = (
                    p.message[len(prefix) :] if not p.line and p.message.startswith(prefix) else p.message
                )
                self._problem("encode", i, replace(p, message=message))
                self.n_encode_problems += 1
        self.n_samples += len(samples)

    def read_problems(self, problems: list[Problem]) -> None:
        for p in problems:
            self._problem("read", -1, p)
            self.n_read_problems += 1

    def _problem(self, stage: str, sample: int, p: Problem) -> None:
        line = json.dumps([sample, p.line, p.severity, p.message], ensure_ascii=False)
        self._put(_PROBLEM_FILES[stage], (line + "\n").encode("utf-8", "surrogatepass"))

    def close(self) -> None:
        if self.folder:
            for f in self._files.values():
                f.close()

    def finish(self) -> dict[str, Any]:
        """Write the samples table; the facts for meta.json."""
        self.table = np.concatenate(self._tables) if self._tables else np.zeros(0, dtype=SAMPLE_DTYPE)
        sizes = {name: f.tell() for name, f in self._files.items()}
        files = {name: {"size": sizes[name], "sha256": h.hexdigest()} for name, h in self._hashes.items()}
        if self.folder:
            path = os.path.join(self.folder, "samples.npy")
            with open(path, "wb") as f:
                np.save(f, self.table, allow_pickle=False)
            files["samples.npy"] = {"size": os.path.getsize(path), "sha256": _file_sha256(path)}
        return {
            "n_samples": len(self.table),
            "n_tokens": self.n_tokens,
            "token_dtype": self.token_dtype.str,
            "n_read_problems": self.n_read_problems,
            "n_encode_problems": self.n_encode_problems,
            "files": files,
            "created": time.time(),
        }

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, bytes]]:
        """The samples table, tokens, trained mask and problems' bytes of an in-memory writer."""
        assert self.table is not None and not self.folder
        buffers = {name: f.getvalue() for name, f in self._files.items()}  # type: ignore[attr-defined]
        tokens = np.frombuffer(buffers["tokens.bin"], dtype=self.token_dtype)
        trained = np.frombuffer(buffers["trained.bin"], dtype=np.bool_)
        return self.table, tokens, trained, {name: buffers[name] for name in _PROBLEM_FILES.values()}


# -- the cache -----------------------------------------------------------------------------------


def _open_cached(
    root: str, shaped_by: dict[str, Any], report: Callable[[PrepareProgress], None]
) -> PreparedData | None:
    """The cache's entry for `shaped_by` when it is complete and intact, else None (it is removed
    when it exists but is stale or damaged)."""
    folder = os.path.join(root, _key(shaped_by))
    if not os.path.isdir(folder):
        return None
    why = _damage(folder, shaped_by, report)
    if why is None:
        with contextlib.suppress(OSError):
            os.utime(os.path.join(folder, "meta.json"))  # recently used: pruned last
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        try:
            data = PreparedData(folder, meta, reused=True, temporary=False)
        except (OSError, ValueError, KeyError) as exc:
            why = f"it cannot be mapped ({exc})"
        else:
            report(PrepareProgress("done", 0, 0, len(data)))
            return data
    log.warning("%s: the prepared dataset is not used and is prepared again: %s", folder, why)
    shutil.rmtree(folder, ignore_errors=True)
    return None


def _damage(folder: str, shaped_by: dict[str, Any], report: Callable[[PrepareProgress], None]) -> str | None:
    """What is wrong with a cache entry (None: nothing): unreadable or foreign meta.json, other
    inputs, a missing file, a size or a SHA-256 that differs from what meta.json lists."""
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or meta.get("shaped_by") != shaped_by:
            return "it was prepared from other inputs"
        files = meta["files"]
        total = sum(int(files[name]["size"]) for name in _FILES)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its meta.json cannot be read ({exc})"
    done = [0]

    def checked(n: int) -> None:
        done[0] += n
        report(PrepareProgress("checking", done[0], total, 0))

    for name in _FILES:
        path = os.path.join(folder, name)
        try:
            size = os.path.getsize(path)
            if size != int(files[name]["size"]):
                return f"{name} is {size} bytes, not {files[name]['size']}"
            if _file_sha256(path, checked) != files[name]["sha256"]:
                return f"{name} does not have the content it was written with"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
    return None


def _clean_temporaries(root: str) -> None:
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".tmp-"):
            with contextlib.suppress(OSError):
                if now - os.path.getmtime(path) > _STALE_TEMPORARY_S:
                    shutil.rmtree(path, ignore_errors=True)


def _prune(root: str, keep: str) -> None:
    """Remove the least recently used entries beyond MAX_ENTRIES (never `keep`)."""
    entries = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".") or path == keep:
            continue
        with contextlib.suppress(OSError):
            entries.append((os.path.getmtime(os.path.join(path, "meta.json")), path))
    entries.sort(reverse=True)
    for _, path in entries[MAX_ENTRIES - 1 :]:
        log.info("removing the prepared dataset %s (least recently used)", path)
        shutil.rmtree(path, ignore_errors=True)
