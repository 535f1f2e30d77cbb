"""Write expected.json: transformers' own rendering of every chat template here, for parity tests.

Run with a Python that has transformers and jinja2 (not the project's venv; torch is not needed):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install transformers jinja2
    /tmp/tfvenv/bin/python tests/data/templates/make_expected.py

Each case renders one template (a *.jinja file here, the engine's CHATML_TEMPLATE, or a small
synthetic template defined below that exercises a feature the real ones do not: strftime_now,
{% generation %}, tojson options, loop controls, namespace/dict) with one conversation, both
with and without add_generation_prompt, through
`transformers.utils.chat_template_utils.render_jinja_template`; for the model templates the
result is cross-checked against `PreTrainedTokenizerFast.apply_chat_template(tokenize=False)`.
A case where transformers raises records the error message instead of the text.

bos/eos are the strings each model really has. Qwen has no bos token: transformers then leaves
`bos_token` undefined; the case records null and the engine passes "" (renders the same).

strftime_now: transformers' clock is frozen at FIXED_NOW while rendering (by replacing the
`datetime` its `strftime_now` reads); the tests give the engine the same fixed clock. None of
the model templates here calls strftime_now; the synthetic "strftime" template does.
"""

from __future__ import annotations

import ast
import datetime as _datetime
import json
from pathlib import Path

import jinja2
import tokenizers
import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _chatml_template() -> str:
    """CHATML_TEMPLATE as engine/chat_template.py defines it, read without importing the engine."""
    module = ast.parse((ROOT / "engine" / "chat_template.py").read_text(encoding="utf-8"))
    for node in module.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CHATML_TEMPLATE":
            return ast.literal_eval(node.value)
    raise LookupError("engine/chat_template.py defines no CHATML_TEMPLATE")


CHATML_TEMPLATE = _chatml_template()

FIXED_NOW = "2025-03-14T09:26:53"

# Special tokens each model really has (tokenizer_config.json): (bos, eos); None = the model has none.
MODEL_TOKENS: dict[str, tuple[str | None, str]] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle — 当前天气",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}

# name -> (messages, extra keyword arguments for the template)
CONVERSATIONS: dict[str, tuple[list[dict], dict]] = {
    "system_user_assistant": (
        [
            SYSTEM,
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris."},
        ],
        {},
    ),
    "two_turns_no_system": (
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "7 is prime."},
        ],
        {},
    ),
    "system_two_turns": (
        [
            SYSTEM,
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "6"},
        ],
        {},
    ),
    "unicode": (
        [
            {"role": "system", "content": "Réponds en français — 日本語もOK."},
            {"role": "user", "content": "héllo — 你好 😀"},
            {"role": "assistant", "content": "Bonjour ! 你好 👋 «ça va ?»"},
        ],
        {},
    ),
    "user_only": ([{"role": "user", "content": "Tell me a joke."}], {}),
    "system_user": ([SYSTEM, {"role": "user", "content": "Tell me a joke."}], {}),
    "whitespace_and_newlines": (
        [
            {"role": "user", "content": "  line one\nline two  \n"},
            {"role": "assistant", "content": "\nAnswer with\n\ttabs and  spaces. \n"},
        ],
        {},
    ),
    "empty_system": (
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
        ],
        {},
    ),
    "reasoning_in_content": (
        [
            {"role": "user", "content": "What is 12 * 12?"},
            {"role": "assistant", "content": "<think>\n12 * 12 = 144\n</think>\n\n144"},
            {"role": "user", "content": "And 13 * 13?"},
            {"role": "assistant", "content": "<think>\n13 * 13 = 169\n</think>\n\n169"},
        ],
        {},
    ),
    "reasoning_field": (
        [
            {"role": "user", "content": "Is 91 prime?"},
            {"role": "assistant", "content": "No: 91 = 7 * 13.", "reasoning_content": "Try 7: 7 * 13 = 91."},
        ],
        {},
    ),
    "reasoning_alias": (
        [
            {"role": "user", "content": "Is 91 prime?"},
            {"role": "assistant", "content": "No.", "reasoning": "91 = 7 * 13."},
            {"role": "user", "content": "Is 97?"},
            {"role": "assistant", "content": "Yes.", "thinking": "No divisor up to 9."},
        ],
        {},
    ),
    "tools": (
        [SYSTEM, {"role": "user", "content": "Weather in Zürich?"}],
        {"tools": [WEATHER_TOOL]},
    ),
    "tool_call_round_trip": (
        [
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call12345",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": '{"temp_c": 21}'},
            {"role": "assistant", "content": "It is 21 °C in Zürich."},
        ],
        {"tools": [WEATHER_TOOL]},
    ),
    "roles_not_alternating": (
        [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}],
        {},
    ),
    "template_variables": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "What day is it?"},
        ],
        {"date_string": "01 Jan 2025", "enable_thinking": False},
    ),
}

# Small templates for features the model templates do not use. name -> (source, conversation names)
SYNTHETIC: dict[str, tuple[str, list[str]]] = {
    "strftime": (
        "{{ bos_token }}Today is {{ strftime_now('%d %B %Y, %H:%M') }}.\n"
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}\n{% endfor %}",
        ["system_user_assistant"],
    ),
    "generation_tag": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message.role + '\\n' }}"
        "{% if message.role == 'assistant' %}"
        "{% generation %}{{ message.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
        "{% else %}{{ message.content + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        ["system_two_turns", "unicode"],
    ),
    "tojson_options": (
        "{{ tools | tojson }}\n{{ tools | tojson(indent=2, sort_keys=true) }}\n"
        "{{ tools | tojson(separators=(',', ':')) }}\n{{ messages | tojson(ensure_ascii=true) }}\n"
        "{{ {'b': 'é', 'a': [1, 2.5, none, true]} | tojson }}",
        ["tools", "unicode"],
    ),
    "loop_controls": (
        "{% for m in messages %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}"
        "{{ loop.index }}:{{ m.role }}={{ m.content }}|"
        "{% endfor %}",
        ["system_two_turns", "two_turns_no_system"],
    ),
    "namespace_dict_filters": (
        "{%- set ns = namespace(n=0, roles=[]) %}\n"
        "{%- for m in messages %}{% set ns.n = ns.n + m.content | length %}{% endfor %}\n"
        "{%- set d = dict(count=ns.n, first=messages[0].content | trim | upper) %}\n"
        "{{- d | tojson }} {{ d.items() | list }}\n"
        "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' / ') }}\n"
        "{{ messages | length }} {{ (messages | last).role | title }} {{ '%s-%d' | format('x', 3) }}",
        ["system_two_turns", "whitespace_and_newlines"],
    ),
}


class _FrozenDatetime(_datetime.datetime):
    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:
        return cls.fromisoformat(FIXED_NOW)


def _tokenizer(bos: str | None, eos: str | None) -> PreTrainedTokenizerFast:
    """A tokenizer that does nothing but carry bos/eos, so apply_chat_template can be called."""
    model = tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(model), bos_token=bos, eos_token=eos)


def _render(
    source: str, messages: list[dict], gen: bool, bos: str | None, eos: str | None, extra: dict
) -> dict:
    tokens = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    try:
        (text,), indices = ctu.render_jinja_template(
            [messages],
            chat_template=source,
            add_generation_prompt=gen,
            return_assistant_tokens_mask="{% generation %}" in source,
            **tokens,
            **extra,
        )
    except Exception as exc:  # noqa: BLE001 - recorded as the expected outcome
        return {"error": str(exc), "error_type": type(exc).__name__}
    out: dict = {"expected": text}
    if indices and indices[0]:
        out["generation_spans"] = [list(span) for span in indices[0]]
    return out


def main() -> None:
    ctu.datetime = _FrozenDatetime  # strftime_now reads the module's `datetime` at call time
    cases = []
    sources = [
        (path.name, None, path.read_text(encoding="utf-8"), list(CONVERSATIONS))
        for path in sorted(HERE.glob("*.jinja"))
    ]
    assert {name for name, *_ in sources} == set(MODEL_TOKENS), "give every template file its bos/eos"
    sources.append(("CHATML_TEMPLATE", None, CHATML_TEMPLATE, list(CONVERSATIONS)))
    for name, (source, conv_names) in SYNTHETIC.items():
        sources.append((f"synthetic:{name}", source, source, conv_names))
    for name, inline_source, source, conv_names in sources:
        default_tokens = (None, "<|im_end|>") if name == "CHATML_TEMPLATE" else ("<s>", "</s>")
        bos, eos = MODEL_TOKENS.get(name, default_tokens)
        tokenizer = _tokenizer(bos, eos) if name in MODEL_TOKENS else None
        for conv_name in conv_names:
            messages, extra = CONVERSATIONS[conv_name]
            for gen in (False, True):
                result = _render(source, messages, gen, bos, eos, extra)
                if tokenizer is not None and "expected" in result:
                    via_tokenizer = tokenizer.apply_chat_template(
                        messages, chat_template=source, add_generation_prompt=gen, tokenize=False, **extra
                    )
                    assert via_tokenizer == result["expected"], (name, conv_name, gen)
                case = {
                    "id": f"{name}|{conv_name}|{'gen' if gen else 'nogen'}",
                    "template": name,
                    **({"template_source": inline_source} if inline_source is not None else {}),
                    "bos_token": bos,
                    "eos_token": eos,
                    "messages": messages,
                    "kwargs": extra,
                    "add_generation_prompt": gen,
                    **result,
                }
                cases.append(case)
    out = {
        "generator": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}, "
        "render_jinja_template (model templates cross-checked with apply_chat_template)",
        "fixed_now": FIXED_NOW,
        "note": "bos_token null: the model has none (transformers leaves it undefined; "
        "the engine passes ''). strftime_now ran on a clock frozen at fixed_now.",
        "cases": cases,
    }
    path = HERE / "expected.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {path}: {len(cases)} cases ({n_err} where transformers raises)")


if __name__ == "__main__":
    main()
