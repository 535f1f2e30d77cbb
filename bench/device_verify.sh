#!/usr/bin/env bash
# Every open GPU check and timing in one or two device calls, by parts:
#
#     bash bench/device_verify.sh [PART ...]        # default: checks dense curve archs moe
#
# Parts (each step capped with `timeout`; checks run side by side, timings alone on the GPU):
#   checks    at the same time, capped at CHECK_S (default 150 s):
#             - every GPU test of the suite (`pytest -m gpu -n 8 tests/kernels tests/engine`, test sizes:
#               TUNE_PARITY_SMALL=1): every twin against its reference, run twice with poisoned buffers
#               for the same bits (the fused dense step's kernels, the new architectures' ops, the MoE
#               routes), graph replay of a MoE layer, the no-host-sync test, the NCCL collective and
#               `--collective nccl` with one rank against the single path;
#             - bench/gpu_29.py replay: the fused dense step captured as a CUDA graph equals the eager
#               step bit for bit over 3 batches;
#             - bench/gpu_check.py --only train: 10 training steps on the CPU and the GPU from the same
#               file and seed for every family (llama, qwen3, qwen3moe, qwen2moe, gemma3, gpt-oss,
#               deepseek, deepseek2 with and without q compression, V3 routing), generation with the KV
#               cache, the exported adapter's logits on the CPU.
#   dense     bench/gpu.py: the Qwen2.5-1.5B-shaped Q4_K dense LoRA run (fused step, graph) beside
#             transformers + PEFT in the same call, one profiled step each (busy share, kernels, launches)
#   curve     bench/gpu_29.py curve: 50 steps of the fused step against the generic fp32-LoRA path
#   archs     bench/gpu.py: gpt-oss-20b-like (MXFP4) and DeepSeek-V2-Lite-like (Q4_K) shapes, LAYERS
#             layers (default 4), beside transformers' GptOss / DeepseekV2 + PEFT
#   moe       bench/device_30.sh's timings: the grouped expert GEMM routes beside torch._grouped_mm,
#             the 12-layer Qwen3-30B-A3B shape beside PEFT
#   sanitize  compute-sanitizer memcheck over the parity tests of the newest kernels
#   moestep   issue 30's MoE layers inside the captured step (not in the default list: `moe` times the
#             12-layer shape on the same default step), about 4 minutes:
#             - side by side, capped at MSTEP_CHECK_S (default 120 s): tests/engine/test_moe_step_gpu.py
#               (tiny qwen3moe, qwen2moe, olmoe, Mixtral: the captured step's replays equal the eager step
#               bit for bit, expert counts, factors and moments included, and follow the generic path) and
#               bench/gpu_29.py replay --arch moe (the Qwen3-30B-A3B shape cut to MSTEP_LAYERS layers,
#               default 4, B 2 x T 512: the same bit-for-bit check on the real shape);
#             - MSTEP_CURVE=1 adds bench/gpu_29.py curve --arch moe (30 steps, captured against generic);
#             - bench/gpu.py: the 12-layer Qwen3-30B-A3B shape, cache off, the captured step and the generic
#               step one after the other in one engine process, beside transformers + PEFT (MSTEP_E2E_S, 170)
# Output: $OUT/summary.txt (printed last), $OUT/gpu_*.txt (the timed tables), $OUT/verify.tgz (all logs).
# Needs the gguf wheel in .whl/, carried (carry [".whl"]):
#     echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --no-deps --only-binary=:all: -d .whl gguf==0.19.0
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-verify-out}
W=$OUT/verify
mkdir -p "$W"
C=${CHECK_S:-150}
PARTS=${*:-checks dense curve archs moe}
export TUNE_PARITY_SMALL=${TUNE_PARITY_SMALL-1}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "$1: $(($(date +%s) - T0)) s" >>"$W/times.txt"; }
{
    nvidia-smi
    nvcc --version | tail -n 2
    python3 -c "import cupy, numpy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
    python3 -c "import cupy; from cupy_backends.cuda.libs import cublas; print('cuBLAS', cublas.getVersion(cupy.cuda.device.get_cublas_handle()))"
    python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
    python3 -c "from engine.train.collective import nccl_available as a; print('nccl:', a())"
    nproc
} >"$W/env.txt" 2>&1

has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if has checks; then
    OPENBLAS_NUM_THREADS=1 timeout "$C" python3 -m pytest -q -rfs -m gpu -n 8 -p no:cacheprovider --timeout "$C" \
        tests/kernels tests/engine >"$W/pytest_gpu.txt" 2>&1 &
    timeout 90 python3 bench/gpu_29.py replay --layers 8 --batch 4 --ctx 512 >"$W/replay.txt" 2>&1 &
    OPENBLAS_NUM_THREADS=4 OUT=$W/check timeout "$C" python3 bench/gpu_check.py --only train \
        >"$W/check_train.txt" 2>&1 &
    wait
    stamp checks
fi
if has dense; then
    OUT=$W/dense timeout 160 python3 bench/gpu.py --sections e2e --e2e dense --budgets auto --budget-s 150 \
        --caps engine:dense=80,peer:dense=60 >"$W/dense.txt" 2>&1
    cp "$W/dense/gpu.txt" "$OUT/gpu_dense.txt" 2>/dev/null
    stamp dense
fi
if has curve; then
    timeout 70 python3 bench/gpu_29.py curve --steps 50 --layers 8 --batch 4 --ctx 512 >"$W/curve.txt" 2>&1
    stamp curve
fi
if has archs; then
    OUT=$W/archs timeout 115 python3 bench/gpu.py --sections e2e --e2e gptoss deepseek2 --moe-layers "${LAYERS:-4}" \
        --batch 2 --ctx 1024 --warmup 1 --measure 2 --budgets off --child-cap-s 45 --budget-s 110 \
        >"$W/archs.txt" 2>&1
    cp "$W/archs/gpu.txt" "$OUT/gpu_archs.txt" 2>/dev/null
    stamp archs
fi
if has moe; then
    if [ -f bench/device_30.sh ]; then
        OUT=$W/moe timeout "${MOE_S:-220}" bash bench/device_30.sh timings >"$W/moe.txt" 2>&1
    else
        echo "bench/device_30.sh is not in this tree" >"$W/moe.txt"
    fi
    stamp moe
fi
if has moestep; then
    export TUNE_MOE_STEP=1  # MoE models take the captured step only when asked, until this part has passed
    MC=${MSTEP_CHECK_S:-120}
    # each log ends with its exit status (124: killed at its time limit)
    {
        OPENBLAS_NUM_THREADS=1 timeout "$MC" python3 -m pytest -q -rfs -m gpu -p no:cacheprovider --timeout "$MC" \
            tests/engine/test_moe_step_gpu.py
        echo "exit status $?"
    } >"$W/moestep_pytest.txt" 2>&1 &
    {
        timeout "$MC" python3 bench/gpu_29.py replay --arch moe --layers "${MSTEP_LAYERS:-4}" --batch 2 --ctx 512
        echo "exit status $?"
    } >"$W/moestep_replay.txt" 2>&1 &
    wait
    if [ "${MSTEP_CURVE:-0}" = 1 ]; then
        {
            timeout 120 python3 bench/gpu_29.py curve --arch moe --steps 30 --layers "${MSTEP_LAYERS:-4}" \
                --batch 2 --ctx 512
            echo "exit status $?"
        } >"$W/moestep_curve.txt" 2>&1
    fi
    ME=${MSTEP_E2E_S:-170}
    OUT=$W/moestep timeout "$ME" python3 bench/gpu.py --sections e2e --e2e moe --moe-layers 12 --budgets off \
        --gpu-steps graph,generic --warmup 2 --measure 3 --caps engine:moe=100,peer:moe=45 \
        --budget-s $((ME - 5)) >"$W/moestep_e2e.txt" 2>&1
    cp "$W/moestep/gpu.txt" "$OUT/gpu_moestep.txt" 2>/dev/null
    stamp moestep
fi
if has sanitize; then
    timeout "${SAN_S:-120}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
        -p no:cacheprovider --timeout 0 -m gpu tests/kernels/test_dense_step_kernels.py \
        tests/kernels/test_attention_parity.py tests/kernels/test_glu_parity.py >"$W/sanitizer.txt" 2>&1
    echo "exit status $?" >>"$W/sanitizer.txt"
    stamp sanitize
fi

{
    echo "== environment"
    grep -E "H100|H200|Driver Version|release|cupy|cuBLAS|torch|nccl:" "$W/env.txt"
    cat "$W/times.txt"
    if has checks; then
        echo "== pytest -m gpu"
        grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest_gpu.txt" | tail -n 30
        echo "== gpu_29 replay"
        grep -E "PASS|FAIL|Error|Traceback" "$W/replay.txt" | tail -n 6
        echo "== gpu_check: training"
        grep -E "^[a-z0-9-]+ +10 |passed, |FAIL|raised|Error" "$W/check_train.txt" | tail -n 40
    fi
    if has dense; then
        echo "== dense beside PEFT"
        grep -vE "^(wrote|---)" "$W/dense.txt" | tail -n 60
    fi
    if has curve; then
        echo "== loss curve"
        grep -E "PASS|FAIL|Error|^ +[0-9]+ " "$W/curve.txt" | tail -n 12
    fi
    if has archs; then
        echo "== gpt-oss / DeepSeek-V2-Lite shapes"
        sed -n '/^end to end/,$p' "$W/archs.txt" | tail -n 30
        grep -E "Traceback|Error" "$W/archs.txt" | head -n 5
    fi
    if has moe; then
        echo "== MoE"
        tail -n 45 "$W/moe.txt"
    fi
    if has moestep; then
        echo "== MoE inside the captured step (issue 30)"
        grep -E "^(FAILED|ERROR)|passed|failed|skipped|exit status" "$W/moestep_pytest.txt" | tail -n 8
        grep -E "PASS|FAIL|Error|Traceback|steps in|exit status" "$W/moestep_replay.txt" | tail -n 6
        [ -f "$W/moestep_curve.txt" ] && grep -E "PASS|FAIL|Error|^ +[0-9]+ |exit status" "$W/moestep_curve.txt" | tail -n 12
        sed -n '/^end to end/,$p' "$W/moestep_e2e.txt" | tail -n 12
        grep -E "Traceback|Error" "$W/moestep_e2e.txt" | head -n 5
    fi
    if has sanitize; then
        echo "== compute-sanitizer memcheck"
        grep -E "ERROR SUMMARY|passed|failed|exit status" "$W/sanitizer.txt" | tail -n 4
    fi
} >"$OUT/summary.txt" 2>&1
tar -czf "$OUT/verify.tgz" -C "$OUT" verify && rm -rf "$W"
cat "$OUT/summary.txt"
