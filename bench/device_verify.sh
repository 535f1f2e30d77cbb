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
#   sanitize  compute-sanitizer memcheck over the parity tests of the newest kernels (the fused dense
#             step's, attention, GLU, the MoE tc and v1 routes), beside the checks, capped at SAN_S (120 s)
#   moestep   issue 30's MoE layers inside the captured step (not in the default list: `moe` times the
#             12-layer shape on the same default step), about 4 minutes:
#             - beside the checks, capped at MSTEP_CHECK_S (default 120 s): tests/engine/test_moe_step_gpu.py
#               (tiny qwen3moe, qwen2moe, olmoe, Mixtral: the captured step's replays equal the eager step
#               bit for bit, expert counts, factors and moments included, and follow the generic path;
#               run by `checks` when that part is asked for too) and bench/gpu_29.py replay --arch moe
#               (the Qwen3-30B-A3B shape cut to MSTEP_LAYERS layers, default 4, B 2 x T 512, weight cache
#               MSTEP_BUDGET, default auto: the same bit-for-bit check on the real shape);
#             - MSTEP_CURVE=1 adds bench/gpu_29.py curve --arch moe (30 steps, captured against generic);
#             - bench/gpu.py: the 12-layer Qwen3-30B-A3B shape, cache off, the captured step and the generic
#               step one after the other in one engine process, beside transformers + PEFT (MSTEP_E2E_S, 170)
#   moe48     the whole 48-layer Qwen3-30B-A3B shape (a 16 GB Q4_K file, written beside the checks), cache
#             off, the captured step (where moestep's replay did not fail) and the generic one, beside
#             transformers + PEFT (whose bf16 weights alone are 61 GB: an H200 part; M48_S, 250 s)
#   ncu       Nsight Compute on the tc route's grouped expert kernels at 4096 tokens (bench/gpu_moe.py,
#             --clock-control none: the card's clocks are left alone): speed of light, occupancy, warp
#             states, pipes and memory of mg_gate_up, mg_scatter_nn, mg_down_back, mg_scatter_nt,
#             mg_outer_skinny and mg_skinny_nt, 14 launches after 10 skipped (issue 30: why they run at
#             15-21% of the bf16 peak);
#             capped at NCU_S (150 s); the full report in the archive
# Order: the check parts and moe48's file side by side first, then the timings alone on the GPU:
# dense, curve, moe, moestep, moe48, archs, ncu. BUDGET_S=N ends the script N seconds after it starts: each
# timing is cut to what is left, and one that would get under 30 s is skipped (times.txt says so).
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
# left N: N seconds, or fewer so that the script ends BUDGET_S seconds after it began (with 30 s for
# the summary and the archive); a part given under 30 s is skipped and says so in times.txt
left() {
    local n=$1
    if [ -n "${BUDGET_S:-}" ]; then
        local rest=$((T0 + BUDGET_S - 30 - $(date +%s)))
        [ "$rest" -lt "$n" ] && n=$rest
    fi
    echo "$n"
}
fits() { [ "$(left "$1")" -ge 30 ] || { echo "$2: skipped, $(left "$1") s left" >>"$W/times.txt"; return 1; }; }
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

# The check parts (checks, moestep's checks, sanitize) and moe48's model file run side by side, the
# timings after them, alone on the GPU.
if has checks; then
    OPENBLAS_NUM_THREADS=1 timeout "$C" python3 -m pytest -q -rfs -m gpu -n 8 -p no:cacheprovider --timeout "$C" \
        tests/kernels tests/engine >"$W/pytest_gpu.txt" 2>&1 &
    timeout 90 python3 bench/gpu_29.py replay --layers 8 --batch 4 --ctx 512 >"$W/replay.txt" 2>&1 &
    OPENBLAS_NUM_THREADS=4 OUT=$W/check timeout "$C" python3 bench/gpu_check.py --only train \
        >"$W/check_train.txt" 2>&1 &
fi
if has moestep; then
    MC=${MSTEP_CHECK_S:-120}
    if ! has checks; then  # `checks` runs these tests among the others
        {
            OPENBLAS_NUM_THREADS=1 timeout "$MC" python3 -m pytest -q -rfs -m gpu -p no:cacheprovider \
                --timeout "$MC" tests/engine/test_moe_step_gpu.py
            echo "exit status $?"
        } >"$W/moestep_pytest.txt" 2>&1 &
    fi
    {
        timeout "$MC" python3 bench/gpu_29.py replay --arch moe --layers "${MSTEP_LAYERS:-4}" --batch 2 --ctx 512 \
            --budget "${MSTEP_BUDGET:-auto}"
        echo "exit status $?"
    } >"$W/moestep_replay.txt" 2>&1 &
fi
if has sanitize; then
    {
        timeout "${SAN_S:-120}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
            -p no:cacheprovider --timeout 0 -m gpu tests/kernels/test_dense_step_kernels.py \
            tests/kernels/test_attention_parity.py tests/kernels/test_glu_parity.py \
            tests/kernels/test_moe_parity.py -k "not cublas and not no_host"
        echo "exit status $?"
    } >"$W/sanitizer.txt" 2>&1 &
fi
M48=/tmp/moe48
if has moe48; then  # the 48-layer file (17 GB) is written on the CPU while the checks run
    mkdir -p "$M48"
    timeout "${M48_FILE_S:-200}" python3 -c "
import os, sys, time
from bench.gpu_e2e import E2EOptions, spec_for, write_shaped
spec = spec_for('moe', E2EOptions(moe_layers=48))
path = os.path.join('$M48', f'{spec.name}-L{spec.L}.gguf')
t = time.perf_counter()
write_shaped(spec, path + '.part')
os.replace(path + '.part', path)
print(f'wrote {path}: {os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - t:.1f} s')
" >"$W/moe48_file.txt" 2>&1 &
fi
wait
stamp "checks (side by side)"
if has dense && fits 160 dense; then
    OUT=$W/dense timeout "$(left 160)" python3 bench/gpu.py --sections e2e --e2e dense --budgets auto --budget-s $(($(left 160) - 10)) \
        --caps engine:dense=80,peer:dense=60 >"$W/dense.txt" 2>&1
    cp "$W/dense/gpu.txt" "$OUT/gpu_dense.txt" 2>/dev/null
    stamp dense
fi
if has curve && fits 70 curve; then
    timeout "$(left 70)" python3 bench/gpu_29.py curve --steps 50 --layers 8 --batch 4 --ctx 512 >"$W/curve.txt" 2>&1
    stamp curve
fi
if has moe && fits "${MOE_S:-220}" moe; then
    if [ -f bench/device_30.sh ]; then
        OUT=$W/moe timeout "$(left "${MOE_S:-220}")" bash bench/device_30.sh timings >"$W/moe.txt" 2>&1
    else
        echo "bench/device_30.sh is not in this tree" >"$W/moe.txt"
    fi
    stamp moe
fi
if has moestep && fits 170 moestep; then
    if [ "${MSTEP_CURVE:-0}" = 1 ]; then
        {
            timeout "$(left 120)" python3 bench/gpu_29.py curve --arch moe --steps 30 --layers "${MSTEP_LAYERS:-4}" \
                --batch 2 --ctx 512
            echo "exit status $?"
        } >"$W/moestep_curve.txt" 2>&1
    fi
    ME=$(left "${MSTEP_E2E_S:-170}")
    OUT=$W/moestep timeout "$ME" python3 bench/gpu.py --sections e2e --e2e moe --moe-layers 12 --budgets off \
        --gpu-steps graph,generic --warmup 2 --measure 3 --caps engine:moe=100,peer:moe=45 \
        --budget-s $((ME - 5)) >"$W/moestep_e2e.txt" 2>&1
    cp "$W/moestep/gpu.txt" "$OUT/gpu_moestep.txt" 2>/dev/null
    stamp moestep
fi
if has moe48 && fits 120 moe48; then
    # the captured MoE step (where moestep's replay did not fail) and the generic one, each in its own
    # process (what one run leaves held on the device never limits the next); PEFT beside the first
    # unless M48_PEER=0
    STEPS="graph generic"
    if [ -f "$W/moestep_replay.txt" ] && ! grep -q "^PASS" "$W/moestep_replay.txt"; then STEPS=generic; fi
    PEER=${M48_PEER:-1}
    : >"$W/moe48.txt"
    if ! ls "$M48"/*-L48.gguf >/dev/null 2>&1; then
        echo "the 48-layer file was not written" >"$W/moe48.txt"
    else
        for STEP in $STEPS; do
            fits 60 "moe48 $STEP" || break
            S48=$(left "${M48_S:-170}")
            NOPEER=--no-peer
            [ "$PEER" = 1 ] && NOPEER=
            # caps are scaled by layers / 12 for the MoE shape: engine 4 x 35 s, peer 4 x 20 s
            OUT=$W/moe48_$STEP timeout "$S48" python3 bench/gpu.py --sections e2e --e2e moe \
                --moe-layers 48 --budgets off --gpu-steps "$STEP" --warmup 2 --measure 3 --workdir "$M48" \
                --caps engine:moe=35,peer:moe=20 --budget-s $((S48 - 5)) $NOPEER >>"$W/moe48.txt" 2>&1
            PEER=0
            cat "$W/moe48_$STEP/gpu.txt" >>"$OUT/gpu_moe48.txt" 2>/dev/null
            python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['e2e']:
    if r.get('who') == 'engine':
        print('held after', r.get('setting'), ':', json.dumps(r.get('held_after')), 'free', r.get('device_free_after'))
" "$W/moe48_$STEP/gpu.json" >>"$W/moe48.txt" 2>&1
        done
    fi
    stamp moe48
fi
if has archs && fits 115 archs; then
    OUT=$W/archs timeout "$(left 115)" python3 bench/gpu.py --sections e2e --e2e gptoss deepseek2 --moe-layers "${LAYERS:-4}" \
        --batch 2 --ctx 1024 --warmup 2 --measure 4 --budgets off --child-cap-s 50 --budget-s $(($(left 115) - 5)) \
        >"$W/archs.txt" 2>&1
    cp "$W/archs/gpu.txt" "$OUT/gpu_archs.txt" 2>/dev/null
    stamp archs
fi
if has ncu && fits 60 ncu; then
    NS=$(left "${NCU_S:-150}")
    {
        timeout "$NS" ncu --clock-control none --target-processes all \
            --kernel-name regex:"^mg_(gate_up|scatter_nn|down_back|scatter_nt|outer_skinny|skinny_nt)$" \
            --launch-skip 10 --launch-count 14 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis python3 bench/gpu_moe.py --routes tc --tokens 4096 --repeats 2 \
            --no-sync-check
        echo "exit status $?"
    } >"$W/ncu.txt" 2>&1
    stamp ncu
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
        [ -f "$W/moestep_pytest.txt" ] && grep -E "^(FAILED|ERROR)|passed|failed|skipped|exit status" \
            "$W/moestep_pytest.txt" | tail -n 8
        grep -E "PASS|FAIL|Error|Traceback|steps in|exit status" "$W/moestep_replay.txt" | tail -n 6
        [ -f "$W/moestep_curve.txt" ] && grep -E "PASS|FAIL|Error|^ +[0-9]+ |exit status" "$W/moestep_curve.txt" | tail -n 12
        sed -n '/^end to end/,$p' "$W/moestep_e2e.txt" | tail -n 12
        grep -E "Traceback|Error" "$W/moestep_e2e.txt" | head -n 5
    fi
    if has moe48; then
        echo "== the 48-layer Qwen3-30B-A3B shape beside PEFT"
        cat "$W/moe48_file.txt"
        grep -E "^moe 48L|^errors|^  moe|held after|the 48-layer" "$W/moe48.txt" | cut -c1-1500
        grep -E "Traceback" -A3 "$W/moe48.txt" | head -n 8
    fi
    if has ncu; then
        echo "== ncu: the tc route's grouped kernels (4096 tokens)"
        grep -E "^  mg_|Duration|Compute \(SM\) Throughput|^    Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Executed Ipc Active|Stall|exit status|==ERROR|==WARNING" \
            "$W/ncu.txt" | head -n 90
    fi
    if has sanitize; then
        echo "== compute-sanitizer memcheck"
        grep -E "ERROR SUMMARY|passed|failed|exit status" "$W/sanitizer.txt" | tail -n 4
    fi
} >"$OUT/summary.txt" 2>&1
tar -czf "$OUT/verify.tgz" -C "$OUT" verify && rm -rf "$W"
cat "$OUT/summary.txt"
