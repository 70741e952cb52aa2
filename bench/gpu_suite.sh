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
# same with the default mode.  The models are census models whose breaks
# GraphMend removes: in float32 (XLM's length assert, the Nemotron ASR encoder's
# logging) and in float16 (BART's and NLLB-MoE's overflow clamps);
# MODELS_FP32 and MODELS_FP16 override them.  Then the torch.cond cases:
# continuation predication on the remote-code families whose branches only
# torch.cond merges (ChatGLM2/3 of bench/remote_corpus,
# which need transformers 4.x; their published files are fetched beforehand with
# bench/remote_corpus_fetch.py, and carried to a machine without network), with and
# without CUDA graphs: under TorchInductor a
# cond reads its predicate on the host, so the CUDA-graph skips are the figure to
# read; MODELS_COND overrides them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-bench/results/gpu}}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
models_fp32=${MODELS_FP32:-xlm,nemotron_asr_streaming_encoder}
models_fp16=${MODELS_FP16:-bart,nllb-moe}
models_cond=${MODELS_COND:-remote:chatglm2,remote:chatglm3}

python3 - <<'PY' | tee "$out/environment.txt"
import torch, transformers
assert torch.cuda.is_available(), "no CUDA device"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"{torch.cuda.get_device_name()}")
PY

# four runs of at most 110 s each and two cond runs of at most 80 s: 10 minutes in all
for mode in reduce-overhead default; do
    for dtype in float32 float16; do
        models=$models_fp32
        [ "$dtype" = float16 ] && models=$models_fp16
        name="perf-cuda-$mode-$dtype"
        timeout 110 python3 bench/perf.py --models "$models" --device cuda --mode "$mode" \
            --dtype "$dtype" --repeats 2 --calls 100 --timeout 60 --json "$out/$name.json" \
            | tee "$out/$name.txt" || echo "perf.py --mode $mode --dtype $dtype stopped: $?"
    done
done

for mode in reduce-overhead default; do
    name="perf-cuda-$mode-float16-cond"
    timeout 80 python3 bench/perf.py --models "$models_cond" --device cuda --mode "$mode" \
        --dtype float16 --repeats 1 --calls 50 --timeout 35 --json "$out/$name.json" \
        | tee "$out/$name.txt" || echo "perf.py --mode $mode cond cases stopped: $?"
done
