"""Tokenizers and chat templates of Gemma 3, gpt-oss and DeepSeek, read from the file's metadata: Gemma's
SentencePiece without a space prefix and its turn template (the fallback for base files, which carry
none), gpt-oss's harmony template and DeepSeek-V3.1's rendered in the sandbox with the spans training
learns, and the byte-level pre-tokenizers of DeepSeek and gpt-oss."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from engine.testing import CHATML, spm_vocab
from engine.text.chat_template import GEMMA_TEMPLATE, ChatTemplate
from engine.text.tokenizer import Tokenizer
from tests.engine.test_tokenizer import _tiny_metadata

TEMPLATES = Path(__file__).parent.parent / "data" / "templates-extra"


def _gemma_metadata(**changes) -> dict:
    tokens, scores, types = spm_vocab(300)
    tokens[259:261] = ["<start_of_turn>", "<end_of_turn>"]  # in place of ChatML's, control tokens too
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": False,
    }
    md.update(changes)
    return md


def test_gemma_files_without_a_template_get_gemmas_and_its_turns_are_special_tokens():
    md = _gemma_metadata()
    tpl = ChatTemplate.from_metadata(md)
    assert tpl.is_default and tpl.source == GEMMA_TEMPLATE and tpl.name == "default Gemma template"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " hello "},
        {"role": "assistant", "content": "the quick fox"},
    ]
    text, spans = tpl.render_with_spans(messages)
    assert text == (
        "<s><start_of_turn>user\nBe brief.\n\nhello<end_of_turn>\n"
        "<start_of_turn>model\nthe quick fox<end_of_turn>\n"
    )
    assert [text[a:b] for a, b in spans] == ["the quick fox<end_of_turn>"]
    assert tpl.render(messages[:2], add_generation_prompt=True).endswith("<start_of_turn>model\n")
    tok = Tokenizer.from_metadata(md)
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert ids[:2] == [1, 259] and 260 in ids and 260 in tok.eot_ids
    # no space prefix (Gemma): "hello" is not "▁hello"
    first = tok.encode("hello", add_special=False)
    assert not tok.token_text(first[0]).startswith("\u2581")
    spaced = Tokenizer.from_metadata(_gemma_metadata(**{"tokenizer.ggml.add_space_prefix": True}))
    assert spaced.token_text(spaced.encode("hello", add_special=False)[0]).startswith("\u2581")
    # a file that has its own template keeps it; one without Gemma's turn tokens gets ChatML
    assert ChatTemplate.from_metadata(_gemma_metadata(**{"tokenizer.chat_template": CHATML})).source == CHATML
    tokens, _, _ = spm_vocab(300)
    assert "im_start" in ChatTemplate.from_metadata({"tokenizer.ggml.tokens": tokens}).source


def _harmony(**kw) -> ChatTemplate:
    source = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    return ChatTemplate(
        source, bos_token="<|startoftext|>", eos_token="<|return|>", now=lambda: datetime(2025, 8, 5), **kw
    )


def test_gpt_oss_harmony_template_renders_in_the_sandbox():
    tpl = _harmony()
    prompt = tpl.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        reasoning_effort="low",
    )
    assert prompt == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: low\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
        "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>"
    )
    # the replies a run learns: each with its end marker (<|end|> in the history, <|return|> last)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye now."},
    ]
    text, spans = tpl.render_with_spans(messages)
    assert [text[a:b] for a, b in spans] == ["Hello!<|end|>", "Bye now.<|return|>"]
    # tools: macros, recursion, namespace(), tojson, slicing, `in` on mappings
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather now",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City"},
                        "unit": {"type": "string", "enum": ["c", "f"]},
                    },
                    "required": ["city"],
                },
            },
        }
    ]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "content": "20C"},
        {"role": "assistant", "content": "It is 20C."},
    ]
    text = tpl.render(chat, tools=tools)
    assert "namespace functions {" in text and 'unit?: "c" | "f"' in text
    assert (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
        in text
    )
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"20C"<|end|>' in text


def test_deepseek_v3_template_renders_with_its_spans():
    source = (TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja").read_text(encoding="utf-8")
    tpl = ChatTemplate(source, bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    assert tpl.render(messages[:2], add_generation_prompt=True, thinking=True).endswith(
        "<｜Assistant｜><think>"
    )
    text, spans = tpl.render_with_spans(messages)
    assert text.startswith("<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>")
    assert [text[a:b] for a, b in spans] == ["Hello!<｜end▁of▁sentence｜>"]


@pytest.mark.parametrize(
    "pre, pieces",
    [
        ("deepseek-llm", ["11", "11"]),  # \p{N}+, then BPE
        ("deepseek-v3", ["111", "1"]),  # \p{N}{1,3}
        ("gpt-4o", ["111", "1"]),  # gpt-oss's o200k split: \p{N}{1,3}
        ("deepseek-coder", ["1", "1", "1", "1"]),  # \p{N}
    ],
)
def test_deepseek_and_gpt_oss_pre_tokenizers_group_digits_as_llama_cpp(pre, pieces):
    tok = Tokenizer.from_metadata(_tiny_metadata(pre))
    assert [tok.token_text(i) for i in tok.encode("1111", add_special=False)] == pieces
    text = "DeepSeek 日本語 ünï 12345!\n\n  x"
    assert tok.decode(tok.encode(text, add_special=False)) == text
