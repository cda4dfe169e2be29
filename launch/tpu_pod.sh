#!/usr/bin/env bash
# Runs mural on every host of a Cloud TPU VM pod slice (e.g. v3-128 = 16 hosts).
#
#   TPU_NAME=my-pod ZONE=europe-west4-a WORKDIR=gs://bucket/runs/mural_base \
#     launch/tpu_pod.sh configs/mural_base.py [--config.total_steps=1000 ...]
#
# The same command runs on all hosts (--worker=all). No --coordinator_address
# or --process_id: on TPU VMs JAX discovers the pod's hosts from the TPU
# metadata by itself. WORKDIR must be shared by all hosts (a gs:// bucket):
# orbax writes one checkpoint collectively, process 0 writes metrics and
# eval JSON. A preempted slice gets SIGTERM; mural saves a checkpoint at the
# next step and rerunning this command resumes from it.
#
# Setup once per pod (same checkout and venv on every host):
#   gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command='
#     git clone <repo> ~/mural && cd ~/mural && python3 -m venv .venv &&
#     .venv/bin/pip install -e ".[tpu]"'
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}"
: "${ZONE:?set ZONE}"
: "${WORKDIR:?set WORKDIR (a gs:// path every host can write)}"
CONFIG="${1:?usage: launch/tpu_pod.sh CONFIG [--config.field=value ...]}"
shift
REPO_DIR="${REPO_DIR:-~/mural}"

printf -v EXTRA ' %q' "$@"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
  cd $REPO_DIR && .venv/bin/python -m mural.main --config=$CONFIG --workdir=$WORKDIR$EXTRA"
