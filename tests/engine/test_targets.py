"""Choosing LoRA targets and full-weight tensors by preset, pattern and layer range."""

from __future__ import annotations

import pytest

from engine.errors import ModelError
from engine.io.gguf_file import GGUFFile
from engine.model.targets import (
    TargetSpec,
    lora_candidates,
    parse_layers,
    select_full,
    select_targets,
    split_name,
)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from engine.testing import SynthSpec, write_model

    path = write_model(tmp_path_factory.mktemp("t") / "m.gguf", SynthSpec.for_arch("qwen2moe", L=4))
    return GGUFFile(path).tensors


def test_split_name():
    assert split_name("blk.12.ffn_up_exps.weight") == (12, "ffn_up_exps")
    assert split_name("blk.0.attn_q.bias") == (0, "attn_q.bias")
    assert split_name("output.weight") == (None, "output")
    assert split_name("token_embd.weight") == (None, "token_embd")


def test_candidates_say_why_a_tensor_cannot_take_lora(moe):
    c = {x.name: x for x in lora_candidates(moe)}
    assert c["blk.0.ffn_up_exps.weight"].lora_ok and c["blk.0.ffn_up_exps.weight"].shape == (4, 32, 64)
    assert c["blk.0.ffn_gate_inp.weight"].lora_ok
    assert not c["blk.0.attn_norm.weight"].lora_ok and "vector" in c["blk.0.attn_norm.weight"].reason
    assert not c["blk.0.attn_q.bias"].lora_ok and "bias" in c["blk.0.attn_q.bias"].reason


@pytest.mark.parametrize(
    "preset,kinds",
    [
        ("attention", {"attn_q", "attn_k", "attn_v", "attn_output"}),
        ("mlp", {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}),
        ("experts", {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}),
        ("router", {"ffn_gate_inp"}),
    ],
)
def test_presets(moe, preset, kinds):
    names = select_targets(moe, TargetSpec(preset=preset), 4)
    assert {split_name(n)[1] for n in names} == kinds
    assert len(names) == 4 * len(kinds)


def test_all_covers_every_matrix_inside_the_layers(moe):
    names = set(select_targets(moe, TargetSpec(preset="all"), 4))
    inside = {c.name for c in lora_candidates(moe) if c.lora_ok and c.layer is not None}
    assert names == inside


def test_patterns_layers_and_exclusions(moe):
    names = select_targets(
        moe,
        TargetSpec(
            preset="attention",
            patterns=("output", "blk.*.ffn_up_exps.weight"),
            layers="1-2",
            exclude=("attn_k",),
        ),
        4,
    )
    assert "output.weight" in names  # global tensors ignore the layer range
    assert "blk.1.ffn_up_exps.weight" in names and "blk.0.ffn_up_exps.weight" not in names
    assert not any("attn_k" in n for n in names)
    assert {split_name(n)[0] for n in names} == {None, 1, 2}


def test_errors_name_the_problem(moe):
    with pytest.raises(ModelError, match="matches no tensor"):
        select_targets(moe, TargetSpec(patterns=("attn_qkv",)), 4)
    with pytest.raises(ModelError, match="cannot take LoRA"):
        select_targets(moe, TargetSpec(preset="none", patterns=("attn_norm",)), 4)
    with pytest.raises(ModelError, match="unknown target preset"):
        select_targets(moe, TargetSpec(preset="everything"), 4)
    with pytest.raises(ModelError, match="no tensor selected"):
        select_targets(moe, TargetSpec(preset="none"), 4)
    with pytest.raises(ModelError, match="outside 0..3"):
        parse_layers("2-9", 4)
    with pytest.raises(ModelError, match="not N or A-B"):
        parse_layers("x", 4)


def test_parse_layers():
    assert parse_layers("0-2, 5", 8) == {0, 1, 2, 5}
    assert parse_layers(None, 8) is None and parse_layers("", 8) is None


def test_full_weight_selection(moe):
    names = select_full(moe, ("attn_norm", "ffn_gate_inp", "blk.3.ffn_down_exps.weight"), 4, layers="2-3")
    assert sorted(names) == [
        "blk.2.attn_norm.weight",
        "blk.2.ffn_gate_inp.weight",
        "blk.3.attn_norm.weight",
        "blk.3.ffn_down_exps.weight",
        "blk.3.ffn_gate_inp.weight",
    ]
    assert len(select_full(moe, ("all",), 4)) == len(moe)
    with pytest.raises(ModelError, match="full-weight pattern"):
        select_full(moe, ("nothing_here",), 4)


def test_lora_param_count_equals_what_training_allocates(tmp_path):
    from engine.model.model import Model
    from engine.model.targets import lora_param_count
    from engine.testing import SynthSpec, write_model
    from engine.train.train_model import Trainable

    model = Model.load(write_model(tmp_path / "m.gguf", SynthSpec.for_arch("qwen2moe")))
    names = select_targets(model.tensors, TargetSpec(preset="all", patterns=("output", "token_embd")), 2)
    assert lora_param_count(model.tensors, names, 8) == Trainable.init(model, names, rank=8).n_params
