#!/usr/bin/env bash
# Debug run on this machine's GPU(s) (one process; all visible GPUs form the mesh).
#
#   launch/gpu_local.sh configs/demo.py /tmp/mural_gpu [--config.tasks.i2t.batch_size=256 ...]
#
# CUDA_VISIBLE_DEVICES picks the GPUs (default: all). XLA would take 75% of
# GPU memory up front; MEM_FRACTION changes that (or set
# XLA_PYTHON_CLIENT_PREALLOCATE=false to allocate on demand while debugging).
# bf16 compute: --config.model.dtype=bfloat16. Installs mural's CUDA extra
# into .venv on first use (pip install -e '.[cuda]': jax with CUDA 12).
set -euo pipefail

CONFIG="${1:?usage: launch/gpu_local.sh CONFIG WORKDIR [--config.field=value ...]}"
WORKDIR="${2:?usage: launch/gpu_local.sh CONFIG WORKDIR [--config.field=value ...]}"
shift 2
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
if [ ! -x "$PY" ]; then python3 -m venv .venv; fi
if ! "$PY" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; then
  "$PY" -m pip install --quiet -e '.[cuda]'
fi

export XLA_PYTHON_CLIENT_MEM_FRACTION="${MEM_FRACTION:-0.75}"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}"
exec "$PY" -m mural.main --config="$CONFIG" --workdir="$WORKDIR" "$@"
