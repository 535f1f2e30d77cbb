#!/usr/bin/env bash
# Issue 29 in one device call (one H100; about 4 minutes): the fused dense step's checks, then its
# timings beside transformers + PEFT. Every step is capped with `timeout`; output under $OUT/29/,
# a short summary printed last.
#
#   1. graph replay equals the eager step bit for bit over 3 batches (bench/gpu_29.py replay: an
#      8-layer Qwen2.5-1.5B-shaped Q4_K model, B 4 x T 512; warm-up, capture, 3 replays)   ~25 s
#   2. the GPU parity tests of the step's kernels (tests/kernels/test_dense_step_kernels.py -m gpu:
#      q/k/v + RoPE, fused norms, bf16 SwiGLU, device-decided AdamW bit for bit, padded head loss)  ~20 s
#   3. bench/gpu.py --sections e2e --e2e dense --budgets auto: the Qwen2.5-1.5B-shaped Q4_K dense LoRA
#      run (r16 on every linear, B 4 x T 1024, 2 warm-up + 5 measured steps) beside transformers +
#      PEFT in the same call: tokens/s, peak memory, MFU, and one profiled step of each (GPU busy
#      share, per-kernel table, launch count)                                           ~120 s
#   4. a 50-step loss curve of the fused step against the generic fp32-LoRA path (bench/gpu_29.py
#      curve: the 8-layer model at B 4 x T 512, smaller than step 3's to fit the call)  ~60 s
# Needs the gguf wheel in .whl/ (bench/gpu_check.py says how), carried: carry [".whl"].
#     bash bench/device_29.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-29-out}
W=$OUT/29
mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import cupy; print('cupy', cupy.__version__)"; } >"$W/env.txt" 2>&1
timeout 45 python3 bench/gpu_29.py replay --layers 8 --batch 4 --ctx 512 >"$W/replay.txt" 2>&1
echo "exit status $?" >>"$W/replay.txt"
timeout 40 python3 -m pytest -q -rfs -m gpu -p no:cacheprovider --timeout 40 tests/kernels/test_dense_step_kernels.py \
    tests/kernels/test_adamw_parity.py tests/kernels/test_cross_entropy_parity.py >"$W/pytest_gpu.txt" 2>&1
echo "exit status $?" >>"$W/pytest_gpu.txt"
OUT=$W timeout 150 python3 bench/gpu.py --sections e2e --e2e dense --budgets auto --budget-s 145 \
    --caps engine:dense=75,peer:dense=55 \
    >"$W/gpu_stdout.txt" 2>&1
echo "exit status $?" >>"$W/gpu_stdout.txt"
timeout 55 python3 bench/gpu_29.py curve --steps 50 --layers 8 --batch 4 --ctx 512 >"$W/curve.txt" 2>&1
echo "exit status $?" >>"$W/curve.txt"
{
    echo "== environment ($(($(date +%s) - t0)) s)"
    cat "$W/env.txt"
    echo "== 1. graph replay vs eager"
    grep -E "PASS|FAIL|Error|exit status" "$W/replay.txt" | tail -n 4
    echo "== 2. GPU parity of the step's kernels"
    grep -E "^(FAILED|ERROR)|passed|failed|exit status" "$W/pytest_gpu.txt" | tail -n 12
    echo "== 3. bench/gpu.py dense beside PEFT"
    grep -vE "^(wrote|---)" "$W/gpu_stdout.txt" | tail -n 70
    echo "== 4. loss curve, 50 steps"
    grep -E "PASS|FAIL|Error|exit status|^ +[0-9]+ " "$W/curve.txt" | tail -n 14
} >"$OUT/summary_29.txt" 2>&1
cat "$OUT/summary_29.txt"
