#!/usr/bin/env bash
# Sets up the PyTorch backend's environment: a virtualenv at .deps/torch-<TORCH_VERSION>/ (git-ignored)
# with the pinned torch (scripts/toolkits.env), pytest, and braid_torch built from python/ against it.
# PyPI's Linux torch brings its CUDA wheels (about 2.7 GB) even for CPU use; pip keeps the downloaded
# wheels in its cache (~/.cache/pip), so a second environment on one machine downloads nothing.
# Prints the interpreter's path on its last line. Usage: scripts/torch-env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=toolkits.env
. scripts/toolkits.env
venv=.deps/torch-$TORCH_VERSION
py=$venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [ ! -f "$venv/.installed" ]; then
  echo "torch-env: installing torch==$TORCH_VERSION into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$venv"
  } >&2
  "$py" -m pip install --quiet "torch==$TORCH_VERSION" numpy pytest expecttest ninja wheel setuptools >&2
  echo "torch==$TORCH_VERSION" >"$venv/.installed"
fi
# Rebuilt on every run (ninja recompiles only what changed): the extension is compiled against the
# headers of this checkout.
MAX_JOBS=${MAX_JOBS:-$(nproc)} "$py" -m pip install --quiet --no-build-isolation --no-deps ./python >&2
echo "$py"
