#!/usr/bin/env bash
# The performance bench on CUDA, sized to finish in under 10 minutes on one GPU.
#
#   bash bench/gpu_suite.sh [OUTDIR]
#
# Meant for a lent GPU machine, whose image already has python3 with a CUDA
# build of torch and transformers: GraphMend runs from this checkout's src/
# (pure Python, nothing to build).  For each model it measures, with and
# without GraphMend, in separate processes with fresh TorchInductor caches:
# time to first result, compile time, graphs, steady-state latency with
# mode="reduce-overhead" (CUDA graphs) and the CUDA graphs recorded, then the
# same with the default mode.  MODELS overrides the model list.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-bench/results/gpu}}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
models=${MODELS:-xlm,flaubert,fastspeech2_conformer,jamba}

python3 - <<'PY' | tee "$out/environment.txt"
import torch, transformers
assert torch.cuda.is_available(), "no CUDA device"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"{torch.cuda.get_device_name()}")
PY

for mode in reduce-overhead default; do
    timeout 270 python3 bench/perf.py --models "$models" --device cuda --mode "$mode" \
        --repeats 2 --calls 100 --timeout 240 --json "$out/perf-cuda-$mode.json" \
        | tee "$out/perf-cuda-$mode.txt" || echo "perf.py --mode $mode stopped: $?"
done
