#!/usr/bin/env bash
# The hybrid engine's acceptance numbers on a GPU machine, one command, < 9 minutes (bench/gpu/accept.py says
# what it measures). On the measurement H100 (no network): first send the offline wheels of ../shared/gpu as its
# README says (they land in /tmp/offline-parts); this script installs them once, then runs from the working tree.
# Writes bench/results/gpu_accept.json and gpu_accept.md (paste the table into docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! python3 -c "import vllm" 2>/dev/null; then
  if [ -f .gpu/install.sh ]; then
    bash .gpu/install.sh
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "vllm is not importable and .gpu/install.sh is absent: see ../shared/gpu/README.md" >&2
    exit 3
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1
exec timeout 530 python3 bench/gpu/accept.py "$@"
