"""Fast data preparation against the reference path, and prepared data on disk.

The fast path (skeleton renders of templates that pass contents through, batch tokenization,
token ranges by search, vectorised packing and splits) must give the reference path's tokens,
masks, problems, packing and batches bit for bit: on the golden datasets and on generated
conversations of every template family. Prepared data is then written as memory-mapped files,
kept in a cache folder keyed by what shaped it, and never reused when stale or damaged.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import DatasetError, TemplateError
from engine.io.gguf_file import GGUFFile
from engine.text.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate
from engine.text.content_flow import passes_contents_through
from engine.text.tokenizer import Tokenizer
from engine.train import batches as batches_module
from engine.train import encode as encode_module
from engine.train import prepared as prepared_module
from engine.train.batches import batch_encoded, pack, pack_ref
from engine.train.data import (
    Sample,
    load_jsonl,
    parse_sample,
)
from engine.train.encode import Encoded, EncodeOptions, encode_samples, encode_samples_ref
from engine.train.prepared import KEPT, PackedBatches, prepare_data
from engine.train.rewards import group_advantages, reward_weights
from engine.train.trainer import TrainConfig, Trainer
from engine.train.val_split import split_validation, validation_indices, validation_indices_ref
from tests.conftest import DATA

TEMPLATE_FILES = sorted([*(DATA / "templates").glob("*.jinja"), *(DATA / "templates-extra").glob("*.jinja")])
# ChatML with a default system prompt, as SmolLM2's template writes it
SMOLLM_LIKE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
FAMILIES = {
    "chatml": CHATML_TEMPLATE,
    "gemma": GEMMA_TEMPLATE,
    "smollm-like": SMOLLM_LIKE,
    **{path.stem: path.read_text(encoding="utf-8") for path in TEMPLATE_FILES},
}
EXPECTED = json.loads((DATA / "templates" / "expected.json").read_text(encoding="utf-8"))
CONTENTS = (
    "Hello there.",
    "",
    "  spaced  ",
    "\n\nnew\nlines\n\n",
    "<|im_end|> written in the data",
    "<think>a thought</think>The answer",
    "héllo wörld ✓ 日本 🙂",
    "x " * 120,
    "a\u2028b",
    " ",
    "</s><|eot_id|><end_of_turn>",
)


def chats(seed: int, n: int) -> list[list[dict[str, Any]]]:
    """Conversations of many shapes: a system prompt or none, one to three turns (and now and then
    ten: the windowed search), contents empty, padded, with special tokens, reasoning fields."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": rng.choice(CONTENTS)})
        for _ in range(rng.choice((1, 1, 1, 2, 3, 10))):
            messages.append({"role": "user", "content": rng.choice(CONTENTS)})
            reply: dict[str, Any] = {"role": "assistant", "content": rng.choice(CONTENTS)}
            if rng.random() < 0.1:
                reply["reasoning_content"] = "because"
            messages.append(reply)
        out.append(messages)
    return out


def conversations() -> list[list[dict[str, Any]]]:
    return chats(0, 60) + [case["messages"] for case in EXPECTED["cases"]]


def _template(source: str, *, fast: bool = True) -> ChatTemplate:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>", fast_spans=fast)


def _spans_or_error(template: ChatTemplate, messages: list[dict[str, Any]]) -> Any:
    try:
        return template.render_with_spans(messages)
    except TemplateError as exc:
        return ("error", str(exc))


# -- templates: one render per structure ---------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_spans_equal_the_reference_renders(family):
    """Every conversation's text and reply spans (or error) equal those of four real renders per
    reply, in every template family, whether or not it passes contents through."""
    fast, reference = _template(FAMILIES[family]), _template(FAMILIES[family], fast=False)
    for messages in conversations():
        assert _spans_or_error(fast, messages) == _spans_or_error(reference, messages), messages


def test_templates_that_pass_contents_through():
    passing = {name for name, source in FAMILIES.items() if _template(source).passes_contents_through}
    assert {"chatml", "smollm-like", "Qwen-Qwen2.5-7B-Instruct", "microsoft-Phi-3.5-mini-instruct"} <= passing
    # they look into contents (split, startswith, trim), or read the clock
    assert not passing & {
        "Qwen-Qwen3-0.6B",
        "meta-llama-Llama-3.1-8B-Instruct",
        "gemma",
        "openai-gpt-oss-120b",
    }


LOOP = "{% for message in messages %}"
END = "{% endfor %}"


@pytest.mark.parametrize(
    "body",
    [
        "{{ message.content | trim }}",
        "{{ message.content.split('x')[0] }}",
        "{% if message.content == 'x' %}x{% endif %}",
        "{% if 'x' in message.content %}x{% endif %}",
        "{{ message.content | length }}",
        "{{ message | tojson }}",
        "{% for k, v in message.items() %}{{ v }}{% endfor %}",
        "{{ message['content'][0] }}",
        "{{ message.get('content') | upper }}",
        "{{ loop.previtem }}",
        "{% set c = message.content %}{{ c[1:] }}",
        "{% set ns = namespace(c=message.content) %}{{ ns.c }}",
        "{% filter upper %}{{ message.content }}{% endfilter %}",
        "{{ raise_exception(message.content) }}",
        "{{ strftime_now('%d') }}{{ message.content }}",
        "{{ messages | map(attribute='content') | join }}",
        "{% for c in message.content %}{{ c }}{% endfor %}",
        "{{ (message.content ~ 'x') | replace('a', 'b') }}",
    ],
)
def test_templates_that_look_into_contents_are_rendered_for_real(body):
    source = LOOP + body + END
    assert not passes_contents_through(source, _analysis())
    fast, reference = _template(source), _template(source, fast=False)
    for messages in chats(1, 20):
        assert _spans_or_error(fast, messages) == _spans_or_error(reference, messages)


@pytest.mark.parametrize(
    "body",
    [
        "{{ message.role + ': ' + message.content + '\\n' }}",
        "{% set c = message['content'] %}{{ '[' ~ c ~ ']' }}",
        "{% if message.content %}{{ message.content }}{% else %}(empty){% endif %}",
        "{% if message.content is string %}{{ message.content }}{% endif %}",
        "{{ message.get('content') or 'none' }}",
        "{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ message.content }}",
    ],
)
def test_templates_that_pass_contents_through_render_from_skeletons(body):
    source = LOOP + body + END
    assert passes_contents_through(source, _analysis())
    fast, reference = _template(source), _template(source, fast=False)
    for messages in chats(2, 40):
        assert _spans_or_error(fast, messages) == _spans_or_error(reference, messages)
    fast._skeletons.clear()
    for i in range(40):  # conversations of one structure: one skeleton per render they need
        fast.render_with_spans(
            [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a {i}"}]
        )
    assert len(fast._skeletons) <= 3


def test_a_content_that_could_pass_the_size_limit_is_rendered_for_real():
    """A skeleton knows what a character of content costs the size limit; contents that could reach
    it are rendered for real, and stop at the limit as the reference does."""
    source = "{% for m in messages %}{% for i in range(100) %}{{ m.content }}{% endfor %}{% endfor %}"
    template, reference = _template(source), _template(source, fast=False)
    assert template.passes_contents_through
    renders = []
    real = ChatTemplate.render
    template.render = lambda *a, **k: renders.append(1) or real(template, *a, **k)  # type: ignore[method-assign]
    small = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert template.render_with_spans(small) == reference.render_with_spans(small)
    assert not renders  # from the skeleton
    big = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y" * (1 << 19)}]
    assert _spans_or_error(template, big) == _spans_or_error(reference, big)
    assert "limit" in str(_spans_or_error(reference, big))
    assert renders  # rendered for real


def _analysis():
    from engine.text.chat_template import _analysis_environment

    return _analysis_environment()


# -- tokens and masks ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(synth_model) -> dict[str, Tokenizer]:
    """SentencePiece (the tiny synthetic model, Gemma 3's vocabulary) and byte-level BPE (Qwen2)
    tokenizers, and Phi-3's rule that special tokens swallow the spaces after them."""
    out = {}
    for name, path in (
        ("spm", Path(synth_model("llama"))),
        ("gemma", DATA / "models-extra" / "gemma3.gguf"),
        ("qwen2", DATA / "vocab" / "ggml-vocab-qwen2.gguf"),
        ("phi3", DATA / "vocab" / "ggml-vocab-llama-spm.gguf"),
    ):
        with GGUFFile(path) as f:
            md = dict(f.metadata)
        if name == "phi3":
            md["general.name"] = "Phi-3 mini"
        out[name] = Tokenizer.from_metadata(md, name)
    return out


def _samples(messages_list: list[list[dict[str, Any]]], line: int = 0) -> list[Sample]:
    out = []
    for k, messages in enumerate(messages_list):
        sample, _ = parse_sample({"messages": messages}, line + k if line else 0)
        if sample is not None:
            out.append(sample)
    return out


def _assert_encodes_as_reference(samples, tok, template, options: EncodeOptions) -> None:
    """encode_samples gives what encode_samples_ref gives: the same problems, and per sample the same
    index, weight, truncation, tokens and trained mask (int32 and bool arrays)."""
    ea, pa = encode_samples(samples, tok, template, options)
    eb, pb = encode_samples_ref(samples, tok, template, options)
    assert pa == pb
    assert len(ea) == len(eb)
    for x, y in zip(ea, eb, strict=True):
        assert (x.index, x.weight, x.truncated) == (y.index, y.weight, y.truncated)
        assert x.tokens.dtype == y.tokens.dtype == np.int32 and np.array_equal(x.tokens, y.tokens)
        assert x.trained.dtype == y.trained.dtype == np.bool_ and np.array_equal(x.trained, y.trained)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tokens_and_masks_equal_the_reference_in_every_template_family(family, tokenizers):
    samples = _samples(chats(3, 20), line=1) + _samples(chats(4, 4))  # from a file, and made in memory
    template = _template(FAMILIES[family])
    runs = [("spm" if family != "gemma" else "gemma", EncodeOptions(4096)), ("qwen2", EncodeOptions(40))]
    if family in ("chatml", "Qwen-Qwen2.5-7B-Instruct"):
        runs += [("spm", EncodeOptions(40)), ("qwen2", EncodeOptions(64, train_on_prompt=True))]
    for name, options in runs:
        tok = tokenizers[name]
        _assert_encodes_as_reference(samples, tok, template, options)


@pytest.mark.parametrize("name", ["sample_data.jsonl", "sample_rwsft_data.jsonl"])
@pytest.mark.parametrize("vocab", ["spm", "qwen2", "phi3"])
def test_golden_datasets_encode_as_the_reference(name, vocab, tokenizers):
    samples, _ = load_jsonl(DATA / "datasets" / name)
    template = _template(
        FAMILIES["chatml"] if vocab != "llama3" else FAMILIES["meta-llama-Llama-3.1-8B-Instruct"]
    )
    tok = tokenizers[vocab]
    for options in (
        EncodeOptions(512),
        EncodeOptions(24),
        EncodeOptions(512, train_on_prompt=True),
        EncodeOptions(64, prompt_format="raw"),
        EncodeOptions(64, train_on_prompt=True, prompt_format="raw"),
    ):
        _assert_encodes_as_reference(samples, tok, template, options)


def test_many_samples_go_through_the_tokenizing_thread_as_the_reference(tokenizers):
    """More than one chunk: the pipelined path (a worker thread tokenizes while the next chunk is
    rendered) keeps every sample in order."""
    short = [
        [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": "a " * (i % 9)}]
        for i in range(1100)
    ]
    samples = _samples(short, line=1)
    template = _template(CHATML_TEMPLATE)
    options = EncodeOptions(96)
    _assert_encodes_as_reference(samples, tokenizers["spm"], template, options)


def test_samples_that_cannot_be_rendered_or_tokenized_are_the_same_problems(tokenizers):
    raising = _template("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
                        "{% endif %}{{ m.content }}{% endfor %}")  # fmt: skip
    samples = _samples(chats(6, 40), line=1)
    text = parse_sample({"text": "plain \ud800 text"}, 0)[0]  # not Unicode: parse refuses it, memory may not
    bad = Sample(0, "text", (), None, None, "plain \ud800 text", None, "") if text is None else text
    for tok in (tokenizers["spm"], tokenizers["qwen2"]):
        for template in (raising, None):
            mixed = [*samples[:10], bad, *samples[10:]]
            _assert_encodes_as_reference(mixed, tok, template, EncodeOptions(64))


TEXTS = ("a", "b", " ", "  ", "\n", "é", "日本", "🙂", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "\t",
         "x1", "123", "'s", "<|eot_id|>", "<start_of_turn>", "\u2028", "  \n ")  # fmt: skip


@pytest.mark.parametrize("vocab", ["spm", "gemma", "qwen2", "phi3"])
def test_span_token_ranges_equal_the_offsets_masks(vocab, tokenizers):
    """encode_batch_ranges finds the tokens of each span that encode_with_offsets' offsets mark,
    for spans anywhere: inside characters' bytes, at special tokens, empty, at the ends."""
    tok = tokenizers[vocab]
    rng = random.Random(7)
    texts, spans = [], []
    for _ in range(300):
        text = "".join(rng.choice(TEXTS) for _ in range(rng.randint(0, 30)))
        text_spans, pos = [], 0
        while pos < len(text) and rng.random() < 0.7:
            a = rng.randint(pos, len(text))
            b = rng.randint(a, len(text))
            text_spans.append((a, b))
            pos = b
        texts.append(text)
        spans.append(text_spans)
    for text, text_spans, (ids, ranges) in zip(
        texts, spans, tok.encode_batch_ranges(texts, spans), strict=True
    ):
        want_ids, offsets = tok.encode_with_offsets(text, parse_special=True)
        want = np.asarray(encode_module._mask_spans(offsets, text_spans), dtype=bool)
        got = np.zeros(len(ids), dtype=bool)
        for k0, k1 in ranges:
            got[k0:k1] = True
        assert ids == want_ids
        np.testing.assert_array_equal(got, want, err_msg=f"{text!r} {text_spans}")


def test_first_true_from_a_hint_is_the_binary_search():
    from engine.text.tokenizer import _first

    rng = random.Random(3)
    for _ in range(2000):
        n = rng.randint(0, 40)
        cut = rng.randint(0, n)
        hint = rng.choice([None, rng.randint(-2, n + 2)])
        asked: list[int] = []

        def holds(k: int, cut: int = cut, asked: list[int] = asked) -> bool:
            asked.append(k)
            return k >= cut

        assert _first(holds, n, hint) == cut
        assert all(0 <= k < n for k in asked)


# -- packing and splits --------------------------------------------------------------------------


def test_packing_equals_the_reference(rng):
    for trial in range(100):
        n_ctx = int(rng.integers(2, 64))
        lengths = rng.integers(2, n_ctx + 1, size=int(rng.integers(0, 200)))
        if trial % 3 == 0:
            lengths = np.minimum(lengths, rng.integers(2, 5))
        encoded = [Encoded(i, np.zeros(n, np.int32), np.ones(n, bool)) for i, n in enumerate(lengths)]
        for seed in (None, trial):
            got = [[e.index for e in w] for w in pack(encoded, n_ctx, shuffle_seed=seed)]
            want = [[e.index for e in w] for w in pack_ref(encoded, n_ctx, shuffle_seed=seed)]
            assert got == want
        items = rng.integers(0, n_ctx + 1, size=len(lengths))
        assert batches_module._first_fit(items, n_ctx).tolist() == batches_module._first_fit_ref(
            items.tolist(), n_ctx
        )


def test_validation_split_equals_the_reference(rng, caplog):
    for trial in range(150):
        n = int(rng.integers(0, 50))
        groups = ["" if rng.random() < 0.2 else f"g{rng.integers(0, rng.integers(1, 8))}" for _ in range(n)]
        if trial % 7 == 0:
            groups = ["same"] * n
        samples = [Sample(i + 1, "prompt", (), "p", "r", None, None, g) for i, g in enumerate(groups)]
        for fraction in (0.0, 0.1, 0.3, 0.5, 0.9):
            seed = int(rng.integers(0, 1000))
            assert validation_indices(samples, fraction, seed) == validation_indices_ref(
                samples, fraction, seed
            )


# -- prepared data and its cache -----------------------------------------------------------------


def _chat_file(path: Path, n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            reward = {"reward": round(rng.random(), 3)} if i % 3 else {}
            question = {"role": "user", "content": f"Question {i % 40}: what is {i % 7} plus {i % 5}?"}
            answer = {"role": "assistant", "content": rng.choice(CONTENTS[:7]) + f" {i}"}
            f.write(json.dumps({"messages": [question, answer], **reward}) + "\n")
        f.write("not json\n")
    return str(path)


def _old_batches(path: str, cfg: TrainConfig, epoch: int, tok: Tokenizer, template: ChatTemplate):
    """The batches and problems of the run as the trainer made them before prepared data."""
    samples, problems = load_jsonl(path)
    train, val = split_validation(samples, cfg.val_split, cfg.seed)
    options = EncodeOptions(cfg.n_ctx, cfg.train_on_prompt, cfg.prompt_format)
    enc, p1 = encode_samples_ref(train, tok, template, options)
    enc_val, p2 = encode_samples_ref(val, tok, template, options) if val else ([], [])
    weights, normalize = None, "tokens"
    if cfg.reward_mode == "weighted":
        weights = reward_weights([s.reward for s in train])
    elif cfg.reward_mode == "group":
        weights = group_advantages([s.reward for s in train], [s.group for s in train])
        normalize = "samples"
    batches = batch_encoded(enc, cfg.n_ctx, cfg.batch_size, weights=weights, shuffle_seed=cfg.seed + epoch,
                            normalize=normalize)  # fmt: skip
    val_batches = batch_encoded(enc_val, cfg.n_ctx, cfg.batch_size) if enc_val else []
    return batches, val_batches, [str(p) for p in [*problems, *p1, *p2]]


def _assert_same_batches(got, want) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for name in ("tokens", "targets", "weights", "positions", "segments", "sample_ids"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        assert a.n_label_tokens == b.n_label_tokens


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(n_ctx=200, batch_size=2, val_split=0.2, seed=3),
        TrainConfig(n_ctx=72, batch_size=3, reward_mode="weighted", val_split=0.3),
        TrainConfig(n_ctx=128, batch_size=1, reward_mode="group", train_on_prompt=True, prompt_format="raw"),
    ],
    ids=["split", "weighted-truncated", "group-raw"],
)
def test_a_run_trains_on_the_batches_of_the_old_path(cfg, synth_model, tmp_path):
    model = synth_model("llama")
    sources = [_chat_file(tmp_path / "chats.jsonl", 150), str(DATA / "datasets" / "sample_rwsft_data.jsonl")]
    for path in sources:
        run = Trainer(model, path, replace_cfg(cfg, data_cache=str(tmp_path / "cache")))
        run._prepare()
        tok, template = (
            Tokenizer.from_metadata(run.model.metadata),
            ChatTemplate.from_metadata(run.model.metadata),
        )
        for epoch in (0, 1):
            batches, val_batches, problems = _old_batches(path, cfg, epoch, tok, template)
            _assert_same_batches(list(run.batches_for_epoch(epoch)), batches)
            _assert_same_batches(list(run.val_batches), val_batches)
        assert [str(p) for p in run.problems] == problems
        assert run.problems_total == len(problems)


def replace_cfg(cfg: TrainConfig, **changes: Any) -> TrainConfig:
    import dataclasses

    return dataclasses.replace(cfg, **changes)


def test_samples_in_memory_are_named_by_their_position_in_their_split(synth_model):
    """A sample made in memory (line 0) that cannot be trained on is reported as the old path
    reported it: by its position in the training (or validation) list."""
    chats_ = [
        [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(6)
    ]
    samples = _samples(
        [*chats_, [{"role": "user", "content": "q" * 300}, {"role": "assistant", "content": "a"}]]
    )
    samples = [Sample(0, s.kind, s.messages, None, None, None, None, f"g{i}") for i, s in enumerate(samples)]
    cfg = TrainConfig(n_ctx=32, val_split=0.3, seed=1)
    run = Trainer(synth_model("llama"), samples, cfg)
    run._prepare()
    train, val = split_validation(samples, cfg.val_split, cfg.seed)
    tok, template = (
        run.tokenizer or Tokenizer.from_metadata(run.model.metadata),
        ChatTemplate.from_metadata(run.model.metadata),
    )
    options = EncodeOptions(32)
    want = [
        *encode_samples_ref(train, tok, template, options)[1],
        *encode_samples_ref(val, tok, template, options)[1],
    ]
    assert [str(p) for p in run.problems] == [str(p) for p in want]
    assert any("sample " in str(p) for p in want)


def _prepare(path: str, tok: Tokenizer, template: ChatTemplate | None, cache: Path, **kw: Any):
    return prepare_data(path, tok, template, EncodeOptions(kw.pop("n_ctx", 64), **kw), cache=cache)


def _same_data(a, b) -> None:
    assert a.samples.tobytes() == b.samples.tobytes()  # NaN rewards: compared by their bits
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.trained, b.trained)
    assert list(a.problems()) == list(b.problems())


def test_prepared_data_is_what_encode_samples_gives(tokenizers, tmp_path):
    path = _chat_file(tmp_path / "chats.jsonl", 120)
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)
    data = _prepare(path, tok, template, tmp_path / "cache", n_ctx=72)
    samples, read_problems = load_jsonl(path)
    encoded, encode_problems = encode_samples_ref(samples, tok, template, EncodeOptions(72))
    assert encoded and encode_problems  # some kept, some truncated or dropped
    kept = np.flatnonzero(data.samples["flags"] & KEPT)
    assert [e.index for e in encoded] == kept.tolist()
    for e in encoded:
        got = data.encoded(e.index)
        assert np.array_equal(got.tokens, e.tokens) and np.array_equal(got.trained, e.trained)
        assert got.truncated == e.truncated and got.tokens.dtype == np.int32
    assert data.samples["line"].tolist() == [s.line for s in samples]
    rewards = data.samples["reward"]
    assert [None if np.isnan(r) else r for r in rewards.tolist()] == [s.reward for s in samples]
    assert [p for stage, _, p in data.problems() if stage == "read"] == read_problems
    assert [p for stage, _, p in data.problems() if stage == "encode"] == encode_problems
    assert data.samples["group"].tolist() == [int(g) for g in data.samples["group"]]
    assert isinstance(data.tokens, np.memmap)  # on disk, mapped: memory does not grow with the data


def test_the_cache_is_reused_until_the_dataset_template_tokenizer_or_settings_change(tokenizers, tmp_path):
    path = _chat_file(tmp_path / "chats.jsonl", 60)
    cache = tmp_path / "cache"
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)
    first = _prepare(path, tok, template, cache)
    again = _prepare(path, tok, _template(CHATML_TEMPLATE), cache)
    assert not first.reused and again.reused and again.folder == first.folder
    _same_data(first, again)
    changed = [
        _prepare(path, tok, template, cache, n_ctx=65),
        _prepare(path, tok, template, cache, train_on_prompt=True),
        _prepare(path, tokenizers["qwen2"], template, cache),
        _prepare(path, tok, _template(SMOLLM_LIKE), cache),
    ]
    assert not any(d.reused for d in changed)
    assert len({d.folder for d in [first, *changed]}) == 5
    Path(path).write_text(
        Path(path).read_text(encoding="utf-8").replace("Question 7:", "Question 8:"), encoding="utf-8"
    )
    edited = _prepare(path, tok, template, cache)
    assert not edited.reused and edited.folder != first.folder
    assert edited.dataset_sha256 != first.dataset_sha256


@pytest.mark.parametrize(
    "damage", ["flip a token", "cut the mask", "drop the table", "garble meta", "foreign meta"]
)
def test_a_damaged_cache_entry_is_prepared_again_never_trusted(damage, tokenizers, tmp_path, caplog):
    path = _chat_file(tmp_path / "chats.jsonl", 60)
    cache = tmp_path / "cache"
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)
    good = _prepare(path, tok, template, cache)
    folder = Path(good.folder)
    expected = (good.samples.copy(), np.array(good.tokens), np.array(good.trained))
    del good
    if damage == "flip a token":
        raw = bytearray((folder / "tokens.bin").read_bytes())
        raw[10] ^= 0x01
        (folder / "tokens.bin").write_bytes(bytes(raw))
    elif damage == "cut the mask":
        (folder / "trained.bin").write_bytes((folder / "trained.bin").read_bytes()[:-5])
    elif damage == "drop the table":
        (folder / "samples.npy").unlink()
    elif damage == "garble meta":
        (folder / "meta.json").write_text("{not json", encoding="utf-8")
    else:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        meta["shaped_by"]["options"]["n_ctx"] = 99
        (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    again = _prepare(path, tok, template, cache)
    assert not again.reused
    assert again.samples.tobytes() == expected[0].tobytes()
    np.testing.assert_array_equal(again.tokens, expected[1])
    np.testing.assert_array_equal(again.trained, expected[2])
    assert _prepare(path, tok, template, cache).reused  # the rebuilt entry is sound


def test_the_cache_keeps_the_most_recently_used_entries(tokenizers, tmp_path, monkeypatch):
    monkeypatch.setattr(prepared_module, "MAX_ENTRIES", 3)
    path = _chat_file(tmp_path / "chats.jsonl", 20)
    cache = tmp_path / "cache"
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)
    folders = []
    for n_ctx in (30, 31, 32, 33):
        folders.append(_prepare(path, tok, template, cache, n_ctx=n_ctx).folder)
        os.utime(Path(folders[-1]) / "meta.json", (1e9 + n_ctx, 1e9 + n_ctx))
    left = sorted(p.name for p in cache.iterdir())
    assert len(left) == 3 and Path(folders[0]).name not in left


def test_two_processes_preparing_the_same_data_keep_the_first_entry(tokenizers, tmp_path, monkeypatch):
    # Ranks of a data-parallel run prepare the same dataset into one cache at the same time: the
    # one that finishes second must not remove the entry the first one has mapped.
    path = _chat_file(tmp_path / "chats.jsonl", 40)
    cache = tmp_path / "cache"
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)
    first = _prepare(path, tok, template, cache)
    expected = np.array(first.tokens)
    files = {name: os.stat(Path(first.folder) / name).st_ino for name in prepared_module._FILES}
    monkeypatch.setattr(prepared_module, "_open_cached", lambda *args: None)  # as if it looked before
    second = _prepare(path, tok, template, cache)
    assert second.folder == first.folder
    assert {name: os.stat(Path(first.folder) / name).st_ino for name in files} == files  # untouched
    np.testing.assert_array_equal(np.array(first.tokens), expected)
    np.testing.assert_array_equal(np.array(second.tokens), expected)
    assert [p.name for p in cache.iterdir()] == [Path(first.folder).name]  # its own copy removed
    # a damaged entry found there is replaced
    (Path(first.folder) / "trained.bin").write_bytes(b"")
    third = _prepare(path, tok, template, cache)
    np.testing.assert_array_equal(np.array(third.tokens), expected)
    assert os.path.getsize(Path(third.folder) / "trained.bin") == len(expected)


def test_an_interrupted_preparation_leaves_nothing_that_looks_usable(tokenizers, tmp_path, monkeypatch):
    path = _chat_file(tmp_path / "chats.jsonl", 40)
    cache = tmp_path / "cache"
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepared_module._Writer, "finish", broken)
    with pytest.raises(DatasetError, match="No space left"):
        _prepare(path, tok, template, cache)
    assert list(cache.iterdir()) == []
    monkeypatch.undo()
    assert not _prepare(path, tok, template, cache).reused


def test_unreadable_datasets_say_why(tokenizers, tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        _prepare(str(tmp_path / "missing.jsonl"), tokenizers["spm"], None, tmp_path / "cache")
    with pytest.raises(DatasetError, match="folder"):
        _prepare(str(tmp_path), tokenizers["spm"], None, tmp_path / "cache")


def test_packed_batches_are_made_when_asked_for(tokenizers, tmp_path):
    path = _chat_file(tmp_path / "chats.jsonl", 90)
    tok, template = tokenizers["spm"], _template(CHATML_TEMPLATE)
    data = _prepare(path, tok, template, tmp_path / "cache", n_ctx=96)
    rows = np.flatnonzero(data.samples["flags"] & KEPT)
    weights = np.linspace(0.0, 1.0, len(rows))
    batches = PackedBatches(data, rows, np.arange(len(rows)), weights, 96, 4, shuffle_seed=5)
    encoded = [data.encoded(int(r), k) for k, r in enumerate(rows)]
    want = batch_encoded(encoded, 96, 4, weights=weights, shuffle_seed=5)
    _assert_same_batches(list(batches), want)
    assert batches[-1] is not None and len(batches) == len(want)
    assert batches.n_windows == sum(len(w) for w in [b.tokens for b in want])
    assert batches.n_tokens == sum(b.n_tokens for b in want)
    assert batches.n_label_tokens == sum(b.n_label_tokens for b in want)
    with pytest.raises(IndexError):
        batches[len(batches)]


def test_a_second_run_reuses_the_prepared_dataset(synth_model, tmp_path):
    path = _chat_file(tmp_path / "chats.jsonl", 40)
    cfg = TrainConfig(steps=2, n_ctx=64, data_cache=str(tmp_path / "prepared"), seed=4)
    losses = []
    for _ in range(2):
        run = Trainer(synth_model("llama"), path, cfg)
        events: list[Any] = []
        run.run(events.append)
        losses.append([e.loss for e in events if type(e).__name__ == "Step"])
        reused = run.prepared.reused
    assert reused and losses[0] == losses[1]
    assert len(list((tmp_path / "prepared").iterdir())) == 1


def test_a_plan_lists_the_first_problems_and_counts_them_all(synth_model, tmp_path):
    path = tmp_path / "long.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1100):
            f.write(json.dumps({"text": f"sample {i} " * 20}) + "\n")
    run = Trainer(
        synth_model("llama"), str(path), TrainConfig(steps=1, n_ctx=16, data_cache=str(tmp_path / "prepared"))
    )
    started = run.start()
    plan = started.plan
    assert len(plan.problems) == 1000 and plan.problems_total == 1100
    assert plan.problems[0].startswith("line 1: warning: ") and "truncated to n_ctx=16" in plan.problems[0]


EDGE_SAMPLES = (
    {"text": "<s>starts with a BOS and ends with an EOS</s>"},
    {"text": "</s>"},
    {"text": " "},
    {"text": "<|im_end|> ends the turn <|endoftext|>"},
    {"prompt": "", "response": "an answer"},
    {"prompt": "a question", "response": ""},
    {"prompt": "<s>", "response": "</s>"},
    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]},
    {"messages": [{"role": "assistant", "content": "<s>"}]},
)


@pytest.mark.parametrize("vocab", ["spm", "gemma", "qwen2", "phi3"])
def test_edge_samples_encode_as_the_reference(vocab, tokenizers):
    """BOS and EOS written in the text, empty prompts and replies, a single space: the flat-array
    assembly gives what the reference gives, in every prompt format and with train_on_prompt."""
    samples = [s for obj in EDGE_SAMPLES if (s := parse_sample(obj, 3)[0]) is not None]
    samples += [s for obj in EDGE_SAMPLES if (s := parse_sample(obj, 0)[0]) is not None]  # made in memory
    template = _template(CHATML_TEMPLATE)
    tok = tokenizers[vocab]
    for options in (
        EncodeOptions(4096),
        EncodeOptions(3),
        EncodeOptions(4096, train_on_prompt=True),
        EncodeOptions(4096, prompt_format="raw"),
        EncodeOptions(4, train_on_prompt=True, prompt_format="raw"),
    ):
        _assert_encodes_as_reference(samples, tok, template, options)


def test_without_a_cache_the_files_are_temporary(tokenizers, tmp_path, monkeypatch):
    """cache None ("off" for a run): a temporary folder, gone when the prepared data is closed."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = _chat_file(tmp_path / "chats.jsonl", 30)
    data = prepare_data(path, tokenizers["spm"], _template(CHATML_TEMPLATE), EncodeOptions(64), cache=None)
    folder = Path(data.folder)
    assert folder.parent == tmp_path / "tmp" and (folder / "tokens.bin").exists() and not data.reused
    assert len(data.encoded(0).tokens) > 0
    data.close()
    assert not folder.exists()
