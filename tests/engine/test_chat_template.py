"""Chat templates: parity with transformers, loss spans, errors, the sandbox and model metadata.

Parity cases come from tests/data/templates/expected.json, written by make_expected.py with
transformers' own renderer; transformers is not needed here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import gguf
import pytest

from engine.errors import ModelError, TemplateError
from engine.io.gguf_file import GGUFFile
from engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "data" / "templates"
EXPECTED = json.loads((TEMPLATE_DIR / "expected.json").read_text(encoding="utf-8"))
FIXED_NOW = datetime.fromisoformat(EXPECTED["fixed_now"])


@dataclass(frozen=True)
class Model:
    """What a test needs to know about one model's template."""

    bos: str  # bos_token string ("" when the model has none)
    eos: str  # eos_token string
    end_of_turn: str  # what closes an assistant turn
    turn_header: str  # what comes right before an assistant reply in a full conversation
    generation_prompt: str  # what add_generation_prompt=True appends after a user turn


MODELS: dict[str, Model] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": Model(
        "", "<|im_end|>", "<|im_end|>", "<|im_start|>assistant\n", "<|im_start|>assistant\n"
    ),
    "Qwen-Qwen3-0.6B.jinja": Model(
        "", "<|im_end|>", "<|im_end|>", "<|im_start|>assistant\n", "<|im_start|>assistant\n"
    ),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": Model(
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜Assistant｜>",
        "<｜Assistant｜><think>\n</think>",
    ),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": Model(
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "microsoft-Phi-3.5-mini-instruct.jinja": Model(
        "<s>", "<|endoftext|>", "<|end|>", "<|assistant|>\n", "<|assistant|>\n"
    ),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": Model("<s>", "</s>", "</s>", "[/INST]", "[/INST]"),
    "CHATML_TEMPLATE": Model(
        "", "<|im_end|>", "<|im_end|>", "<|im_start|>assistant\n", "<|im_start|>assistant\n"
    ),
}


def load(name: str, **kwargs: Any) -> ChatTemplate:
    model = MODELS[name]
    source = (
        CHATML_TEMPLATE if name == "CHATML_TEMPLATE" else (TEMPLATE_DIR / name).read_text(encoding="utf-8")
    )
    return ChatTemplate(source, bos_token=model.bos, eos_token=model.eos, **kwargs)


def conversation(name: str) -> list[dict[str, Any]]:
    """A conversation used by make_expected.py, by name."""
    for case in EXPECTED["cases"]:
        if case["id"].split("|")[1] == name:
            return case["messages"]
    raise KeyError(name)


SYSTEM_USER_ASSISTANT = conversation("system_user_assistant")
SPAN_CONVERSATIONS = ["system_user_assistant", "two_turns_no_system", "system_two_turns", "unicode"]


def test_every_template_file_is_covered() -> None:
    files = {path.name for path in TEMPLATE_DIR.glob("*.jinja")}
    assert files == set(MODELS) - {"CHATML_TEMPLATE"}
    covered = {case["template"] for case in EXPECTED["cases"]}
    assert set(MODELS) <= covered


# -- parity with transformers ----------------------------------------------------


@pytest.mark.parametrize("case", EXPECTED["cases"], ids=[case["id"] for case in EXPECTED["cases"]])
def test_render_matches_transformers(case: dict[str, Any]) -> None:
    if "template_source" in case:
        source = case["template_source"]
    elif case["template"] == "CHATML_TEMPLATE":
        source = CHATML_TEMPLATE
    else:
        source = (TEMPLATE_DIR / case["template"]).read_text(encoding="utf-8")
    template = ChatTemplate(
        source, bos_token=case["bos_token"] or "", eos_token=case["eos_token"] or "", now=lambda: FIXED_NOW
    )
    kwargs = dict(case["kwargs"], add_generation_prompt=case["add_generation_prompt"])
    if "error" in case:
        assert case["error_type"] == "TemplateError"  # transformers' raise_exception
        with pytest.raises(TemplateError, match=re.escape(f"chat template raised: {case['error']}")):
            template.render(case["messages"], **kwargs)
        return
    assert template.render(case["messages"], **kwargs) == case["expected"]
    if "generation_spans" in case and not case["add_generation_prompt"]:
        text, spans = template.render_with_spans(case["messages"], **case["kwargs"])
        assert text == case["expected"]
        assert spans == [tuple(span) for span in case["generation_spans"]]


def test_parity_cases_cover_what_they_claim() -> None:
    cases = EXPECTED["cases"]
    assert len(cases) >= 200
    assert any("你好" in case.get("expected", "") for case in cases)
    assert any("Today is 14 March 2025" in case.get("expected", "") for case in cases)
    assert any("generation_spans" in case for case in cases)
    assert {case["add_generation_prompt"] for case in cases} == {False, True}


# -- every template on the basic conversation ----------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_every_template_renders_system_user_assistant(name: str) -> None:
    template = load(name)
    text = template.render(SYSTEM_USER_ASSISTANT)
    system, user, reply = (m["content"] for m in SYSTEM_USER_ASSISTANT)
    assert user in text and reply in text
    # Mistral-Nemo puts the system prompt into the last user turn only when that turn is the last
    # message, so a conversation ending with a reply loses it (transformers renders the same).
    assert (system in text) == ("Mistral" not in name)
    assert text.rstrip().endswith(MODELS[name].eos if "Phi" in name else MODELS[name].end_of_turn)
    prompt = template.render(SYSTEM_USER_ASSISTANT[:2], add_generation_prompt=True)
    assert prompt.endswith(MODELS[name].generation_prompt)
    assert SYSTEM_USER_ASSISTANT[1]["content"] in prompt
    assert SYSTEM_USER_ASSISTANT[2]["content"] not in prompt


def test_chatml_default_is_standard_chatml() -> None:
    text = ChatTemplate(CHATML_TEMPLATE).render(SYSTEM_USER_ASSISTANT, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# -- spans --------------------------------------------------------------------------------


@pytest.mark.parametrize("conv_name", SPAN_CONVERSATIONS)
@pytest.mark.parametrize("name", MODELS)
def test_spans_cover_reply_and_end_of_turn(name: str, conv_name: str) -> None:
    model = MODELS[name]
    messages = conversation(conv_name)
    text, spans = load(name).render_with_spans(messages)
    assert text == load(name).render(messages)
    replies = [m for m in messages if m["role"] == "assistant"]
    assert len(spans) == len(replies)
    previous_end = 0
    for (start, end), reply in zip(spans, replies, strict=True):
        assert previous_end <= start < end <= len(text)
        piece = text[start:end]
        assert reply["content"] in piece
        assert piece.endswith(model.end_of_turn)
        assert text[:start].endswith(model.turn_header)  # the header is not part of the span
        assert piece == piece.strip()
        previous_end = end


@pytest.mark.parametrize("name", MODELS)
def test_spans_exact_for_two_turns(name: str) -> None:
    messages = conversation("two_turns_no_system")
    text, spans = load(name).render_with_spans(messages)
    eot = MODELS[name].end_of_turn
    think = "<think>\n\n</think>\n\n" if "Qwen3" in name else ""  # Qwen3 writes one into the last reply
    assert [text[s:e] for s, e in spans] == [f"Hello! How can I help?{eot}", f"{think}7 is prime.{eot}"]


def test_phi_spans_leave_out_the_closing_eos() -> None:
    text, spans = load("microsoft-Phi-3.5-mini-instruct.jinja").render_with_spans(SYSTEM_USER_ASSISTANT)
    assert text.endswith("<|end|>\n<|endoftext|>")
    assert text[spans[-1][0] : spans[-1][1]] == "The capital of France is Paris.<|end|>"


def test_qwen3_spans_with_reasoning() -> None:
    # Qwen3 drops the <think> block of replies before the last user turn and keeps the last one's.
    messages = conversation("reasoning_in_content")
    text, spans = load("Qwen-Qwen3-0.6B.jinja").render_with_spans(messages)
    assert [text[s:e] for s, e in spans] == [
        "144<|im_end|>",
        "<think>\n13 * 13 = 169\n</think>\n\n169<|im_end|>",
    ]
    # The last reply without reasoning still gets the empty think block the template writes.
    text, spans = load("Qwen-Qwen3-0.6B.jinja").render_with_spans(conversation("two_turns_no_system"))
    assert text[spans[-1][0] : spans[-1][1]] == "<think>\n\n</think>\n\n7 is prime.<|im_end|>"


def test_deepseek_spans_with_reasoning() -> None:
    messages = conversation("reasoning_in_content")
    text, spans = load("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").render_with_spans(messages)
    assert [text[s:e] for s, e in spans] == ["\n\n144<｜end▁of▁sentence｜>", "\n\n169<｜end▁of▁sentence｜>"]


def test_mistral_spans_when_the_prompt_places_the_system_message_elsewhere() -> None:
    # With a generation prompt the system message joins the last user turn; in the finished
    # conversation it is gone, so prompts are no prefixes of the text and replies are probed for.
    template = load("mistralai-Mistral-Nemo-Instruct-2407.jinja")
    messages = conversation("system_two_turns")
    prompt = template.render(messages[:2], add_generation_prompt=True)
    assert prompt == "<s>[INST]You are a helpful assistant.\n\n2 + 2?[/INST]"
    text, spans = template.render_with_spans(messages)
    assert text == "<s>[INST]2 + 2?[/INST]4</s>[INST]And 3 + 3?[/INST]6</s>"
    assert [text[s:e] for s, e in spans] == ["4</s>", "6</s>"]


@pytest.mark.parametrize(
    "name",
    ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"],
)
def test_spans_of_tool_calls(name: str) -> None:
    messages = conversation("tool_call_round_trip")
    text, spans = load(name).render_with_spans(messages, tools=[])
    assert len(spans) == 2
    call, answer = (text[s:e] for s, e in spans)
    assert "get_weather" in call and "Zürich" in call and call.endswith(MODELS[name].end_of_turn)
    think = "<think>\n\n</think>\n\n" if "Qwen3" in name else ""  # Qwen3 writes one into the last reply
    assert answer == f"{think}It is 21 °C in Zürich.{MODELS[name].end_of_turn}"


def test_spans_without_assistant_messages() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert load("CHATML_TEMPLATE").render_with_spans(messages) == ("<|im_start|>user\nhi<|im_end|>\n", [])


def test_spans_refuse_generation_prompt() -> None:
    with pytest.raises(TypeError):
        load("CHATML_TEMPLATE").render_with_spans(SYSTEM_USER_ASSISTANT, add_generation_prompt=True)


def test_unlocatable_reply_names_the_message() -> None:
    # The reply is rendered twice, so neither a prefix nor a probe can place it.
    template = ChatTemplate("{% for m in messages %}{{ m.content }};{% endfor %}|{{ messages[-1].content }}")
    with pytest.raises(TemplateError, match="assistant message 1"):
        template.render_with_spans([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])


@pytest.mark.parametrize(
    "source",
    [
        # Every reply in a block; the blocks end with "\n", which the spans leave out.
        "{% for m in messages %}<{{ m.role }}>"
        "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<end>\n{% endgeneration %}"
        "{% else %}{{ m.content }}<end>\n{% endif %}{% endfor %}",
        # Only the last reply is marked: the blocks do not describe every reply, so spans are found as usual.
        "{% for m in messages %}<{{ m.role }}>"
        "{% if loop.last %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}"
        "<end>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    ],
    ids=["generation_blocks_give_the_spans", "generation_blocks_not_matching_replies_fall_back"],
)
def test_generation_block_spans(source: str) -> None:
    text, spans = ChatTemplate(source).render_with_spans(conversation("two_turns_no_system"))
    assert [text[s:e] for s, e in spans] == ["Hello! How can I help?<end>", "7 is prime.<end>"]


# -- errors -------------------------------------------------------------------------------


def test_raise_exception_becomes_template_error() -> None:
    template = load("mistralai-Mistral-Nemo-Instruct-2407.jinja")
    messages = [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}]
    with pytest.raises(TemplateError) as info:
        template.render(messages)
    assert str(info.value) == (
        "chat template raised: After the optional system message, "
        "conversation roles must alternate user/assistant/user/assistant/..."
    )


def test_raise_exception_uses_the_template_name() -> None:
    template = ChatTemplate("{{ raise_exception('no ' + messages[0].role) }}", name="Foo-7B chat template")
    with pytest.raises(TemplateError, match=r"^Foo-7B chat template raised: no user$"):
        template.render([{"role": "user", "content": "x"}])


def test_syntax_error_at_construction() -> None:
    with pytest.raises(TemplateError, match=r"syntax error on line 2"):
        ChatTemplate("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(TemplateError, match="syntax error"):
        ChatTemplate("{% for m in messages %}{{ m.content }}")  # never closed


def test_failure_while_rendering_names_line_and_cause() -> None:
    template = ChatTemplate("ok\n{{ messages[0].content + 1 }}")
    with pytest.raises(TemplateError, match=r"^chat template failed on line 2: TypeError"):
        template.render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError, match="UndefinedError"):
        ChatTemplate("{{ messages[0].nope.deeper }}").render([{"role": "user", "content": "x"}])


def test_bad_messages_are_template_errors() -> None:
    template = load("CHATML_TEMPLATE")
    with pytest.raises(TemplateError, match="message 1 is a str"):
        template.render([{"role": "user", "content": "x"}, "oops"])
    with pytest.raises(TemplateError, match="messages must be a list"):
        template.render("hello")
    with pytest.raises(TemplateError, match="tools must be a list"):
        template.render([], tools={"name": "x"})


# -- sandbox ------------------------------------------------------------------------------

# Reaching for Python internals: the sandbox either raises or hands back an empty undefined.
ESCAPES = [
    "{{ messages.__class__ }}",
    "{{ messages.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{{ namespace.__init__.__globals__.os }}",
    "{{ dict.__call__.__globals__ }}",
    "{{ messages[0].items.__self__.__class__ }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
]
# Changing the caller's data or exhausting memory: always refused.
REFUSED = [
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'system'}) }}",
    "{% set ns = namespace(_private=1) %}",
    "{% set ns = namespace() %}{% set ns._private = 1 %}",
    "{{ 'x' * 10 ** 9 }}",
    "{{ ([0] * 10 ** 9) | length }}",
    "{{ 9 ** 9999999 }}",
    "{{ range(10 ** 9) | length }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_stops_escapes(source: str) -> None:
    try:
        out = ChatTemplate(source).render([{"role": "user", "content": "x"}])
    except TemplateError as exc:
        assert "sandbox" in str(exc) or "Undefined" in str(exc)
    else:
        assert out == ""


@pytest.mark.parametrize("source", REFUSED)
def test_sandbox_refuses_mutation_and_huge_values(source: str) -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(messages)
    assert messages == [{"role": "user", "content": "x"}]


def test_unsafe_attribute_renders_nothing() -> None:
    # Printing an unsafe attribute yields an empty undefined (harmless); using it further raises.
    assert ChatTemplate("[{{ ''.__class__ }}]").render([]) == "[]"
    with pytest.raises(TemplateError, match="stopped by the sandbox"):
        ChatTemplate("{{ ''.__class__.__mro__ }}").render([])


def test_objects_reach_the_template_as_inert_data() -> None:
    class Secret:
        def leak(self) -> str:
            return "leaked"

    template = ChatTemplate("{{ obj }} {{ obj.leak }} {{ messages[0].content }}")
    out = template.render([{"role": "user", "content": Secret()}], obj=Secret())
    assert out == "<Secret>  <Secret>"


# -- filters, globals, variables --------------------------------------------------------------


def test_tojson_keeps_non_ascii_and_html() -> None:
    template = ChatTemplate("{{ messages[0] | tojson }}|{{ x | tojson(indent=2, sort_keys=true) }}")
    out = template.render([{"role": "user", "content": "héllo — 你好 <b>&'"}], x={"b": 1, "a": [1]})
    assert out == '{"role": "user", "content": "héllo — 你好 <b>&\'"}|{\n  "a": [\n    1\n  ],\n  "b": 1\n}'
    assert (
        ChatTemplate("{{ x | tojson(separators=(',', ':')) }}").render([], x={"a": [1, 2]}) == '{"a":[1,2]}'
    )


def test_loop_controls() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}{{ m.content }};{% endfor %}"
    )
    messages = [{"role": "system", "content": "s"}] + [{"role": "user", "content": str(i)} for i in range(5)]
    assert template.render(messages) == "0;1;"  # loop.index counts the skipped system message


def test_strftime_now_uses_the_clock() -> None:
    template = ChatTemplate("{{ strftime_now('%d %b %Y') }}", now=lambda: datetime(2024, 7, 26, 12, 0))
    assert template.render([]) == "26 Jul 2024"
    before = datetime.now().strftime("%Y-%m-%d")
    today = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([])
    assert today in {before, datetime.now().strftime("%Y-%m-%d")}


def test_variables_reach_the_template() -> None:
    template = ChatTemplate(
        "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools | length }}|"
        "{{ documents[0].title }}|{{ enable_thinking }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    out = template.render(
        [],
        add_generation_prompt=True,
        tools=[{"name": "f"}],
        documents=[{"title": "T", "text": "x"}],
        enable_thinking=False,
    )
    assert out == "<s>|</s>|True|1|T|False"
    assert (
        ChatTemplate("{{ bos_token }}{{ tools }}", bos_token="<s>").render([], bos_token="[B]") == "[B]None"
    )


def test_reasoning_is_aliased_like_transformers() -> None:
    template = ChatTemplate("{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}")
    assert template.render([{"role": "assistant", "content": "a", "reasoning": "r"}]) == "r|r"


def test_caller_messages_are_not_modified() -> None:
    messages = [{"role": "assistant", "content": "a", "reasoning": "r"}]
    ChatTemplate("{% set m = messages[0] %}{{ m.content }}").render(messages)
    load("Qwen-Qwen3-0.6B.jinja").render_with_spans(messages)
    assert messages == [{"role": "assistant", "content": "a", "reasoning": "r"}]


# -- from_metadata ----------------------------------------------------------------------------

TOKENS = ["<unk>", "<s>", "</s>", "<|im_end|>", "a", "b"]


def test_from_metadata_uses_the_model_template_and_tokens() -> None:
    source = (TEMPLATE_DIR / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text(encoding="utf-8")
    metadata = {
        "tokenizer.chat_template": source,
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    template = ChatTemplate.from_metadata(metadata)
    assert template.source == source and not template.is_default
    assert (template.bos_token, template.eos_token) == ("<s>", "</s>")
    assert template.render(SYSTEM_USER_ASSISTANT[1:]) == (
        "<s>[INST]What is the capital of France?[/INST]The capital of France is Paris.</s>"
    )


@pytest.mark.parametrize("source", [None, "", "  \n"])
def test_from_metadata_falls_back_to_chatml(source: str | None) -> None:
    metadata: dict[str, Any] = {"tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.eos_token_id": 3}
    if source is not None:
        metadata["tokenizer.chat_template"] = source
    template = ChatTemplate.from_metadata(metadata)
    assert template.is_default and template.source == CHATML_TEMPLATE
    assert (template.bos_token, template.eos_token) == ("", "<|im_end|>")
    assert template.render([{"role": "user", "content": "a"}]) == "<|im_start|>user\na<|im_end|>\n"


def test_from_metadata_rejects_bad_values() -> None:
    with pytest.raises(ModelError, match=r"bos_token_id is 99; expected a token id in 0\.\.5"):
        ChatTemplate.from_metadata({"tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.bos_token_id": 99})
    with pytest.raises(ModelError, match="no tokenizer.ggml.tokens"):
        ChatTemplate.from_metadata({"tokenizer.ggml.eos_token_id": 2})
    with pytest.raises(TemplateError, match="expected a string"):
        ChatTemplate.from_metadata({"tokenizer.chat_template": ["{{ x }}"]})
    with pytest.raises(TemplateError, match="syntax error"):
        ChatTemplate.from_metadata({"tokenizer.chat_template": "{% if %}"})


def test_from_metadata_of_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(3)
    writer.add_chat_template(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    template = ChatTemplate.from_metadata(GGUFFile(path).metadata)
    assert not template.is_default
    assert template.render([{"role": "user", "content": "héllo"}]) == "<s>héllo<|im_end|>"


def test_a_template_pickles_as_its_recipe_and_renders_the_same_in_another_process():
    import pickle

    t = ChatTemplate(CHATML_TEMPLATE, bos_token="<s>", eos_token="</s>", name="chatml", time_limit=2.0)
    again = pickle.loads(pickle.dumps(t))
    assert again is not t and again.recipe() == t.recipe()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert again.render(messages) == t.render(messages)
    assert again.render_with_spans(messages) == t.render_with_spans(messages)
