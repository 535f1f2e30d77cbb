"""Reading GGUF files: metadata and tensors, and a clear ModelError for every kind of bad file."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from engine.errors import ExportError, ModelError
from engine.io.gguf_file import GGUFFile, dequantizable_types
from engine.io.gguf_write import write_gguf
from engine.io.quantize import quantizable_types, quantize
from engine.model.model import Model
from engine.model.summary import summarize
from engine.testing import SynthSpec, random_weights, write_model
from tests.conftest import GOLDEN_MODELS


def test_metadata_and_tensors_match_gguf_py_reader():
    path = GOLDEN_MODELS / "llama256-q4_k_m.gguf"
    ours = GGUFFile(path)
    ref = GGUFReader(path)
    for name, field in ref.fields.items():
        if name.startswith("GGUF."):
            continue
        want = field.contents()
        assert (
            ours.metadata[name] == pytest.approx(want)
            if isinstance(want, float)
            else ours.metadata[name] == want
        )
    assert len(ours.tensors) == len(ref.tensors)
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.qtype == t.tensor_type.name
        assert info.shape == tuple(reversed(t.shape.tolist()))
        np.testing.assert_array_equal(
            ours.load(t.name), dequantize(t.data, t.tensor_type).reshape(info.shape)
        )


@pytest.mark.parametrize("qtype", [q for q in quantizable_types() if q not in ("F32", "F16")])
def test_quantize_roundtrip_through_gguf_py_dequantize(qtype, rng):
    x = rng.standard_normal((4, 512)).astype(np.float32)
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8
    y = dequantize(raw, GGMLQuantizationType[qtype]).reshape(x.shape)
    rel = np.linalg.norm(y - x) / np.linalg.norm(x)
    # round-to-nearest error bounds per format (4-bit ~ 0.08, 5-bit ~ 0.04, 6-bit ~ 0.02, 8-bit ~ 0.005)
    bound = {"BF16": 0.004, "Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.05, "Q5_1": 0.05}.get(qtype, 0.1)
    assert rel < bound, f"{qtype}: relative error {rel:.4f} >= {bound}"


def test_quantize_unsupported_type_is_export_error(rng):
    with pytest.raises(ExportError, match="IQ2_XXS"):
        quantize(rng.standard_normal((1, 256)), "IQ2_XXS")


def test_write_then_read_keeps_metadata_types_and_values(tmp_path, rng):
    md = {
        "a.u32": 7,
        "a.neg": -3,
        "a.f": 0.5,
        "a.s": "héllo",
        "a.b": True,
        "a.list": [1, 2, 3],
        "a.strs": ["x", "▁y"],
        "a.floats": [0.25, -1.0],
    }
    t = rng.standard_normal((3, 32)).astype(np.float32)
    p = write_gguf(tmp_path / "m.gguf", "llama", md, {"w": (t, "F32"), "q": (t, "Q8_0")})
    f = GGUFFile(p)
    for k, v in md.items():
        assert f.metadata[k] == v
    assert f.metadata["general.architecture"] == "llama"
    assert f.metadata_types["a.neg"][0].name == "INT32"
    assert [t.name for t in f.metadata_types["a.strs"]] == ["ARRAY", "STRING"]
    assert [t.name for t in f.metadata_types["a.floats"]] == ["ARRAY", "FLOAT32"]
    assert f.metadata_types["a.f"][0].name == "FLOAT32"
    np.testing.assert_array_equal(f.load("w"), t)
    assert f.tensors["q"].qtype == "Q8_0" and f.tensors["q"].shape == (3, 32)


def test_failed_write_leaves_existing_file_untouched(tmp_path, rng):
    target = tmp_path / "keep.gguf"
    target.write_bytes(b"precious")
    bad = rng.standard_normal((2, 33)).astype(np.float32)  # 33 is not a multiple of Q8_0's 32
    with pytest.raises(ExportError):
        write_gguf(target, "llama", {}, {"w": (bad, "Q8_0")})
    assert target.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.gguf"]


def test_every_dequantizable_type_named():
    types = dequantizable_types()
    for t in (
        "F32",
        "F16",
        "BF16",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ4_NL",
        "IQ4_XS",
    ):
        assert t in types


# --- bad files -----------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ModelError, match="not a GGUF file") as err:
        GGUFFile(p)
    assert "starts with the bytes 50 4b 03 04" in str(err.value) and "b'" not in str(err.value)
    p.write_bytes(b"hello, not a model" + b"\0" * 100)
    with pytest.raises(ModelError, match='it starts with "hell"'):
        GGUFFile(p)


@pytest.mark.parametrize("keep", [10, 30, 200, 5000, -100])
def test_truncated_file_names_truncation(tmp_path, synth_model, keep):
    src = synth_model("llama")
    data = open(src, "rb").read()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(ModelError) as err:
        Model.load(p)
    msg = str(err.value)
    assert str(p) in msg
    assert "truncated" in msg or "too short" in msg


def test_corrupt_header_count(tmp_path, synth_model):
    data = bytearray(open(synth_model("llama"), "rb").read())
    data[8:16] = (2**40).to_bytes(8, "little")  # tensor count
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="corrupt"):
        GGUFFile(p)


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    spec = SynthSpec.for_arch("llama")
    p = write_model(tmp_path / "m.gguf", spec)
    f = GGUFFile(p)
    md = dict(f.metadata)
    md = {k.replace("llama.", "gemma2."): v for k, v in md.items()}
    w = random_weights(spec)
    write_gguf(tmp_path / "g.gguf", "gemma2", md, {n: (a, "F32") for n, a in w.items()})
    with pytest.raises(ModelError) as err:
        Model.load(tmp_path / "g.gguf")
    assert "'gemma2'" in str(err.value) and "qwen3moe" in str(err.value)


def test_missing_tensor_is_named(tmp_path):
    spec = SynthSpec.for_arch("qwen3")
    w = random_weights(spec)
    del w["blk.1.attn_k_norm.weight"]
    p = write_model(tmp_path / "m.gguf", spec, weights=w)
    with pytest.raises(ModelError, match=r"blk\.1\.attn_k_norm\.weight.*missing"):
        Model.load(p)


def test_wrong_shape_is_named(tmp_path):
    spec = SynthSpec.for_arch("llama")
    w = random_weights(spec)
    w["blk.0.attn_v.weight"] = w["blk.0.attn_v.weight"][:16]
    p = write_model(tmp_path / "m.gguf", spec, weights=w)
    with pytest.raises(ModelError, match=r"blk\.0\.attn_v\.weight.*shape \(16, 64\), expected \(32, 64\)"):
        Model.load(p)


def test_tensor_type_without_float_meaning_is_rejected(tmp_path):
    spec = SynthSpec.for_arch("llama")
    p = write_model(tmp_path / "m.gguf", spec)
    data = bytearray(open(p, "rb").read())
    # rewrite the type id of output_norm.weight (F32 = 0) to I32 (26), which has no float meaning
    name = b"output_norm.weight"
    at = data.index(name) + len(name)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    assert int.from_bytes(data[type_at : type_at + 4], "little") == 0
    data[type_at : type_at + 4] = int(GGMLQuantizationType.I32).to_bytes(4, "little")
    bad = tmp_path / "i32.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(
        ModelError, match="'output_norm.weight' cannot be read: type code 26 is I32, integers"
    ):
        Model.load(bad)


def test_adapter_file_is_not_a_model(tmp_path):
    shutil.copy(GOLDEN_MODELS / "llama.lora.gguf", tmp_path / "a.gguf")
    with pytest.raises(ModelError, match="adapter"):
        Model.load(tmp_path / "a.gguf")


def test_moe_arch_without_experts_is_rejected(tmp_path):
    spec = SynthSpec.for_arch("olmoe")
    p = write_model(tmp_path / "m.gguf", spec)
    f = GGUFFile(p)
    meta = {k: v for k, v in f.metadata.items() if k != "olmoe.expert_count"}
    w = {n: (f.load(n), "F32") for n in f.tensors}
    write_gguf(tmp_path / "n.gguf", "olmoe", meta, w)
    with pytest.raises(ModelError, match="expert_count"):
        Model.load(tmp_path / "n.gguf")


def test_summary_of_quantized_moe_model(tmp_path):
    spec = SynthSpec.for_arch("qwen2moe", qtype="Q8_0")
    p = write_model(tmp_path / "m.gguf", spec)
    s = summarize(p)
    assert s.config.arch == "qwen2moe" and s.config.E == 4 and s.config.K == 2 and s.config.F_shexp == 64
    kinds = {k.kind: k for k in s.kinds}
    assert kinds["ffn_up_exps.weight"].count == spec.L
    assert kinds["ffn_up_exps.weight"].types == {"Q8_0": spec.L}
    assert kinds["ffn_up_exps.weight"].shape == (4, 32, 64)
    assert kinds["attn_norm.weight"].types == {"F32": spec.L}
    assert s.file_type == "Q8_0"
    assert s.n_params == sum(int(np.prod(a.shape)) for a in random_weights(spec).values())
    assert s.has_chat_template and s.tokenizer_model == "llama"


def test_random_header_corruption_only_ever_raises_model_error(tmp_path):
    """Flip bytes in the header and tensor directory of a real model: load, summary and tokenizer either
    work or raise an EngineError subclass; nothing else escapes (400 corrupted files)."""
    from engine.errors import EngineError
    from engine.text.tokenizer import Tokenizer

    data = (GOLDEN_MODELS / "qwen3moe.gguf").read_bytes()
    header_end = 40000  # metadata (vocabulary) and tensor directory of this file
    rng = np.random.default_rng(0)
    path = tmp_path / "fuzz.gguf"
    for _ in range(400):
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(4, header_end))] = int(rng.integers(0, 256))
        path.write_bytes(bytes(b))
        for load in (Model.load, summarize, Tokenizer.from_gguf):
            try:
                load(path)
            except EngineError:
                pass


def test_dimension_overflow_is_caught(tmp_path, synth_model):
    data = bytearray(open(synth_model("llama"), "rb").read())
    name = b"output_norm.weight"
    at = data.index(name) + len(name) + 4  # first dimension of the tensor
    data[at : at + 8] = (2**62 + 2**61).to_bytes(8, "little")
    p = tmp_path / "huge.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="truncated"):
        GGUFFile(p)


def test_written_files_get_normal_permissions(tmp_path):
    import os

    p = write_gguf(tmp_path / "m.gguf", "llama", {}, {"w": (np.zeros((2, 32), np.float32), "F32")})
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(p).st_mode & 0o777 == 0o666 & ~umask
    os.chmod(p, 0o640)
    write_gguf(p, "llama", {}, {"w": (np.ones((2, 32), np.float32), "F32")})
    assert os.stat(p).st_mode & 0o777 == 0o640  # replacing a file keeps its mode


def test_human_sizes_and_counts():
    from engine import human_bytes, human_count

    assert human_bytes(512) == "512 B" and human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"
    assert human_count(999) == "999" and human_count(77_824) == "77.82 K"
    assert human_count(494_032_768, exact=True) == "494,032,768 (494.03 M)"
