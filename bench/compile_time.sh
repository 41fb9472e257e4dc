#!/usr/bin/env bash
# Compile time of a translation unit that includes <tessera/tessera.hpp> and evaluates a few
# fused expressions (bench/compile_time/expressions.cpp), with g++ -O2, median of N runs; for
# scale, in the same run: the header alone, and LibTorch's <torch/torch.h> alone when installed.
#   bash bench/compile_time.sh [runs=5]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-5}
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -fopenmp -Iinclude)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Prints the median wall time (seconds) of compiling stdin-or-file with the given arguments.
median_time() {
  local times=()
  for _ in $(seq "$runs"); do
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{ a[NR] = $1 } END { printf "%.2f", a[int((NR + 1) / 2)] }'
}

probe=$(median_time "$cxx" "${flags[@]}" -c bench/compile_time/expressions.cpp -o "$out/probe.o")
header=$(median_time "$cxx" "${flags[@]}" -fsyntax-only -x c++ bench/compile_time/header_only.cpp)
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $("$cxx" --version | head -1)"
echo "tessera.hpp + a few expressions, g++ -O2 -c: ${probe} s (median of $runs; budget 5 s)"
echo "tessera.hpp alone, -fsyntax-only:           ${header} s"
if [ -f /usr/include/torch/csrc/api/include/torch/torch.h ]; then
  torch=$(median_time "$cxx" -std=c++17 -O2 -I/usr/include/torch/csrc/api/include -fsyntax-only \
    -x c++ bench/compile_time/torch_only.cpp)
  echo "<torch/torch.h> alone, -fsyntax-only:         ${torch} s"
  echo "torch header / tessera probe = $(echo "$torch / $probe" | bc -l | xargs printf '%.1f')"
fi
