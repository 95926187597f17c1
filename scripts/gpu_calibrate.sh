#!/usr/bin/env bash
# Calibrate a GPU profile and check it against real execution, in one run, everything in one folder.
#
#   bash scripts/gpu_calibrate.sh OUT_DIR [full|smoke]
#
# 1. priosim calibrate: prefill, chunked, decode (under CUDA graphs) and mixed steps and KV
#    transfers of a random-weight model, timed with CUDA events, fitted into a profile:
#    OUT_DIR/<gpu>-<shape>-measured.json (the grid "full", about 3 minutes for an 8B model on an
#    H200; "smoke" runs the "quick" grid and a 40-request check, to try the path in a minute).
# 2. priosim validate: the built-in two-class trace (300 requests, 3 runs) served for real on
#    the GPU by the continuous-batching loop and simulated by priosim on that profile, per class:
#    OUT_DIR/validate/validation.json, real.parquet, sim.parquet, validation_cdf.png.
#
# Environment: SHAPE (default llama-3-8b), DEVICE (default cuda; cpu runs the same path with
# SHAPE=tiny), NAME (profile file name without .json; default h200-<shape>-measured),
# PY (the Python to use; default python3), PRIOSIM (how to call priosim; default
# "$PY -m sim.cli", from the repository root).
# LIMIT_CAL, LIMIT_VAL: each stage's time limit in seconds (full: 420 and 300). What a stage wrote stays in OUT_DIR if a later one fails.
set -u -o pipefail
OUT=${1:?usage: gpu_calibrate.sh OUT_DIR [full|smoke]}
MODE=${2:-full}
SHAPE=${SHAPE:-llama-3-8b}
DEVICE=${DEVICE:-cuda}
NAME=${NAME:-h200-$SHAPE-measured}
PY=${PY:-python3}
PRIOSIM=${PRIOSIM:-$PY -m sim.cli}
export PYTHONUNBUFFERED=1
case "$MODE" in
  full)  GRID=full;  REQUESTS=300; REPEATS=3; LIMIT_CAL=${LIMIT_CAL:-420}; LIMIT_VAL=${LIMIT_VAL:-300} ;;
  smoke) GRID=quick; REQUESTS=40;  REPEATS=1; LIMIT_CAL=${LIMIT_CAL:-240}; LIMIT_VAL=${LIMIT_VAL:-120} ;;
  *) echo "gpu_calibrate.sh: mode '$MODE' is not full or smoke" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
LOG="$OUT/log.txt"
{
  echo "== $(date -u +%FT%TZ) mode=$MODE shape=$SHAPE device=$DEVICE grid=$GRID"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  fi
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  echo "== calibrate"
  t0=$(date +%s)
  timeout "$LIMIT_CAL" $PRIOSIM calibrate --device "$DEVICE" --shape "$SHAPE" --grid "$GRID" --out "$OUT/$NAME.json"
  echo "calibrate: exit $?, $(( $(date +%s) - t0 )) s"
  if [ -f "$OUT/$NAME.json" ]; then
    echo "== validate"
    t0=$(date +%s)
    timeout "$LIMIT_VAL" $PRIOSIM validate --profile "$OUT/$NAME.json" --requests "$REQUESTS" \
      --repeats "$REPEATS" --out "$OUT/validate"
    echo "validate: exit $?, $(( $(date +%s) - t0 )) s"
  fi
  echo "== $(date -u +%FT%TZ) done"
} 2>&1 | tee "$LOG"
