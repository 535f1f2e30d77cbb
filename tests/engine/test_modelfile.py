"""The Ollama Modelfile: the chat template translated to a Go template, checked by rendering it with
an interpreter of the emitted subset and comparing with the engine's own rendering."""

from __future__ import annotations

import pytest

from engine.cli.main import main
from engine.errors import ExportError, TemplateError
from engine.export.modelfile import PROBES, modelfile_text, render_go, translate, write_modelfile
from engine.text.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate
from engine.train.data import load_jsonl
from tests.conftest import DATA

TEMPLATES = DATA / "templates"
KNOWN = [  # (name, template source, bos, family)
    ("ChatML (default)", CHATML_TEMPLATE, "", "ChatML"),
    ("Gemma 3", GEMMA_TEMPLATE, "<bos>", "Gemma"),
    ("Qwen2.5 (default system)", "Qwen-Qwen2.5-7B-Instruct.jinja", "", "ChatML"),
    ("Qwen3", "Qwen-Qwen3-0.6B.jinja", "", "ChatML"),
    (
        "Llama 3.1 (knowledge-date preamble)",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "<|begin_of_text|>",
        "Llama 3",
    ),
]
NOT_TRANSLATED = [
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
]


def _template(source: str, bos: str = "") -> ChatTemplate:
    if source.endswith(".jinja"):
        source = (TEMPLATES / source).read_text(encoding="utf-8")
    return ChatTemplate(source, bos_token=bos, eos_token="</s>")


def _conversations() -> list[list[dict]]:
    """Sample conversations: the probes, and the demo dataset's cut to end on a user turn."""
    samples, _ = load_jsonl(DATA / "datasets" / "sample_data.jsonl")
    out = [list(p) for p in PROBES]
    for s in samples:
        msgs = [{"role": m["role"], "content": m["content"]} for m in s.messages]
        while msgs and msgs[-1]["role"] != "user":
            msgs.pop()
        if msgs:
            out.append(msgs)
    out.append([{"role": "user", "content": 'Quotes " and {braces} and a backslash \\ stay.'}])
    return out


@pytest.mark.parametrize(("name", "source", "bos", "family"), KNOWN, ids=[k[0] for k in KNOWN])
def test_translated_template_renders_as_the_engine(name, source, bos, family):
    template = _template(source, bos)
    translation = translate(template)
    assert translation.family == family, translation.reason
    conversations = _conversations()
    assert len(conversations) > 6
    for messages in conversations:
        if family == "Gemma" and any(m["role"] == "system" for m in messages[1:]):
            continue  # Gemma allows a system message first only
        want = template.render(messages, add_generation_prompt=True).removeprefix(bos)
        assert render_go(translation.template, messages) == want, (name, messages)


@pytest.mark.parametrize("source", NOT_TRANSLATED)
def test_other_templates_are_refused_before_writing(source, tmp_path):
    template = _template(source, "<s>")
    translation = translate(template)
    assert translation.family is None and "not yet" in translation.reason
    with pytest.raises(ExportError, match="no Modelfile"):
        write_modelfile(tmp_path / "m.gguf", template)
    assert not (tmp_path / "Modelfile").exists()


def test_interpreter_subset():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    src = (
        '{{- $n := "x" }}\n{{- range .Messages }}{{ if eq .Role "user" }}[{{ .Content }}]'
        '{{ else if ne .Role "user" }}<{{ .Content }}>{{ end }}{{ $n = .Role }}{{ end }}'
        " {{ $n }}|{{ $.System -}}  \n!"
    )
    assert render_go(src, msgs) == "<S>[U] user|S!"
    assert render_go("{{ if and .System (not false) }}y{{ else }}n{{ end }}", msgs[1:]) == "n"
    for bad in ("{{ printf .System }}", "{{ if .System }}x", "{{ end }}", "{{ $undeclared = 1 }}"):
        with pytest.raises(TemplateError):
            render_go(bad, msgs)


def test_modelfile_text_for_merged_and_adapter():
    translation = translate(_template(CHATML_TEMPLATE))
    merged = modelfile_text(translation, gguf="merged.gguf", sampling={"temperature": 0.7, "top_p": 0.9})
    lines = merged.splitlines()
    assert "FROM ./merged.gguf" in lines and 'PARAMETER stop "<|im_end|>"' in lines
    assert "PARAMETER temperature 0.7" in lines and "PARAMETER top_p 0.9" in lines
    assert 'TEMPLATE """' in merged and "ADAPTER" not in merged
    adapter = modelfile_text(translation, gguf="adapter.gguf", base="/models/base.gguf")
    assert "FROM /models/base.gguf\nADAPTER ./adapter.gguf\n" in adapter


def test_cli_export_writes_the_modelfile(tmp_path, capsys):
    from engine.model.model import Model
    from engine.testing import SynthSpec, random_adapter, write_adapter, write_model

    base = write_model(tmp_path / "base.gguf", SynthSpec.for_arch("llama", seed=3))
    pairs = random_adapter(Model.load(base), ["blk.0.attn_q.weight"], rank=2, seed=1, std=0.02)
    adapter = write_adapter(tmp_path / "a.gguf", "llama", pairs, alpha=2.0)
    out = tmp_path / "out" / "merged.gguf"
    out.parent.mkdir()
    assert (
        main(["export", adapter, "--model", base, "--merge", "--out", str(out), "--modelfile", "--no-verify"])
        == 0
    )
    text = (out.parent / "Modelfile").read_text(encoding="utf-8")
    assert text.splitlines()[1] == "FROM ./merged.gguf" and 'PARAMETER stop "<|im_end|>"' in text
    assert "ollama create" in capsys.readouterr().out
    out2 = tmp_path / "out2" / "adapter.gguf"
    out2.parent.mkdir()
    assert main(["export", adapter, "--model", base, "--out", str(out2), "--modelfile"]) == 0
    text = (out2.parent / "Modelfile").read_text(encoding="utf-8")
    assert f"FROM {base}\nADAPTER ./adapter.gguf" in text
    assert main(["export", adapter, "--out", str(tmp_path / "x.gguf"), "--modelfile"]) == 2
    assert "--modelfile needs the base model" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()
