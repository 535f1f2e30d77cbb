"""Sample answers during training: greedy answers to a few prompts every N steps, with the
adapter of that step, as SampleAnswers events (kept in the events file)."""

from __future__ import annotations

from engine.model.lora import LoraAdapter
from engine.model.model import Model
from engine.model.targets import TargetSpec
from engine.train import events as ev
from engine.train.trainer import TrainConfig, Trainer
from tests.conftest import write_chats
from tests.engine.test_trainer import CHATS, answer, models, run  # noqa: F401 - models: fixture

PROMPTS = ("hello", "who are you")


def test_sample_answers_at_the_planned_steps_with_the_adapter_of_that_step(models, tmp_path):  # noqa: F811
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    out = tmp_path / "adapter.gguf"
    cfg = TrainConfig(
        targets=TargetSpec(preset="all"), rank=8, alpha=16, lr=1e-2, steps=30, schedule="constant",
        n_ctx=64, batch_size=3, out=str(out), seed=1,
        sample_prompts=PROMPTS, sample_every=10, sample_tokens=12,
    )  # fmt: skip
    got, result = run(Trainer(models["llama"], data, cfg))
    assert isinstance(result, ev.Finished)
    table = [e for e in got if isinstance(e, ev.SampleAnswers)]
    assert [e.step for e in table] == [10, 20, 30]
    assert all(e.prompts == list(PROMPTS) and len(e.answers) == 2 for e in table)
    # each row is emitted after its step's Step event
    order = [(type(e).__name__, e.step) for e in got if isinstance(e, (ev.Step, ev.SampleAnswers))]
    assert order.index(("SampleAnswers", 10)) == order.index(("Step", 10)) + 1
    # the last row is what the written adapter answers (greedy: the same every time)
    model = Model.load(models["llama"])
    terms = LoraAdapter.load(out, model).terms()
    full = [answer(model, terms, p) for p in PROMPTS]  # up to 128 tokens; the table's are 12
    assert all(a and f.startswith(a) for a, f in zip(table[-1].answers, full, strict=True)), (table[-1], full)
    base = [answer(model, None, p) for p in PROMPTS]
    assert table[-1].answers != base  # the answers moved away from the base model's during the run
    # kept in the events file: the JSON line reads back equal
    back = ev.event_from_json(ev.event_to_json(table[1]))
    assert back == table[1]


def test_no_sample_answers_unless_asked(models, tmp_path):  # noqa: F811
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    cfg = TrainConfig(targets=TargetSpec(preset="all"), steps=2, n_ctx=64, batch_size=3, sample_every=1)
    got, _ = run(Trainer(models["llama"], data, cfg))
    assert not [e for e in got if isinstance(e, ev.SampleAnswers)]


def test_cli_prints_and_keeps_sample_answers(models, tmp_path, capsys):  # noqa: F811
    from engine.cli.main import main

    data = write_chats(tmp_path / "d.jsonl", CHATS)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n\nwho are you\n", encoding="utf-8")
    events = tmp_path / "ev.jsonl"
    args = ["train", models["llama"], data, "--out", str(tmp_path / "a.gguf"), "--steps", "4", "--ctx", "64",
            "--sample-prompts", str(prompts), "--sample-every", "2", "--events", str(events)]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "sample at step 2: 'hello' -> " in err and "sample at step 4: 'who are you' -> " in err
    rows = [ev.event_from_json(line) for line in events.read_text(encoding="utf-8").splitlines()]
    table = [e for e in rows if isinstance(e, ev.SampleAnswers)]
    assert [(e.step, e.prompts) for e in table] == [
        (2, ["hello", "who are you"]),
        (4, ["hello", "who are you"]),
    ]


def _mixed_rows(path):
    """12 samples with distinct prompts q0..q11: q4 is a text sample (no prompt), q7 has a system
    turn, q9 is a prompt/response sample."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for i in range(12):
            turns = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
            row = {"messages": turns}
            if i == 4:
                row = {"text": f"q{i} plain text"}
            elif i == 7:
                row = {"messages": [{"role": "system", "content": "be brief"}, *turns]}
            elif i == 9:
                row = {"prompt": f"q{i}", "response": f"a{i}"}
            f.write(json.dumps(row) + "\n")
    return str(path)


def test_prompts_from_the_validation_split_first_in_file_order(models, tmp_path):  # noqa: F811
    import numpy as np

    from engine.train.val_split import split_groups

    cfg = TrainConfig(
        targets=TargetSpec(preset="all"), steps=2, n_ctx=64, batch_size=2, val_split=0.5, seed=0,
        sample_prompts=("typed",), sample_every=2, sample_tokens=4, sample_from_validation=3,
    )  # fmt: skip
    trainer = Trainer(models["llama"], _mixed_rows(tmp_path / "d.jsonl"), cfg)
    got, result = run(trainer)
    assert isinstance(result, ev.Finished)
    _, val = split_groups(trainer.prepared.samples["group"], cfg.val_split, cfg.seed)
    held_out = [f"q{r}" for r in np.sort(val) if r != 4]  # the text sample has no prompt to answer
    assert len(held_out) >= 3 and set(held_out) != {f"q{i}" for i in range(12) if i != 4}
    (table,) = [e for e in got if isinstance(e, ev.SampleAnswers)]
    assert table.prompts == ["typed", *held_out[:3]] and all(table.answers)  # typed ones first
    assert held_out[:3] == ["q2", "q5", "q7"]  # (seed 0 holds out 2, 4, 5, 7, 9, 11: q4 is text)
    # a held-out conversation is asked with its system turn, up to its answer
    assert trainer.validation_prompts[2] == (
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "q7"},
    )  # fmt: skip
    assert not [e for e in got if isinstance(e, ev.RunWarning) and "validation" in e.message]


def test_validation_prompts_asked_for_and_none_there_is_said(models, tmp_path):  # noqa: F811
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    cfg = TrainConfig(targets=TargetSpec(preset="all"), steps=2, n_ctx=64, batch_size=3, sample_every=1,
                      sample_tokens=2, sample_from_validation=2)  # fmt: skip
    got, result = run(Trainer(models["llama"], data, cfg))
    assert isinstance(result, ev.Finished) and not [e for e in got if isinstance(e, ev.SampleAnswers)]
    (warning,) = [e for e in got if isinstance(e, ev.RunWarning)]
    assert "no validation split" in warning.message


def test_cli_samples_from_the_validation_split(models, tmp_path, capsys):  # noqa: F811
    from engine.cli.main import main

    data = _mixed_rows(tmp_path / "d.jsonl")
    args = ["train", models["llama"], data, "--out", str(tmp_path / "a.gguf"), "--steps", "2", "--ctx", "64",
            "--sample-from-validation", "2", "--sample-every", "2"]  # fmt: skip
    assert main(args) == 2  # no --val-split: refused, saying what to give
    assert "--val-split" in capsys.readouterr().err
    assert main([*args, "--val-split", "0.5", "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("sample at step 2: 'q")]) == 2


def test_validation_prompts_of_preference_pairs_and_of_a_file(tmp_path):
    """Rows of a pair-prepared table are two per pair (chosen, rejected): row 2k is pair k's prompt;
    a file is read again only up to the rows asked for; a prompt asked twice comes once."""
    import json

    import numpy as np

    from engine.train.data import parse_sample
    from engine.train.samples import validation_prompts

    lines = [{"prompt": f"p{k}", "chosen": "yes", "rejected": "no"} for k in range(4)]
    lines.insert(1, {"text": "not a pair"})  # left out of pair rows: the pairs' rows do not count it
    samples = [parse_sample(obj, i + 1)[0] for i, obj in enumerate(lines)]
    got = validation_prompts(samples, np.array([2, 6]), 5, pairs=True)
    assert [c[-1]["content"] for c in got] == ["p1", "p3"]
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "same", "response": "a"}, {"prompt": "same", "response": "b"}, {"text": "t"},
            {"messages": [{"role": "assistant", "content": "an answer with no question"}]},
            {"prompt": "other", "response": "c"}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = validation_prompts(str(path), np.arange(5), 2)
    assert got == [({"role": "user", "content": "same"},), ({"role": "user", "content": "other"},)]
    assert validation_prompts(str(path), np.arange(0), 2) == []
