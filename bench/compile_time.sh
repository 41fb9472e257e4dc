#!/usr/bin/env bash
# Compile time of the translation units a user writes, in CPU seconds (user + sys, median of N
# runs), with g++ -O2 -c, header-only and in compiled mode (-DTESSERA_COMPILED=1: what linking
# tessera::compiled gives a unit; the library itself is compiled once, timed on its own line).
# Each mode also with <tessera/tessera.hpp> precompiled ("+ pch": what tessera_precompile_headers
# gives a CMake target; the header is precompiled once per mode, timed on its own line, and the
# unit compiled with it included first, as CMake does). The budgets (issue 9) are in the last
# column; LibTorch's <torch/torch.h> alone is timed for scale when installed.
# With nvcc (issue 45): tessera.hpp alone by nvcc header-only (the kernels every such unit
# compiles); the CUDA training program bench/compile_time/training_cuda.cpp: by nvcc
# header-only and in compiled mode, and by g++ in compiled mode against a tessera::compiled built
# with CUDA; each with the number of kernels its object holds (bench/cuda_kernels.py); then
# tessera::compiled itself by nvcc (one run: it takes minutes), with its kernel count.
#   bash bench/compile_time.sh [runs=3] [cpu|cuda|all=all]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-3}
parts=${2:-all}
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

if [ "$parts" != cuda ]; then
# The precompiled header of each mode, as CMake makes it: a wrapper that includes
# <tessera/tessera.hpp>, precompiled to <dir>/tessera_pch.hpp.gch, included first in each unit
# (-Winvalid-pch says so if it could not be used).
compiled_flags=(-DTESSERA_COMPILED=1)
mkdir -p "$out/pch-header" "$out/pch-compiled"
for dir in "$out/pch-header" "$out/pch-compiled"; do
  echo '#include <tessera/tessera.hpp>' > "$dir/tessera_pch.hpp"
done
pch_header=$(median_cpu "$cxx" "${flags[@]}" -x c++-header "$out/pch-header/tessera_pch.hpp" \
  -o "$out/pch-header/tessera_pch.hpp.gch")
pch_compiled=$(median_cpu "$cxx" "${flags[@]}" "${compiled_flags[@]}" -x c++-header \
  "$out/pch-compiled/tessera_pch.hpp" -o "$out/pch-compiled/tessera_pch.hpp.gch")
pch_from() {  # the options that use the precompiled header in directory $1
  printf '%s\n' -I"$1" -Winvalid-pch -include tessera_pch.hpp
}
mapfile -t header_pch_flags < <(pch_from "$out/pch-header")
mapfile -t compiled_pch_flags < <(pch_from "$out/pch-compiled")

printf '%-44s %12s %8s %10s %8s %8s\n' "unit" "header-only" "+ pch" "compiled" "+ pch" "budget"
row() {  # name, source, budget
  local header header_pch compiled compiled_pch
  header=$(median_cpu "$cxx" "${flags[@]}" -c "$2" -o "$out/unit.o")
  header_pch=$(median_cpu "$cxx" "${header_pch_flags[@]}" "${flags[@]}" -c "$2" -o "$out/unit.o")
  compiled=$(median_cpu "$cxx" "${flags[@]}" "${compiled_flags[@]}" -c "$2" -o "$out/unit.o")
  compiled_pch=$(median_cpu "$cxx" "${compiled_pch_flags[@]}" "${flags[@]}" "${compiled_flags[@]}" \
    -c "$2" -o "$out/unit.o")
  printf '%-44s %12s %8s %10s %8s %8s\n' "$1" "$header" "$header_pch" "$compiled" "$compiled_pch" "$3"
}
row "tessera.hpp alone" bench/compile_time/header_only.cpp 1.5
row "one fused expression" bench/compile_time/expression.cpp 4
row "a few expressions (the earlier probe)" bench/compile_time/expressions.cpp -
row "smallest training program" bench/compile_time/training.cpp 8
row "examples/train_mlp.cpp" examples/train_mlp.cpp 10
library=$(median_cpu "$cxx" "${flags[@]}" -DTESSERA_COMPILED=1 -DTESSERA_IMPLEMENTATION=1 \
  -c cmake/tessera_compiled.cpp -o "$out/library.o")
echo "tessera::compiled library (once per build): ${library} s"
echo "precompiled tessera.hpp (once per target): ${pch_header} s header-only, ${pch_compiled} s compiled"
if [ -f /usr/include/torch/csrc/api/include/torch/torch.h ]; then
  torch=$(median_cpu "$cxx" -std=c++17 -O2 -I/usr/include/torch/csrc/api/include -fsyntax-only \
    -x c++ bench/compile_time/torch_only.cpp)
  echo "<torch/torch.h> alone, -fsyntax-only: ${torch} s"
fi
fi

# ---- CUDA ------------------------------------------------------------------------------------
if [ "$parts" != cpu ]; then
  nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [ ! -x "$nvcc" ]; then
    echo "no nvcc: the CUDA rows are skipped"
    exit 0
  fi
  cuda_include=$(dirname "$(dirname "$(readlink -f "$nvcc")")")/include
  # As CMake builds Tessera's CUDA units: Hopper, the relaxed constexpr Tessera needs, OpenMP
  # for the host code, cuDNN when its header is there.
  nvcc_flags=(-std=c++20 -O2 -arch=sm_90 --expt-relaxed-constexpr -Xcompiler=-fopenmp -Iinclude)
  gxx_cuda_flags=("${flags[@]}" -DTESSERA_CUDA=1 -I"$cuda_include")
  if compgen -G "$cuda_include/cudnn*.h" >/dev/null || [ -f /usr/include/cudnn.h ]; then
    nvcc_flags+=(-DTESSERA_CUDNN=1)
    gxx_cuda_flags+=(-DTESSERA_CUDNN=1)
  fi
  for flag in "${flags[@]}"; do
    [ "$flag" = -DTESSERA_BLAS=1 ] && nvcc_flags+=(-DTESSERA_BLAS=1)
  done
  echo
  echo "CUDA: $("$nvcc" --version | tail -1); nvcc ${nvcc_flags[*]} -c"
  unit=bench/compile_time/training_cuda.cpp
  kernels() { python3 bench/cuda_kernels.py --count "$1"; }
  printf '%-44s %10s %8s %8s\n' "CUDA training program" "CPU s" "kernels" "budget"
  # What every header-only nvcc unit pays before it uses anything: the kernels the library's
  # inline functions name (nvcc compiles them whether or not the unit calls those functions).
  t=$(median_cpu "$nvcc" "${nvcc_flags[@]}" -x cu -c bench/compile_time/header_only.cpp \
    -o "$out/alone.o")
  printf '%-44s %10s %8s %8s\n' "nvcc, tessera.hpp alone (header-only)" "$t" \
    "$(kernels "$out/alone.o")" -
  t=$(median_cpu "$nvcc" "${nvcc_flags[@]}" -x cu -c "$unit" -o "$out/header.o")
  printf '%-44s %10s %8s %8s\n' "nvcc, header-only" "$t" "$(kernels "$out/header.o")" 60
  t=$(median_cpu "$nvcc" "${nvcc_flags[@]}" -DTESSERA_COMPILED=1 -x cu -c "$unit" -o "$out/compiled.o")
  printf '%-44s %10s %8s %8s\n' "nvcc, compiled mode" "$t" "$(kernels "$out/compiled.o")" 30
  t=$(median_cpu "$cxx" "${gxx_cuda_flags[@]}" -DTESSERA_COMPILED=1 -c "$unit" -o "$out/gxx.o")
  printf '%-44s %10s %8s %8s\n' "g++ .cpp, compiled mode (CUDA library)" "$t" - 8
  saved_runs=$runs
  runs=1
  # The library's two units (cmake/tesseraCompiled.cmake): the main one and the primitives'.
  t=$(median_cpu "$nvcc" "${nvcc_flags[@]}" -DTESSERA_COMPILED=1 -DTESSERA_IMPLEMENTATION=1 \
    -x cu -c cmake/tessera_compiled.cpp -o "$out/library.o")
  p=$(median_cpu "$nvcc" "${nvcc_flags[@]}" -DTESSERA_COMPILED=1 \
    -x cu -c cmake/tessera_cuda_primitives.cpp -o "$out/primitives.o")
  runs=$saved_runs
  printf '%-44s %10s %8s %8s\n' "tessera::compiled with CUDA (once, 1 run)" \
    "$(python3 -c "print(round($t + $p, 2))")" \
    "$(python3 bench/cuda_kernels.py --count "$out/library.o" "$out/primitives.o")" 300
  printf '%-44s %10s %8s %8s\n' "  main unit / primitives' unit" "$t / $p" \
    "$(kernels "$out/library.o") / $(kernels "$out/primitives.o")" -
fi
