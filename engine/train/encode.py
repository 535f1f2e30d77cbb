"""Encoding samples: tokens and the per-token "trained" mask, through the model's chat template.

`encode_samples` turns samples (engine.train.data) into tokens and a per-token "trained" mask: the
tokens the model must learn to produce. Conversations go through the model's chat template; a token
is trained when its characters overlap an assistant reply as `ChatTemplate.render_with_spans`
locates it (the reply and its end-of-turn marker). Prompt/response samples are a user and an
assistant message ("chat") or the prompt, the response and EOS tokenized one after the other, as
llama.cpp's finetune-qlora does ("raw"). Text samples train every token after BOS and an EOS
appended. Control tokens written in the data ("<|im_end|>") are parsed as control tokens.
`encode_samples_ref` does it one sample at a time with the template's reference renders: the
specification. `encode_samples` (and the streams `encode_iter`, `encode_chunks`) give the same
tokens, masks and problems faster: a conversation is rendered once (its structure once, for
templates that pass contents through), a few hundred texts are tokenized at once by the library's
threads while the next ones are read, a reply's tokens are found as a range, and masks,
truncation and problems are array operations over the chunk.

It does not split samples longer than `n_ctx` into several windows: they are truncated and
reported.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import TemplateError, TokenizerError
from .data import ERROR, WARNING, Problem, Sample

if TYPE_CHECKING:
    from ..text.chat_template import ChatTemplate
    from ..text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# -- encoding -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeOptions:
    """How samples become tokens."""

    n_ctx: int  # window length in tokens (T); longer samples are truncated
    train_on_prompt: bool = False  # loss on every token, not only assistant/response tokens
    prompt_format: str = "chat"  # prompt/response samples: "chat" (via the template) or "raw"

    def __post_init__(self) -> None:
        try:
            n_ctx = operator.index(self.n_ctx)
        except TypeError:
            n_ctx = 0
        if isinstance(self.n_ctx, bool) or n_ctx < 2:
            raise ValueError(f"n_ctx must be an integer >= 2, got {self.n_ctx!r}")
        object.__setattr__(self, "n_ctx", n_ctx)
        if self.prompt_format not in ("chat", "raw"):
            raise ValueError(f"prompt_format must be 'chat' or 'raw', got {self.prompt_format!r}")


@dataclass(frozen=True)
class Encoded:
    """One sample as tokens, with the tokens it is trained on."""

    index: int  # index of the sample in the list given to encode_samples
    tokens: np.ndarray  # int32 (n,), with BOS first when the tokenizer adds one
    trained: np.ndarray  # bool (n,): token i is one the model must learn to produce
    weight: float = 1.0  # per-sample loss weight (rewards); 1.0 by default
    truncated: bool = False  # the sample was longer than n_ctx and was cut

    @property
    def n_targets(self) -> int:
        """Trained tokens that have a token before them: the loss terms this sample gives."""
        return int(np.count_nonzero(self.trained[1:]))


def _with_bos(tokenizer: Tokenizer, ids: list[int], trained: list[bool]) -> tuple[list[int], list[bool]]:
    if tokenizer.add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
        return [tokenizer.bos_id, *ids], [False, *trained]
    return ids, trained


def _mask_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """Per token: does its character range overlap one of `spans` (an empty range at s: a <= s < b)?

    Spans in order and apart (as `render_with_spans` gives them) take one binary search per token:
    the only span a token can overlap is the first that ends after the token starts.
    """
    if not offsets:
        return []
    o = np.asarray(offsets, dtype=np.int64)  # (n, 2)
    start, end = o[:, 0], o[:, 1]
    empty = start == end
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 2)  # (S, 2)
    a, b = sp[:, 0], sp[:, 1]
    if len(sp) and np.all(a <= b) and np.all(b[:-1] <= a[1:]):
        k = np.searchsorted(b, start, side="right")  # (n,) first span ending after the token starts
        inside = k < len(sp)
        ak = np.where(inside, a[np.minimum(k, len(sp) - 1)], 0)
        mask = inside & np.where(empty, ak <= start, ak < end)
        return mask.tolist()
    mask = np.zeros(len(o), dtype=bool)
    for lo, hi in sp.tolist():
        mask |= np.where(empty, (lo <= start) & (start < hi), (start < hi) & (end > lo))
    return mask.tolist()


def _encode_one(
    sample: Sample, tokenizer: Tokenizer, template: ChatTemplate | None, options: EncodeOptions
) -> tuple[list[int], list[bool]]:
    """Token ids and trained flags of one sample, before truncation."""
    if sample.kind == "text":
        assert sample.text is not None
        ids = tokenizer.encode(sample.text, add_special=False, parse_special=True)
        trained = [True] * len(ids)
        ids, trained = _with_bos(tokenizer, ids, trained)
        if tokenizer.bos_id is not None and ids and ids[0] == tokenizer.bos_id:
            trained[0] = False
        if tokenizer.eos_id is not None and (not ids or ids[-1] != tokenizer.eos_id):
            ids, trained = [*ids, tokenizer.eos_id], [*trained, True]
        return ids, trained
    if sample.kind == "prompt" and options.prompt_format == "raw":
        assert sample.prompt is not None and sample.response is not None
        p = tokenizer.encode(sample.prompt, add_special=False, parse_special=True)
        r = tokenizer.encode(sample.response, add_special=False, parse_special=True)
        if tokenizer.eos_id is not None:
            r.append(tokenizer.eos_id)
        ids, trained = _with_bos(tokenizer, p + r, [options.train_on_prompt] * len(p) + [True] * len(r))
    else:
        if template is None:
            raise TemplateError("a chat template is needed for conversations, and none was given")
        text, spans = template.render_with_spans(list(sample.messages))
        ids, offsets = tokenizer.encode_with_offsets(text, parse_special=True)
        trained = [True] * len(ids) if options.train_on_prompt else _mask_spans(offsets, spans)
        ids, trained = _with_bos(tokenizer, ids, trained)
    if options.train_on_prompt and trained:
        trained = [True] * len(trained)
        trained[0] = not (tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id)
    return ids, trained


def _finish(
    sample: Sample, index: int, tokens: np.ndarray, mask: np.ndarray, n_ctx: int
) -> tuple[Encoded | None, Problem | None]:
    """A sample's encoding cut to n_ctx, and the problem it has (a truncation warning, or an error
    when no trained token is left: then no encoding)."""
    n = len(tokens)
    truncated = n > n_ctx
    kept_tokens, kept = (tokens[:n_ctx], mask[:n_ctx]) if truncated else (tokens, mask)
    if not kept[1:].any():
        return None, _no_trained_tokens(sample, index, n, n_ctx, int(np.argmax(mask)))
    problem = None
    if truncated:
        problem = _truncation(sample, index, n, n_ctx, int(np.count_nonzero(mask[n_ctx:])))
    return Encoded(index, kept_tokens, kept, 1.0, truncated), problem


def _no_trained_tokens(sample: Sample, index: int, n: int, n_ctx: int, first: int) -> Problem:
    """The error of a sample left with no trained token (`first`: its first trained token, 0: none)."""
    where = "" if sample.line else f"sample {index}: "
    if n > n_ctx:
        message = (
            f"{where}no trained tokens left after truncating its {n} tokens to n_ctx={n_ctx}: "
            f"the first trained token is token {first}; raise n_ctx or shorten the prompt"
        )
    else:
        message = f"{where}has no trained tokens ({n} tokens)"
    return Problem(sample.line, message, ERROR)


def _truncation(sample: Sample, index: int, n: int, n_ctx: int, cut: int) -> Problem:
    """The warning of a sample cut to n_ctx (`cut`: trained tokens cut off)."""
    where = "" if sample.line else f"sample {index}: "
    message = f"{where}{n} tokens, truncated to n_ctx={n_ctx} ({cut} trained tokens cut off)"
    return Problem(sample.line, message, WARNING)


def _unencodable(sample: Sample, index: int, exc: Exception) -> Problem:
    where = "" if sample.line else f"sample {index}: "
    return Problem(sample.line, f"{where}cannot be encoded: {exc}", ERROR)


def encode_samples_ref(
    samples: Sequence[Sample], tokenizer: Tokenizer, template: ChatTemplate | None, options: EncodeOptions
) -> tuple[list[Encoded], list[Problem]]:
    """`encode_samples` one sample at a time, each conversation's spans found with the template's
    reference renders: the specification that `encode_samples` is tested against."""
    if template is not None and template.fast_spans:
        template = _reference_template(template)
    out: list[Encoded] = []
    problems: list[Problem] = []
    for index, sample in enumerate(samples):
        try:
            ids, trained = _encode_one(sample, tokenizer, template, options)
        except (TemplateError, TokenizerError) as exc:
            problems.append(_unencodable(sample, index, exc))
            continue
        encoded, problem = _finish(
            sample, index, np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=bool), options.n_ctx
        )
        if problem is not None:
            problems.append(problem)
        if encoded is not None:
            out.append(encoded)
    return out, problems


def _reference_template(template: ChatTemplate) -> ChatTemplate:
    from ..text.chat_template import ChatTemplate

    return ChatTemplate(**{**template.recipe(), "fast_spans": False})


_BATCH = 512  # samples tokenized in one call of the tokenizers library (spread over its threads)
_IN_FLIGHT = 2  # chunks rendered and handed to the tokenizing thread ahead of the one assembled


@dataclass
class EncodedChunk:
    """A few hundred samples encoded as `encode_samples` encodes them, in flat arrays: sample k's
    tokens before truncation are tokens[starts[k]:starts[k] + lengths[k]] (trained alike); it keeps
    kept[k] of them (0: it is dropped), truncated[k] says it was cut, targets[k] counts its kept
    trained tokens after the first (`Encoded.n_targets`); problems[k] are its problems."""

    samples: list[Sample]
    first_index: int  # `Encoded.index` of samples[0]
    tokens: np.ndarray  # int32, every sample's tokens before truncation, one after another
    trained: np.ndarray  # bool, alike
    starts: np.ndarray  # int64 (m,)
    lengths: np.ndarray  # int64 (m,): tokens before truncation (0 for a sample that failed)
    kept: np.ndarray  # int64 (m,): tokens kept; 0: dropped
    truncated: np.ndarray  # bool (m,)
    targets: np.ndarray  # int64 (m,)
    problems: list[list[Problem]]

    def encoded(self, k: int) -> Encoded | None:
        """Sample k's `Encoded` (views of the chunk's arrays), or None when it is dropped."""
        n = int(self.kept[k])
        if not n:
            return None
        a = int(self.starts[k])
        return Encoded(self.first_index + k, self.tokens[a : a + n], self.trained[a : a + n], 1.0,
                       bool(self.truncated[k]))  # fmt: skip


def encode_chunks(
    samples: Iterable[Sample],
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
    *,
    batch: int = _BATCH,
) -> Iterator[EncodedChunk]:
    """Samples, a few hundred at a time, encoded as `encode_samples` encodes them
    (`Encoded.index` counts the samples from 0), as flat arrays (`EncodedChunk`).

    Each chunk goes through three stages: each conversation's text and reply spans come from one
    `render_with_spans` (which renders each conversation structure once for templates that pass
    contents through); the texts are tokenized by the library's parallel batch encoding, on a
    thread of its own while the next chunk is read and rendered; the chunk's tokens are laid out
    in one array, a span's trained tokens found as a range (not token by token), and truncation
    and masks worked out with array operations. `samples` is consumed as the chunks are taken, so
    a stream of samples is never held whole. `batch`: samples per chunk (smaller chunks give the
    interpreter up more often, for a program that must stay responsive)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    index = 0
    for work in _pipelined(_chunks(samples, batch), tokenizer, template, options):
        chunk = work.assemble(index)
        index += len(chunk.samples)
        yield chunk


def encode_iter(
    samples: Iterable[Sample],
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
    *,
    batch: int = _BATCH,
) -> Iterator[tuple[Sample, Encoded | None, list[Problem]]]:
    """`encode_samples` one sample at a time, as a stream: (sample, its encoding or None when it
    is dropped, its problems), in order, `batch` samples tokenized at once (see `encode_chunks`)."""
    for chunk in encode_chunks(samples, tokenizer, template, options, batch=batch):
        for k, sample in enumerate(chunk.samples):
            yield sample, chunk.encoded(k), chunk.problems[k]


def encode_samples(
    samples: Sequence[Sample], tokenizer: Tokenizer, template: ChatTemplate | None, options: EncodeOptions
) -> tuple[list[Encoded], list[Problem]]:
    """Tokens and trained masks of `samples`, and the problems met (in sample order).

    A sample longer than `options.n_ctx` keeps its first n_ctx tokens (a warning); one left with
    no trained token, or that the chat template cannot render, is dropped (an error). `template`
    may be None when no sample needs one (text samples, raw prompt/response). The same tokens,
    masks and problems as `encode_samples_ref`, faster (see `encode_iter`).
    """
    out: list[Encoded] = []
    problems: list[Problem] = []
    for _, encoded, found in encode_iter(samples, tokenizer, template, options):
        problems.extend(found)
        if encoded is not None:
            out.append(encoded)
    return out, problems


def _chunks(samples: Iterable[Sample], size: int) -> Iterator[list[Sample]]:
    it = iter(samples)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _pipelined(
    chunks: Iterator[list[Sample]],
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
) -> Iterator[_Chunk]:
    """Each chunk rendered and tokenized, in order; the tokenization runs on a worker thread (the
    library releases the interpreter lock) while the next chunks are read and rendered here."""
    first = next(chunks, None)
    if first is None:
        return
    second = next(chunks, None)
    if second is None:  # one chunk: no thread
        work = _Chunk(first, tokenizer, template, options)
        work.tokenize()
        yield work
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
        pending: collections.deque[tuple[_Chunk, concurrent.futures.Future]] = collections.deque()
        for chunk in itertools.chain((first, second), chunks):
            work = _Chunk(chunk, tokenizer, template, options)
            pending.append((work, pool.submit(work.tokenize)))
            if len(pending) > _IN_FLIGHT:  # the library always has the next chunk waiting
                done, future = pending.popleft()
                future.result()
                yield done
        while pending:
            done, future = pending.popleft()
            future.result()
            yield done


class _Chunk:
    """Samples on their way to tokens: rendered when made, `tokenize` (the library's batch
    encoding: any thread), `assemble` (the ids and trained masks, as `_encode_one` makes them)."""

    def __init__(
        self,
        samples: list[Sample],
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        options: EncodeOptions,
    ):
        self.samples, self.tokenizer, self.template, self.options = samples, tokenizer, template, options
        self.jobs: list[tuple[str, int] | Exception] = []  # per sample: (kind, its first text) or the error
        self.texts: list[str] = []
        self.spans: list[list[tuple[int, int]] | None] = []
        self.encodings: list | None = None
        self.failed = False  # the batch could not be tokenized (a text that is not Unicode)
        raw = options.prompt_format == "raw"
        for sample in samples:
            if sample.kind == "text":
                assert sample.text is not None
                self._add("text", [sample.text], [None])
            elif sample.kind == "prompt" and raw:
                assert sample.prompt is not None and sample.response is not None
                self._add("raw", [sample.prompt, sample.response], [None, None])
            elif template is None:
                self.jobs.append(
                    TemplateError("a chat template is needed for conversations, and none was given")
                )
            else:
                try:
                    text, reply_spans = template.render_with_spans(list(sample.messages))
                except TemplateError as exc:
                    self.jobs.append(exc)
                    continue
                self._add("chat", [text], [None if options.train_on_prompt else reply_spans])

    def _add(self, kind: str, texts: list[str], spans: list[list[tuple[int, int]] | None]) -> None:
        self.jobs.append((kind, len(self.texts)))
        self.texts += texts
        self.spans += spans

    def tokenize(self) -> None:
        try:
            self.encodings = self.tokenizer.encodings(self.texts, parse_special=True)
        except TokenizerError:
            self.failed = True

    def assemble(self, first_index: int) -> EncodedChunk:
        """The chunk's samples as `_encode_one` and `_finish` make them, in flat arrays."""
        tokenizer, options = self.tokenizer, self.options
        m = len(self.samples)
        lengths = np.zeros(m, dtype=np.int64)
        errors: dict[int, Exception] = {}
        pieces: list[Iterable[int]] = []  # every sample's ids, in order
        bounds: list[int] = []  # trained ranges [a, b) in the chunk's flat array, flattened
        if self.failed or self.encodings is None:  # find the text that is not Unicode, sample by sample
            masks = []
            for k, sample in enumerate(self.samples):
                result = _encode_alone(sample, tokenizer, self.template, options)
                if isinstance(result, Exception):
                    errors[k] = result
                    continue
                pieces.append(result[0].tolist())
                masks.append(result[1])
                lengths[k] = len(result[0])
            trained = np.concatenate(masks) if masks else np.zeros(0, dtype=bool)
        else:
            encoded = tokenizer.ranges_of(self.encodings, self.texts, self.spans)
            self.encodings = None
            bos, eos = tokenizer.bos_id, tokenizer.eos_id
            add_bos = tokenizer.add_bos and bos is not None
            top = options.train_on_prompt
            at = 0  # where the sample starts in the flat array
            for k, job in enumerate(self.jobs):
                if isinstance(job, Exception):
                    errors[k] = job
                    continue
                kind, j = job
                ids = encoded[j][0]
                if kind == "text":  # every token trained but a first BOS; EOS appended unless last
                    lead = 1 if add_bos and (not ids or ids[0] != bos) else 0  # a BOS first, untrained
                    last = ids[-1] if ids else (bos if lead else None)
                    tail = 1 if eos is not None and last != eos else 0
                    n = lead + len(ids) + tail
                    first = bos if lead else (ids[0] if ids else None)
                    bounds += (at + (1 if bos is not None and first == bos else 0), at + n)
                    pieces += ((bos,) * lead, ids, (eos,) * tail)
                else:
                    if kind == "raw":  # the prompt, then the response and EOS (trained)
                        prompt, response = ids, encoded[j + 1][0]
                        body = [*prompt, *response, eos] if eos is not None else [*prompt, *response]
                        spans = [(len(prompt), len(body))]
                    else:
                        body, spans = ids, encoded[j][1]
                    lead = 1 if add_bos and (not body or body[0] != bos) else 0  # a BOS first, untrained
                    n = lead + len(body)
                    pieces += ((bos,) * lead, body)
                    if top and n:  # every token trained, but a first BOS
                        first = bos if lead else body[0]
                        bounds += (at + (1 if bos is not None and first == bos else 0), at + n)
                    else:
                        for k0, k1 in spans:
                            bounds += (at + lead + k0, at + lead + k1)
                lengths[k] = n
                at += n
            trained = _ranges_mask(bounds, at)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])) if m else np.zeros(0, dtype=np.int64)
        total = int(lengths.sum())
        tokens = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int32, count=total)
        return _truncate(self.samples, first_index, tokens, trained, starts, lengths, errors, options.n_ctx)


def _ranges_mask(bounds: list[int], n: int) -> np.ndarray:
    """A bool array of n that is True inside any of the ranges [a, b) listed as a, b, a, b, ..."""
    edges = np.zeros(n + 1, dtype=np.int32)
    if bounds:
        b = np.asarray(bounds, dtype=np.int64)
        np.add.at(edges, b[0::2], 1)
        np.add.at(edges, b[1::2], -1)
    return np.cumsum(edges[:-1]) > 0


def _truncate(
    samples: list[Sample],
    first_index: int,
    tokens: np.ndarray,
    trained: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    errors: dict[int, Exception],
    n_ctx: int,
) -> EncodedChunk:
    """`_finish` for a chunk at once: what each sample keeps, and its problems."""
    m = len(samples)
    ends = starts + lengths
    kept = np.minimum(lengths, n_ctx)
    before = np.concatenate(([0], np.cumsum(trained, dtype=np.int64)))  # trained tokens before each position
    targets = before[starts + kept] - before[np.minimum(starts + 1, starts + kept)]
    truncated = lengths > n_ctx
    failed = np.zeros(m, dtype=bool)
    failed[list(errors)] = True
    dropped = (targets == 0) | failed
    problems: list[list[Problem]] = [[] for _ in range(m)]
    for k, exc in errors.items():
        problems[k].append(_unencodable(samples[k], first_index + k, exc))
    for k in np.flatnonzero(dropped & ~failed).tolist():
        a, n = int(starts[k]), int(lengths[k])
        first = int(np.argmax(trained[a : a + n])) if n else 0
        problems[k].append(_no_trained_tokens(samples[k], first_index + k, n, n_ctx, first))
    for k in np.flatnonzero(truncated & ~dropped).tolist():
        cut = int(before[ends[k]] - before[starts[k] + n_ctx])
        problems[k].append(_truncation(samples[k], first_index + k, int(lengths[k]), n_ctx, cut))
    kept[dropped] = 0
    targets[dropped] = 0
    return EncodedChunk(samples, first_index, tokens, trained, starts, lengths, kept, truncated & ~dropped,
                        targets, problems)  # fmt: skip


def _encode_alone(
    sample: Sample, tokenizer: Tokenizer, template: ChatTemplate | None, options: EncodeOptions
) -> tuple[np.ndarray, np.ndarray] | Exception:
    try:
        ids, trained = _encode_one(sample, tokenizer, template, options)
    except (TemplateError, TokenizerError) as exc:
        return exc
    return np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=bool)
