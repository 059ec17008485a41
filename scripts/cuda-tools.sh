#!/usr/bin/env bash
# Installs cuobjdump and nvdisasm, from NVIDIA's PyPI wheels, into .deps/cuda-tools (bin/ holds links
# to them) for the static kernel checks (tests/static/check_kernels.py, CTest label `static`). The CUDA
# toolkit braid builds with ships nvcc and ptxas without them. Run by scripts/deps.sh; does nothing
# where there is no nvcc. A failed install does not stop the caller: the check then fails, saying
# why, which is where it must show (a check that cannot run must not pass or skip).
set -uo pipefail
cd "$(dirname "$0")/.."
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "cuda-tools: no nvcc, nothing to install"
  exit 0
fi
# 13.2.51 reads nvcc 13.0's sm_90 code (checked: docs/gpu-kernels.md); there is no 13.0 wheel.
version=13.2.51
dest=.deps/cuda-tools
stamp=$dest/installed-$version
if [ -f "$stamp" ] && [ -x "$dest/bin/cuobjdump" ] && [ -x "$dest/bin/nvdisasm" ]; then
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest/bin"
echo "cuda-tools: installing cuobjdump and nvdisasm $version into $dest"
if ! python3 -m pip install --quiet --disable-pip-version-check --no-input --root-user-action=ignore --target "$dest/pip" \
    "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version"; then
  echo "cuda-tools: FAILED to install cuobjdump/nvdisasm from PyPI: the static kernel checks will fail" >&2
  exit 0
fi
for t in cuobjdump nvdisasm; do
  f=$(find "$dest/pip" -type f -name "$t" -path '*/bin/*' | head -n 1)
  if [ -z "$f" ]; then
    echo "cuda-tools: FAILED: no $t in the wheel: the static kernel checks will fail" >&2
    exit 0
  fi
  chmod +x "$f"
  ln -sf "$(realpath "$f")" "$dest/bin/$t"
done
touch "$stamp"
