#!/usr/bin/env bash
# Issue 31 in one device call (one H100 or H200, about 3 minutes): the GPU checks of the CUDA twins
# that make Gemma 3, gpt-oss, DeepSeek-MoE and DeepSeek-V2/V3 train on the GPU, then two timed shapes
# beside transformers + PEFT.
#
# Checks, at the same time (each capped at CHECK_S seconds, default 70):
#   - the GPU parity tests of the twins (`pytest -m gpu`, 8 workers): attention (flash and tensor-core
#     paths with sinks, sliding-window masks, a value head size of its own), the gated activation
#     (SwiGLU, GEGLU through ggml's fp16 table, clamped SwiGLU), MLA's key/value decompression, the
#     head loss with a soft-cap and the soft-cap alone, and the MoE twins (V3 routing: sigmoid, bias,
#     groups; gpt-oss: softmax over the chosen logits, biases, clamped SwiGLU; plus the earlier cases,
#     the ops dispatch and the no-host-sync test). Test sizes (TUNE_PARITY_SMALL=1; set it empty for
#     the real-model sizes too, which take minutes of float64 references on the host). Every twin runs
#     twice with poisoned buffers and must give the same bits;
#   - bench/gpu_check.py's training rows for the new families: 10 steps of gemma3, gpt-oss (MXFP4
#     experts; sinks and expert biases trained in full), deepseek, deepseek2 as V2-Lite (no q
#     compression), deepseek2 with q compression, and deepseek2 with V3-style routing, each on the CPU
#     and on the GPU from the same file; every step's cross-entropy within 2e-2 and gradient norm within
#     5e-2 of the CPU's, the loss falling, greedy generation with the KV cache equal to the full pass,
#     and the exported adapter's logits on the CPU within 2e-2 of the device's;
# then, with nothing else on the GPU (capped at TIME_S seconds, default 110):
#   - bench/gpu.py's end-to-end rows for a gpt-oss-20b-shaped model (MXFP4 experts, the rest Q8_0) and
#     a DeepSeek-V2-Lite-shaped one (Q4_K, Q8_0 where rows are not whole 256-value blocks), cut to
#     LAYERS layers (default 4 of 24 and 27: the call's time), BATCH x CTX tokens a step (default
#     2 x 1024), 1 warm-up and up to 2 measured steps, cache off (QLoRA at rest); each run (engine,
#     peer) capped at CHILD_S seconds (default 40). The peers: transformers' GptOss (eager attention:
#     it takes no SDPA) and DeepseekV2 + PEFT on the same shapes and tensors (bench/gpu_e2e.py).
# Output: $OUT/31/summary.txt (printed last), $OUT/31/gpu.txt (the timed tables), $OUT/31/details.tgz
# (every log and JSON).
#
# Needs the gguf wheel in .whl/ (bench/gpu_check.py says how), carried: carry [".whl"].
#     bash bench/device_31.sh
# Without a GPU, EMULATE=1 runs the same commands on the g++ kernel emulator at tiny sizes (a dry run:
# no peer, no timings worth reading; the pytest step only skips).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-31-out}
D=$OUT/31
W=$D/work
mkdir -p "$W"
CHECK_S=${CHECK_S:-70}
TIME_S=${TIME_S:-110}
CHILD_S=${CHILD_S:-40}
LAYERS=${LAYERS:-4}
BATCH=${BATCH:-2}
CTX=${CTX:-1024}
EMULATE=${EMULATE:-}
export TUNE_PARITY_SMALL=${TUNE_PARITY_SMALL-1}
MODELS="gemma3 gpt-oss deepseek deepseek2 deepseek2-q deepseek2-v3"
PARITY="tests/kernels/test_attention_parity.py tests/kernels/test_glu_parity.py tests/kernels/test_mla_parity.py
tests/kernels/test_cross_entropy_parity.py tests/kernels/test_moe_parity.py"
if [ -z "$EMULATE" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
    PY=python3
    EMU=()
    XDIST=(-n 8)
else
    export PYTHONPATH=. PYTHONUNBUFFERED=1
    PY=${PY:-python3}
    EMU=(--emulate)
    XDIST=()
fi
{
    nvidia-smi
    $PY -c "import cupy, numpy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
    $PY -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
    nproc
} >"$W/env.txt" 2>&1

t0=$(date +%s)
# shellcheck disable=SC2086
OPENBLAS_NUM_THREADS=1 timeout "$CHECK_S" $PY -m pytest -q -rfs -m gpu "${XDIST[@]}" -p no:cacheprovider \
    --timeout "$CHECK_S" $PARITY >"$W/pytest_gpu.txt" 2>&1 &
# shellcheck disable=SC2086
OPENBLAS_NUM_THREADS=4 OUT=$W/check timeout "$CHECK_S" $PY bench/gpu_check.py "${EMU[@]}" --only train \
    --train-models $MODELS >"$W/check_train.txt" 2>&1 &
wait
echo "checks: $(($(date +%s) - t0)) s" >>"$W/env.txt"

t1=$(date +%s)
OUT=$W timeout "$TIME_S" $PY bench/gpu.py "${EMU[@]}" --sections e2e --e2e gptoss deepseek2 --moe-layers "$LAYERS" \
    --batch "$BATCH" --ctx "$CTX" --warmup 1 --measure 2 --budgets off --child-cap-s "$CHILD_S" \
    --budget-s $((TIME_S - 5)) >"$W/gpu_stdout.txt" 2>&1
echo "timed: $(($(date +%s) - t1)) s" >>"$W/env.txt"

{
    echo "== environment"
    grep -E "H100|H200|Driver Version|cupy|torch|checks:|timed:" "$W/env.txt"
    echo "== pytest -m gpu (the twins' parity tests; TUNE_PARITY_SMALL=${TUNE_PARITY_SMALL})"
    grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$W/pytest_gpu.txt" | tail -n 20
    echo "== gpu_check: training, cpu vs device (10 steps)"
    grep -E "^[a-z0-9-]+ +10 |passed, |FAIL|raised|^train .*steps cpu|^generate" "$W/check_train.txt" | tail -n 40
    echo "== gpu.py: gpt-oss-20b and DeepSeek-V2-Lite shapes beside transformers + PEFT ($LAYERS layers)"
    sed -n '/^end to end/,$p' "$W/gpu_stdout.txt"
    grep -E "^PEFT targets|^attention |^torch grouped|killed|Traceback|Error" "$W/gpu_e2e.log" 2>/dev/null | sort -u | head -n 12
} >"$D/summary.txt" 2>&1
cp "$W/gpu.txt" "$D/gpu.txt" 2>/dev/null
tar -czf "$D/details.tgz" -C "$D" work && rm -rf "$W"
cat "$D/summary.txt"
