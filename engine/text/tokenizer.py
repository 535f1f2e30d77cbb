"""A tokenizer built from a GGUF file's metadata that gives llama.cpp's token ids.

Two kinds are supported, as `tokenizer.ggml.model` names them:

- ``"llama"`` (SentencePiece, kind ``"spm"``): a `tokenizers` BPE model whose merges
  are derived from the piece scores the way transformers' `LlamaConverter` does,
  with byte fallback to ``<0xNN>`` tokens and the ``▁`` space prefix.
- ``"gpt2"`` (byte-level BPE, kind ``"bpe"``): a `tokenizers` BPE model over
  `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, pre-split by the regular
  expressions that llama.cpp's `llama-vocab.cpp` selects for `tokenizer.ggml.pre`.

Special tokens follow llama.cpp's `tokenizer_st_partition`: user-defined tokens are
always split out of the text, control and unknown tokens only with
``parse_special=True``. Token attributes, end-of-generation ids and the add-BOS
defaults follow `llama_vocab::impl::load`, including its detection of special
tokens by their text.

This module is not a general HF tokenizer loader: WordPiece (``bert``), Unigram
(``t5``), RWKV and PLaMo vocabularies are refused with a `TokenizerError`, and so are
the pre-tokenizers that llama.cpp implements partly in code (kimi-k2, afmoe, gemma4,
sarvam-moe, whitespace, superbpe), those of embedding models (jina-*, roberta-bpe,
modern-bert, granite-embed-multi-*) and two whose regexes could not be checked here
(tiny_aya, youtu): never approximated. A file without `tokenizer.ggml.pre` gets
llama.cpp's "default" regexes, with a warning, as llama.cpp does.

It does no chat templating (see `engine.text.chat_template`). `decode` is lossless: it
does not apply llama.cpp's ``clean_spaces`` pass (which removes the space in " ,"
or " 's" for some BPE vocabularies), so concatenated `token_bytes` equal `decode`.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import operator
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from ..errors import TokenizerError
from ..io.gguf_file import GGUFFile
from .llama_vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_OF_TYPE,
    ATTR_RSTRIP,
    ATTR_SPECIAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    CHAR_TO_BYTE,
    EOG_TEXTS,
    EOM_TEXTS,
    EOT_TEXTS,
    FIM_TEXTS,
    FORCED_USER_DEFINED,
    ID_KEYS,
    MAX_MERGED_PIECE,
    MODELS,
    PRE_TOKENIZERS,
    REGEXES,
    REQUIRED_IN_VOCAB,
    SPACE_MARK,
    PreSpec,
)

log = logging.getLogger(__name__)


def _token_ranges(
    encoding: Any, n: int, length: int, spans: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Per span [a, b), the tokens [k0, k1) of `encoding` (n tokens of a text of `length`
    characters) that are part of it, as `encode_with_offsets` defines it. Each bound is the first
    token where a condition that never turns false again holds, found from the token that the
    library says holds the bound's character, a step or two either way."""
    to_chars, to_token = encoding.token_to_chars, encoding.char_to_token

    def start(k: int) -> int:  # encode_with_offsets' start of token k (the text's end past the last)
        return 0 if k == 0 else length if k >= n else to_chars(k)[0]

    ranges = []
    for a, b in spans:
        # the first token starting at or after b; the first one ending after a (or empty, at >= a)
        k1 = _first(lambda k, b=b: start(k) >= b, n, to_token(b) if 0 <= b < length else None)
        k0 = _first(
            lambda k, a=a: (e := start(k + 1)) > a or (e == start(k) and e >= a),
            n,
            to_token(a) if 0 <= a < length else None,
        )
        ranges.append((k0, max(k0, k1)))
    return ranges


_STEPS = 4  # steps from a hint before a binary search takes over


def _first(holds: Callable[[int], bool], n: int, hint: int | None) -> int:
    """The first k in [0, n) where `holds(k)` (false, then true for good), or n: from `hint`, a
    few steps either way, then a binary search."""
    lo, hi = 0, n  # the answer is in [lo, hi]
    if hint is not None and 0 <= hint < n:
        k = hint
        if holds(k):
            hi = k
            for _ in range(_STEPS):
                if k == 0 or not holds(k - 1):
                    return k
                k -= 1
                hi = k
        else:
            lo = k + 1
            for _ in range(_STEPS):
                k += 1
                if k >= n or holds(k):
                    return min(k, n)
                lo = k + 1
    return bisect.bisect_left(range(lo, hi), True, key=holds) + lo


# -- metadata helpers ------------------------------------------------------------


def _opt_int(md: Mapping[str, Any], key: str, source: str) -> int | None:
    value = md.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TokenizerError(f"{source}: {key} is {value!r}; expected a token id (an integer)")
    return value


def _opt_bool(md: Mapping[str, Any], key: str, source: str) -> bool | None:
    value = md.get(key)
    if value is None:
        return None
    if not isinstance(value, (bool, int)):
        raise TokenizerError(f"{source}: {key} is {value!r}; expected true or false")
    return bool(value)


def _opt_list(
    md: Mapping[str, Any], key: str, source: str, n: int | None, kinds: tuple[type, ...]
) -> list | None:
    """The array at `key` (its first `n` entries, all of them if n is None) after checking its type."""
    value = md.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TokenizerError(f"{source}: {key} is a {type(value).__name__}; expected an array")
    if n is not None and len(value) != n:
        raise TokenizerError(
            f"{source}: {key} has {len(value)} entries for {n} tokens; expected one entry per token"
        )
    value = list(value)
    if not set(map(type, value)) <= set(kinds):  # exact types: a bool is not an int here
        bad = next(v for v in value if type(v) not in kinds)
        raise TokenizerError(
            f"{source}: {key} holds {bad!r}; expected {' or '.join(k.__name__ for k in kinds)} values"
        )
    return value


def _spm_merges(
    tokens: Sequence[str], scores: Sequence[float], vocab: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Merges for a SentencePiece vocabulary, ranked by the merged piece's score.

    As transformers' `SentencePieceExtractor`: every split of a piece into two pieces
    of the vocabulary is a merge; within a piece, splits are ordered by the ids of
    their halves; overall, higher scores first and ties in vocabulary order. Pieces longer
    than `MAX_MERGED_PIECE` characters (none in a real vocabulary) get no merges, so that a
    corrupt vocabulary cannot make this take hours.
    """
    ranked: list[tuple[float, str, str]] = []
    vocab_lengths = {len(t) for t in tokens}
    lengths = sorted(vocab_lengths)  # a split whose halves have no such length is no merge
    long = 0
    for piece, score in zip(tokens, scores, strict=True):
        local = []
        n = len(piece)
        if n > MAX_MERGED_PIECE:
            long += 1
            continue
        for k in lengths:
            if k >= n:
                break
            if n - k not in vocab_lengths:
                continue
            left, right = piece[:k], piece[k:]
            il, ir = vocab.get(left), vocab.get(right)
            if il is not None and ir is not None:
                local.append((il, ir, left, right))
        if local:
            local.sort()
            ranked.extend((score, left, right) for _, _, left, right in local)
    if long:
        log.warning("%d tokens longer than %d characters get no merges", long, MAX_MERGED_PIECE)
    ranked.sort(key=lambda m: m[0], reverse=True)  # stable: ties keep vocabulary order
    return [(left, right) for _, left, right in ranked]


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary, as llama.cpp tokenizes it.

    Build with `Tokenizer.from_gguf(path)` or `Tokenizer.from_metadata(metadata)`.
    Instances are immutable after construction and safe to share between threads.
    """

    kind: str  # "spm" (SentencePiece) or "bpe" (byte-level BPE)
    pre: str | None  # tokenizer.ggml.pre for bpe; None for spm
    n_vocab: int  # number of tokens (V)
    bos_id: int | None  # beginning-of-sequence token
    eos_id: int | None  # end-of-sequence token
    pad_id: int | None  # padding token, if the file names one
    unk_id: int | None  # unknown token
    eot_ids: frozenset[int]  # every end-of-generation id (llama.cpp's special_eog_ids)
    add_bos: bool  # encode(add_special=True) prepends bos_id
    add_eos: bool  # encode(add_special=True) appends eos_id
    add_space_prefix: bool  # spm: text gets a leading "▁"; decode drops one leading space

    def __init__(self, metadata: Mapping[str, Any], source: str = "model"):
        if not isinstance(metadata, Mapping):
            raise TokenizerError(f"{source}: metadata is a {type(metadata).__name__}, expected a mapping")
        self._source = source
        md = metadata

        model = md.get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError(f"{source}: tokenizer.ggml.model is missing; the file has no tokenizer")
        if not isinstance(model, str) or model not in MODELS:
            supported = ", ".join(f"{k!r} ({v})" for k, v in MODELS.items())
            raise TokenizerError(
                f"{source}: tokenizer.ggml.model {repr(model)[:60]} is not supported; supported: {supported}"
            )
        self.kind = MODELS[model]

        tokens = _opt_list(md, "tokenizer.ggml.tokens", source, None, (str,))
        if not tokens:
            what = "missing" if tokens is None else "empty"
            raise TokenizerError(f"{source}: tokenizer.ggml.tokens is {what}; the file has no vocabulary")
        n = len(tokens)
        for i, t in enumerate(tokens):
            if not t:  # llama.cpp renames empty tokens so that they stay unique
                log.warning("%s: empty token at index %d", source, i)
                tokens[i] = f"[EMPTY_{i}]"
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise TokenizerError(
                        f"{source}: duplicate token in tokenizer.ggml.tokens: {t!r} has ids {seen[t]} and {i}"
                    )
                seen[t] = i
        self.n_vocab = n
        self._tokens: list[str] = tokens

        scores = _opt_list(md, "tokenizer.ggml.scores", source, n, (float, int))
        if scores is not None and any(x != x for x in scores):  # NaN: the merge order would be arbitrary
            i = next(i for i, x in enumerate(scores) if x != x)
            raise TokenizerError(
                f"{source}: tokenizer.ggml.scores[{i}] (token {tokens[i][:40]!r}) is NaN; "
                "expected finite scores"
            )
        types_ = _opt_list(md, "tokenizer.ggml.token_type", source, n, (int,))
        attrs = [ATTR_NORMAL] * n if types_ is None else [ATTR_OF_TYPE.get(t, 0) for t in types_]

        # flags and default special ids, as llama_vocab::impl::load sets them per model type
        if self.kind == "spm":
            self.pre = None
            spec = None
            add_bos, add_space_prefix = True, True
            default_ids = {"bos": 1, "eos": 2, "unk": 0}
        else:
            pre = md.get("tokenizer.ggml.pre")
            if pre is None or pre == "":
                log.warning(
                    "%s: tokenizer.ggml.pre is missing; using llama.cpp's 'default' pre-tokenizer", source
                )
                pre = "default"
            if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
                raise TokenizerError(
                    f"{source}: tokenizer.ggml.pre {repr(pre)[:60]} is not supported; supported: "
                    + ", ".join(sorted(PRE_TOKENIZERS))
                )
            self.pre = pre
            spec = PRE_TOKENIZERS[pre]
            add_bos, add_space_prefix = spec.add_bos, False
            default_ids = {"bos": None if spec.no_default_bos else 11, "eos": 11, "unk": None}
        add_eos = False
        flag = _opt_bool(md, "tokenizer.ggml.add_space_prefix", source)
        if flag is not None:
            add_space_prefix = flag

        ids: dict[str, int | None] = {}
        for name in ID_KEYS:
            default = default_ids.get(name)
            if default is not None and default >= n:
                log.warning(
                    "%s: default %s token id %d is out of the vocabulary, disabling", source, name, default
                )
                default = None
            for key in ID_KEYS[name]:
                value = _opt_int(md, key, source)
                if value is None:
                    continue
                if not 0 <= value < n:
                    if name in REQUIRED_IN_VOCAB:
                        raise TokenizerError(
                            f"{source}: {key} is {value}, outside the vocabulary; expected a token id "
                            f"in 0..{n - 1}"
                        )
                    # llama.cpp's "bad special token ... using default id": real files have these
                    # (padding_token_id = 32000 with 32000 tokens); the id is not used to encode
                    log.warning(
                        "%s: %s = %d is out of the vocabulary (%d tokens), ignored", source, key, value, n
                    )
                    continue
                default = value
            ids[name] = default

        flag = _opt_bool(md, "tokenizer.ggml.add_bos_token", source)
        if flag is not None:
            add_bos = flag
        flag = _opt_bool(md, "tokenizer.ggml.add_eos_token", source)
        if flag is not None:
            add_eos = flag
        if add_bos and ids["bos"] is None:
            raise TokenizerError(f"{source}: tokenizer.ggml.add_bos_token is true but no BOS token id is set")
        if add_eos and ids["eos"] is None:
            raise TokenizerError(f"{source}: tokenizer.ggml.add_eos_token is true but no EOS token id is set")

        self.eot_ids = frozenset(self._find_special_tokens(ids, attrs, vocab))
        self._phi3_rstrip(md, attrs, vocab)

        self.bos_id, self.eos_id, self.pad_id, self.unk_id = ids["bos"], ids["eos"], ids["pad"], ids["unk"]
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self._fingerprint: str | None = None
        self._attrs: list[int] = attrs
        self._pieces: list[bytes] | None = None  # token_bytes table, built on first use

        try:
            if self.kind == "spm":
                model_ = self._spm_model(tokens, scores, vocab, ids["unk"])
            else:
                assert spec is not None
                model_ = self._bpe_model(md, vocab, spec)
            self._plain = self._hf_tokenizer(model_, spec, encode_special_tokens=True)
            self._special = self._hf_tokenizer(model_, spec, encode_special_tokens=False)
        except TokenizerError:
            raise
        except Exception as exc:  # the tokenizers library rejects the vocabulary or merges
            raise TokenizerError(
                f"{source}: the tokenizer cannot be built from this vocabulary: {exc}"
            ) from exc

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], source: str = "model") -> Tokenizer:
        """Build from GGUF metadata (plain Python values); `source` names it in error messages."""
        return cls(metadata, source)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Build from a GGUF file's metadata; file errors surface as `ModelError`."""
        with GGUFFile(path) as f:
            metadata = f.metadata
        return cls(metadata, os.fspath(path))

    def _find_special_tokens(
        self, ids: dict[str, int | None], attrs: list[int], vocab: Mapping[str, int]
    ) -> set[int]:
        """llama.cpp's detection of special tokens by text; returns the end-of-generation ids.

        Fills ids["eot"], ids["eom"] and the FIM ids when the metadata does not name them and
        marks every detected token CONTROL, as `llama_vocab::impl::load` does.
        """
        tokens = self._tokens

        def detect(name: str, texts: Iterable[str]) -> None:
            if ids[name] is not None:  # named by the metadata: no detection, no fix-up
                return
            found = [vocab[t] for t in texts if t in vocab]
            if found:
                i = min(found)  # llama.cpp takes whichever its hash map yields first
                ids[name] = i
                attrs[i] |= ATTR_CONTROL

        detect("eot", EOT_TEXTS)
        detect("eom", EOM_TEXTS)
        for name, texts in FIM_TEXTS.items():
            detect(name, texts)

        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for text in EOG_TEXTS:
            i = vocab.get(text)
            if i is not None:
                eog.add(i)
                attrs[i] |= ATTR_CONTROL
        for text in FORCED_USER_DEFINED:
            if text in vocab:
                attrs[vocab[text]] = ATTR_USER_DEFINED
        for name in ("eos", "eot", "eom"):
            i = ids[name]
            if i is not None and i not in eog:
                log.info(
                    "%s: %s token %d (%r) is not an end-of-generation text", self._source, name, i, tokens[i]
                )
                eog.add(i)

        # o200k_harmony / solar-open: "<|end|>" ends a message there, not the generation
        texts = {tokens[i] for i in eog}
        if "<|end|>" in texts and (
            ("<|return|>" in texts and texts & {"<|call|>", "<|calls|>"})
            or ("<|flush|>" in texts and texts & {"<|call|>", "<|calls|>"})
        ):
            i = vocab["<|end|>"]
            eog.discard(i)
            attrs[i] = ATTR_USER_DEFINED
        # gemma4 / paddleocr: "</s>" is not an end of generation there
        if "<|tool_response>" in texts and "</s>" in texts:
            i = vocab["</s>"]
            eog.discard(i)
            attrs[i] = ATTR_NORMAL
        return eog

    def _phi3_rstrip(self, md: Mapping[str, Any], attrs: list[int], vocab: Mapping[str, int]) -> None:
        """Phi-3: special tokens swallow the whitespace after them (llama.cpp's per-model attributes)."""
        name = md.get("general.name")
        if not isinstance(name, str) or not any(s in name.lower() for s in ("phi-3", "phi3")):
            return
        for i, a in enumerate(attrs):
            if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                attrs[i] |= ATTR_RSTRIP
        if "</s>" in vocab:
            attrs[vocab["</s>"]] |= ATTR_RSTRIP
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            if text in vocab:
                attrs[vocab[text]] &= ~ATTR_RSTRIP

    def _spm_model(
        self, tokens: list[str], scores: list | None, vocab: dict[str, int], unk_id: int | None
    ) -> BPE:
        merges = _spm_merges(tokens, scores if scores is not None else [0.0] * len(tokens), vocab)
        unk = tokens[unk_id] if unk_id is not None else None
        return BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True)

    def _bpe_model(self, md: Mapping[str, Any], vocab: dict[str, int], spec: PreSpec) -> BPE:
        merges_list = _opt_list(md, "tokenizer.ggml.merges", self._source, None, (str,))
        if merges_list is None:
            raise TokenizerError(
                f"{self._source}: tokenizer.ggml.merges is missing; a gpt2 tokenizer needs merges"
            )
        merges: list[tuple[str, str]] = []
        for m in merges_list:
            pos = m.find(" ", 1)  # llama.cpp: a token may start with a space, never contain one later
            if pos < 0 or pos == len(m) - 1:
                raise TokenizerError(
                    f"{self._source}: merge {m[:60]!r} in tokenizer.ggml.merges is not a pair of tokens; "
                    "expected 'left right'"
                )
            merges.append((m[:pos], m[pos + 1 :]))
        try:
            return BPE(vocab, merges, ignore_merges=spec.ignore_merges)
        except Exception:  # a merge names a token missing from the vocabulary
            pass
        # llama.cpp keeps such merges, but they only matter for a broken vocabulary; drop them
        kept = [(a, b) for a, b in merges if a in vocab and b in vocab and a + b in vocab]
        log.warning(
            "%s: %d merges use tokens missing from the vocabulary and are ignored",
            self._source, len(merges) - len(kept),
        )  # fmt: skip
        return BPE(vocab, kept, ignore_merges=spec.ignore_merges)

    def _hf_tokenizer(self, model: BPE, spec: PreSpec | None, *, encode_special_tokens: bool) -> HFTokenizer:
        tk = HFTokenizer(model)  # the model (vocabulary and merges) is shared, not copied
        if spec is None:  # spm: "▁" prefix and spaces as "▁", as HF's LlamaTokenizerFast (legacy)
            steps = [normalizers.Replace(" ", SPACE_MARK)]
            if self.add_space_prefix:
                steps.insert(0, normalizers.Prepend(SPACE_MARK))
            tk.normalizer = normalizers.Sequence(steps)
        else:
            regexes = REGEXES[spec.regexes]
            if regexes is None:
                tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            else:
                splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
                tk.pre_tokenizer = pre_tokenizers.Sequence(
                    [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
                )
        added = []
        for i, a in enumerate(self._attrs):
            if a & (ATTR_SPECIAL | ATTR_USER_DEFINED):
                added.append(
                    AddedToken(
                        self._tokens[i], special=bool(a & ATTR_SPECIAL), normalized=False,
                        rstrip=bool(a & ATTR_RSTRIP), lstrip=False, single_word=False,
                    )
                )  # fmt: skip
        if added:
            tk.add_tokens(added)
        tk.encode_special_tokens = encode_special_tokens
        return tk

    # -- encoding -------------------------------------------------------------------

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama.cpp's `common_tokenize(ctx, text, add_special, parse_special)`.

        add_special: prepend BOS if `add_bos`, append EOS if `add_eos`.
        parse_special: control tokens written in the text ("<|im_start|>") become their ids;
        otherwise they are tokenized as plain text. User-defined tokens are always matched.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"{self._source}: cannot tokenize a {type(text).__name__}; expected str")
        tk = self._special if parse_special else self._plain
        ids = self._encodings(tk, [text])[0].ids
        return self._add_special(ids) if add_special else ids

    def encode_batch(
        self, texts: Sequence[str], *, add_special: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        """`encode` for many texts at once (the tokenizers library spreads them over threads)."""
        for t in texts:
            if not isinstance(t, str):
                raise TokenizerError(f"{self._source}: cannot tokenize a {type(t).__name__}; expected str")
        tk = self._special if parse_special else self._plain
        out = [e.ids for e in self._encodings(tk, list(texts))]
        return [self._add_special(ids) for ids in out] if add_special else out

    def encode_with_offsets(
        self, text: str, *, parse_special: bool = True
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` (no BOS/EOS added) and, per token, the [start, end) characters it came from.

        The ids equal `encode(text, add_special=False, parse_special=parse_special)`. The offsets
        index `text` as a Python string (code points) and tile it: the first starts at 0, each
        starts where the previous one ends, the last ends at len(text). A character belongs to
        the last token that holds some of its bytes: the byte tokens of a multi-byte character,
        and spm's inserted "▁" prefix, before the token that completes it get empty spans at its
        start. Characters that give no token (whitespace a special token strips) go to the token
        before them. So a token is part of a character range [a, b) when its span overlaps it,
        or, for an empty span at s, when a <= s < b.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"{self._source}: cannot tokenize a {type(text).__name__}; expected str")
        tk = self._special if parse_special else self._plain
        encoding = self._encodings(tk, [text])[0]
        ids = encoding.ids
        if not ids:
            return ids, []
        # The tokenizers library gives each token the characters of the normalized/pre-tokenized
        # piece it came from, mapped back to `text`: byte tokens of one character, and spm's
        # prepended "▁", repeat the span of the character they belong to. Keep only the starts,
        # made non-decreasing, and let each token end where the next one starts.
        starts = [start for start, _ in encoding.offsets]
        starts[0] = 0
        for k in range(1, len(starts)):
            if starts[k] < starts[k - 1]:
                starts[k] = starts[k - 1]
        ends = [*starts[1:], len(text)]
        return ids, list(zip(starts, ends, strict=True))

    def encode_batch_ranges(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[tuple[int, int]] | None],
        *,
        parse_special: bool = True,
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Per text, its token ids (no BOS/EOS added) and, per character span [a, b) of `spans`,
        the tokens that are part of it as `encode_with_offsets` defines it, as a range [k0, k1).

        The same ids and the same tokens as `encode_with_offsets` and its offsets give, for many
        texts at once: the `tokenizers` library encodes them on its threads (`encodings`), and the
        tokens of a span are found by a binary search over the tokens' start characters
        (`ranges_of`), so a long text costs a few lookups per span instead of one per token. None
        in `spans` asks for the ids only.
        """
        return self.ranges_of(self.encodings(texts, parse_special=parse_special), texts, spans)

    def encodings(self, texts: Sequence[str], *, parse_special: bool = True) -> list:
        """The `tokenizers` library's encodings of `texts` (no BOS/EOS added), made on its threads
        with the interpreter lock released: for `ranges_of`. TokenizerError for a text that is not
        a str or not Unicode."""
        for t in texts:
            if not isinstance(t, str):
                raise TokenizerError(f"{self._source}: cannot tokenize a {type(t).__name__}; expected str")
        return self._encodings(self._special if parse_special else self._plain, list(texts))

    @staticmethod
    def ranges_of(
        encodings: Sequence[Any], texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]] | None]
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """`encode_batch_ranges` of encodings made by `encodings(texts)`. The start characters of
        a text's tokens never decrease (the library emits tokens in text order and maps them back
        through order-keeping normalizers and pre-tokenizers), so a binary search finds a span's
        tokens."""
        out: list[tuple[list[int], list[tuple[int, int]]]] = []
        for text, encoding, text_spans in zip(texts, encodings, spans, strict=True):
            ids = encoding.ids
            if not text_spans or not ids:
                out.append((ids, []))
                continue
            out.append((ids, _token_ranges(encoding, len(ids), len(text), text_spans)))
        return out

    def _encodings(self, tk: HFTokenizer, texts: list[str]) -> list:
        """The `tokenizers` encodings of `texts`; TokenizerError for text that is not Unicode (an
        unpaired surrogate, which has no UTF-8 bytes) rather than the library's TypeError."""
        try:
            if len(texts) == 1:
                return [tk.encode(texts[0], add_special_tokens=False)]
            return tk.encode_batch(texts, add_special_tokens=False)
        except TypeError:
            for k, text in enumerate(texts):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    where = f"text {k}" if len(texts) > 1 else "the text"
                    code = ord(text[exc.start])
                    raise TokenizerError(
                        f"{self._source}: {where} holds an unpaired surrogate U+{code:04X} at character "
                        f"{exc.start}, which is not Unicode text; only valid Unicode can be tokenized"
                    ) from None
            raise

    def _add_special(self, ids: list[int]) -> list[int]:
        if self.add_bos:
            assert self.bos_id is not None
            ids = [self.bos_id, *ids]
        if self.add_eos:
            assert self.eos_id is not None
            ids.append(self.eos_id)
        return ids

    # -- decoding -------------------------------------------------------------------

    def _piece_table(self) -> list[bytes]:
        if self._pieces is None:
            self._pieces = [self._piece(i) for i in range(self.n_vocab)]
        return self._pieces

    def _piece(self, i: int) -> bytes:
        """llama.cpp's token_to_piece(special=True), before any leading-space removal."""
        text, a = self._tokens[i], self._attrs[i]
        if a & (ATTR_SPECIAL | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if a & ATTR_NORMAL:
            if self.kind == "spm":
                return text.replace(SPACE_MARK, " ").encode("utf-8")
            try:
                return text.translate(CHAR_TO_BYTE).encode("latin-1")
            except UnicodeEncodeError:  # a character outside GPT-2's byte map: keep it as UTF-8
                return b"".join(
                    bytes([CHAR_TO_BYTE[ord(c)]]) if ord(c) in CHAR_TO_BYTE else c.encode("utf-8")
                    for c in text
                )
        if a & ATTR_BYTE:
            if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                try:
                    return bytes([int(text[3:5], 16)])
                except ValueError:
                    pass
            return text.encode("utf-8")
        return b""  # unused and undefined tokens render as nothing, as in llama.cpp

    def _check_id(self, token_id: int) -> int:
        try:
            i = operator.index(token_id)  # int or NumPy integer, never a float or a str
        except TypeError:
            i = -1
        if isinstance(token_id, bool) or not 0 <= i < self.n_vocab:
            raise TokenizerError(
                f"{self._source}: token id {token_id!r} is outside the vocabulary (0..{self.n_vocab - 1})"
            )
        return i

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes this token adds to the text: byte tokens give their byte, "▁" a space (spm),
        byte-level characters their bytes (bpe), control and user-defined tokens their text.

        For spm vocabularies (`add_space_prefix`), the first token of a text carries the
        prefix space that `decode` drops; a streaming decoder drops it the same way.
        """
        return self._piece_table()[self._check_id(token_id)]

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of `ids`: llama.cpp's `llama_detokenize(remove_special=false,
        unparse_special=not skip_special)` without its clean_spaces pass.

        The first token loses one leading space when `add_space_prefix` (the space that
        encode prepended), whatever that token is: decode([BOS, "▁Hi"]) is " Hi" with
        skip_special and "<s> Hi" without. skip_special drops control and unknown tokens.
        Invalid UTF-8 (a partial multi-byte character) becomes U+FFFD.
        """
        pieces = self._piece_table()
        attrs = self._attrs
        out = bytearray()
        for k, token_id in enumerate(ids):
            i = self._check_id(token_id)
            piece = b"" if skip_special and attrs[i] & ATTR_SPECIAL else pieces[i]
            if k == 0 and self.add_space_prefix and piece[:1] == b" ":
                piece = piece[1:]
            out += piece
        return out.decode("utf-8", errors="replace")

    # -- token properties -------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """The token's string as stored in tokenizer.ggml.tokens."""
        return self._tokens[self._check_id(token_id)]

    def is_control(self, token_id: int) -> bool:
        """True for control tokens (after llama.cpp's fix-ups), which plain text never produces."""
        return bool(self._attrs[self._check_id(token_id)] & ATTR_CONTROL)

    @property
    def fingerprint(self) -> str:
        """A SHA-256 (hex) of everything that decides this tokenizer's ids: the vocabulary, merges,
        normalizer, pre-tokenizer and special tokens as the `tokenizers` library holds them, and the
        BOS/EOS rules. Two tokenizers with the same fingerprint give the same ids for any text."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            # the two library tokenizers differ only in whether control tokens are split out of text
            h.update(self._special.to_str().encode("utf-8"))
            h.update(b"\0%d%d\0" % (self._special.encode_special_tokens, self._plain.encode_special_tokens))
            facts = (self.kind, self.pre, self.n_vocab, self.bos_id, self.eos_id, self.add_bos, self.add_eos)
            h.update(repr((*facts, self.add_space_prefix)).encode("utf-8"))
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"Tokenizer(kind={self.kind!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, eot_ids={sorted(self.eot_ids)}, add_bos={self.add_bos})"
        )
