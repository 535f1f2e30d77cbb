"""`dequant_ref`, the specification of dequantization, and the host side of `dequant` (NumPy only)."""

from __future__ import annotations

import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.io.gguf_file import GGUFFile
from engine.kernels import dequant as dq
from tests.kernels.dequant_cases import random_raw

HOST_ONLY = ("IQ2_XXS", "IQ3_S", "TQ2_0")  # no kernel: dequantized once on the host


def write_gguf(path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (qtype, raw) in tensors.items():
        q = GGMLQuantizationType[qtype]
        w.add_tensor(name, raw, raw_dtype=None if qtype in ("F32", "F16") else q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random IQ/TQ blocks hold NaN and inf scales
def test_ref_reads_gguf_file_raw_layout(tmp_path, fresh_rng):
    """dequant_ref on GGUFFile.raw() gives GGUFFile.load()'s values, bit for bit, in its shape."""
    tensors = {}
    for qtype in dq.GPU_TYPES:
        qk, _ = dq.block_geometry(qtype)
        tensors[f"w.{qtype}"] = (qtype, random_raw(qtype, (3, 5, 2 * max(qk, 32)), fresh_rng))
    tensors["w.IQ2_XXS"] = ("IQ2_XXS", fresh_rng.integers(0, 256, (3, 5, 2 * 66), dtype=np.uint8))
    tensors["w.IQ3_S"] = ("IQ3_S", fresh_rng.integers(0, 256, (3, 5, 2 * 110), dtype=np.uint8))
    tensors["w.TQ2_0"] = ("TQ2_0", fresh_rng.integers(0, 256, (3, 5, 2 * 66), dtype=np.uint8))
    path = tmp_path / "types.gguf"
    write_gguf(path, tensors)
    with GGUFFile(path) as f:
        for name, (qtype, _) in tensors.items():
            info = f.tensors[name]
            assert info.qtype == qtype
            ref = dq.dequant_ref(f.raw(name), qtype)
            loaded = f.load(name)
            assert ref.dtype == np.float32 and ref.shape == info.shape, (qtype, ref.shape, info.shape)
            np.testing.assert_array_equal(ref.view(np.uint32), loaded.view(np.uint32), err_msg=qtype)
            picked = dq.dequant_ref(f.raw(name), qtype, rows=[2, 0, 2])
            np.testing.assert_array_equal(picked.view(np.uint32), loaded[[2, 0, 2]].view(np.uint32))


@pytest.mark.parametrize("qtype", dq.GPU_TYPES)
def test_ref_is_gguf_quants(qtype, fresh_rng):
    raw = random_raw(qtype, (4, 512), fresh_rng)
    ref = dq.dequant_ref(raw, qtype)
    expect = gguf.quants.dequantize(raw, GGMLQuantizationType[qtype])
    assert ref.dtype == np.float32 and ref.shape == (4, 512)
    np.testing.assert_array_equal(ref.view(np.uint32), np.asarray(expect, np.float32).view(np.uint32))
    assert not np.isnan(ref).any() and (ref != 0).any()
    assert ref.flags.writeable


def test_codebooks_are_gguf_quants():
    assert dq.IQ4_NL_KVALUES == tuple(gguf.quants.IQ4_NL.kvalues)
    assert dq.MXFP4_KVALUES == tuple(gguf.quants.MXFP4.kvalues)


def test_every_gpu_type_has_both_kernels():
    for qtype in dq.GPU_TYPES:
        for dtype in dq.OUT_DTYPES:
            assert dq.kernel_name(qtype, dtype) in dq.SOURCE.kernels
    assert len(dq.SOURCE.kernels) == len(set(dq.SOURCE.kernels)) == 2 * len(dq.GPU_TYPES)
    assert "@" not in dq.SOURCE.code, "a template placeholder was left in the CUDA source"


def test_plan_shapes():
    p = dq.dequant_plan((4, 10, 144 * 2), "Q4_K")
    assert p.shape == (4, 10, 512) and (p.n_src, p.n_slices) == (1, 1)
    assert p.slice_values == 4 * 10 * 512 and p.tiles == -(-4 * 10 * 512 // dq.TILE_VALUES)
    g = dq.dequant_plan((4, 10, 144 * 2), "Q4_K", n_rows=3)
    assert g.shape == (3, 10, 512) and (g.n_src, g.n_slices, g.slice_values) == (4, 3, 5120)
    assert g.src_slice_bytes == 10 * 288 and g.grid == 3 * g.tiles
    assert dq.dequant_plan((7, 14), "F16").shape == (7, 7)
    with pytest.raises(ValueError, match="whole 18-byte blocks"):
        dq.dequant_plan((4, 20), "Q4_0")
    with pytest.raises(ValueError, match="first axis"):
        dq.dequant_plan((36,), "Q4_0", n_rows=2)


def test_dequant_rejects_what_it_cannot_do():
    raw = np.zeros((2, 18), np.uint8)
    with pytest.raises(TypeError, match="dequant_ref"):
        dq.dequant(raw, "Q4_0")
    with pytest.raises(ValueError, match="IQ2_XXS.*host"):
        dq.dequant(raw, "IQ2_XXS")
    with pytest.raises(ValueError, match="float16"):
        dq.dequant(raw, "Q4_0", dtype="float16")
    with pytest.raises(ValueError, match="unknown ggml type 'Q9_9'"):
        dq.dequant_ref(raw, "Q9_9")


def test_engine_kernels_imports_without_cupy():
    code = (
        "import sys, engine.kernels, engine.kernels.dequant, engine.kernels.nvrtc as c; "
        "c.all_sources(); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
