"""Hostile model files: a corrupt header, out-of-range hyperparameters, NaN weights and a broken
vocabulary each end in one ModelError/TokenizerError line naming the value, where it is and what
would be accepted, before anything is allocated from it; the file is never changed."""

from __future__ import annotations

import hashlib
import math
import os
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from bench.fuzz import header_map
from engine.errors import ModelError, TokenizerError
from engine.io.gguf_file import GGUFFile
from engine.model.archs import ModelConfig
from engine.model.model import Model
from engine.testing import SynthSpec, model_metadata, random_weights, write_model
from engine.text.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(60)

SMALL = dict(V=300, C=64, NH=4, NKV=2, HS=16, F=64)


def _digest(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _model(tmp_path: Path, arch: str = "llama", *, metadata=None, weights=None, **spec) -> str:
    s = SynthSpec.for_arch(arch, **{**SMALL, **spec})
    md = {"general.alignment": 32, **(metadata or {})}
    return write_model(tmp_path / f"{arch}.gguf", s, weights=weights, metadata=md)


def _patched(path: str, kind: str, name: str, value: int, out: Path) -> Path:
    """A copy of the model with one header field (see bench.fuzz.header_map) set to `value`."""
    data = bytearray(Path(path).read_bytes())
    fields, _ = header_map(bytes(data))
    f = next(f for f in fields if f.kind == kind and f.name == name)
    data[f.offset : f.offset + f.size] = value.to_bytes(f.size, "little")
    out.write_bytes(bytes(data))
    return out


def _fails(path: str | os.PathLike[str], load=Model.load, error=ModelError) -> str:
    """The one-line message `load(path)` fails with; asserts the file was not changed."""
    before = _digest(path)
    with pytest.raises(error) as err:
        load(path)
    assert _digest(path) == before
    message = str(err.value)
    assert "\n" not in message
    return message


# -- the container ------------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [0, 3, 24, 2**31])
def test_alignment_must_be_a_power_of_two(tmp_path, alignment):
    path = _patched(_model(tmp_path), "value", "general.alignment", alignment, tmp_path / "a.gguf")
    message = _fails(path, GGUFFile)
    assert f"general.alignment is {alignment}; expected a power of two from 1 to" in message
    assert str(path) in message


def test_misaligned_tensor_offset_is_named(tmp_path):
    src = _model(tmp_path)
    f = GGUFFile(src)
    offset = next(o for o, n in _offsets(src) if n == "blk.0.attn_q.weight")
    path = _patched(src, "toffset", "blk.0.attn_q.weight", offset + 4, tmp_path / "m.gguf")
    message = _fails(path, GGUFFile)
    assert f"tensor 'blk.0.attn_q.weight' starts at data offset {offset + 4}" in message
    assert "not a multiple of the alignment 32" in message
    f.close()


def test_overlapping_tensors_are_refused(tmp_path):
    src = _model(tmp_path)
    offsets = dict((n, o) for o, n in _offsets(src))
    path = _patched(
        src, "toffset", "blk.0.attn_k.weight", offsets["blk.0.attn_q.weight"], tmp_path / "m.gguf"
    )
    message = _fails(path, GGUFFile)
    assert "'blk.0.attn_q.weight'" in message and "'blk.0.attn_k.weight'" in message and "overlap" in message


@pytest.mark.parametrize("offset", [2**40, 2**64 - 32])
def test_tensor_outside_the_data_section(tmp_path, offset):
    path = _patched(_model(tmp_path), "toffset", "output_norm.weight", offset, tmp_path / "m.gguf")
    message = _fails(path, GGUFFile)
    assert "tensor 'output_norm.weight'" in message and "but the file ends at" in message


def test_duplicate_tensor_names_are_refused(tmp_path):
    data = bytearray(Path(_model(tmp_path)).read_bytes())
    a, b = b"blk.0.attn_q.weight", b"blk.1.attn_q.weight"
    at = data.index(b)
    data[at : at + len(b)] = a
    path = tmp_path / "dup.gguf"
    path.write_bytes(bytes(data))
    assert "tensor 'blk.0.attn_q.weight' appears twice in the tensor directory" in _fails(path, GGUFFile)


def test_duplicate_metadata_keys_are_refused(tmp_path):
    data = bytearray(Path(_model(tmp_path)).read_bytes())
    a, b = b"llama.attention.head_count", b"llama.attention.key_length"  # the same length
    assert len(a) == len(b)
    at = data.index(b)
    data[at : at + len(b)] = a
    path = tmp_path / "dup.gguf"
    path.write_bytes(bytes(data))
    assert "metadata key 'llama.attention.head_count' appears twice" in _fails(path, GGUFFile)


@pytest.mark.parametrize("count", [2**40, 2**63, 2**64 - 1])
def test_huge_array_count_fails_fast_without_allocating(tmp_path, count):
    path = _patched(_model(tmp_path), "count", "tokenizer.ggml.tokens", count, tmp_path / "m.gguf")
    tracemalloc.start()
    try:
        message = _fails(path, GGUFFile)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "metadata 'tokenizer.ggml.tokens' at offset" in message
    assert f"declares {count} STRING items, more than the" in message and "truncated or corrupt" in message
    assert peak < 4 << 20


@pytest.mark.parametrize(("kind", "name"), [("str_len", "general.name"), ("key_len", ""), ("name_len", "")])
def test_huge_string_length_fails_fast(tmp_path, kind, name):
    src = _model(tmp_path)
    fields, _ = header_map(Path(src).read_bytes())
    f = next(f for f in fields if f.kind == kind and (f.name == name or not name))
    data = bytearray(Path(src).read_bytes())
    data[f.offset : f.offset + 8] = (2**62).to_bytes(8, "little")
    path = tmp_path / "s.gguf"
    path.write_bytes(bytes(data))
    message = _fails(path, GGUFFile)
    assert f"at offset {f.offset} declares {2**62} bytes but only" in message


def test_nested_arrays_are_read(tmp_path):
    def string(s: bytes) -> bytes:
        return struct.pack("<Q", len(s)) + s

    body = string(b"x.nested") + struct.pack("<IIQ", 9, 9, 2)
    body += struct.pack("<IQii", 5, 2, 1, 2) + struct.pack("<IQi", 5, 1, 3)
    body += string(b"x.after") + struct.pack("<II", 4, 7)
    path = tmp_path / "nested.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + body)
    assert GGUFFile(path).metadata == {"x.nested": [[1, 2], [3]], "x.after": 7}


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match=r"is a FIFO \(named pipe\), not a file; expected a .gguf file"):
        GGUFFile(fifo)


def test_a_device_is_refused(tmp_path):
    with pytest.raises(ModelError, match="is a character device, not a file"):
        GGUFFile("/dev/zero")


def _offsets(path: str) -> list[tuple[int, str]]:
    data = Path(path).read_bytes()
    fields, _ = header_map(data)
    return [
        (int.from_bytes(data[f.offset : f.offset + 8], "little"), f.name)
        for f in fields
        if f.kind == "toffset"
    ]


# -- hyperparameters ------------------------------------------------------------------------------

HYPERPARAMETERS = [
    # (arch, key (without the arch), value, words of the message)
    ("llama", "block_count", 0, ["llama.block_count is 0; expected an integer in 1..4096"]),
    ("llama", "block_count", 10**9, ["llama.block_count is 1000000000; expected an integer in 1..4096"]),
    (
        "llama",
        "block_count",
        3,
        ["block_count is 3, but the file has tensors for 2 layers", "at most 2"],
    ),
    ("llama", "block_count", "2", ["llama.block_count is '2'; expected an integer"]),
    ("llama", "rope.dimension_count", 18, ["rope.dimension_count is 18; expected an integer in 0..16"]),
    (
        "llama",
        "rope.dimension_count",
        7,
        ["rope.dimension_count is 7; expected an even number from 2 to"],
    ),
    ("llama", "attention.head_count", 3, ["head counts 3 query / 2 key-value are not valid for GQA"]),
    ("llama", "attention.head_count_kv", 5, ["head_count_kv is 5; expected an integer in 1..4"]),
    (
        "llama",
        "context_length",
        2**40,
        ["context_length is 1099511627776; expected an integer in 1..16777216"],
    ),
    ("llama", "context_length", 0, ["context_length is 0; expected an integer in 1..16777216"]),
    (
        "llama",
        "embedding_length",
        128,
        ["token_embd.weight has shape (300, 64)", "shape (300, 128)"],
    ),
    ("llama", "vocab_size", 301, ["says 301 tokens of embedding_length 64", "expected shape (301, 64)"]),
    (
        "llama",
        "attention.key_length+value_length",
        32,
        ["attn_q.weight has 64 rows, but attention.head"],
    ),
    ("llama", "rope.freq_base", math.nan, ["rope.freq_base is nan; expected a finite number more than 0"]),
    (
        "llama",
        "attention.layer_norm_rms_epsilon",
        0.0,
        ["epsilon is 0.0; expected a finite number more"],
    ),
    ("qwen3moe", "expert_count", 0, ["are Mixture-of-Experts, but expert_count is missing or 0"]),
    ("qwen3moe", "expert_count", 5000, ["expert_count is 5000; expected an integer in 0..4096"]),
    ("qwen3moe", "expert_count", 8, ["blk.0.ffn_gate_inp.weight routes to 4 experts, but expert_count is 8"]),
    ("qwen3moe", "expert_used_count", 9, ["expert_used_count 9 must be in 1..4"]),
    ("qwen3moe", "expert_used_count", -1, ["expert_used_count is -1; expected an integer in 0..4096"]),
]


@pytest.mark.parametrize(
    ("arch", "key", "value", "words"), HYPERPARAMETERS, ids=[f"{h[1]}={h[2]}" for h in HYPERPARAMETERS]
)
def test_hyperparameters_out_of_range_name_the_key(tmp_path, arch, key, value, words):
    extra = {"HS": 32, "F_exp": 32} if arch == "qwen3moe" else {}
    keys = ["attention.key_length", "attention.value_length"] if "+" in key else [key]
    path = _model(tmp_path, arch, metadata={f"{arch}.{k}": value for k in keys}, **extra)
    message = _fails(path)
    for word in words:
        assert word in message, (word, message)
    assert str(path) in message


def test_head_size_needs_heads_that_divide_the_width(tmp_path):
    spec = SynthSpec.for_arch("llama", **SMALL)
    md = {k: v for k, v in model_metadata(spec).items() if k != "llama.attention.key_length"}
    md["llama.attention.head_count"] = 3
    md["llama.attention.head_count_kv"] = 1
    from engine.io.gguf_write import write_gguf

    w = random_weights(spec)
    path = write_gguf(tmp_path / "m.gguf", "llama", md, {n: (a, "F32") for n, a in w.items()})
    message = _fails(path)
    assert "embedding_length 64 is not a multiple of attention.head_count 3" in message


def test_config_is_checked_before_the_layer_loop(tmp_path):
    # a directory of 2 layers and block_count at its limit: refused at once, no loop over 4096 layers
    path = _model(tmp_path, metadata={"llama.block_count": 4096})
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    assert cfg.L == 4096
    message = _fails(path)
    assert "block_count is 4096, but the file has tensors for 2 layers" in message


# -- weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qtype", "name", "bad"),
    [
        ("F32", "output_norm.weight", math.nan),  # a vector: dequantized (checked) at load
        ("F32", "blk.1.ffn_up.weight", math.inf),  # read as stored, checked the first time
        ("F16", "blk.0.attn_v.weight", -math.inf),
        ("Q8_0", "blk.0.ffn_down.weight", math.nan),  # a block scale
        ("Q8_0", "output.weight", math.nan),  # the head, walked in blocks
        ("F32", "blk.0.attn_k.weight", 3e36),  # finite, but no weight: bytes of something else
    ],
)
def test_non_finite_weights_are_a_bad_model_file_naming_the_tensor(tmp_path, qtype, name, bad):
    path = _model(tmp_path, qtype=qtype)
    data = bytearray(Path(path).read_bytes())
    fields, end = header_map(bytes(data))
    start = -(-end // 32) * 32 + dict((n, o) for o, n in _offsets(path))[name]
    if qtype == "F32":
        data[start + 8 : start + 12] = struct.pack("<f", bad)
    else:  # an F16 value, or the F16 scale that starts a Q8_0 block
        at = start + (4 if qtype == "F16" else 34)
        data[at : at + 2] = np.float16(bad).tobytes()
    bad_path = tmp_path / "bad.gguf"
    bad_path.write_bytes(bytes(data))
    before = _digest(bad_path)

    def load_and_run(p):
        model = Model.load(p, cache_budget="1M")
        model.forward(np.array([1, 2, 3]))

    message = _fails(bad_path, load_and_run)
    assert f"tensor {name!r} holds" in message and "NaN, infinite or beyond ±1e+15" in message
    assert "the model file is corrupt" in message and "learning rate" not in message
    assert _digest(bad_path) == before


def test_finite_weights_pass_the_check(tmp_path):
    model = Model.load(_model(tmp_path, qtype="Q8_0"), cache_budget=0)
    assert np.isfinite(model.forward(np.array([1, 2, 3]))).all()


# -- vocabulary -------------------------------------------------------------------------------------


def _vocab(**changes) -> dict:
    md = model_metadata(SynthSpec.for_arch("llama", **SMALL))
    md.update(changes)
    return md


@pytest.mark.parametrize("which", ["bos", "eos", "eot", "unknown"])
@pytest.mark.parametrize("value", [300, 2**31])
def test_special_ids_outside_the_vocabulary_are_refused(which, value):
    key = f"tokenizer.ggml.{which}_token_id"
    with pytest.raises(TokenizerError) as err:
        Tokenizer.from_metadata(_vocab(**{key: value}), "m.gguf")
    assert (
        str(err.value) == f"m.gguf: {key} is {value}, outside the vocabulary; expected a token id in 0..299"
    )


def test_padding_id_outside_the_vocabulary_is_ignored_as_llama_cpp_does(caplog):
    # real files carry padding_token_id = 32000 with 32000 tokens; the id is never used to encode
    tok = Tokenizer.from_metadata(_vocab(**{"tokenizer.ggml.padding_token_id": 300}))
    assert tok.pad_id is None
    assert "padding_token_id = 300 is out of the vocabulary" in caplog.text


def test_nan_score_is_refused():
    scores = [0.0] * 300
    scores[260] = math.nan
    with pytest.raises(TokenizerError, match=r"tokenizer.ggml.scores\[260\] \(token '<\|im_end\|>'\) is NaN"):
        Tokenizer.from_metadata(_vocab(**{"tokenizer.ggml.scores": scores}))


@pytest.mark.parametrize("n", [299, 301])
def test_token_types_of_the_wrong_length_are_refused(n):
    with pytest.raises(TokenizerError) as err:
        Tokenizer.from_metadata(_vocab(**{"tokenizer.ggml.token_type": [1] * n}))
    assert str(err.value).endswith(
        f"tokenizer.ggml.token_type has {n} entries for 300 tokens; expected one entry per token"
    )


@pytest.mark.parametrize("merge", ["ab", "a ", " ", "▁a "])
def test_merges_that_are_not_pairs_are_refused(merge):
    md = _vocab(**{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2"})
    md["tokenizer.ggml.merges"] = ["a b", merge]
    with pytest.raises(TokenizerError, match="is not a pair of tokens; expected 'left right'"):
        Tokenizer.from_metadata(md)


def test_a_lone_surrogate_is_not_tokenized():
    tok = Tokenizer.from_metadata(_vocab())
    with pytest.raises(TokenizerError, match=r"unpaired surrogate U\+D800 at character 2"):
        tok.encode("hi\ud800")
    with pytest.raises(TokenizerError, match="text 1 holds an unpaired surrogate"):
        tok.encode_batch(["ok", "\udfff"])


def test_very_long_tokens_do_not_make_the_vocabulary_slow():
    md = _vocab()
    tokens = list(md["tokenizer.ggml.tokens"])
    for i in range(270, 300):  # 30 tokens of 20k characters: every split tried would be 10^9 steps
        tokens[i] = chr(0x4E00 + i) * 20_000
    md["tokenizer.ggml.tokens"] = tokens
    tok = Tokenizer.from_metadata(md)
    assert tok.encode("hello", add_special=False)
