"""Import of CSV, TSV, JSON arrays (Alpaca, ShareGPT, preference pairs) into JSON Lines samples."""

from __future__ import annotations

import json
import os

import pytest

from engine.cli.main import main
from engine.errors import DatasetError
from engine.train.convert import ColumnMap, convert_file, guess_map, parse_map, read_source
from engine.train.data import load_jsonl

CSV = (
    "Question,Answer,System,Score\n"
    "What is 2+2?,4,,1\n"
    '"Name a colour, please","Blue,\nor red",Be brief.,0.5\n'
    "Bad reward,x,,lots\n"
    "Short row\n"
    "Last?,Yes,,\n"
)


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _back(path):
    samples, problems = load_jsonl(path)
    assert not [p for p in problems if p.severity == "error"]
    return samples


def test_csv_round_trip_with_malformed_rows(tmp_path):
    src = _write(tmp_path / "qa.csv", CSV)
    before = src.read_bytes()
    out = tmp_path / "qa.jsonl"
    result = convert_file(src, out)
    assert result.mapping == ColumnMap(prompt="Question", response="Answer", system="System", reward="Score")
    assert src.read_bytes() == before  # the original is never modified
    samples = _back(out)
    assert [s.messages[-1]["content"] for s in samples] == ["4", "Blue,\nor red", "Yes"]
    assert samples[0].kind == "prompt" and samples[0].reward == 1.0
    assert samples[1].messages[0] == {"role": "system", "content": "Be brief."}  # a quoted newline kept
    assert samples[1].reward == 0.5 and samples[2].reward is None
    # problems by the line each record starts on (the quoted record spans lines 3 and 4)
    assert [(p.line, p.severity) for p in result.problems] == [(5, "error"), (6, "error")]
    assert "Score" in result.problems[0].message and "has 4" in result.problems[1].message
    assert result.rows == 5 and len(result.samples) == 3


def test_tsv_with_explicit_map(tmp_path):
    src = _write(tmp_path / "d.tsv", "q\ta\tgood\tbad\nhi\thello\tHello!\tgo away\n")
    out = tmp_path / "d.jsonl"
    convert_file(src, out, parse_map("prompt=q, chosen=good, rejected=bad"))
    (s,) = _back(out)
    assert s.kind == "preference" and s.messages[-1]["content"] == "Hello!" and s.rejected == "go away"


def test_alpaca_json_array(tmp_path):
    rows = [
        {"instruction": "Add", "input": "2 and 2", "output": "4"},
        {"instruction": "Say hi", "output": "hi"},
        {"instruction": "no output"},
        "not an object",
    ]
    text = "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"
    src = _write(tmp_path / "alpaca.json", text)
    out = tmp_path / "a.jsonl"
    result = convert_file(src, out)
    samples = _back(out)
    assert [s.messages[0]["content"] for s in samples] == ["Add\n\n2 and 2", "Say hi"]
    assert [(p.line, p.severity) for p in result.problems] == [(4, "error"), (5, "error")]


def test_sharegpt_json_and_jsonl(tmp_path):
    good = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    bad = {"conversations": [{"from": "robot", "value": "?"}]}
    src = _write(tmp_path / "sg.json", json.dumps([good, bad], indent=1))
    result = convert_file(src, tmp_path / "sg.jsonl")
    (s,) = _back(tmp_path / "sg.jsonl")
    assert s.messages == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
    assert len(result.problems) == 1 and "robot" in result.problems[0].message
    assert result.problems[0].line == 14  # the line where the second element begins
    src2 = _write(tmp_path / "sg2.jsonl", json.dumps(good) + "\n{broken\n" + json.dumps(bad) + "\n")
    result = convert_file(src2, tmp_path / "sg2.out.jsonl")
    assert [p.line for p in result.problems] == [2, 3] and len(result.samples) == 1


def test_preference_json_array(tmp_path):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a"}]
    src = _write(tmp_path / "pref.json", json.dumps(rows))
    result = convert_file(src, tmp_path / "pref.jsonl")
    (s,) = _back(tmp_path / "pref.jsonl")
    assert s.kind == "preference" and s.rejected == "b"
    assert len(result.problems) == 1 and "rejected" in result.problems[0].message


def test_refusals_write_nothing(tmp_path):
    src = _write(tmp_path / "qa.csv", CSV)
    with pytest.raises(DatasetError, match="being imported"):
        convert_file(src, src)
    os.link(src, tmp_path / "alias.jsonl")
    with pytest.raises(DatasetError, match="being imported"):
        convert_file(src, tmp_path / "alias.jsonl")
    assert src.read_text(encoding="utf-8") == CSV
    with pytest.raises(DatasetError, match="no column prompt=Q"):
        convert_file(src, tmp_path / "o.jsonl", parse_map("prompt=Q,response=Answer"))
    nothing = _write(tmp_path / "none.csv", "a,b\n1\n")
    with pytest.raises(DatasetError, match="which columns"):
        convert_file(nothing, tmp_path / "o.jsonl")
    with pytest.raises(DatasetError, match="not closed"):
        convert_file(_write(tmp_path / "open.json", '[{"text": "x"}'), tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()
    existing = _write(tmp_path / "keep.jsonl", '{"text": "old"}\n')
    with pytest.raises(DatasetError, match="no sample"):
        convert_file(_write(tmp_path / "bad.csv", "prompt,response\n1\n"), existing)
    assert existing.read_text(encoding="utf-8") == '{"text": "old"}\n'
    for bad in ("prompt", "role=x", "prompt=a,prompt=b"):
        with pytest.raises(DatasetError):
            parse_map(bad)
    with pytest.raises(DatasetError, match="both"):
        ColumnMap(prompt="a").check()


def test_guess_map():
    assert guess_map(["instruction", "input", "output"]) == ColumnMap()
    assert guess_map(["prompt", "chosen", "rejected"]) == ColumnMap(
        prompt="prompt", chosen="chosen", rejected="rejected"
    )
    assert guess_map(["Text"]) == ColumnMap(text="Text")
    assert guess_map(["x", "y"]) == ColumnMap()


def test_read_source_formats(tmp_path):
    assert read_source(_write(tmp_path / "d.txt", "a\tb\n1\t2\n")).format == "tsv"
    assert read_source(_write(tmp_path / "d2.txt", '[{"text": "x"}]')).format == "json"


def test_cli_convert(tmp_path, capsys):
    src = _write(tmp_path / "qa.csv", CSV)
    out = tmp_path / "qa.jsonl"
    assert main(["convert", str(src), "--out", str(out), "--map", "prompt=Question,response=Answer"]) == 0
    captured = capsys.readouterr()
    assert "4 samples from 5 CSV rows" in captured.out
    assert "line 6: error" in captured.err
    assert len(_back(out)) == 4 and _back(out)[0].reward is None  # reward not mapped
    assert main(["convert", str(src), "--out", str(src)]) == 2
    assert "being imported" in capsys.readouterr().err
    assert src.read_text(encoding="utf-8") == CSV
