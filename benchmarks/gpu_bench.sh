#!/bin/bash
# mural's step against open_clip's on one GPU (issue 9), one configuration per process.
#
#   OUT=/tmp/gpu_bench bash benchmarks/gpu_bench.sh        # needs jax[cuda], torch, open_clip_torch, timm
#   BUDGET=600 PER_RUN=240 bash benchmarks/gpu_bench.sh    # seconds in all / per run (defaults)
#   RUNS="mural_bf16 mural_f32_fast_fused" bash benchmarks/gpu_bench.sh   # only these runs
#   RUNS="mural_f32_profile mural_f32_conv_graphs" bash benchmarks/gpu_bench.sh   # the profiles (--profile),
#                                     # the second with cuDNN convolutions in CUDA graphs (stop 61: not yet run)
#
# Runs, in order, each skipped when less than PER_RUN seconds of BUDGET are left:
# bench_step.py with the GPU's `auto` implementations (XLA's convolutions, flax batch
# norm) in f32 (batch 128, then 1024) and bf16; open_clip stock and channels_last in f32 and channels_last
# with bf16 autocast; bench_step.py with the CPU's fast/fused implementations in f32.
# On an H200 (one session, jax 0.11.2) the f32 `auto` run took 119 s in all (60.7 s of
# compile) and bf16 more than 170 s: give each run 240 s or more.
# Writes $OUT/summary.log, $OUT/full.log and $OUT/results.jsonl (each run's JSON line).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-/tmp/gpu_bench}; BUDGET=${BUDGET:-600}; PER_RUN=${PER_RUN:-240}; PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
$PY -c "import jax; print('jax', jax.__version__, jax.devices())"

run() {  # name, script, args...
  local name=$1 script=$2; shift 2
  if [ -n "${RUNS:-}" ] && [[ " $RUNS " != *" $name "* ]]; then return; fi
  if [ $((BUDGET - SECONDS)) -lt "$PER_RUN" ]; then echo "=== $name: skipped ($((BUDGET - SECONDS)) s left)"; return; fi
  echo "=== $name (at $SECONDS s): $script $*"
  timeout "$PER_RUN" $PY "benchmarks/$script" --warmup=3 --steps="${STEPS:-20}" "$@" > "$OUT/$name.tmp" 2>&1
  echo "exit $?"
  cat "$OUT/$name.tmp" >> "$OUT/full.log"
  grep '^{' "$OUT/$name.tmp" | sed "s/^{/{\"run\": \"$name\", /" >> "$OUT/results.jsonl"
  grep -E "^(samples/s|step:|device memory|params|XLA GFLOP|matmul|\[)|Error" "$OUT/$name.tmp" | tail -10
  grep -A 40 "^profile:" "$OUT/$name.tmp"
  rm -f "$OUT/$name.tmp"
}
run mural_f32 bench_step.py --pipeline_batches=0
run mural_f32_b1024 bench_step.py --pipeline_batches=0 --batch=1024
run mural_bf16 bench_step.py --pipeline_batches=0 --dtype=bfloat16
run open_clip_f32 bench_open_clip.py --device=cuda --configs=stock,channels_last
run open_clip_bf16 bench_open_clip.py --device=cuda --configs=channels_last --amp=bf16
# Where the step's time goes (RUNS=... only): each HLO op's kernels, least over 5 traced steps.
if [ -n "${RUNS:-}" ]; then
  run mural_f32_profile bench_step.py --pipeline_batches=0 --profile="$OUT/trace_f32" --top=25
  run mural_bf16_profile bench_step.py --pipeline_batches=0 --dtype=bfloat16 --profile="$OUT/trace_bf16" --top=25
  # cuDNN's convolutions captured into XLA's CUDA graphs too (openxla/xla#34572; off by default),
  # so fewer launches issue the step: the profile above found it bound by the host.
  XLA_FLAGS="--xla_gpu_enable_command_buffer=+CONVOLUTION" \
    run mural_f32_conv_graphs bench_step.py --pipeline_batches=0 --profile="$OUT/trace_conv_graphs" --top=10
fi
run mural_f32_fast_fused bench_step.py --pipeline_batches=0 --conv_impl=fast --norm_impl=fused
echo "done at $SECONDS s"
