"""The tokenizer: llama.cpp's token ids on its own vocabulary test files, and the conventions around them.

The `ggml-vocab-*.gguf.inp/.out` pairs come from llama.cpp's `models/` folder: inputs separated by
"\\n__ggml_vocab_test__\\n" (as `tests/test-tokenizer-0.cpp` splits them), one line of expected ids
per input, no BOS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import TokenizerError
from engine.io.gguf_file import GGUFFile
from engine.text.tokenizer import PRE_TOKENIZERS, Tokenizer
from tests.conftest import DATA

VOCAB = DATA / "vocab"
VOCABS = ("gpt-2", "llama-bpe", "llama-spm", "qwen2")
BYTE_LEVEL = ("gpt-2", "llama-bpe", "qwen2")
SEP = "\n__ggml_vocab_test__\n"


def _vocab_path(name: str) -> Path:
    return VOCAB / f"ggml-vocab-{name}.gguf"


def _read_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs, split exactly as llama.cpp's test-tokenizer-0 does."""
    raw = (VOCAB / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    lines = (VOCAB / f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8").splitlines()
    assert len(texts) == len(lines), f"{name}: {len(texts)} inputs but {len(lines)} expected-id lines"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


class _Vocabs:
    """Each vocabulary file read, and each tokenizer built, at most once per module."""

    def __init__(self) -> None:
        self._metadata: dict[str, dict[str, Any]] = {}
        self._tokenizers: dict[str, Tokenizer] = {}

    def metadata(self, name: str) -> dict[str, Any]:
        if name not in self._metadata:
            with GGUFFile(_vocab_path(name)) as f:
                self._metadata[name] = f.metadata
        return self._metadata[name]

    def tokenizer(self, name: str) -> Tokenizer:
        if name not in self._tokenizers:
            self._tokenizers[name] = Tokenizer.from_metadata(self.metadata(name), name)
        return self._tokenizers[name]


@pytest.fixture(scope="module")
def vocabs() -> _Vocabs:
    return _Vocabs()


def _with(md: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of metadata with keys changed ("tokenizer_ggml_pre" -> "tokenizer.ggml.pre"); None deletes."""
    out = dict(md)
    for key, value in changes.items():
        key = key.replace("_", ".", 2) if key.startswith("tokenizer_ggml_") else key
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


# -- llama.cpp's own test cases -------------------------------------------------------------


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_file_cases_match_llama_cpp(vocabs, name):
    tok = vocabs.tokenizer(name)
    cases = _read_cases(name)
    assert len(cases) == 46  # the files hold 46 cases each; fewer means the split went wrong
    failures = []
    for text, expected in cases:
        got = tok.encode(text, add_special=False)
        if got != expected:
            failures.append(f"{text!r}: expected {expected}, got {got}")
    assert not failures, f"{name}: {len(failures)}/{len(cases)} cases differ:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_file_cases_round_trip(vocabs, name):
    # llama.cpp's detokenizer drops one leading space from the first token when the vocabulary
    # adds a space prefix (spm): that is the "▁" the tokenizer put there, so text -> ids -> text
    # is exact, also for texts that begin with spaces. Byte-level BPE adds nothing and drops nothing.
    tok = vocabs.tokenizer(name)
    failures = []
    for text, _ in _read_cases(name):
        back = tok.decode(tok.encode(text, add_special=False))
        if back != text:
            failures.append(f"{text!r} came back as {back!r}")
    assert not failures, f"{name}:\n" + "\n".join(failures)


def test_batch_encoding_equals_single_encoding(vocabs):
    tok = vocabs.tokenizer("qwen2")
    texts = [t for t, _ in _read_cases("qwen2")]
    assert tok.encode_batch(texts, add_special=False) == [tok.encode(t, add_special=False) for t in texts]


# -- the space prefix of SentencePiece vocabularies ----------------------------------------------


def test_spm_first_token_carries_the_prefix_space_that_decode_drops(vocabs):
    tok = vocabs.tokenizer("llama-spm")
    assert tok.kind == "spm" and tok.pre is None and tok.add_space_prefix
    ids = tok.encode("Hello world", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["\u2581Hello", "\u2581world"]
    assert b"".join(tok.token_bytes(i) for i in ids) == b" Hello world"
    assert tok.decode(ids) == "Hello world"
    # llama.cpp strips a space from the very first piece only: after a BOS, "▁Hello" keeps it
    assert tok.decode([tok.bos_id, *ids]) == "<s> Hello world"
    assert tok.decode([tok.bos_id, *ids], skip_special=True) == " Hello world"


def test_spm_byte_fallback_tokens_give_their_bytes(vocabs):
    tok = vocabs.tokenizer("llama-spm")
    newline = tok.encode("\n", add_special=False, parse_special=False)
    assert [tok.token_text(i) for i in newline] == ["\u2581", "<0x0A>"]
    assert tok.token_bytes(newline[1]) == b"\n"
    rare = "\U0001f999"  # not in the vocabulary: four byte tokens
    ids = tok.encode(rare, add_special=False)
    assert [tok.token_text(i) for i in ids[-4:]] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    assert tok.decode(ids) == rare


def test_spm_special_token_text_gets_a_space_prefix_after_it(vocabs):
    # llama.cpp prefixes a space to every text fragment that follows a special token
    tok = vocabs.tokenizer("llama-spm")
    ids = tok.encode("<s>Hello", add_special=False, parse_special=True)
    assert [tok.token_text(i) for i in ids] == ["<s>", "\u2581Hello"]
    plain = tok.encode("<s>Hello", add_special=False)
    assert tok.bos_id not in plain
    assert tok.decode(plain) == "<s>Hello"


# -- special tokens -----------------------------------------------------------------------------


def test_parse_special_turns_control_text_into_its_token(vocabs):
    tok = vocabs.tokenizer("qwen2")
    text = "<|im_start|>user"
    special = tok.encode(text, add_special=False, parse_special=True)
    assert special[0] == 151644 and tok.token_text(151644) == "<|im_start|>"
    assert tok.is_control(special[0])
    assert tok.decode(special[1:]) == "user"
    plain = tok.encode(text, add_special=False)
    assert len(plain) > 3 and not any(tok.is_control(i) for i in plain)
    assert tok.decode(plain) == text


def test_parse_special_in_llama3(vocabs):
    tok = vocabs.tokenizer("llama-bpe")
    text = "<|start_header_id|>assistant<|end_header_id|>\n\nHi<|eot_id|>"
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert ids[0] == 128006 and ids[2] == 128007 and ids[-1] == 128009
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=True) == "assistant\n\nHi"
    assert 128009 not in tok.encode(text, add_special=False)


def test_user_defined_tokens_are_split_out_without_parse_special(vocabs):
    # qwen2's "[PAD151646]" is USER_DEFINED (type 4): llama.cpp always matches those
    tok = vocabs.tokenizer("qwen2")
    assert vocabs.metadata("qwen2")["tokenizer.ggml.token_type"][151646] == 4
    ids = tok.encode("a[PAD151646]b", add_special=False)
    assert 151646 in ids and not tok.is_control(151646)
    assert tok.decode(ids) == "a[PAD151646]b"
    assert tok.decode(ids, skip_special=True) == "a[PAD151646]b"  # user-defined text is always shown


def test_add_special_adds_bos_as_the_file_asks(vocabs):
    llama3 = vocabs.tokenizer("llama-bpe")  # no add_bos_token key: llama.cpp's llama3 default is true
    assert llama3.add_bos and not llama3.add_eos
    assert llama3.encode("Hello") == [128000, *llama3.encode("Hello", add_special=False)]
    spm = vocabs.tokenizer("llama-spm")  # add_bos_token = true in the file
    assert spm.add_bos and spm.encode("Hello") == [1, *spm.encode("Hello", add_special=False)]
    qwen2 = vocabs.tokenizer("qwen2")  # no key: llama.cpp's default for qwen2 is false
    assert not qwen2.add_bos and qwen2.encode("Hello") == qwen2.encode("Hello", add_special=False)
    assert spm.encode("") == [1] and spm.encode("", add_special=False) == []


def test_add_eos_and_an_explicit_add_bos_key_are_honoured(vocabs):
    md = vocabs.metadata("llama-spm")
    tok = Tokenizer.from_metadata(
        _with(md, tokenizer_ggml_add_eos_token=True, tokenizer_ggml_add_bos_token=False)
    )
    assert tok.encode("Hi") == [*tok.encode("Hi", add_special=False), 2]


def test_eot_ids(vocabs):
    qwen2 = vocabs.tokenizer("qwen2")
    assert {qwen2.token_text(i) for i in (151643, 151645)} == {"<|endoftext|>", "<|im_end|>"}
    assert {151643, 151645} <= qwen2.eot_ids
    assert 151644 not in qwen2.eot_ids  # <|im_start|>
    # qwen2 also has a NORMAL "</s>" token; llama.cpp treats that text as end of generation
    # and makes the token CONTROL
    assert (
        qwen2.token_text(128247) == "</s>"
        and vocabs.metadata("qwen2")["tokenizer.ggml.token_type"][128247] == 1
    )
    assert qwen2.eot_ids == {151643, 151645, 128247} and qwen2.is_control(128247)
    llama3 = vocabs.tokenizer("llama-bpe")
    assert llama3.token_text(128009) == "<|eot_id|>" and llama3.token_text(128001) == "<|end_of_text|>"
    assert llama3.eot_ids == {128001, 128009}
    assert vocabs.tokenizer("gpt-2").eot_ids == {50256}
    assert vocabs.tokenizer("llama-spm").eot_ids == {2}


def test_special_ids(vocabs):
    qwen2 = vocabs.tokenizer("qwen2")
    assert (qwen2.bos_id, qwen2.eos_id, qwen2.pad_id) == (151643, 151643, 151643)
    assert qwen2.n_vocab == 151936 and qwen2.kind == "bpe" and qwen2.pre == "qwen2"
    spm = vocabs.tokenizer("llama-spm")
    assert (spm.bos_id, spm.eos_id, spm.pad_id, spm.n_vocab) == (1, 2, None, 32000)
    assert spm.is_control(1) and not spm.is_control(15043)


def test_metadata_eot_id_is_an_end_of_generation_id(vocabs):
    tok = Tokenizer.from_metadata(_with(vocabs.metadata("llama-spm"), tokenizer_ggml_eot_token_id=13))
    assert tok.eot_ids == {2, 13}


# -- bytes and decoding ---------------------------------------------------------------------------

SAMPLES = (
    "Hello, world!",
    " leading and  double  spaces ",
    "tabs\tand\nnewlines\r\n",
    "ünïcödé, 日本語, emoji 🦙🚀, combining é",
    "code: def f(x):\n    return x ** 2  # ok",
)


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_token_bytes_concatenate_to_decode(vocabs, name):
    tok = vocabs.tokenizer(name)
    for text in SAMPLES:
        ids = tok.encode(text, add_special=False)
        joined = b"".join(tok.token_bytes(i) for i in ids)
        assert joined.decode("utf-8") == tok.decode(ids) == text


def test_token_bytes_split_characters_stream_back_together(vocabs):
    tok = vocabs.tokenizer("llama-bpe")
    ids = tok.encode("🦙", add_special=False)
    pieces = [tok.token_bytes(i) for i in ids]
    assert len(pieces) > 1 and b"".join(pieces) == "🦙".encode()
    with pytest.raises(UnicodeDecodeError):
        pieces[0].decode("utf-8")  # a partial character: streaming must buffer bytes, not text
    assert tok.decode(ids[:1]) == "\ufffd"


def test_spm_token_bytes_concatenate_to_the_prefix_space_and_decode(vocabs):
    tok = vocabs.tokenizer("llama-spm")
    for text in SAMPLES:
        ids = tok.encode(text, add_special=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == b" " + tok.decode(ids).encode()
        assert tok.decode(ids) == text


def test_byte_level_characters_map_back_to_bytes(vocabs):
    tok = vocabs.tokenizer("gpt-2")
    for text, byte in (("\u0120", b" "), ("\u010a", b"\n"), ("!", b"!")):
        i = tok.encode(byte.decode(), add_special=False)[0]
        assert tok.token_text(i) == text and tok.token_bytes(i) == byte
    assert tok.token_bytes(50256) == b"<|endoftext|>"  # control tokens give their text
    assert tok.decode([50256], skip_special=True) == ""


def test_bad_ids_raise_tokenizer_error(vocabs):
    tok = vocabs.tokenizer("gpt-2")
    for bad in (-1, tok.n_vocab):
        with pytest.raises(TokenizerError, match=str(bad)):
            tok.decode([bad])
        with pytest.raises(TokenizerError, match=str(bad)):
            tok.token_bytes(bad)
    with pytest.raises(TokenizerError, match="'7'"):
        tok.decode(["7"])  # type: ignore[list-item]
    with pytest.raises(TokenizerError, match="bytes"):
        tok.encode(b"hi")  # type: ignore[arg-type]


def test_decode_takes_numpy_ids(vocabs):
    tok = vocabs.tokenizer("gpt-2")
    ids = tok.encode("Hello world", add_special=False)
    assert tok.decode(np.array(ids, dtype=np.int32)) == "Hello world"
    assert tok.token_bytes(np.int64(ids[0])) == b"Hello"


# -- bad metadata ---------------------------------------------------------------------------------


def test_unknown_pre_tokenizer_is_refused(vocabs):
    md = _with(vocabs.metadata("qwen2"), tokenizer_ggml_pre="my-own-regex")
    with pytest.raises(TokenizerError, match="'my-own-regex'") as err:
        Tokenizer.from_metadata(md, "test.gguf")
    assert "test.gguf" in str(err.value) and "qwen2" in str(err.value)  # names what is supported


def test_pre_tokenizer_that_llama_cpp_hand_codes_is_refused(vocabs):
    # kimi-k2 is a llama.cpp pre-tokenizer, but implemented in code, not by a regex
    with pytest.raises(TokenizerError, match="'kimi-k2'"):
        Tokenizer.from_metadata(_with(vocabs.metadata("qwen2"), tokenizer_ggml_pre="kimi-k2"))


def test_unknown_tokenizer_model_is_refused(vocabs):
    md = _with(vocabs.metadata("llama-spm"), tokenizer_ggml_model="bert")
    with pytest.raises(TokenizerError, match="'bert'") as err:
        Tokenizer.from_metadata(md)
    assert "'llama'" in str(err.value) and "'gpt2'" in str(err.value)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"tokenizer_ggml_model": None}, "tokenizer.ggml.model"),
        ({"tokenizer_ggml_tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer_ggml_tokens": []}, "tokenizer.ggml.tokens"),
        ({"tokenizer_ggml_tokens": "abc"}, "tokenizer.ggml.tokens"),
        ({"tokenizer_ggml_tokens": ["a", "b", 3]}, "tokenizer.ggml.tokens"),
        ({"tokenizer_ggml_tokens": ["a", "b", "a"]}, "duplicate"),
        ({"tokenizer_ggml_merges": None}, "tokenizer.ggml.merges"),
        ({"tokenizer_ggml_merges": ["a b", "nospace"]}, "nospace"),
        ({"tokenizer_ggml_merges": 7}, "tokenizer.ggml.merges"),
        ({"tokenizer_ggml_token_type": [1, 1]}, "tokenizer.ggml.token_type"),
        ({"tokenizer_ggml_token_type": "x"}, "tokenizer.ggml.token_type"),
        ({"tokenizer_ggml_bos_token_id": "1"}, "tokenizer.ggml.bos_token_id"),
        ({"tokenizer_ggml_bos_token_id": 1.5}, "tokenizer.ggml.bos_token_id"),
        ({"tokenizer_ggml_add_bos_token": "yes"}, "tokenizer.ggml.add_bos_token"),
        ({"tokenizer_ggml_pre": 3}, "tokenizer.ggml.pre"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_bad_metadata_raises_tokenizer_error(vocabs, changes, match):
    md = _with(vocabs.metadata("gpt-2"), **changes)
    with pytest.raises(TokenizerError, match=match):
        Tokenizer.from_metadata(md)


def test_add_bos_without_a_bos_id_is_refused(vocabs):
    md = _with(vocabs.metadata("llama-bpe"), tokenizer_ggml_bos_token_id=None, tokenizer_ggml_pre="glm4")
    md["tokenizer.ggml.add_bos_token"] = True
    with pytest.raises(TokenizerError, match="add_bos_token"):
        Tokenizer.from_metadata(md)


def test_not_a_mapping_is_refused():
    with pytest.raises(TokenizerError, match="mapping"):
        Tokenizer.from_metadata(["tokenizer.ggml.model"])  # type: ignore[arg-type]


# -- every supported pre-tokenizer, on a tiny byte-level vocabulary ----------------------------------


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's printable character for each byte 0..255 (bytes_to_unicode in GPT-2's encoder.py)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    char = {b: chr(b) for b in printable} | {b: chr(256 + k) for k, b in enumerate(others)}
    return [char[b] for b in range(256)]


def _tiny_metadata(pre: str) -> dict[str, Any]:
    """256 byte characters, "11" and "111" (merged from digits), and two control tokens."""
    tokens = [*_gpt2_byte_chars(), "11", "111", "<|eot_id|>", "<|im_start|>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * 258 + [3, 3],
        "tokenizer.ggml.merges": ["1 1", "11 1"],
        "tokenizer.ggml.bos_token_id": 259,
        "tokenizer.ggml.eos_token_id": 258,
    }


def _one_name_per_regex_group() -> list[str]:
    first: dict[str, str] = {}
    for name, spec in sorted(PRE_TOKENIZERS.items()):
        first.setdefault(spec.regexes, name)
    return sorted(first.values())


@pytest.mark.parametrize("pre", _one_name_per_regex_group())
def test_every_pre_tokenizer_builds_and_round_trips(pre):
    tok = Tokenizer.from_metadata(_tiny_metadata(pre), pre)
    text = "Hello, y'all! 1111 ünï 日本 🦙\n\n\t  x<|eot_id|>"
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text
    assert 258 not in ids
    assert 258 in tok.encode(text, add_special=False, parse_special=True)
    assert tok.eot_ids == {258}


@pytest.mark.parametrize(
    "pre, pieces",
    [
        ("llama3", ["111", "1"]),  # \p{N}{1,3}
        ("qwen2", ["1", "1", "1", "1"]),  # \p{N}
        ("gpt-2", ["11", "11"]),  # \p{N}+, then BPE
        ("starcoder", ["1", "1", "1", "1"]),  # \p{N} first
    ],
)
def test_pre_tokenizer_regex_decides_digit_grouping(pre, pieces):
    tok = Tokenizer.from_metadata(_tiny_metadata(pre))
    assert [tok.token_text(i) for i in tok.encode("1111", add_special=False)] == pieces


def test_llama3_family_defaults_to_adding_bos():
    assert Tokenizer.from_metadata(_tiny_metadata("llama3")).add_bos
    assert not Tokenizer.from_metadata(_tiny_metadata("qwen2")).add_bos


def test_missing_pre_falls_back_to_llama_cpp_default(caplog):
    md = _tiny_metadata("default")
    del md["tokenizer.ggml.pre"]
    tok = Tokenizer.from_metadata(md)
    assert tok.pre == "default"
    assert "tokenizer.ggml.pre is missing" in caplog.text


def test_from_gguf_reads_the_file():
    tok = Tokenizer.from_gguf(_vocab_path("gpt-2"))
    assert tok.n_vocab == 50257 and tok.pre == "gpt-2"
    assert tok.encode("Hello world", add_special=False) == [15496, 995]
