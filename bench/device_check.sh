#!/usr/bin/env bash
# Runs on a lent GPU machine what bench/device_pack.sh packed on the CPU machine, in one go and
# within about 8 minutes: the CUDA tests, the g++ unit that trains on CUDA, DLPack's CUDA test,
# PyTorch's baseline and cuda_bench, whose ratios torch / tessera it prints with its rows.
# Results go to $OUT (or build/device/out) as text and JSON.
#   bash bench/device_check.sh [pack.tar.xz=build/device/pack.tar.xz]
# A short run: TESSERA_DEVICE_SKIP="cuda_gxx_tests torch_profile host_time ncu_resnet50 ncu_rows" skips
# those parts, TESSERA_DEVICE_PARTS="part ..." runs only those, and TESSERA_DEVICE_BENCH_FILTER=regex
# runs only those cuda_bench rows.
# Mixed precision (issue 42): the parts torch_amp (cuda_torch_baseline.py --amp) and cuda_amp_bench
# run only when asked for, by TESSERA_DEVICE_AMP=1 (after the others, within the total: in a call
# of its own, TESSERA_DEVICE_PARTS="torch_amp cuda_amp_bench" alone, about 3 minutes).
# Each part has its own time limit (TESSERA_DEVICE_TEST_S, _TORCH_S, _TORCH_PROFILE_S, _BENCH_S,
# _HOST_TIME_S, _PROFILE_S: 240, 90, 60, 240, 60, 100; the CUDA tests take about 85 s on an H100);
# a part that fails or runs out is reported and the next one still runs. The whole run keeps
# within TESSERA_DEVICE_TOTAL_S (default 530, under the device tool's 560-600 s call): a part gets
# at most the time left (less 20 s for packing the results) and is skipped with under 15 s, so
# the results are always packed. The parts run most needed first: the tests, PyTorch's baseline,
# cuda_bench; then the profiles that explain its figures; the host's call times last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pack=${1:-build/device/pack.tar.xz}
out=${OUT:-build/device/out}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar xJf "$pack" -C "$work" || { echo "device_check: cannot unpack $pack"; exit 1; }
dir=$work/pack
export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "device_check: binaries of $(cat "$dir/commit")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 |
  tee "$out/gpu.txt"

status=0
total_s=${TESSERA_DEVICE_TOTAL_S:-530}
part() {  # name, seconds, command...
  local name=$1 seconds=$2
  shift 2
  if [[ " ${TESSERA_DEVICE_SKIP:-} " == *" $name "* ]]; then
    echo "==== $name: skipped (TESSERA_DEVICE_SKIP)"
    return
  fi
  if [ -n "${TESSERA_DEVICE_PARTS:-}" ] && [[ " $TESSERA_DEVICE_PARTS " != *" $name "* ]]; then
    return
  fi
  local left=$((total_s - SECONDS - 20))
  if [ "$left" -lt 15 ]; then
    echo "==== $name: skipped (out of time: TESSERA_DEVICE_TOTAL_S=$total_s)"
    status=1
    return
  fi
  [ "$seconds" -gt "$left" ] && seconds=$left
  local start=$SECONDS
  echo
  echo "==== $name (limit ${seconds} s)"
  timeout "$seconds" "$@" > >(tee "$out/$name.txt") 2>&1
  local rc=$?
  # 77: passed, with test cases that skipped (TESSERA_SKIP: e.g. one GPU where a case needs two).
  echo "==== $name: exit $rc after $((SECONDS - start)) s$([ "$rc" -eq 77 ] && echo ' (some cases skipped, nothing failed)')"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || status=1
}

part cuda_tests "${TESSERA_DEVICE_TEST_S:-240}" "$dir/bin/tessera_cuda_tests" -r compact
part cuda_gxx_tests 60 "$dir/bin/tessera_cuda_gxx_tests" -r compact
part cuda_dlpack_tests 30 "$dir/bin/tessera_io_dlpack_cuda_tests" -r compact
part torch_baseline "${TESSERA_DEVICE_TORCH_S:-90}" python3 "$dir/cuda_torch_baseline.py" \
  "$out/torch.json"
baseline=()
[ -s "$out/torch.json" ] && baseline=(env "TESSERA_TORCH_BASELINE=$out/torch.json")
part cuda_bench "${TESSERA_DEVICE_BENCH_S:-240}" "${baseline[@]}" "$dir/bin/cuda_bench" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/cuda_bench.json" --benchmark_out_format=json \
  "--benchmark_filter=${TESSERA_DEVICE_BENCH_FILTER:-.}"
# PyTorch's step by kernel at batch 32, to set beside cuda_bench's by-node table of the batch-32
# step (ts::tools::Profile, printed with the BM_resnet50_step_tessera/32/* rows), and at batch 8
# (beside ncu_resnet50's kernel list).
part torch_profile_b32 "${TESSERA_DEVICE_TORCH_PROFILE_S:-60}" python3 bench/torch_profile.py 32 3
part torch_profile "${TESSERA_DEVICE_TORCH_PROFILE_S:-60}" python3 bench/torch_profile.py 8 5
# NVRTC's cost with the driver's load of the cubin, which only a GPU machine measures (issue 45).
[ -x "$dir/bin/nvrtc_cost" ] && part nvrtc_cost 60 "$dir/bin/nvrtc_cost" 5
# Why the row reductions run below the copy's bandwidth (issue 41, item 1): ncu's speed of light,
# memory, occupancy, launch and warp-stall sections of the first launch of each BM_row_sum form
# (sum(x, 2), sum(x * x, 2), sum((x - m)^2, 2) over [32, 256, 3136]) and of sum(a * b)'s first
# block pass, and of sum(x, 2) with a warp per row (BM_row_sum_lanes/0/32), into ncu_rows.txt.
# TESSERA_DEVICE_NCU_ROWS_S=0 skips it.
rows_s=${TESSERA_DEVICE_NCU_ROWS_S:-110}
if [ "$rows_s" -gt 0 ] && command -v ncu >/dev/null 2>&1; then
  # (part runs its command under timeout, which runs programs, not shell functions: bash -c.)
  part ncu_rows "$rows_s" bash -c '
    for form in BM_row_sum/0 BM_row_sum/1 BM_row_sum/2 BM_row_sum_lanes/0/32 BM_sum_product; do
      echo "---- $form"
      ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        -k "regex:reduce_(rows|all)_kernel" --launch-count 1 \
        "$1" "--benchmark_filter=$form" --benchmark_min_time=0.05 || exit 1
    done' ncu_rows "$dir/bin/cuda_bench"
fi
# Where a ResNet-50 step's GPU time goes: ncu times every kernel of about one step at batch 8
# (launches 3000-4199, past the model's creation and the first steps) and kernel_profile.py sums
# them by kernel; TESSERA_DEVICE_PROFILE_S=0 skips it.
profile_s=${TESSERA_DEVICE_PROFILE_S:-100}
if [ "$profile_s" -gt 0 ] && command -v ncu >/dev/null 2>&1; then
  part ncu_resnet50 "$profile_s" ncu --clock-control none --metrics gpu__time_duration.sum \
    --print-units base --csv --launch-skip 3000 --launch-count 1200 --log-file "$out/ncu.csv" \
    "$dir/bin/cuda_bench" --benchmark_filter='BM_resnet50_step_tessera/8/1'
  [ -s "$out/ncu.csv" ] && python3 bench/kernel_profile.py "$out/ncu.csv" | tee "$out/profile.txt"
fi
# Where the host's time goes in a ResNet-50 step at batch 8: the time inside each CUDA, cuDNN and
# cuBLAS call (bench/host_time.c, preloaded; a step makes 53 cuDNN forward calls), and samples of
# the host's call stacks (host_samples.txt: bench/host_profile.py sums them by function, on the
# CPU machine, where addr2line has the same binary).
if [ -f "$dir/lib/host_time.so" ]; then
  part host_time "${TESSERA_DEVICE_HOST_TIME_S:-60}" env LD_PRELOAD="$dir/lib/host_time.so" \
    HOST_TIME_OUT="$out/host_time_calls.txt" HOST_TIME_SAMPLES="$out/host_samples.txt" \
    "$dir/bin/cuda_bench" \
    --benchmark_filter='BM_resnet50_step_tessera/8/1' --benchmark_min_time=2
  [ -s "$out/host_time_calls.txt" ] && cat "$out/host_time_calls.txt"
fi

# Mixed precision (issue 42): PyTorch's AMP rows, then cuda_amp_bench against them and against
# PyTorch's float32 rows above (when torch_baseline ran).
if [ "${TESSERA_DEVICE_AMP:-0}" = 1 ] || [[ " ${TESSERA_DEVICE_PARTS:-} " == *" torch_amp "* ]] ||
   [[ " ${TESSERA_DEVICE_PARTS:-} " == *" cuda_amp_bench "* ]]; then
  part torch_amp "${TESSERA_DEVICE_TORCH_AMP_S:-150}" python3 "$dir/cuda_torch_baseline.py" --amp \
    "$out/torch_amp.json"
  amp_baseline=()
  for json in "$out/torch.json" "$out/torch_amp.json"; do
    [ -s "$json" ] && amp_baseline+=("$json")
  done
  amp_env=()
  [ ${#amp_baseline[@]} -gt 0 ] && amp_env=(env "TESSERA_TORCH_BASELINE=$(IFS=:; echo "${amp_baseline[*]}")")
  part cuda_amp_bench "${TESSERA_DEVICE_AMP_BENCH_S:-300}" "${amp_env[@]}" "$dir/bin/cuda_amp_bench" \
    --benchmark_out="$out/cuda_amp_bench.json" --benchmark_out_format=json
fi
# The device tool brings back at most 8 files from $OUT: everything goes into results.tar.xz, and
# the files read first stay beside it.
if [ -n "${OUT:-}" ]; then
  tar cJf "$work/results.tar.xz" -C "$out" . &&
    find "$out" -maxdepth 1 -type f ! -name cuda_tests.txt ! -name cuda_bench.txt \
      ! -name torch_baseline.txt ! -name profile.txt ! -name ncu_rows.txt ! -name gpu.txt \
      ! -name cuda_amp_bench.txt -delete &&
    mv "$work/results.tar.xz" "$out/"
fi
echo
echo "device_check: results in $out; $([ "$status" -eq 0 ] && echo 'every part passed' || echo 'a part FAILED')"
exit "$status"
