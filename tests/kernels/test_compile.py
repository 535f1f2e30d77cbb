"""Every CUDA kernel source compiles with NVRTC for sm_90, and for sm_80 too where its code (headers
inlined) depends on the architecture (`__CUDA_ARCH__`), without a warning: a source that does not
branch on it compiles the same C++ for both (each compilation takes 1-2.5 s of the suite).

The sources are the .cu files of engine/kernels/cuda, as the op modules declare them (`SOURCES`,
read with `KernelSource.from_file`); every file there belongs to one declared source.

Needs no GPU and runs on every machine, CI included: NVRTC and the CUDA headers come from the
`nvidia-cuda-nvrtc` and `nvidia-cuda-runtime` wheels of the test extra. Where they are missing on a
platform that has them (Linux, Windows), the tests fail rather than skip: a kernel that does not
compile must never wait for a GPU session to be found out.
"""

from __future__ import annotations

from importlib import resources

import pytest

from engine.kernels import nvrtc as nv
from engine.kernels.nvrtc import CudaToolkitError, KernelCompileError, KernelSource

ARCHS = ("sm_80", "sm_90")  # Ampere (A100, RTX 30) and Hopper (H100, H200)


@pytest.fixture(scope="module")
def nvrtc() -> tuple[int, int]:
    try:
        return nv.nvrtc_version()
    except CudaToolkitError as exc:
        if not nv.platform_has_nvrtc_wheels():
            pytest.skip(f"NVIDIA ships no NVRTC for this platform: {exc}")
        pytest.fail(f"{exc}\nNVRTC comes with the test extra: pip install -e '.[test]'")


def test_registry_lists_the_kernel_modules():
    sources = nv.all_sources()
    names = [s.name for s in sources]
    assert "dequant" in names
    assert len(names) == len(set(names))
    for s in sources:
        assert s.kernels and all(k.isidentifier() for k in s.kernels), s.name


def test_every_cu_file_is_a_declared_source():
    folder = resources.files("engine.kernels") / "cuda"
    files = sorted(f.name for f in folder.iterdir() if f.name.endswith(".cu"))
    assert files == sorted(f"{s.name}.cu" for s in nv.all_sources())


def test_local_headers_are_inlined_between_line_directives():
    folder = resources.files("engine.kernels") / "cuda"
    lines = (folder / "norm.cu").read_text().splitlines()
    at = lines.index('#include "common.cuh"') + 1  # 1-based line of the include
    code = nv.read_cuda_source("norm.cu")
    assert '#include "common.cuh"' not in code.splitlines()
    header = (folder / "common.cuh").read_text()
    assert f'#line 1 "common.cuh"\n{header}#line {at + 1} "norm.cu"\n{lines[at]}\n' in code
    assert code.count(header) == 1


def _targets() -> list:
    return [
        pytest.param(source, arch, id=f"{source.name}-{arch}")
        for source in nv.all_sources()
        for arch in ARCHS
        if arch == "sm_90" or "__CUDA_ARCH__" in source.code
    ]


@pytest.mark.parametrize("source,arch", _targets())
def test_source_compiles_without_warnings(nvrtc, source: KernelSource, arch: str):
    cubin = nv.compile_source(source, arch)  # raises with NVRTC's log on any error or warning
    assert cubin[:4] == b"\x7fELF", f"{source.name} for {arch}: NVRTC returned no cubin"
    missing = [k for k in source.kernels if b"\0" + k.encode() + b"\0" not in cubin]
    assert not missing, f"{source.name} for {arch}: kernels declared but not in the cubin: {missing}"


def test_ptx_target_gives_ptx(nvrtc):
    ptx = nv.compile_ptx_or_cubin(
        'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "k", "compute_90"
    )
    assert b".entry k" in ptx and b".target sm_90" in ptx


def test_compile_error_carries_the_log(nvrtc):
    with pytest.raises(KernelCompileError, match="does not compile") as err:
        nv.compile_ptx_or_cubin('extern "C" __global__ void k(float* x) { x[0] = y; }', "broken", "sm_90")
    assert '"y" is undefined' in err.value.log and "broken" in str(err.value)


def test_warning_is_an_error(nvrtc):
    code = 'extern "C" __global__ void k(float* x) { int unused = 3; x[0] = 1.0f; }'
    with pytest.raises(KernelCompileError, match="with warnings") as err:
        nv.compile_ptx_or_cubin(code, "warns", "sm_90")
    assert "warning" in err.value.log
    assert nv.compile_ptx_or_cubin(code, "warns", "sm_90", warnings_as_errors=False)[:4] == b"\x7fELF"


def test_bad_arch_is_refused():
    with pytest.raises(ValueError, match="sm_XX"):
        nv.compile_ptx_or_cubin("", "x", "hopper")


def test_device_target():
    archs = (75, 80, 86, 89, 90, 100, 120)
    assert nv.device_target(90, archs) == "sm_90"
    assert nv.device_target(121, archs) == "compute_120"  # newer than NVRTC: PTX for the driver
    with pytest.raises(CudaToolkitError, match="none at or below"):
        nv.device_target(70, archs)
