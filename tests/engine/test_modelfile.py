"""The Ollama Modelfile: the translated Go template renders what the engine's Jinja template renders.

Go's text/template is not available here; `tests/engine/gotemplate.py` is a small interpreter of the
subset the translation emits, and stands in for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import TemplateError
from engine.export.modelfile import (
    TemplateNotTranslatable,
    plan_modelfile,
    translate,
    write_modelfile,
)
from engine.model.generate import SamplingConfig
from engine.text.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate

from . import gotemplate

DATA = Path(__file__).parent.parent / "data" / "templates"

# SmolLM2-Instruct's template: a default system prompt, and its BOS token is "<|im_start|>"
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Mistral-7B-Instruct-v0.1's template: spaces inside [INST] ... [/INST], no system message
MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# (template source, bos, eos, the family it must translate to)
FAMILY_CASES = {
    "smollm2": (SMOLLM2, "<|im_start|>", "<|im_end|>", "ChatML"),
    "chatml-default": (CHATML_TEMPLATE, "", "<|im_end|>", "ChatML"),
    "qwen2.5": ((DATA / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(), "", "<|im_end|>", "ChatML"),
    "qwen3": ((DATA / "Qwen-Qwen3-0.6B.jinja").read_text(), "", "<|im_end|>", "ChatML"),
    "llama3.1": (
        (DATA / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(),
        "<|begin_of_text|>",
        "<|eot_id|>",
        "Llama 3",
    ),
    "gemma3": (GEMMA_TEMPLATE, "<bos>", "<eos>", "Gemma"),
    "mistral-v0.1": (MISTRAL_V01, "<s>", "</s>", "Mistral (spaced)"),
    "mistral-nemo": (
        (DATA / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text(),
        "<s>",
        "</s>",
        "Mistral",
    ),
    "deepseek-r1": (
        (DATA / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text(),
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "DeepSeek R1",
    ),
}


def _m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


# Not the probes the translation is fitted on: other texts, lengths, lines and punctuation.
CONVERSATIONS = {
    "system and three turns": [
        _m("system", "You are terse.\nAnswer in French."),
        _m("user", "What is 2+2?"),
        _m("assistant", "Quatre."),
        _m("user", 'And 3+3? Say it "twice".'),
        _m("assistant", "Six, six."),
        _m("user", "Thanks!\n\nBye."),
    ],
    "no system, two turns": [
        _m("user", "Hi there"),
        _m("assistant", "Hello! How can I help?"),
        _m("user", "Tell me a joke"),
    ],
    "one question": [_m("user", "Why is the sky blue?")],
    "system and one question": [_m("system", "Be kind."), _m("user", "Name a colour {not a template}.")],
}


@pytest.mark.parametrize("case", FAMILY_CASES)
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_translated_template_renders_like_the_engine(case, conversation):
    source, bos, eos, family = FAMILY_CASES[case]
    template = ChatTemplate(source, bos_token=bos, eos_token=eos, name=case)
    fmt = translate(template)
    assert fmt.family == family
    messages = CONVERSATIONS[conversation]
    if fmt.system == "none" and messages[0]["role"] == "system":  # the template refuses them
        with pytest.raises(TemplateError):
            template.render(messages, add_generation_prompt=True)
        return
    want = template.render(messages, add_generation_prompt=True)
    got = gotemplate.render(fmt.go_template(), messages)
    assert got == want
    assert fmt.render(messages) == want  # the Python specification agrees too


@pytest.mark.parametrize("case", ["qwen2.5", "llama3.1", "gemma3"])
def test_tokenizer_bos_is_left_to_the_tokenizer(case):
    source, bos, eos, _ = FAMILY_CASES[case]
    template = ChatTemplate(source, bos_token=bos, eos_token=eos)
    fmt = translate(template, bos_added=True)
    messages = CONVERSATIONS["system and three turns"]
    want = template.render(messages, add_generation_prompt=True)
    got = gotemplate.render(fmt.go_template(), messages)
    assert (bos + got if bos else got) == want
    assert not bos or not got.startswith(bos)


@pytest.mark.parametrize("case", ["chatml-default", "llama3.1", "gemma3"])
def test_trailing_assistant_message_is_left_open_for_ollama_to_continue(case):
    source, bos, eos, _ = FAMILY_CASES[case]
    template = ChatTemplate(source, bos_token=bos, eos_token=eos)
    fmt = translate(template)
    messages = CONVERSATIONS["no system, two turns"]
    got = gotemplate.render(fmt.go_template(), [*messages, _m("assistant", "Why did")])
    assert got == template.render(messages, add_generation_prompt=True) + "Why did"


@pytest.mark.parametrize(
    "source",
    [
        (DATA / "microsoft-Phi-3.5-mini-instruct.jinja").read_text(),
        (DATA.parent / "templates-extra" / "openai-gpt-oss-120b.jinja").read_text(),
        "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}### assistant:",
    ],
    ids=["phi3.5", "gpt-oss-harmony", "custom"],
)
def test_unknown_templates_are_not_translated(source):
    with pytest.raises(TemplateNotTranslatable, match="no chat-template family"):
        translate(ChatTemplate(source, bos_token="<s>", eos_token="</s>"))


def test_interpreter_follows_go_rules_it_claims():
    run = gotemplate.execute
    assert run("a  {{- 1 -}}  b", {}) == "a1b"
    assert run('{{ if eq .X "a" }}A{{ else if eq .X "b" }}B{{ else }}C{{ end }}', {"X": "b"}) == "B"
    assert run("{{ if and .X (not .Y) }}yes{{ end }}", {"X": "1", "Y": ""}) == "yes"
    loop = "{{ range $i, $_ := .L }}{{ $last := eq (len (slice $.L $i)) 1 }}{{ $i }}"
    loop += "{{ if $last }}!{{ end }}{{ end }}"
    assert run(loop, {"L": [1, 2, 3]}) == "012!"
    with pytest.raises(ValueError):
        run("{{ printf .X }}", {"X": 1})


def test_modelfile_of_a_model_names_files_stops_and_sampling(synth_model, tmp_path):
    from engine.io.gguf_file import GGUFFile

    with GGUFFile(synth_model("llama")) as f:
        metadata = f.metadata
    sampling = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, seed=7)
    plan = plan_modelfile(metadata, sampling)
    assert plan.format.family == "ChatML"
    assert "<|im_end|>" in plan.stops
    merged = write_modelfile(plan, str(tmp_path / "run.merged.gguf"), merged=True, base="/m/base.gguf")
    text = Path(merged).read_text()
    assert "FROM ./run.merged.gguf\n" in text and "ADAPTER" not in text
    for line in ('PARAMETER stop "<|im_end|>"', "PARAMETER temperature 0.7", "PARAMETER top_k 20",
                 "PARAMETER top_p 0.9", "PARAMETER min_p 0.1"):  # fmt: skip
        assert line in text.splitlines()
    template = text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    messages = CONVERSATIONS["system and three turns"]
    assert gotemplate.render(template, messages) == ChatTemplate.from_metadata(metadata).render(
        messages, add_generation_prompt=True
    )
    adapter = write_modelfile(plan, str(tmp_path / "run.f16.gguf"), merged=False, base="/m/base.gguf")
    assert merged == str(tmp_path / "run.merged.Modelfile") and adapter == str(tmp_path / "run.f16.Modelfile")
    lines = Path(adapter).read_text().splitlines()
    assert "FROM /m/base.gguf" in lines and "ADAPTER ./run.f16.gguf" in lines
    assert "FROM ./run.merged.gguf" in Path(merged).read_text().splitlines()  # each export keeps its own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.f16.Modelfile", "run.merged.Modelfile"]


def _adapter_file(model_path: str, folder: Path) -> str:
    from engine.model.model import Model
    from engine.testing import random_adapter, write_adapter

    model = Model.load(model_path)
    return write_adapter(
        str(folder / "run.gguf"), "llama", random_adapter(model, ["blk.0.attn_q.weight"]), 8.0
    )


def test_cli_export_writes_modelfile_naming_the_files(synth_model, tmp_path, capsys):
    from engine.cli.main import main

    base = synth_model("llama")
    adapter = _adapter_file(base, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    merged = out / "run.merged.gguf"
    args = [
        "export",
        adapter,
        "--model",
        base,
        "--merge",
        "--out",
        str(merged),
        "--modelfile",
        "--temp",
        "0.3",
    ]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert f"wrote {out / 'run.merged.Modelfile'} " in said
    assert f"ollama create NAME -f {out / 'run.merged.Modelfile'}" in said
    lines = (out / "run.merged.Modelfile").read_text().splitlines()
    assert "FROM ./run.merged.gguf" in lines and "PARAMETER temperature 0.3" in lines
    assert 'PARAMETER stop "<|im_end|>"' in lines
    assert main(["export", adapter, "--model", base, "--out", str(out / "run.f16.gguf"), "--type", "f16",
                 "--modelfile"]) == 0  # fmt: skip
    assert f"ollama create NAME -f {out / 'run.f16.Modelfile'}" in capsys.readouterr().out
    lines = (out / "run.f16.Modelfile").read_text().splitlines()
    assert f"FROM {base}" in lines and "ADAPTER ./run.f16.gguf" in lines
    # the merged model's Modelfile is still its own: the second export did not write over it
    assert "FROM ./run.merged.gguf" in (out / "run.merged.Modelfile").read_text().splitlines()
    assert sorted(p.name for p in out.iterdir()) == [
        "run.f16.Modelfile", "run.f16.gguf", "run.merged.Modelfile", "run.merged.gguf",
    ]  # fmt: skip
    assert main(args) == 0  # the same export again replaces its own Modelfile, saying so first
    assert main([*args, "--check"]) == 0
    assert "replacing the one an earlier export of this file wrote" in capsys.readouterr().out


def test_untranslatable_template_is_said_by_the_check_and_the_export_still_works(tmp_path, capsys):
    from engine.cli.main import main
    from engine.testing import SynthSpec, write_model

    custom = {"tokenizer.chat_template": "{% for m in messages %}## {{ m.content }}\n{% endfor %}"}
    base = write_model(tmp_path / "custom.gguf", SynthSpec.for_arch("llama"), metadata=custom)
    adapter = _adapter_file(base, tmp_path)
    out = tmp_path / "run.f32.gguf"
    check = ["export", adapter, "--model", base, "--out", str(out), "--modelfile", "--check"]
    assert main(check) == 0
    assert "No Ollama Modelfile will be written" in capsys.readouterr().out
    assert main(["export", adapter, "--model", base, "--out", str(out), "--modelfile"]) == 0
    assert "no chat-template family" in capsys.readouterr().err
    assert out.exists() and not (tmp_path / "run.f32.Modelfile").exists()


def test_modelfile_that_would_replace_an_input_is_refused(synth_model, tmp_path):
    import shutil

    from engine.cli.main import main
    from engine.export.check import ExportRequest, check_export

    base = str(shutil.copy(synth_model("llama"), tmp_path / "run.f32.Modelfile"))  # a model named so
    adapter = _adapter_file(base, tmp_path)
    out = tmp_path / "run.f32.gguf"
    report = check_export(ExportRequest(adapter, str(out), base, modelfile=True))
    [name] = [i for i in report.items if i.label == "Output name"]
    assert not report.ok and not name.ok and "Modelfile" in name.detail and "base model" in name.detail
    assert main(["export", adapter, "--model", base, "--out", str(out), "--modelfile"]) == 2
    assert not out.exists()


def test_a_modelfile_of_another_file_is_never_written_over(synth_model, tmp_path, capsys):
    """A Modelfile already at the export's Modelfile path that builds another file (a hand-written
    one, a copied folder) or is no Modelfile at all: the check refuses, naming it, and nothing is
    written; without the Modelfile the export goes ahead."""
    from engine.cli.main import main
    from engine.export.check import ExportRequest, check_export

    base = synth_model("llama")
    adapter = _adapter_file(base, tmp_path)
    out = tmp_path / "run.merged.gguf"
    theirs = tmp_path / "run.merged.Modelfile"
    mine = "FROM ./other.gguf\nPARAMETER temperature 0.1\n"
    theirs.write_text(mine)
    report = check_export(ExportRequest(adapter, str(out), base, merge=True, modelfile=True))
    [name] = [i for i in report.items if i.label == "Output name"]
    assert not report.ok and "the Modelfile of another file (./other.gguf" in name.detail
    assert "it is kept" in name.detail
    args = ["export", adapter, "--model", base, "--merge", "--out", str(out), "--modelfile"]
    assert main(args) == 2
    assert "./other.gguf" in capsys.readouterr().err
    assert theirs.read_text() == mine and not out.exists()
    theirs.write_text("notes about my model\n")  # not a Modelfile either: kept
    assert main(args) == 2 and "is not an Ollama Modelfile" in capsys.readouterr().err
    assert main(args[:-1]) == 0 and out.exists()  # without --modelfile: the export alone
    assert theirs.read_text() == "notes about my model\n"
