"""Hostile datasets: any JSON value on a line, text that is not UTF-8, paths that are not files,
lines and files too large; one problem per bad line with its number while the rest loads, a
DatasetError for a file that cannot be read at all, never a wait or a changed file. And long
conversations are encoded in linear time with the same token ids and masks as before."""

from __future__ import annotations

import hashlib
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import engine.text.chat_template as chat_template
from engine.errors import DatasetError
from engine.testing import SynthSpec, write_model
from engine.text.chat_template import ChatTemplate
from engine.text.tokenizer import Tokenizer
from engine.train import data, encode
from engine.train.data import load_jsonl, parse_sample, save_jsonl
from engine.train.encode import EncodeOptions, encode_samples

pytestmark = pytest.mark.timeout(60)

GOOD = '{"text": "fine"}'
TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(path: Path):
    """load_jsonl, asserting the file is unchanged and every problem is one line."""
    before = _digest(path)
    samples, problems = load_jsonl(path)
    assert _digest(path) == before
    assert all("\n" not in p.message for p in problems)
    return samples, problems


def _one_bad_line(tmp_path: Path, line: bytes | str):
    path = tmp_path / "d.jsonl"
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    path.write_bytes(GOOD.encode() + b"\n" + raw + b"\n" + b'{"text": "also fine"}\n')
    samples, problems = _load(path)
    assert [s.line for s in samples] == [1, 3], problems
    assert len(problems) == 1 and problems[0].line == 2 and problems[0].severity == "error"
    return problems[0].message


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


HOSTILE_LINES = [
    # (line, words of its problem)
    ('{"text": "a\\ud800b"}', ["unpaired surrogate \\ud800", "not Unicode text"]),
    ('{"\\udfff": 1, "text": "a"}', ["unpaired surrogate \\udfff"]),
    (
        '{"messages": [{"role": "user", "content": "\\udc00"}, {"role": "assistant", "content": "a"}]}',
        ["\\udc00"],
    ),
    ('{"text": "a", "n": %s}' % ("9" * 5000), ["invalid JSON: a number has too many digits"]),
    ('{"text": "a", "x": ' + _nested(100) + "}", ["nested more than 64 levels deep"]),
    ('{"text": "a", "x": ' + _nested(50_000) + "}", ["invalid JSON: nested too deeply"]),
    ('{"text": "a", "x": 1e999}', ["a number is inf (NaN and infinities are not JSON numbers)"]),
    ('{"text": "a", "x": [NaN]}', ["a number is nan"]),
    ('"just a string"', ["expected a JSON object, got a string"]),
    ("12345678901234567890", ["expected a JSON object, got a number"]),
    ("null", ["expected a JSON object, got null"]),
    ("[]", ["expected a JSON object, got an array"]),
    (
        '{"messages": [1, 2, 3]}',
        ["messages[0] must be an object, got a number", "(and 2 more errors on this line)"],
    ),
    ('{"messages": [{"role": ["user"], "content": "q"}]}', ["unknown role ['user']", "user, assistant"]),
    ('{"messages": [{"role": "user", "content": {"a": 1}}]}', ['"content" must be a string, got an object']),
    ('{"text": "a", "reward": "high"}', ['"reward" must be a finite number']),
    ('{"text": "a", "reward": 1e999}', ['"reward" must be a finite number, got inf']),
    (
        '{"messages": [{"role": "user", "content": "q"}, '
        '{"role": "assistant", "content": null, "tool_calls": "f"}]}',
        ["\"tool_calls\" must be a list of objects, got 'f'"],
    ),
    ('{"a\\nb": 1, "c": 2}', ['keys found: "a\\nb", "c"']),
    ("{" + ", ".join(f'"k{i}": {i}' for i in range(100)) + "}", ['"k7" and 92 more']),
    (b'{"text": "caf\xe9"}', ["not UTF-8 text: byte 0xe9 (byte 14 of the line) is invalid"]),
    (b"\xed\xa0\x80", ["not UTF-8 text: byte 0xed"]),  # a surrogate written as UTF-8 bytes
]


@pytest.mark.parametrize(("line", "words"), HOSTILE_LINES, ids=[str(h[0])[:30] for h in HOSTILE_LINES])
def test_each_hostile_line_is_one_problem_and_the_rest_loads(tmp_path, line, words):
    message = _one_bad_line(tmp_path, line)
    for word in words:
        assert word in message, (word, message)
    assert len(message) < 400


def test_huge_strings_load():
    sample, problems = parse_sample({"text": "x" * 5_000_000}, 1)
    assert sample is not None and problems == []


def test_parse_sample_takes_any_value():
    for value in (
        None,
        1,
        1.5,
        "s",
        [],
        [[[]]],
        {"messages": None},
        {"text": b"x"},
        {1: 2},
        {"text": "a\udfff"},
    ):
        sample, problems = parse_sample(value, 3)
        assert sample is None and problems and all(p.line == 3 for p in problems)


def test_a_file_with_no_utf8_line_is_in_another_encoding(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"text": "café"}\n\n{"text": "naïve"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError) as err:
        load_jsonl(path)
    assert str(err.value) == (
        f"{path} is not UTF-8 text: on line 1, byte 0xe9 (byte 14 of the line) is invalid (JSON Lines files "
        "are UTF-8; was the file saved in another encoding?)"
    )


def test_lines_not_utf8_are_problems_on_their_lines(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n{"text": "b"}\n\x80\n{"text": "c"}\n')
    samples, problems = _load(path)
    assert [s.text for s in samples] == ["a", "b", "c"]
    assert [p.line for p in problems] == [2, 4]


@pytest.mark.parametrize("content", [b"", b"\n\n", b"   \n\t\n"])
def test_empty_files_have_no_samples(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    assert _load(path) == ([], [])


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(
        DatasetError, match=r"pipe.jsonl is a FIFO \(named pipe\), not a file; expected a JSON"
    ):
        load_jsonl(fifo)
    with pytest.raises(DatasetError, match="is a FIFO"):
        save_jsonl(fifo, [])
    with pytest.raises(DatasetError, match="is a FIFO"):
        data.append_jsonl(fifo, [])


@pytest.mark.timeout(10)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_devices_are_refused(tmp_path, device):
    link = tmp_path / "data.jsonl"
    link.symlink_to(device)
    with pytest.raises(DatasetError, match="is a character device, not a file"):
        load_jsonl(link)
    assert os.readlink(link) == device


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="is a folder; expected a JSON Lines file"):
        load_jsonl(tmp_path)


def test_files_beyond_the_cap_are_refused_with_their_size(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.truncate(data.MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(DatasetError) as err:
        load_jsonl(path)
    assert f"is 1.0 GiB ({data.MAX_FILE_BYTES + 1} bytes); dataset files up to 1 GiB are read" in str(
        err.value
    )


def test_binary_files_are_refused(tmp_path):
    path = tmp_path / "model.gguf.jsonl"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 10)
    with pytest.raises(DatasetError, match="is not JSON Lines text: byte 5 is a NUL byte"):
        load_jsonl(path)


def test_a_line_beyond_the_cap_is_skipped_without_being_held(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_LINE_BYTES", 1 << 16)
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "' + b"x" * (8 << 20) + b'"}\n{"text": "b"}\n')
    before = _digest(path)
    tracemalloc.start()
    try:
        samples, problems = load_jsonl(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _digest(path) == before
    assert [s.text for s in samples] == ["a", "b"]
    assert [(p.line, p.message) for p in problems] == [
        (2, f"the line is {(8 << 20) + 13:,} bytes long; lines up to 0.0625 MiB are read")
    ]
    assert peak < 4 << 20


def test_save_writes_through_a_link_and_keeps_it(tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text(GOOD + "\n", encoding="utf-8")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    samples, _ = load_jsonl(link)
    save_jsonl(link, samples * 2)
    assert link.is_symlink() and len(load_jsonl(target)[0]) == 2


def test_save_refuses_a_sample_that_is_not_unicode(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(GOOD + "\n", encoding="utf-8")
    before = _digest(path)
    bad = data.Sample(0, "text", (), None, None, "a\ud800", None, "")
    with pytest.raises(DatasetError, match=r"sample 0 \(line 0\) cannot be written as JSON"):
        save_jsonl(path, [bad])
    assert _digest(path) == before and os.listdir(tmp_path) == ["out.jsonl"]


# -- long conversations ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth_vocab(tmp_path_factory):
    path = write_model(
        tmp_path_factory.mktemp("m") / "m.gguf", SynthSpec.for_arch("llama", V=300, C=32, NH=2, NKV=1)
    )
    tok = Tokenizer.from_gguf(path)
    return tok


def _conversation(n: int, system: bool = True) -> list[dict]:
    out = [{"role": "system", "content": "Be brief."}] if system else []
    for i in range(n // 2):
        out += [
            {"role": "user", "content": f"question {i} about the quick brown fox"},
            {"role": "assistant", "content": f"answer {i}: the lazy dog jumps"},
        ]
    return out


def _sample(messages):
    sample, problems = parse_sample({"messages": messages}, 1)
    assert sample is not None, problems
    return sample


def test_masks_are_found_with_linear_work(synth_vocab, monkeypatch):
    """Messages rendered in all to encode a conversation grow linearly with its length (they grew
    with its square: every reply re-rendered the conversation before it)."""
    template = ChatTemplate(chat_template.CHATML_TEMPLATE)
    rendered = []
    original = ChatTemplate._variables

    def counting(self, messages, *args):
        rendered.append(len(messages))
        return original(self, messages, *args)

    monkeypatch.setattr(ChatTemplate, "_variables", counting)
    work = {}
    for n in (200, 800):
        rendered.clear()
        encoded, problems = encode_samples(
            [_sample(_conversation(n))], synth_vocab, template, EncodeOptions(1 << 20)
        )
        assert problems == [] and encoded[0].n_targets > 0
        work[n] = sum(rendered)
    assert work[800] < 4.5 * work[200]  # linear: 4x; quadratic: 16x
    assert work[800] < 20 * 800


def test_long_conversations_encode_in_linear_time(synth_vocab):
    template = ChatTemplate(chat_template.CHATML_TEMPLATE)

    def seconds(n: int) -> float:
        sample = _sample(_conversation(n))
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            encode_samples([sample], synth_vocab, template, EncodeOptions(1 << 20))
            best = min(best, time.perf_counter() - t)
        return best

    small, large = seconds(200), seconds(800)
    assert large < 3.0  # was 48 s for 800 messages with a heavier template
    assert large < 10 * small + 0.05  # linear: 4x; quadratic: 16x (best of 3: a busy machine)


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.glob("*.jinja")))
def test_long_conversations_keep_the_same_ids_and_masks(synth_vocab, monkeypatch, name):
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    samples = [_sample(_conversation(40)), _sample(_conversation(30, system=False))]
    fast, p1 = encode_samples(samples, synth_vocab, template, EncodeOptions(1 << 20))
    monkeypatch.setattr(chat_template, "_EXACT_REPLIES", 10**9)  # every reply in the whole conversation
    exact, p2 = encode_samples(samples, synth_vocab, template, EncodeOptions(1 << 20))
    assert p1 == p2 == []
    for a, b in zip(fast, exact, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.trained, b.trained)


def test_mask_spans_equals_the_span_by_span_reference():
    rng = np.random.default_rng(0)

    def reference(offsets, spans):
        o = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        start, end = o[:, 0], o[:, 1]
        mask = np.zeros(len(o), dtype=bool)
        for a, b in spans:
            mask |= np.where(start == end, (a <= start) & (start < b), (start < b) & (end > a))
        return mask.tolist()

    for _ in range(300):
        cuts = np.sort(rng.integers(0, 60, size=rng.integers(1, 30)))
        offsets = list(zip([0, *cuts.tolist()], [*cuts.tolist(), 60], strict=True))
        edges = np.sort(rng.integers(0, 61, size=2 * rng.integers(0, 6))).tolist()
        spans = list(zip(edges[0::2], edges[1::2], strict=True))
        assert encode._mask_spans(offsets, spans) == reference(offsets, spans), (offsets, spans)
        unordered = spans[::-1] + [(5, 50)]
        assert encode._mask_spans(offsets, unordered) == reference(offsets, unordered)
