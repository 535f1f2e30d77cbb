#!/usr/bin/env bash
# Issue 30 on the device (one H100 or H200), by parts:
#
#     bash bench/device_30.sh [checks] [timings]      # default: both, checks first (about 4 minutes)
#
# checks (about 60 s; at the same time, each capped at CHECK_S seconds, default 55):
#   - the MoE GPU tests (tests/kernels/test_moe_parity.py, 8 workers): every parity case on every route
#     (float32 stacks on v1; bf16 stacks on v1, the v2 tensor-core kernels "tc" and the v2 cuBLAS tiles
#     "cublas"; gpt-oss's biases and clamped SwiGLU and V3's routing among them), each run twice and
#     compared bit for bit; a layer captured as a CUDA graph and replayed on new inputs (tc, cublas); the
#     twins through engine.model.ops; no host synchronisation;
#   - the spill test of the v2 kernels and the NVRTC compile test of the MoE sources (moe, moe_gemm,
#     moe_cublas; sm_80 and sm_90) with this machine's NVRTC;
#   - the tiny MoE models (qwen3moe, qwen2moe) trained 10 steps on the GPU against the CPU
#     (bench/gpu_check.py --only train --train-models qwen3moe qwen2moe: losses and gradient norms).
# timings (about 150-200 s; alone on the GPU):
#   - bench/gpu_moe.py at 4096 tokens: both v2 routes' grouped products beside torch._grouped_mm on
#     the same rows, every kernel with and without LoRA, the host-synchronisation check (MOE_S, 45);
#   - bench/gpu.py: the 12-layer Qwen3-30B-A3B-shaped Q4_K model, weight cache off, beside
#     transformers + PEFT (tokens/s, peak memory, one profiled step each; 2 warm-up + 3 measured
#     steps; the engine's child capped at 70 s, PEFT's at 45) (E2E_S, 110).
# bench/device_verify.sh's `moe` part runs `bash bench/device_30.sh timings` (its `checks` part runs every
# GPU test, these included).
# Expected: every check passes; the numbers go to bench/GPU_NOTES.md (issue 30's section has the
# predictions they are read against). The route the engine takes by default is DEFAULT_ROUTE in
# engine/kernels/moe_gemm.py ("tc"); gpu_moe.py's table says whether "cublas" is faster.
#
# Needs the gguf wheel in .whl/ (bench/gpu_check.py says how), carried: carry [".whl"] (skipped when
# /tmp/site already has it, as after device_verify.sh).
# Everything lands in $OUT/30/ (summary.txt, gpu_moe.txt, gpu_e2e.txt, and all.tgz with every log); the
# summary is printed last.
set -u
cd "$(dirname "$0")/.."
PARTS=${*:-checks timings}
for p in $PARTS; do
    case $p in
    checks | timings) ;;
    *)
        echo "device_30.sh: unknown part '$p' (parts: checks timings)" >&2
        exit 2
        ;;
    esac
done
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
OUT=${OUT:-/tmp/device-30-out}
W=$OUT/30/work
mkdir -p "$W"
C=${CHECK_S:-55}
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
{
    echo "parts: $PARTS"
    nvidia-smi -L
    nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -n 1
    python3 -c "import cupy, numpy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
    python3 -c "import cupy; from cupy_backends.cuda.libs import cublas; print('cuBLAS version', cublas.getVersion(cupy.cuda.device.get_cublas_handle()))"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} >"$W/env.txt" 2>&1
T0=$(date +%s)

if has checks; then
    OPENBLAS_NUM_THREADS=1 timeout "$C" python3 -m pytest -q -rfs -m gpu -n 8 -p no:cacheprovider --timeout "$C" \
        tests/kernels/test_moe_parity.py >"$W/pytest_moe_gpu.txt" 2>&1 &
    compile=()
    for src in moe moe_gemm moe_cublas; do
        for arch in sm_80 sm_90; do compile+=("tests/kernels/test_compile.py::test_source_compiles_without_warnings[$src-$arch]"); done
    done
    timeout "$C" python3 -m pytest -q -rfs -p no:cacheprovider \
        tests/kernels/test_moe_gemm_emulated.py::test_v2_kernels_spill_no_registers "${compile[@]}" \
        >"$W/pytest_spill_compile.txt" 2>&1 &
    OPENBLAS_NUM_THREADS=2 OUT=$W/train timeout "$C" python3 bench/gpu_check.py --only train \
        --train-models qwen3moe qwen2moe >"$W/check_train_moe.txt" 2>&1 &
    wait
    echo "checks: $(($(date +%s) - T0)) s" >>"$W/env.txt"
fi

if has timings; then
    t1=$(date +%s)
    OUT=$W timeout "${MOE_S:-45}" python3 bench/gpu_moe.py --tokens 4096 --repeats 5 --routes tc cublas \
        >"$W/gpu_moe.txt" 2>&1
    echo "gpu_moe: $(($(date +%s) - t1)) s" >>"$W/env.txt"
    t2=$(date +%s)
    E2E=${E2E_S:-110}
    OUT=$W timeout "$E2E" python3 bench/gpu.py --sections e2e --e2e moe --moe-layers 12 --budgets off \
        --warmup 2 --measure 3 --caps engine:moe=70,peer:moe=45 --budget-s $((E2E - 5)) >"$W/gpu_stdout.txt" 2>&1
    echo "e2e: $(($(date +%s) - t2)) s" >>"$W/env.txt"
    cp "$W/gpu_moe.txt" "$OUT/30/gpu_moe.txt" 2>/dev/null
    cp "$W/gpu.txt" "$OUT/30/gpu_e2e.txt" 2>/dev/null
fi
echo "total: $(($(date +%s) - T0)) s" >>"$W/env.txt"

{
    echo "== environment"
    cat "$W/env.txt"
    if has checks; then
        echo "== pytest -m gpu tests/kernels/test_moe_parity.py (every case on every route, twice bit for bit)"
        grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest_moe_gpu.txt" | tail -n 30
        echo "== spill + compile tests (this machine's NVRTC)"
        grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest_spill_compile.txt" | tail -n 10
        echo "== tiny MoE models, 10 steps, GPU vs CPU"
        grep -E "^(qwen|train|generate)|passed, |FAIL|raised" "$W/check_train_moe.txt" | tail -n 30
    fi
    if has timings; then
        # the last lines are what device_verify.sh shows (its tail of this summary): the tables
        echo "== gpu_moe (4096 tokens, routes tc and cublas beside torch._grouped_mm)"
        tail -n 20 "$W/gpu_moe.txt"
        echo "== gpu.py e2e (12-layer Qwen3-30B-A3B shape, cache off, beside PEFT)"
        grep -E "Traceback|Error" "$W/gpu_stdout.txt" | head -n 3
        tail -n 24 "$W/gpu_stdout.txt"
    fi
} >"$OUT/30/summary.txt" 2>&1
tar -czf "$OUT/30/all.tgz" -C "$OUT/30" work && rm -rf "$W"
cat "$OUT/30/summary.txt"
