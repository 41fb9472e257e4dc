#!/usr/bin/env bash
# Compile time of the translation units a user writes, in CPU seconds (user + sys, median of N
# runs), with g++ -O2 -c, header-only and in compiled mode (-DTESSERA_COMPILED=1: what linking
# tessera::compiled gives a unit; the library itself is compiled once, timed on its own line).
# The budgets (issue 9) are in the last column; LibTorch's <torch/torch.h> alone is timed for
# scale when installed.
#   bash bench/compile_time.sh [runs=3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-3}
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -fopenmp -Iinclude)
# As CMake builds a user's unit when a CBLAS is found (the default on the CI machine).
if [ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ]; then
  flags+=(-DTESSERA_BLAS=1)
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Prints the median CPU time (user + sys, seconds) of running the given command N times.
median_cpu() {
  local times=()
  for _ in $(seq "$runs"); do
    /usr/bin/time -f '%U %S' -o "$out/time" "$@" >/dev/null
    times+=("$(awk '{ printf "%.2f", $1 + $2 }' "$out/time")")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{ a[NR] = $1 } END { printf "%.2f", a[int((NR + 1) / 2)] }'
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $("$cxx" --version | head -1)"
echo "CPU seconds (user + sys), median of $runs, $cxx ${flags[*]} -c"
printf '%-44s %12s %10s %8s\n' "unit" "header-only" "compiled" "budget"
row() {  # name, source, budget
  local header compiled
  header=$(median_cpu "$cxx" "${flags[@]}" -c "$2" -o "$out/unit.o")
  compiled=$(median_cpu "$cxx" "${flags[@]}" -DTESSERA_COMPILED=1 -c "$2" -o "$out/unit.o")
  printf '%-44s %12s %10s %8s\n' "$1" "$header" "$compiled" "$3"
}
row "tessera.hpp alone" bench/compile_time/header_only.cpp 1.5
row "one fused expression" bench/compile_time/expression.cpp 4
row "a few expressions (the earlier probe)" bench/compile_time/expressions.cpp -
row "smallest training program" bench/compile_time/training.cpp 8
row "examples/train_mlp.cpp" examples/train_mlp.cpp 10
library=$(median_cpu "$cxx" "${flags[@]}" -DTESSERA_COMPILED=1 -DTESSERA_IMPLEMENTATION=1 \
  -c cmake/tessera_compiled.cpp -o "$out/library.o")
echo "tessera::compiled library (once per build): ${library} s"
if [ -f /usr/include/torch/csrc/api/include/torch/torch.h ]; then
  torch=$(median_cpu "$cxx" -std=c++17 -O2 -I/usr/include/torch/csrc/api/include -fsyntax-only \
    -x c++ bench/compile_time/torch_only.cpp)
  echo "<torch/torch.h> alone, -fsyntax-only: ${torch} s"
fi
