#!/usr/bin/env bash
# What a session does with a lent GPU (issue 31, "measured on a GPU"), prepared so that the device
# time goes to measuring: each phase prints its figures and keeps its logs under OUT, and phases can
# be run alone, so the work splits over calls that each fit the device's per-call limit.
#
#   bench/gpu_session.sh [PHASE...]      default: build tests kernels train ncu
#
#   build    make BACKEND ($BACKEND, default cuda) everything, timed; on cuda SASS for sm_90 alone
#            (SASS_ARCHS, default 90: the H100's and H200's; the Makefile's default adds sm_80's, a
#            second device-code pass per file the lent GPU never runs) in build/cuda-sm90
#   tests    every one-rank test binary with the filter a single GPU can run (no MPI ranks, no
#            host-only, sanitizer or hidden cases), each under a time limit; a line per binary
#   kernels  kernels_bench at the 1B shape (head dim 64) and the 8B shape (head dim 128), T = 2048
#            and 8192, one sequence of 2048 (the split dK/dV), and one rank of the 8B shape under
#            --tp 8 at one sequence of 4096 (every attention kernel split), beside perf_model's
#            predicted kernel times (its last table: the splits per layer)
#   train    the default run and Llama-3.2-1B full at 4 x 2048 (two micro-batches a step), each
#            eager and with --cuda-graphs, and Llama-3.1-8B QLoRA r 16 at 4 x 2048: ms per step and
#            tokens/s over the steps after the first (metrics.jsonl)
#   ncu      Nsight Compute on the three attention kernels at the 1B shape, where ncu is installed
#
# Environment: OUT (default: a new directory under /tmp), BACKEND (cuda), SASS_ARCHS (90), JOBS (make -j; nproc),
# TEST_LIMIT (seconds per test binary, 240), STEPS (train steps, 4), SHAPES_1B / SHAPES_8B (the
# kernels_bench shapes, default llama-3.2-1b / llama-3.1-8b), TRAIN_PRESET_1B / TRAIN_PRESET_8B
# (default the same presets), SEQ (the train runs' sequence length, 2048), KERNEL_SEQS (the
# kernels_bench sequence lengths, "2048 8192": batch 4 and 1 at the first, 1 at the others), TP_SPEC
# (the tensor-parallel rank's kernels_bench run: shape, batch, seq, ranks; "SHAPES_8B 1 4096 8").
# On the host flavour (BACKEND=host) it runs too, at whatever shapes the environment names: that is
# how the script itself is checked.
set -uo pipefail
backend="${BACKEND:-cuda}"
out="${OUT:-$(mktemp -d /tmp/polevault_gpu.XXXXXX)}"
jobs="${JOBS:-$(nproc)}"
limit="${TEST_LIMIT:-240}"
steps="${STEPS:-4}"
seq="${SEQ:-2048}"
kernel_seqs="${KERNEL_SEQS:-2048 8192}"
shape_1b="${SHAPES_1B:-llama-3.2-1b}"
shape_8b="${SHAPES_8B:-llama-3.1-8b}"
preset_1b="${TRAIN_PRESET_1B:-llama-3.2-1b}"
preset_8b="${TRAIN_PRESET_8B:-llama-3.1-8b}"
sass_archs="${SASS_ARCHS:-90}"
# The Makefile's folder for these settings (SASS_ARCHS other than its default "80 90" get one of their own).
build=$(make --no-print-directory -s BACKEND="$backend" SASS_ARCHS="$sass_archs" print-build-dir)
phases=("$@")
[[ ${#phases[@]} -eq 0 ]] && phases=(build tests kernels train ncu)
mkdir -p "$out"
echo "gpu_session: $backend build, logs in $out"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# mean of a metrics.jsonl field over steps 2..
mean_of() {
  awk -v key="\"$2\": " '$0 ~ key { split($0, p, key); split(p[2], a, /[,}]/); n++; if (n > 1) { s += a[1]; k++ } }
                         END { if (k) printf "%.1f", s / k; else print "n/a" }' "$1"
}

phase_build() {
  local start=$SECONDS
  if make -j"$jobs" BACKEND="$backend" SASS_ARCHS="$sass_archs" everything > "$out/build.log" 2>&1; then
    echo "build: $((SECONDS - start)) s ($build)"
  else
    echo "build: FAILED after $((SECONDS - start)) s (tail of $out/build.log):"
    tail -20 "$out/build.log"
    return 1
  fi
}

phase_tests() {
  local filter='~[.]~[host-only]~[asan]~[tsan]~[mpi]' passed=0 failed=0
  for t in "$build"/test/test_*; do
    [[ -x "$t" && ! -d "$t" ]] || continue
    local name start=$SECONDS
    name=$(basename "$t")
    if timeout "$limit" "$t" "$filter" > "$out/$name.log" 2>&1; then
      passed=$((passed + 1))
      echo "tests: $name passed ($((SECONDS - start)) s)"
    else
      failed=$((failed + 1))
      echo "tests: $name FAILED, exit $? ($((SECONDS - start)) s): $(grep -m1 -E 'FAILED|REQUIRE|error' "$out/$name.log")"
    fi
  done
  echo "tests: $passed binaries passed, $failed failed"
}

phase_kernels() {
  local specs=() first=1
  for t in $kernel_seqs; do
    for shape in "$shape_1b" "$shape_8b"; do specs+=("$shape $((first ? 4 : 1)) $t 1"); done
    # and one sequence at the first length: a grid the dK/dV kernel splits (attention_mma_blocks.h)
    if ((first)); then for shape in "$shape_1b" "$shape_8b"; do specs+=("$shape 1 $t 1"); done; fi
    first=0
  done
  # one rank of --tp 8 (TP_SPEC: shape, batch, seq, ranks): the forward's, dK/dV's and dQ's grids split
  specs+=("${TP_SPEC:-$shape_8b 1 4096 8}")
  for spec in "${specs[@]}"; do
    read -r shape batch t tp <<< "$spec"
    local log="$out/kernels_${shape}_${batch}x${t}_tp$tp.log"
    echo "kernels: $shape, batch $batch x $t, --tp $tp"
    "$build/bench/kernels_bench" --shape "$shape" --tp "$tp" --batch "$batch" --seq "$t" > "$log" 2>&1 ||
      echo "kernels: FAILED ($log)"
    grep -E "attention|matmul qkv|rmsnorm|swiglu|cross" "$log" | sed 's/^/  /'
  done
  "$build/bench/perf_model" --kernels > "$out/perf_model.log" 2>&1 && echo "kernels: predictions in $out/perf_model.log"
}

train_run() {  # name, flags...: one run, its mean step time and throughput after the first step
  local name="$1"
  shift
  local dir="$out/train_$name"
  if "$build/train" "$@" --sample-tokens 0 --eval-interval 0 --out-dir "$dir" > "$dir.log" 2>&1; then
    echo "train: $name: $(mean_of "$dir/metrics.jsonl" ms) ms a step, $(mean_of "$dir/metrics.jsonl" tokens_per_s) tokens/s (steps 2..)$(grep -o 'cuda graphs: .*' "$dir.log" | sed 's/^/; /')"
  else
    echo "train: $name FAILED (tail of $dir.log):"
    tail -5 "$dir.log"
  fi
}

phase_train() {
  for graphs in "" "--cuda-graphs"; do
    train_run "default${graphs:+_graphs}" --steps 30 $graphs
    train_run "1b_full${graphs:+_graphs}" --preset "$preset_1b" --batch 8 --micro-batch 4 --seq-len "$seq" \
      --steps "$steps" --warmup 1 $graphs
  done
  train_run 8b_qlora --preset "$preset_8b" --lora-rank 16 --quantize nf4 --batch 4 --micro-batch 4 --seq-len "$seq" \
    --steps "$steps" --warmup 1 --checkpoint-activations auto
}

phase_ncu() {
  if ! command -v ncu > /dev/null; then
    echo "ncu: not installed"
    return 0
  fi
  ncu --kernel-name regex:attention_mma --launch-count 3 --section SpeedOfLight --section Occupancy \
    "$build/bench/kernels_bench" --shape "$shape_1b" --batch 4 --seq "$seq" --repeat 1 > "$out/ncu.log" 2>&1
  grep -E "attention_mma|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy" "$out/ncu.log"
}

status=0
for p in "${phases[@]}"; do
  case "$p" in
    build | tests | kernels | train | ncu) "phase_$p" || status=1 ;;
    *) echo "gpu_session: unknown phase $p (build tests kernels train ncu)"; exit 2 ;;
  esac
done
exit $status
