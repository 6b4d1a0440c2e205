#!/usr/bin/env bash
# The GPU checks and measurements the docs mark as not measured, as one short run on a machine with
# one CUDA GPU, from the repository root. Each step writes under OUT as it finishes, so a run cut
# short keeps what it had; a step that would not finish inside the budget is skipped, and said so.
#
#   OUT=<folder> bash scripts/gpu-check.sh     # on the GPU machine (python3 there holds PyTorch);
#                                              # OUT defaults to results/gpu-check
#   DRY_RUN=1 bash scripts/gpu-check.sh        # print each step's command, run nothing
#
# In order (the first ones matter most):
#   1. env.log: the GPU, the driver, torch's version and build;
#   2. tests-gpu.log: the tests marked gpu: the int8 integer path on the GPU (int_mm, i.e.
#      torch._int_mm on int8 tensor cores; forward, layer gradient, the probe, the layers against
#      fake), the executors and the augmentation on CUDA;
#   3. resnet20-compiled-integer.json: ResNet-20, 8 nodes x 32, batched and compiled (CUDA graphs,
#      the paper profile's step), FP beside 8-bit with int8_arithmetic integer, eager and compiled
#      interleaved (`lpdl bench`); the 8-bit fake step's LP/FP 1.60 is on record
#      (docs/measurements.md, step-h200-compiled), so this one gives the integer row;
#   4. vgg11-compiled-integer.json, resnet54-compiled-integer.json: the same for the next models of
#      config/step-times.yaml, whose steps are scaled from ResNet-20's today.
# A compiled bench spends most of its time compiling (85-100 s a precision with a cold cache on an
# H200), so one run of the default budget (BUDGET_S=540 seconds) gets through step 3; a second,
# with STEPS="vgg11 resnet54", does step 4. STEPS (default: all) names the steps to run, of: env
# tests resnet20 vgg11 resnet54. At most 8 files land in OUT (a device machine returns no more).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
DRY_RUN=${DRY_RUN:-}
STEPS=${STEPS:-env tests resnet20 vgg11 resnet54}
START=$(date +%s)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -n "$DRY_RUN" ] || mkdir -p "$OUT"

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# step NAME NEEDS_S TIMEOUT_S COMMAND...: run COMMAND (stdout and stderr to OUT/NAME.log) if NEEDS_S
# seconds are left, stopped after TIMEOUT_S (or what is left, if less)
step() {
  local name=$1 needs=$2 limit=$3
  shift 3
  case " $STEPS " in *" ${name%%-*} "*) ;; *) return 0 ;; esac
  if [ -n "$DRY_RUN" ]; then
    echo "$*"
    return 0
  fi
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt "$needs" ]; then
    echo "gpu-check: $name skipped: ${remaining} s of the ${BUDGET_S} s budget left, it needs about ${needs} s"
    return 0
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  local t0 rc
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "gpu-check: $name: exit $rc after $(($(date +%s) - t0)) s ($(left) s left); log $OUT/$name.log"
  tail -n 3 "$OUT/$name.log"
}

bench() {  # bench NAME NEEDS_S MODEL ARGS...: lpdl bench of MODEL at 8 x 32, its JSON in OUT/NAME.json
  local name=$1 needs=$2 model=$3
  shift 3
  step "$name" "$needs" 420 "$PY" -m lpdl_core bench --model "$model" --device cuda --nodes 8 --batch 32 \
    --out "$OUT/$name.json" "$@"
}

step env 5 30 bash -c "nvidia-smi; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no CUDA device\")'"
step tests-gpu 60 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_int8_arithmetic.py tests/test_engine.py tests/test_augment.py
bench resnet20-compiled-integer 240 resnet20 --executor batched --compile --int8-arithmetic integer \
  --steps 20 --warmup 3
bench vgg11-compiled-integer 240 vgg11 --executor batched --compile --int8-arithmetic integer --steps 10 --warmup 2
bench resnet54-compiled-integer 240 resnet54 --executor batched --compile --int8-arithmetic integer \
  --steps 10 --warmup 2
[ -z "$DRY_RUN" ] && echo "gpu-check: done in $(($(date +%s) - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit 0
