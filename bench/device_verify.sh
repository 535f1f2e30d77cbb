#!/usr/bin/env bash
# Issue 13 in one device call (one H100, about 9 minutes): every check first, then the timings alone.
#
# Checks, at the same time (each capped at CHECK_S seconds, default 240):
#   - every GPU test of the suite (`pytest -m gpu`, 8 workers): the kernel parity tests, the MoE
#     twins with their no-host-synchronisation test;
#   - bench/gpu_check.py's kernel rows in two processes (CHECK_OPS_A, CHECK_OPS_B; default: every op;
#     real-model sizes, poisoned outputs, two runs compared bit for bit) and its CPU-vs-GPU training,
#     generation and exported-adapter rows;
#   - compute-sanitizer: memcheck over the MoE parity cases and the tensor-core attention's test,
#     racecheck and synccheck over three MoE cases (the sanitizers slow kernels 10-100x: the whole
#     MoE parity file does not fit racecheck's time);
# then, with nothing else on the GPU:
#   - bench/gpu.py (ceilings, kernel timings, end-to-end steps beside transformers + PEFT, one
#     profiled step of each run), capped at TIME_S (default 240);
#   - bench/gpu_moe.py on two token counts (MoE kernels against the ceilings, host synchronisations),
#     capped at MOE_S (default 70).
# Everything lands in $OUT/verify.tgz (one file: the device tool brings back at most eight), with
# gpu.txt and the summary beside it; the summary is printed last.
#
# Needs the gguf wheel in .whl/ (bench/gpu_check.py says how), carried: carry [".whl"].
#     bash bench/device_verify.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-verify-out}
W=$OUT/verify
mkdir -p "$W"
C=${CHECK_S:-240}
OPS_A=${CHECK_OPS_A:-norm rope glu embedding linear attention}
OPS_B=${CHECK_OPS_B:-cross_entropy adamw dequant moe}
MOE_CASES="k1-norenorm-bfloat16 or skewed-bfloat16 or ties-float32"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
{
    nvidia-smi
    nvcc --version
    python3 -c "import cupy, numpy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
    compute-sanitizer --version
    nproc
} >"$W/env.txt" 2>&1

sanitize() {  # tool, time limit, pytest arguments...
    local tool=$1 limit=$2
    shift 2
    timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        python3 -m pytest -q -p no:cacheprovider --timeout 0 "$@" >"$W/sanitizer_$tool.txt" 2>&1
    echo "exit status $?" >>"$W/sanitizer_$tool.txt"
}

t0=$(date +%s)
OPENBLAS_NUM_THREADS=1 timeout "$C" python3 -m pytest -q -rfs -m gpu -n 8 -p no:cacheprovider \
    --timeout "$C" tests/kernels >"$W/pytest_gpu.txt" 2>&1 &
i=0
for ops in "$OPS_A" "$OPS_B"; do  # two processes: the float64 references on the host take most of it
    i=$((i + 1))
    # shellcheck disable=SC2086
    OPENBLAS_NUM_THREADS=3 OUT=$W/kernels$i timeout "$C" python3 bench/gpu_check.py --only $ops \
        >"$W/check_kernels$i.txt" 2>&1 &
done
OUT=$W/train timeout "$C" python3 bench/gpu_check.py --only train >"$W/check_train.txt" 2>&1 &
(
    sanitize memcheck $((C * 2 / 5)) -k "matches_reference or gemm_path" \
        tests/kernels/test_moe_parity.py tests/kernels/test_attention_parity.py
    sanitize racecheck $((C * 2 / 5)) -k "$MOE_CASES" tests/kernels/test_moe_parity.py
    sanitize synccheck $((C / 5)) -k "$MOE_CASES" tests/kernels/test_moe_parity.py
) &
wait
echo "checks: $(($(date +%s) - t0)) s" >>"$W/env.txt"

OUT=$W timeout "${TIME_S:-240}" python3 bench/gpu.py --budget-s $((${TIME_S:-240} - 10)) >"$W/gpu_stdout.txt" 2>&1
OUT=$W timeout "${MOE_S:-70}" python3 bench/gpu_moe.py --tokens 1024 4096 --repeats 5 >"$W/gpu_moe.txt" 2>&1

{
    echo "== environment"
    grep -E "H100|H200|Driver Version|release|cupy|Sanitizer|checks:" "$W/env.txt"
    echo "== pytest -m gpu"
    grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest_gpu.txt" | tail -n 20
    for tool in memcheck racecheck synccheck; do
        echo "== compute-sanitizer $tool"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|exit status" "$W/sanitizer_$tool.txt" | tail -n 4
    done
    echo "== gpu_check: training"
    grep -E "passed|FAIL|raised" "$W/check_train.txt" | tail -n 8
    for i in 1 2; do
        echo "== gpu_check: kernels ($i)"
        grep -E "^FAIL|passed, |^\(|^  [a-z_]+: " "$W/check_kernels$i.txt" | tail -n 20
    done
    echo "== gpu_moe"
    tail -n 25 "$W/gpu_moe.txt"
    echo "== gpu.py"
    tail -n 80 "$W/gpu_stdout.txt"
} >"$OUT/summary.txt" 2>&1
cp "$W/gpu.txt" "$OUT/gpu.txt" 2>/dev/null
tar -czf "$OUT/verify.tgz" -C "$OUT" verify && rm -rf "$W"
cat "$OUT/summary.txt"
