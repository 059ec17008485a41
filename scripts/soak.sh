#!/usr/bin/env bash
# Soak: randomized collectives (sizes, types, operators, algorithms, rank counts 1-8, threads and
# processes) for a set time, every output element checked against an independent reference.
# Usage: scripts/soak.sh [seconds (default 120)] [build-dir (default build-soak)] [extra braid-soak args]
# e.g.   scripts/soak.sh 3600 build-soak --seed 0x6f1c2026     (prints the seed; any failure prints
#        the epoch seed and the braid-soak command that replays it)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
build=${2:-build-soak}
shift $(( $# > 2 ? 2 : $# ))
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_CUDA=OFF -DBRAID_BUILD_BENCH=OFF \
    -DBRAID_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$build" --target braid-soak -j "$(nproc)"
exec "$build/tests/braid-soak" --seconds "$seconds" "$@"
