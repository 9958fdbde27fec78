#!/usr/bin/env bash
# `rltune up` on a GPU machine's real GPUs (pynvml) and one job through it.
#
# For a machine with Python 3.12, torch and nvidia-ml-py but no network: the other
# packages `rltune up` and `rltune submit` need come as wheels in .whl/ (list and
# download command in docs/guide/gpu-hosts.md), installed into a folder of their own
# (RLTUNE_DEVICE_SITE, default /tmp/rltune-site) and put first on PYTHONPATH with this
# checkout; nothing is built, nothing is fetched. Without OR-Tools the placer is
# `greedy` (the MILP needs it).
#
#   OUT=/some/dir bash scripts/device/agents-on-gpu.sh [--command CMD] [--num-gpus N]
#
# Writes OUT/agents-on-gpu.json (the inventory as advertised on cluster.nodes, the
# job's events, what its command printed, the times from `up` to `finished`),
# OUT/up.log, OUT/logs/ (every service's log and the job's output), OUT/pip.log and
# OUT/nvidia-smi.txt. Exit status: that of `rltune submit --wait finished`.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/device}
PY=${PYTHON:-python3}
SITE=${RLTUNE_DEVICE_SITE:-/tmp/rltune-site}
WHL=${RLTUNE_DEVICE_WHEELS:-.whl}
mkdir -p "$OUT"
if compgen -G "$WHL/*.whl" >/dev/null; then
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install --no-index --no-deps --disable-pip-version-check --target "$SITE" \
      "$WHL"/*.whl >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
  else  # no pip: a wheel is a zip laid out as site-packages (none of these has .data)
    "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      "$SITE" "$WHL"/*.whl >"$OUT/pip.log" 2>&1
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" --version >"$OUT/python.txt" 2>&1
"$PY" -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  >>"$OUT/python.txt" 2>&1 || true
nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1 || true
exec "$PY" scripts/device/agents_on_gpu.py --out "$OUT" "$@"
