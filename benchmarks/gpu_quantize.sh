#!/usr/bin/env bash
# GPU check of the quantize schemes on an NVIDIA machine (minutes): every scheme's node placement on the
# CUDA execution provider (CPU fallbacks flagged) and decode ms/token against FP16, side by side.
#
#   benchmarks/gpu_quantize.sh [OUT_DIR]     # needs the `gpu` extra (onnxruntime-gpu, not onnxruntime)
#
# It exports the demo draft (FP32 and FP16) and the 134M random Llama of benchmarks/quantize_speed.py,
# quantizes each with dynamic / static / weight-only, then runs `quantize check --providers` and
# `quantize bench --providers CUDAExecutionProvider`. Exit status: non-zero if CUDA is absent.
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${1:-${OUT:-/tmp/coinfer-gpu}}
mkdir -p "$OUT"
"$PY" - <<'PY'
import onnxruntime as ort, sys
print("onnxruntime", ort.__version__, ort.get_available_providers())
sys.exit(0 if "CUDAExecutionProvider" in ort.get_available_providers() else 3)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -m benchmarks.quantize_speed --prepare-only            # builds/caches every variant on this machine
ROOTS=$("$PY" -m benchmarks.quantize_speed --list-dirs)      # one line per model: FP32 dir then INT8 dirs
while read -r line; do
  set -- $line
  name=$(basename "$(dirname "$1")")
  for d in "$@"; do
    "$PY" -m coinfer.quantize check "$d" --no-structure --providers CUDAExecutionProvider CPUExecutionProvider --json \
      > "$OUT/placement-$name-$(basename "$d").json" || true   # exit 1 = fallback found; the JSON says where
  done
  "$PY" -m coinfer.quantize bench "$@" --providers CUDAExecutionProvider CPUExecutionProvider --batch 5 --json \
    > "$OUT/bench-$name.json"
  "$PY" -c 'import json, sys; from coinfer.quantize.bench import table; print(table(json.load(open(sys.argv[1]))))' \
    "$OUT/bench-$name.json"                                   # the table of that same run
done <<< "$ROOTS"
