"""`tune-engine` on the golden models: each subcommand's output, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from engine.cli.main import main
from tests.conftest import DATA, GOLDEN_MODELS, golden_cases

MODELS = sorted({c["model_file"] for c in golden_cases()})


@pytest.mark.parametrize("model", MODELS)
def test_inspect_every_golden_model(model, capsys):
    assert main(["inspect", str(GOLDEN_MODELS / model)]) == 0
    out = capsys.readouterr().out
    case = next(c for c in golden_cases() if c["model_file"] == model)
    hp = case["hparams"]
    assert f"architecture  {case['arch']}" in out
    assert f"layers        {hp['n_layer']}" in out
    assert f"{hp['n_head']} query, {hp['n_head_kv']} key/value" in out
    assert "blk" not in out and "attn_q.weight" in out
    assert main(["inspect", str(GOLDEN_MODELS / model), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["L"] == hp["n_layer"] and info["vocab_size"] == hp["n_vocab"]
    if "n_expert" in hp:
        assert info["config"]["E"] == hp["n_expert"] and "experts" in out


def test_inspect_reports_quant_types(capsys):
    main(["inspect", str(GOLDEN_MODELS / "llama256-q4_k_m.gguf")])
    out = capsys.readouterr().out
    assert "Q4_K" in out and "Q6_K" in out


@pytest.mark.parametrize("model", MODELS)
def test_tokenize_every_golden_model(model, capsys):
    assert main(["tokenize", str(GOLDEN_MODELS / model), "--text", "hello world"]) == 0
    ids = [int(t) for t in capsys.readouterr().out.split()]
    assert ids[0] == 1 and len(ids) >= 2  # BOS, then the text
    assert main(["tokenize", str(GOLDEN_MODELS / model), "--text", "hello world", "--no-bos"]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == ids[1:]


def test_tokenize_matches_llama_cpp_suite(tmp_path, capsys):
    vocab = DATA / "vocab" / "ggml-vocab-llama-bpe.gguf"
    text = "Hello world"
    expected = None
    cases = (
        (DATA / "vocab" / "ggml-vocab-llama-bpe.gguf.inp")
        .read_text(encoding="utf-8")
        .split("\n__ggml_vocab_test__\n")
    )
    outs = (DATA / "vocab" / "ggml-vocab-llama-bpe.gguf.out").read_text(encoding="utf-8").split("\n")
    for case, ids in zip(cases, outs, strict=False):
        if case == text:
            expected = ids.strip()
    assert expected, "the suite has a 'Hello world' case"
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")
    assert main(["tokenize", str(vocab), "--file", str(f), "--no-bos"]) == 0
    assert capsys.readouterr().out.strip() == expected


@pytest.mark.parametrize(
    "case",
    [c for c in golden_cases() if c["case"] in ("llama.lora.scale0.5", "qwen3moe.lora", "llama256-q8_0")],
    ids=lambda c: c["case"],
)
def test_logits_every_position_match_llama_cpp(case, tmp_path, capsys):
    z = np.load(GOLDEN_MODELS / case["cases_file"])
    tokens = " ".join(str(t) for t in z["tokens_2"])
    out = tmp_path / "l.npy"
    args = ["logits", str(GOLDEN_MODELS / case["model_file"]), "--tokens", tokens, "--out", str(out)]
    if case.get("adapter_file"):
        args += [
            "--lora",
            str(GOLDEN_MODELS / case["adapter_file"]),
            "--lora-scale",
            str(case["adapter"]["scale"]),
        ]
    assert main(args) == 0
    logits = np.load(out)
    assert logits.dtype == np.float32 and logits.shape == z["logits_2"].shape
    assert np.abs(logits - z["logits_2"]).max() <= case["tolerance"]["logits_max_abs"]


@pytest.mark.parametrize("model", MODELS)
def test_generate_on_every_golden_model(model, capsys):
    assert main(["generate", str(GOLDEN_MODELS / model), "--prompt", "hello", "-n", "6", "--temp", "0"]) == 0
    greedy = capsys.readouterr().out
    assert main(["generate", str(GOLDEN_MODELS / model), "--prompt", "hello", "-n", "6", "--temp", "0"]) == 0
    assert capsys.readouterr().out == greedy
    assert (
        main(
            [
                "generate",
                str(GOLDEN_MODELS / model),
                "--prompt",
                "hello",
                "-n",
                "6",
                "--seed",
                "1",
                "--samples",
                "3",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("--- sample") == 3


def test_generate_chat_with_adapter(synth_model, capsys):
    model = str(GOLDEN_MODELS / "qwen3moe.gguf")
    assert (
        main(
            [
                "generate",
                model,
                "--prompt",
                "hi",
                "--chat",
                "-n",
                "4",
                "--temp",
                "0",
                "--lora",
                str(GOLDEN_MODELS / "qwen3moe.lora.gguf"),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() != ""


def test_chat_template_renders_and_template_file_overrides(synth_model, tmp_path, capsys):
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    model = synth_model("llama")
    assert main(["chat-template", model, "--messages", str(messages), "--add-generation-prompt"]) == 0
    assert capsys.readouterr().out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    assert main(["chat-template", model, "--messages", str(messages), "--template-file", str(tpl)]) == 0
    assert capsys.readouterr().out == "[user] Hi\n"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "command",
    [
        ["inspect"],
        ["tokenize", "--text", "x"],
        ["logits", "--tokens", "1 2", "--out", "/tmp/never.npy"],
        ["generate", "--prompt", "x"],
    ],
)
def test_bad_file_gives_one_line_and_exit_2(command, tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes((GOLDEN_MODELS / "llama.gguf").read_bytes()[:5000])
    result = _run(command[0], str(bad), *command[1:])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "truncated" in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_inputs_are_one_line_errors(tmp_path):
    model = str(GOLDEN_MODELS / "llama.gguf")
    r = _run("logits", model, "--tokens", "1 two", "--out", str(tmp_path / "x.npy"))
    assert r.returncode == 2 and "integers" in r.stderr
    r = _run("logits", model, "--tokens", "1 99999", "--out", str(tmp_path / "x.npy"))
    assert r.returncode == 2 and "out of range" in r.stderr
    r = _run("logits", model, "--tokens", "1 2", "--lora", model, "--out", str(tmp_path / "x.npy"))
    assert r.returncode == 2 and "not a LoRA adapter" in r.stderr
    r = _run("chat-template", model, "--messages", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "cannot be read" in r.stderr
    assert not (tmp_path / "x.npy").exists()


def test_train_norms_export_round_trip(tmp_path, capsys):
    from engine.model.lora import LoraAdapter
    from engine.model.model import Model
    from engine.testing import SynthSpec, write_model

    model_path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("qwen2moe", seed=4))
    data = DATA / "datasets" / "sample_data.jsonl"
    out = tmp_path / "a.gguf"
    events = tmp_path / "ev.jsonl"
    args = ["train", model_path, str(data), "--out", str(out), "--preset", "all", "--targets", "output",
            "--steps", "4", "--ctx", "256", "--batch", "2", "--lr", "5e-3", "--checkpoint-every", "2",
            "--events", str(events)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr()
    assert "finished after 4 steps" in printed.out and "step 4/4" in printed.err
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [r["event"] for r in rows]
    assert kinds[0] == "Started" and kinds[-1] == "Finished" and kinds.count("Step") == 4
    assert kinds.count("Checkpoint") == 2 and "ExpertUsage" in kinds and "LoraNorms" in kinds
    model = Model.load(model_path)
    adapter = LoraAdapter.load(out, model)
    assert "output.weight" in adapter.pairs and "blk.1.ffn_up_exps.weight" in adapter.pairs
    assert adapter.metadata["training.steps"] == 4
    assert main(["norms", str(out), "--model", model_path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["tensors"]) == len(adapter.pairs)
    merged = tmp_path / "merged.gguf"
    assert main(["export", str(out), "--model", model_path, "--merge", "--out", str(merged)]) == 0
    tokens = np.array([1, 270, 280, 290])
    want = model.forward(tokens, lora=adapter.terms())
    np.testing.assert_allclose(Model.load(merged).forward(tokens), want, atol=1e-4)


def test_train_failure_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    r = _run(
        "train",
        str(GOLDEN_MODELS / "llama.gguf"),
        str(bad),
        "--out",
        str(tmp_path / "a.gguf"),
        "--steps",
        "1",
    )
    assert r.returncode == 2 and "no usable sample" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a.gguf").exists()


def test_train_resume_without_options_continues_the_checkpoints_run(tmp_path, capsys, chats):
    """`train MODEL DATA --out B --resume CKPT` with no other option takes the checkpoint's settings and
    runs to its planned step: the adapter equals the uninterrupted run's; an option that changes the
    trajectory is refused unless accepted, and so is a checkpoint that has nothing left to train."""
    from engine.model.lora import LoraAdapter
    from engine.model.model import Model
    from engine.testing import SynthSpec, write_model

    model_path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", seed=3))
    first = tmp_path / "a.gguf"
    args = ["train", model_path, chats, "--out", str(first), "--preset", "all", "--rank", "4", "--steps", "8",
            "--ctx", "64", "--batch", "2", "--lr", "3e-3", "--warmup", "2", "--seed", "5",
            "--checkpoint-every", "3"]  # fmt: skip
    assert main(args) == 0
    ckpts = tmp_path / "a.checkpoints"
    assert sorted(p.name for p in ckpts.glob("ckpt-*")) == ["ckpt-000006", "ckpt-000008"]
    capsys.readouterr()
    resumed = tmp_path / "b.gguf"
    argv = ["train", model_path, chats, "--out", str(resumed), "--resume", str(ckpts / "ckpt-000006")]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "resuming" in printed.err and "at step 6 of 8: 8 steps, context 64, batch 2" in printed.err
    assert "step 8/8" in printed.err and "finished after 8 steps" in printed.out
    model = Model.load(model_path)
    a, b = LoraAdapter.load(first, model), LoraAdapter.load(resumed, model)
    for name, (A, B) in a.pairs.items():
        np.testing.assert_array_equal(b.pairs[name][0], A)
        np.testing.assert_array_equal(b.pairs[name][1], B)
    # a changed context is a new trajectory: refused, naming it, unless accepted
    changed = [*argv[:-2], "--resume", str(ckpts / "ckpt-000006"), "--ctx", "128"]
    assert main(changed) == 2
    assert "context 64 -> 128" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text(open(chats).read().replace("plus", "and"))
    assert main(["train", model_path, str(other), "--out", str(resumed), "--resume", str(ckpts)]) == 2
    err = capsys.readouterr().err
    assert "dataset" in err and "--accept-changes" in err
    assert main([*changed, "--accept-changes"]) == 0
    # the newest checkpoint is the run's end: nothing is left to train
    assert main(["train", model_path, chats, "--out", str(resumed), "--resume", str(ckpts)]) == 2
    assert "nothing is left to train" in capsys.readouterr().err
