#!/usr/bin/env bash
# `sift eval qa` on one H200 on NQ prompts of 10 and 20 passages, every mode, in four processes at once
# (SmolLM2 at these lengths is launch-bound, so they share the GPU without slowing each other much):
#   fp32 model + the reference backend (the method's own accuracy, no bf16 rounding between full and sift), and
#   bf16 model + the CUDA kernels (what `sift prefill` runs by default on a Hopper GPU).
# Per-question results are appended to $OUT/qa-<dtype>-<n>.jsonl as they finish, so the time limit keeps what
# finished. Usage: experiments/qa_four_processes.sh GGUF DATA_DIR QUESTIONS SECONDS
set -u
gguf=$1 data=$2 questions=$3 seconds=$4
export SIFT_CACHE_DIR=${SIFT_CACHE_DIR:-/tmp/sift-cache} PYTHONUNBUFFERED=1
python3 -c "from sift_cli.models import load_model; load_model('$gguf', device='cuda')" || exit 1
for n in 10 20; do
  for cfg in "float32 reference" "bfloat16 cuda"; do
    set -- $cfg
    timeout "$seconds" python3 -m sift_cli eval qa --nq --n-docs "$n" --questions "$questions" --model "$gguf" \
      --device cuda --dtype "$1" --backend "$2" --data-dir "$data" --work "/tmp/qa-$1-$n" \
      --results "$OUT/qa-$1-$n.jsonl" > "/tmp/qa-$1-$n.log" 2>&1 &
  done
done
wait
for f in /tmp/qa-*.log; do echo "== $f"; tail -c 2500 "$f"; done
