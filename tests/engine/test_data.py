"""Training data: loading and its problems, token offsets and loss masks, packing, batches, splits, saving."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from engine.errors import DatasetError
from engine.io.gguf_file import GGUFFile
from engine.text.chat_template import ChatTemplate
from engine.text.tokenizer import Tokenizer
from engine.train import data
from engine.train.batches import batch_encoded, build_batches, make_batches, pack
from engine.train.data import (
    Problem,
    Sample,
    append_jsonl,
    load_jsonl,
    parse_sample,
    save_jsonl,
)
from engine.train.encode import Encoded, EncodeOptions, encode_samples
from engine.train.val_split import split_validation, validation_indices
from tests.conftest import DATA

DATASETS = DATA / "datasets"
GOLDEN = ("sample_data.jsonl", "sample_rwsft_data.jsonl")

CONVERSATION = (
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "the answer is yes"},
    {"role": "user", "content": "and the fox?"},
    {"role": "assistant", "content": "quick brown fox, é 漢"},
)


class Vocab:
    """A tokenizer and the chat template that goes with it."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, end_of_turn: str):
        self.tokenizer = tokenizer
        self.template = template
        self.end_of_turn = end_of_turn


def _from_gguf(path: Path) -> Vocab:
    with GGUFFile(path) as f:
        md = f.metadata
    return Vocab(Tokenizer.from_metadata(md, str(path)), ChatTemplate.from_metadata(md), "<|im_end|>")


@pytest.fixture(scope="module")
def vocabs(synth_model) -> dict[str, Vocab]:
    """synth: the tiny SentencePiece model with ChatML; qwen2: byte-level BPE with its own template;
    llama3: the Llama 3 vocabulary with the Llama 3.1 template file (the vocab file has none)."""
    out = {
        "synth": _from_gguf(Path(synth_model("llama"))),
        "qwen2": _from_gguf(DATA / "vocab" / "ggml-vocab-qwen2.gguf"),
    }
    with GGUFFile(DATA / "vocab" / "ggml-vocab-llama-bpe.gguf") as f:
        md = f.metadata
    source = (DATA / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(encoding="utf-8")
    template = ChatTemplate(source, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    out["llama3"] = Vocab(Tokenizer.from_metadata(md, "llama-bpe"), template, "<|eot_id|>")
    return out


def _write(path: Path, lines: list[str], *, bom: bool = False) -> Path:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "\n".join(lines).encode("utf-8") + b"\n")
    return path


def _sample(obj: dict, line: int = 0) -> Sample:
    sample, problems = parse_sample(obj, line)
    assert sample is not None, problems
    return sample


def _trained_runs(tokenizer: Tokenizer, e: Encoded) -> list[bytes]:
    """The bytes of each maximal run of trained tokens."""
    runs, current = [], []
    for token, trained in zip(e.tokens.tolist(), e.trained.tolist(), strict=True):
        if trained:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [b"".join(tokenizer.token_bytes(t) for t in run) for run in runs]


# -- Tokenizer.encode_with_offsets ---------------------------------------------------------------

OFFSET_TEXTS = (
    "Hello world",
    " é漢字🙂 x  two  spaces ",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<s>a</s>\n\n<|begin_of_text|>b\t\tc",
    "",
    "🙂🙂 🙂",
)


@pytest.mark.parametrize("name", ["synth", "qwen2", "llama3"])
@pytest.mark.parametrize("parse_special", [True, False])
def test_encode_with_offsets_tiles_the_text_and_matches_encode(vocabs, name, parse_special):
    tk = vocabs[name].tokenizer
    spm = tk.kind == "spm"

    def norm(b: bytes) -> bytes:  # spm inserts a "▁" (a space) before each run of text: ignore spaces
        return b.replace(b" ", b"") if spm else b

    for text in OFFSET_TEXTS:
        ids, offsets = tk.encode_with_offsets(text, parse_special=parse_special)
        assert ids == tk.encode(text, add_special=False, parse_special=parse_special)
        assert len(offsets) == len(ids)
        if not ids:
            continue
        starts, ends = [s for s, _ in offsets], [e for _, e in offsets]
        assert starts[0] == 0 and ends[-1] == len(text)
        assert starts[1:] == ends[:-1], "each token starts where the previous one ends"
        assert all(s <= e for s, e in offsets)
        # the characters before token k are exactly those whose last byte is in tokens 0..k-1
        done = b""
        for k, token in enumerate(ids):
            s = starts[k]
            before, upto = norm(text[:s].encode()), norm(text[: s + 1].encode())
            assert norm(done).startswith(before), (name, text, k)
            assert upto.startswith(norm(done)), (name, text, k)
            if not text[s : s + 1].isspace() or not spm:
                assert len(norm(done)) < len(upto) or s == len(text), (name, text, k)
            done += tk.token_bytes(token)
        assert norm(done) == norm(text.encode())


def test_encode_with_offsets_special_tokens_span_their_text(vocabs):
    tk = vocabs["qwen2"].tokenizer
    text = "<|im_start|>user\nHi<|im_end|>\n"
    ids, offsets = tk.encode_with_offsets(text)
    pieces = [text[s:e] for s, e in offsets]
    assert pieces == ["<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "\n"]
    assert ids[0] == tk.encode("<|im_start|>", add_special=False, parse_special=True)[0]


# -- loading --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_datasets_load_without_problems(name):
    samples, problems = load_jsonl(DATASETS / name)
    assert problems == []
    n_lines = sum(1 for line in (DATASETS / name).read_text(encoding="utf-8").splitlines() if line.strip())
    assert len(samples) == n_lines
    assert [s.line for s in samples] == list(range(1, n_lines + 1))
    for s in samples:
        assert s.kind in ("messages", "prompt", "text")
        if s.kind != "text":
            assert s.messages[-1]["role"] == "assistant"


def test_golden_rewards_and_groups():
    samples, _ = load_jsonl(DATASETS / "sample_rwsft_data.jsonl")
    assert [s.reward for s in samples][:4] == [0.9, 0.2, 1.0, 0.3]
    # pairs of answers to one question share a group; different questions do not
    assert samples[0].group == samples[1].group != samples[2].group == samples[3].group
    assert samples[4].kind == "prompt" and samples[4].group == samples[4].prompt == samples[5].group
    text_samples = [s for s in load_jsonl(DATASETS / "sample_data.jsonl")[0] if s.kind == "text"]
    assert text_samples and all(s.group == "" and s.reward is None for s in text_samples)


GOOD = '{"text": "fine"}'
U, A = '{"role": "user", "content": "q"}', '{"role": "assistant", "content": "a"}'


def _msgs(*messages: str) -> str:
    return '{"messages": [' + ", ".join(messages) + "]}"


BAD_LINES = [
    # (line, severity, substrings of the message)
    ('{"text": "a" x}', "error", ["invalid JSON", "column 14"]),
    ('["text", "a"]', "error", ["JSON object", "array"]),
    ('{"foo": 1, "bar": 2}', "error", ['"foo"', '"bar"', '"messages"', '"prompt"', '"text"']),
    ('{"prompt": "p"}', "error", ['"prompt" needs "response"']),
    ('{"messages": "hi"}', "error", ['"messages" must be a list', "a string"]),
    (_msgs('{"content": "x"}', A), "error", ['messages[0] has no "role"']),
    (_msgs('{"role": "user"}', A), "error", ['messages[0] (user) has no "content"']),
    (_msgs('{"role": "bot", "content": "x"}'), "error", ["unknown role 'bot'", "user, assistant, tool"]),
    (_msgs('{"role": "user", "content": 5}', A), "error", ["must be a string"]),
    (_msgs(U, U), "error", ["no assistant message", "nothing to learn"]),
    ('{"prompt": 3, "response": "r"}', "error", ['"prompt" must be a string', "a number"]),
    ('{"prompt": "p", "response": ["r"]}', "error", ['"response" must be a string', "an array"]),
    ('{"text": null}', "error", ['"text" must be a string', "null"]),
    ('{"text": "a", "reward": "high"}', "error", ['"reward" must be a finite number', "'high'"]),
    ('{"text": "a", "reward": NaN}', "error", ['"reward" must be a finite number', "nan"]),
    ('{"text": "a", "score": Infinity}', "error", ['"score" must be a finite number', "inf"]),
    ('{"text": "a", "reward": true}', "error", ['"reward" must be a finite number']),
    ('{"text": "a", "reward": 1%s}' % ("0" * 400), "error", ['"reward" must be a finite number']),
    ('{"instruction": "i", "output": null}', "error", ['"output" must be a string', "null"]),
    ('{"conversations": [{"from": "alien", "value": "x"}]}', "error", ["\"from\" 'alien'", "gpt", "human"]),
    (_msgs(U, A.replace('"a"', '" "')), "warning", ["messages[1] (assistant) has empty"]),
    ('{"prompt": "q", "response": ""}', "warning", ["response is empty"]),
]  # fmt: skip


@pytest.mark.parametrize(("line", "severity", "words"), BAD_LINES, ids=[b[0][:40] for b in BAD_LINES])
def test_each_problem_is_reported_on_its_line(tmp_path, line, severity, words):
    path = _write(tmp_path / "d.jsonl", [GOOD, "", line, '{"text": "also fine"}'])
    samples, problems = load_jsonl(path)
    assert len(problems) == 1, problems
    problem = problems[0]
    assert (problem.line, problem.severity) == (3, severity)
    for word in words:
        assert word in problem.message, (word, problem.message)
    kept = [s.line for s in samples]
    assert kept == ([1, 3, 4] if severity == "warning" else [1, 4])


def test_mixed_file_keeps_the_good_lines_in_order(tmp_path):
    lines = [
        '{"text": "one"}',
        "not json",
        "   ",
        '{"prompt": "p", "response": "r", "score": -0.5}',
        "42",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
        "",
    ]
    samples, problems = load_jsonl(_write(tmp_path / "mixed.jsonl", lines))
    assert [(s.line, s.kind) for s in samples] == [(1, "text"), (4, "prompt"), (6, "messages")]
    assert samples[1].reward == -0.5
    assert [(p.line, p.severity) for p in problems] == [(2, "error"), (5, "error")]
    assert str(problems[0]).startswith("line 2: error: invalid JSON")


def test_bom_crlf_and_blank_lines_are_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n\r\n  \n{"text": "b"}\r\n')
    samples, problems = load_jsonl(path)
    assert problems == []
    assert [(s.line, s.text) for s in samples] == [(1, "a"), (4, "b")]


def test_line_separator_inside_a_string_does_not_split_the_line(tmp_path):
    path = _write(tmp_path / "u2028.jsonl", ['{"text": "a\u2028b"}', GOOD])
    samples, problems = load_jsonl(path)
    assert problems == [] and samples[0].text == "a\u2028b" and samples[1].line == 2


def test_duplicates_are_kept_with_a_warning(tmp_path):
    line = '{"prompt": "p", "response": "r"}'
    same_keys_reordered = '{"response": "r", "prompt": "p"}'
    samples, problems = load_jsonl(_write(tmp_path / "dup.jsonl", [line, GOOD, same_keys_reordered]))
    assert len(samples) == 3
    assert problems == [Problem(3, "duplicate of line 1 (the same sample twice)", "warning")]


def test_sharegpt_and_alpaca_become_messages_without_warnings(tmp_path):
    lines = [
        json.dumps(
            {
                "conversations": [
                    {"from": "system", "value": "be nice"},
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                ]
            }
        ),
        json.dumps({"instruction": "Add", "input": "2 and 2", "output": "4"}),
        json.dumps({"instruction": "Say hi", "input": "", "output": "hi"}),
    ]
    samples, problems = load_jsonl(_write(tmp_path / "alias.jsonl", lines))
    assert problems == []
    assert [s.kind for s in samples] == ["messages"] * 3
    assert samples[0].messages == (
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    )
    assert samples[1].messages == (
        {"role": "user", "content": "Add\n\n2 and 2"},
        {"role": "assistant", "content": "4"},
    )
    assert samples[2].messages[0] == {"role": "user", "content": "Say hi"}


def test_group_is_the_conversation_before_the_last_reply():
    a = _sample({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}]})
    b = _sample({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a2"}]})
    c = _sample({"messages": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "a1"}]})
    assert a.group == b.group != c.group
    assert a.line == 0


def test_unreadable_files_raise_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="folder"):
        load_jsonl(tmp_path)
    latin1 = tmp_path / "latin1.jsonl"  # a line that is not UTF-8 is a problem; the others load
    latin1.write_bytes('{"text": "ok"}\n{"text": "café"}\n'.encode("latin-1"))
    samples, problems = load_jsonl(latin1)
    assert [s.text for s in samples] == ["ok"]
    assert [(p.line, p.severity) for p in problems] == [(2, "error")]
    assert "not UTF-8" in problems[0].message and "0xe9" in problems[0].message
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes('{"text": "ok"}\n'.encode("utf-16"))
    with pytest.raises(DatasetError, match="UTF-16"):
        load_jsonl(utf16)


# -- saving ---------------------------------------------------------------------------------------


def test_save_round_trips_every_kind_and_keeps_rewards(tmp_path):
    samples, _ = load_jsonl(DATASETS / "sample_rwsft_data.jsonl")
    samples += load_jsonl(DATASETS / "sample_data.jsonl")[0]
    samples.append(
        _sample({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]})
    )
    samples.append(_sample({"text": "scored", "score": 3}))
    path = tmp_path / "out.jsonl"
    save_jsonl(path, samples)
    back, problems = load_jsonl(path)
    assert problems == []
    assert back == [dataclasses.replace(s, line=i + 1) for i, s in enumerate(samples)]
    assert back[-1].reward == 3.0


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_save_is_atomic_when_a_sample_cannot_be_serialised(tmp_path):
    path = _write(tmp_path / "keep.jsonl", [GOOD])
    before = _snapshot(tmp_path)
    bad = _sample({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    bad.messages[0]["extra"] = object()  # not JSON
    with pytest.raises(DatasetError, match="sample 1"):
        save_jsonl(path, [_sample({"text": "x"}), bad])
    assert _snapshot(tmp_path) == before


def test_save_is_atomic_when_the_replace_fails(tmp_path, monkeypatch):
    path = _write(tmp_path / "keep.jsonl", [GOOD])
    os.chmod(path, 0o640)
    before = _snapshot(tmp_path)

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(data.os, "replace", failing_replace)
    with pytest.raises(DatasetError, match="No space left"):
        save_jsonl(path, [_sample({"text": "new"})])
    assert _snapshot(tmp_path) == before  # original intact, no temporary file left
    monkeypatch.undo()
    save_jsonl(path, [_sample({"text": "new"})])
    assert [s.text for s in load_jsonl(path)[0]] == ["new"]
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_append_adds_lines_and_repairs_a_missing_newline(tmp_path):
    path = tmp_path / "rated.jsonl"
    path.write_bytes(b'{"text": "first"}')  # no trailing newline
    append_jsonl(path, [_sample({"prompt": "p", "response": "r", "reward": 1})])
    append_jsonl(path, [_sample({"text": "third"})])
    samples, problems = load_jsonl(path)
    assert problems == []
    assert [(s.line, s.kind, s.reward) for s in samples] == [
        (1, "text", None),
        (2, "prompt", 1.0),
        (3, "text", None),
    ]


# -- encoding and masks ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN)
@pytest.mark.parametrize("vocab", ["synth", "qwen2"])
def test_golden_datasets_encode(vocabs, name, vocab):
    v = vocabs[vocab]
    samples, _ = load_jsonl(DATASETS / name)
    encoded, problems = encode_samples(samples, v.tokenizer, v.template, EncodeOptions(n_ctx=1024))
    assert problems == []
    assert [e.index for e in encoded] == list(range(len(samples)))
    for e, s in zip(encoded, samples, strict=True):
        assert e.tokens.dtype == np.int32 and e.trained.dtype == bool and not e.truncated
        runs = _trained_runs(v.tokenizer, e)
        if s.kind == "text":
            assert e.trained[1:].all()
        else:
            replies = [m["content"] for m in s.messages if m["role"] == "assistant"]
            assert runs == [(r + v.end_of_turn).encode() for r in replies]


@pytest.mark.parametrize("vocab", ["synth", "qwen2", "llama3"])
def test_only_assistant_replies_and_their_end_of_turn_are_trained(vocabs, vocab):
    v = vocabs[vocab]
    sample = _sample({"messages": list(CONVERSATION)})
    (e,), problems = encode_samples([sample], v.tokenizer, v.template, EncodeOptions(n_ctx=512))
    assert problems == []
    assert _trained_runs(v.tokenizer, e) == [
        f"the answer is yes{v.end_of_turn}".encode(),
        f"quick brown fox, é 漢{v.end_of_turn}".encode(),
    ]
    tk = v.tokenizer
    if tk.add_bos:  # BOS once, whether the template writes it (llama3) or not (synth)
        assert e.tokens[0] == tk.bos_id and e.tokens[1] != tk.bos_id
    else:
        assert tk.bos_id not in e.tokens[:1]


@pytest.mark.parametrize("vocab", ["synth", "qwen2"])
def test_train_on_prompt_trains_everything(vocabs, vocab):
    v = vocabs[vocab]
    samples = [_sample({"messages": list(CONVERSATION)}), _sample({"prompt": "p q", "response": "r"})]
    for fmt in ("chat", "raw"):
        options = EncodeOptions(n_ctx=512, train_on_prompt=True, prompt_format=fmt)
        encoded, problems = encode_samples(samples, v.tokenizer, v.template, options)
        assert problems == []
        for e in encoded:
            assert e.trained[1:].all()
            assert e.trained[0] == (not v.tokenizer.add_bos)


@pytest.mark.parametrize("vocab", ["synth", "qwen2"])
def test_text_samples_train_every_token_and_eos(vocabs, vocab):
    tk = vocabs[vocab].tokenizer
    (e,), _ = encode_samples([_sample({"text": "the quick brown fox"})], tk, None, EncodeOptions(n_ctx=64))
    body = tk.encode("the quick brown fox", add_special=False)
    expected = ([tk.bos_id] if tk.add_bos else []) + body + [tk.eos_id]
    assert e.tokens.tolist() == expected
    assert e.trained.tolist() == ([False] if tk.add_bos else []) + [True] * (len(body) + 1)


@pytest.mark.parametrize("vocab", ["synth", "qwen2"])
def test_prompt_response_in_both_formats(vocabs, vocab):
    v = vocabs[vocab]
    tk = v.tokenizer
    sample = _sample({"prompt": "what is the answer", "response": "yes it is"})
    (chat,), _ = encode_samples([sample], tk, v.template, EncodeOptions(n_ctx=256, prompt_format="chat"))
    assert _trained_runs(tk, chat) == [f"yes it is{v.end_of_turn}".encode()]
    (raw,), _ = encode_samples([sample], tk, None, EncodeOptions(n_ctx=256, prompt_format="raw"))
    p = tk.encode("what is the answer", add_special=False)
    r = tk.encode("yes it is", add_special=False) + [tk.eos_id]
    bos = [tk.bos_id] if tk.add_bos else []
    assert raw.tokens.tolist() == bos + p + r
    assert raw.trained.tolist() == [False] * (len(bos) + len(p)) + [True] * len(r)


def test_truncation_is_reported_with_the_line_number(vocabs, tmp_path):
    v = vocabs["synth"]
    long_reply = " ".join(["word"] * 60)
    lines = [
        GOOD,
        json.dumps({"prompt": "short", "response": long_reply}),
        json.dumps({"prompt": " ".join(["the"] * 80), "response": "yes"}),
    ]
    samples, _ = load_jsonl(_write(tmp_path / "long.jsonl", lines))
    encoded, problems = encode_samples(samples, v.tokenizer, v.template, EncodeOptions(n_ctx=48))
    assert [e.index for e in encoded] == [0, 1]
    assert encoded[1].truncated and len(encoded[1].tokens) == 48 and not encoded[0].truncated
    (warning, error) = problems
    assert (warning.line, warning.severity) == (2, "warning")
    assert "truncated to n_ctx=48" in warning.message
    assert (error.line, error.severity) == (3, "error")
    assert "no trained tokens left" in error.message


def test_chat_samples_without_a_template_are_errors(vocabs):
    v = vocabs["synth"]
    samples = [_sample({"text": "fox"}), _sample({"prompt": "p", "response": "r"})]
    encoded, problems = encode_samples(samples, v.tokenizer, None, EncodeOptions(n_ctx=64))
    assert [e.index for e in encoded] == [0]
    assert problems[0].severity == "error" and "sample 1" in problems[0].message
    assert "chat template" in problems[0].message


def test_encode_options_are_validated():
    assert (
        EncodeOptions(n_ctx=np.int64(16)).n_ctx == 16 and type(EncodeOptions(n_ctx=np.int64(16)).n_ctx) is int
    )
    with pytest.raises(ValueError, match="n_ctx"):
        EncodeOptions(n_ctx=16.0)
    with pytest.raises(ValueError, match="n_ctx"):
        EncodeOptions(n_ctx=1)
    with pytest.raises(ValueError, match="prompt_format"):
        EncodeOptions(n_ctx=8, prompt_format="alpaca")


# -- packing and batches --------------------------------------------------------------------------


def _random_encoded(rng: np.random.Generator, n: int, n_ctx: int) -> list[Encoded]:
    out = []
    for i in range(n):
        length = int(rng.integers(2, n_ctx + 1))
        tokens = rng.integers(1, 300, size=length).astype(np.int32)
        trained = rng.random(length) < 0.6
        trained[int(rng.integers(1, length))] = True  # at least one target
        out.append(Encoded(i, tokens, trained, float(rng.uniform(0.5, 2.0)), False))
    return out


def test_pack_places_every_sample_once_whole_and_within_n_ctx(rng):
    n_ctx = 32
    encoded = _random_encoded(rng, 60, n_ctx)
    for seed in (None, 7):
        windows = pack(encoded, n_ctx, shuffle_seed=seed)
        assert all(sum(len(e.tokens) for e in w) <= n_ctx for w in windows)
        assert sorted(e.index for w in windows for e in w) == list(range(60))
        assert all(w for w in windows)
        # first-fit decreasing: no two windows could be merged
        fills = sorted(sum(len(e.tokens) for e in w) for w in windows)
        assert fills[0] + fills[1] > n_ctx
    assert [[e.index for e in w] for w in pack(encoded, n_ctx, shuffle_seed=7)] == [
        [e.index for e in w] for w in pack(encoded, n_ctx, shuffle_seed=7)
    ]
    assert pack(encoded, n_ctx, shuffle_seed=7) != pack(encoded, n_ctx, shuffle_seed=8)
    with pytest.raises(ValueError, match="more than n_ctx"):
        pack(encoded, 4)


def test_batches_keep_samples_apart(rng):
    n_ctx, encoded = 32, _random_encoded(rng, 40, 32)
    batches = make_batches(pack(encoded, n_ctx, shuffle_seed=1), 3, n_ctx)
    by_index = {e.index: e for e in encoded}
    seen = []
    for batch in batches:
        B, T = batch.tokens.shape
        assert T == n_ctx and 1 <= B <= 3
        assert batch.tokens.dtype == batch.targets.dtype == batch.positions.dtype == np.int64
        assert batch.weights.dtype == np.float32
        assert batch.n_label_tokens == int((batch.targets >= 0).sum())
        for b in range(B):
            row_segments = batch.segments[b]
            pad = row_segments < 0
            assert (batch.targets[b, pad] == -1).all() and (batch.weights[b, pad] == 0).all()
            assert (batch.sample_ids[b, pad] == -1).all() and (batch.tokens[b, pad] == 0).all()
            assert not pad[: (~pad).sum()].any(), "padding only at the end of a row"
            ids_in_row = []
            for k in np.unique(row_segments[~pad]):
                cols = np.flatnonzero(row_segments == k)
                sid = int(batch.sample_ids[b, cols[0]])
                ids_in_row.append(sid)
                e = by_index[sid]
                assert (batch.sample_ids[b, cols] == sid).all()
                assert (cols == np.arange(cols[0], cols[0] + len(e.tokens))).all()
                assert (batch.positions[b, cols] == np.arange(len(e.tokens))).all()
                assert (batch.tokens[b, cols] == e.tokens).all()
                expected = np.where(e.trained[1:], e.tokens[1:], -1)
                assert (batch.targets[b, cols[:-1]] == expected).all()
                assert batch.targets[b, cols[-1]] == -1, "no target across a sample boundary"
            assert len(set(ids_in_row)) == len(ids_in_row)
            seen += ids_in_row
        has_target = batch.targets >= 0
        t, b_ = np.nonzero(has_target.T)
        assert (batch.weights[b_, t] > 0).all() and (batch.weights[~has_target] == 0).all()
    assert sorted(seen) == list(range(40))


def _per_sample_weight(batch) -> dict[int, float]:
    out: dict[int, float] = {}
    for sid, w in zip(batch.sample_ids.ravel().tolist(), batch.weights.ravel().tolist(), strict=True):
        if sid >= 0:
            out[sid] = out.get(sid, 0.0) + w
    return out


def test_batch_weight_normalisation(rng):
    n_ctx = 32
    unit = [dataclasses.replace(e, weight=1.0) for e in _random_encoded(rng, 30, n_ctx)]
    for batch in make_batches(pack(unit, n_ctx), 4, n_ctx, normalize="tokens"):
        assert batch.weights.sum(dtype=np.float64) == pytest.approx(1.0, abs=1e-5)
        nz = batch.weights[batch.targets >= 0]
        assert np.allclose(nz, 1.0 / batch.n_label_tokens)
    weighted = _random_encoded(rng, 30, n_ctx)
    by_index = {e.index: e for e in weighted}
    for batch in make_batches(pack(weighted, n_ctx), 4, n_ctx, normalize="samples"):
        totals = _per_sample_weight(batch)
        n = len(totals)
        for sid, total in totals.items():
            assert total == pytest.approx(by_index[sid].weight / n, rel=1e-5)
    with pytest.raises(ValueError, match="normalize"):
        make_batches([], 1, n_ctx, normalize="mean")


def test_negative_weights_in_samples_mode(rng):
    encoded = [
        dataclasses.replace(e, weight=w) for e, w in zip(_random_encoded(rng, 2, 8), (-1.0, 1.0), strict=True)
    ]
    (batch,) = make_batches([encoded], 1, 16, normalize="samples")
    totals = _per_sample_weight(batch)
    assert totals[0] == pytest.approx(-0.5) and totals[1] == pytest.approx(0.5)


def test_build_batches_end_to_end_with_weights(vocabs):
    v = vocabs["qwen2"]
    samples, _ = load_jsonl(DATASETS / "sample_rwsft_data.jsonl")
    weights = np.linspace(0.0, 1.0, len(samples))
    options = EncodeOptions(n_ctx=128)
    batches, problems = build_batches(
        samples, v.tokenizer, v.template, options, 2, weights=weights, shuffle_seed=3
    )
    assert problems == []
    seen = {sid for b in batches for sid in b.sample_ids.ravel().tolist() if sid >= 0}
    assert seen == set(range(len(samples)))
    for batch in batches:
        for sid, total in _per_sample_weight(batch).items():
            n_targets = int(((batch.sample_ids == sid) & (batch.targets >= 0)).sum())
            assert total == pytest.approx(weights[sid] * n_targets / batch.n_label_tokens, rel=1e-5, abs=1e-7)
    encoded, _ = encode_samples(samples, v.tokenizer, v.template, options)
    again = batch_encoded(encoded, 128, 2, weights=weights, shuffle_seed=3)
    assert all(
        (a.tokens == b.tokens).all() and (a.weights == b.weights).all()
        for a, b in zip(batches, again, strict=True)
    )
    with pytest.raises(ValueError, match="weights"):
        build_batches(samples, v.tokenizer, v.template, options, 2, weights=[1.0])


# -- validation split -----------------------------------------------------------------------------


def _grouped_samples() -> list[Sample]:
    out = []
    for q in range(12):
        for a in range(1 + q % 3):  # groups of 1, 2 and 3 answers
            out.append(_sample({"prompt": f"question {q}", "response": f"answer {a}", "reward": a}))
    out += [_sample({"text": f"text {i}"}) for i in range(6)]
    return out


def test_split_validation_is_deterministic_keeps_groups_and_respects_the_fraction():
    samples = _grouped_samples()
    n = len(samples)
    train, val = split_validation(samples, 0.25, seed=5)
    assert (train, val) == split_validation(samples, 0.25, seed=5)
    assert split_validation(samples, 0.25, seed=6) != (train, val)
    assert len(train) + len(val) == n and {id(s) for s in train}.isdisjoint({id(s) for s in val})
    assert 1 <= len(val) <= round(0.25 * n)
    assert len(val) >= round(0.25 * n) - 2  # groups are at most 3 samples
    train_groups = {s.group for s in train if s.group}
    assert train_groups.isdisjoint({s.group for s in val if s.group})
    assert train == [s for s in samples if any(s is t for t in train)], "original order kept"
    assert any(s.kind == "text" for s in val) or any(s.kind == "text" for s in train)


def test_validation_indices_are_the_split_s_positions():
    samples = _grouped_samples()
    for fraction, seed in ((0.0, 0), (0.2, 1), (0.5, 7), (0.05, 3)):
        train, val = validation_indices(samples, fraction, seed)
        e_train, e_val = split_validation(samples, fraction, seed)
        assert [samples[i] for i in train] == e_train and [samples[i] for i in val] == e_val
        assert sorted(train + val) == list(range(len(samples))) and (fraction == 0.0) == (not val)


def test_split_validation_edge_cases():
    samples = _grouped_samples()
    assert split_validation(samples, 0.0, seed=1) == (samples, [])
    two = [_sample({"text": "a"}), _sample({"text": "b"})]
    train, val = split_validation(two, 0.01, seed=1)
    assert len(train) == 1 and len(val) == 1
    one_group = [_sample({"prompt": "p", "response": f"r{i}"}) for i in range(4)]
    assert split_validation(one_group, 0.5, seed=1) == (one_group, [])
    pairs = [_sample({"prompt": f"p{i // 2}", "response": f"r{i}"}) for i in range(6)]
    train, val = split_validation(pairs, 0.1, seed=2)  # target 1, every group has 2
    assert len(val) == 2 and val[0].group == val[1].group
    with pytest.raises(ValueError, match="fraction"):
        split_validation(samples, 1.0, seed=1)
