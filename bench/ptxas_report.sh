#!/usr/bin/env bash
# Registers, shared memory, spills and occupancy of every kernel instantiation as ptxas compiles
# them for sm_90 (H100), and what their SASS is made of. Fails if
# - any bf16 or fp32 instantiation spills (fp64 ones exist for checking and may), or a kernel with
#   __launch_bounds__ needs more registers than its block can have (registers x threads > 65536);
# - a bf16 tensor-core kernel (TENSOR_CORE_KERNELS) has no HMMA instruction, or a bf16
#   bandwidth-bound kernel (VECTOR_KERNELS) has no 128-bit global load (LDG.E.128): the SASS, read
#   with cuobjdump -sass, shows whether the code does what the performance model assumes;
# - the tensor-core attention kernels' tile loops cannot be counted (bench/attention_sass.py, which
#   prints each one's instructions per warp and tile by class, per HMMA, and its issue ceiling);
# - an attention kernel programs run spills when compiled for sm_80 (bench/sass/attention_variants.cu
#   is compiled for sm_80 too: the SASS an A100 runs and, by binary compatibility, the sm_86/sm_89
#   GPUs; attention_sass.py counts it as well), but for the ones SM80_SPILLS_ALLOWED names.
# cuobjdump is not in the toolkit image: it is installed from PyPI (nvidia-cuda-cuobjdump, pinned)
# into build/sass-tools on first use; set CUOBJDUMP to use another.
#
# Occupancy per SM (sm_90: 65536 registers, 228 KiB shared memory, 2048 threads, 32 blocks): warps
# the registers allow (registers rounded up to 8 per thread), and for kernels with launch bounds the
# resident blocks: min(by threads, by registers, by shared memory (static, plus 1 KiB reserved per
# block), 32). Dynamic shared memory is chosen at launch and not counted here.
#
#   bench/ptxas_report.sh [--attention-header OUT.h] [SOURCE.cu ...]
#     SOURCE.cu: default bench/kernels_bench.cu, which instantiates every kernel of the model for
#                bf16, fp32 and fp64; model/attention_kernels.cu, where the attention kernels are
#                compiled once (every head dim they dispatch to; kernels/attention_instances.h); and
#                bench/sass/attention_variants.cu, the same kernels with one tile body each, which
#                bench/attention_sass.py counts
#     --attention-header: write the attention tile loops' counts as model/attention_sass.h's table
#                (make attention-sass writes that file; make sass-check compares)
# The compiles go through ccache when it is installed (their ptxas output is cached with them).
set -euo pipefail
cd "$(dirname "$0")/.."
attention_header=()
if [[ "${1:-}" == "--attention-header" ]]; then
  attention_header=(--header "$(realpath -m "${2:?--attention-header needs a file}")"); shift 2
fi
sources=("$@")
[[ ${#sources[@]} -gt 0 ]] || sources=(bench/kernels_bench.cu model/attention_kernels.cu bench/sass/attention_variants.cu)
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVCC=("$CUDA_HOME/bin/nvcc")
if command -v ccache > /dev/null; then NVCC=(env CCACHE_NOHASHDIR=true ccache "${NVCC[@]}"); fi
# Kernels whose bf16 instantiations must use tensor cores, and those that must load 16 bytes at
# once: extended regular expressions matched against the demangled name, '~' standing for a space
# (each must match at least one bf16 instantiation). The vector kernels are the 16-byte instantiations (W = 8 for bf16) of
# the elementwise loop and the row kernels.
TENSOR_CORE_KERNELS="${TENSOR_CORE_KERNELS:-attention_mma_forward_kernel< attention_mma_dkv_kernel< attention_mma_dq_kernel<}"
VECTOR_KERNELS="${VECTOR_KERNELS:-elementwise_kernel<pv::Swiglu.*,~8, elementwise_kernel<pv::Rope.*,~8, rmsnorm_forward_kernel<__nv_bfloat16,~8 rmsnorm_backward_kernel<__nv_bfloat16,~8 cross_entropy_forward_kernel<__nv_bfloat16,~8 cross_entropy_loss_and_gradient_kernel<__nv_bfloat16,~8 embedding_sum_kernel<__nv_bfloat16,~8 sum_of_squares_partials_kernel<__nv_bfloat16,~true attention_backward_dot_kernel<__nv_bfloat16,~8}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-x cu -std=c++20 -O2 -I. -isystem "$CUDA_HOME/include")
# Each source's object and ptxas log; the reports below read them together. (One compile per
# source: the launch bounds come from the object's ELF below, not from a second pass to PTX.)
# The compiles run at once: each is single-threaded and about as long as the others (40-50 s cold
# on a 2-core machine at -O2), and `make -j2 everything sass-check` starts this script only when
# its last other job has started, so compiled one after another they were a tail with one core idle.
# A compile that fails shows its own output.
compiles=()  # "PID<TAB>LOG"
compile() {  # ARCH SOURCE OBJECT LOG
  "${NVCC[@]}" "${flags[@]}" -gencode "arch=compute_$1,code=sm_$1" -Xptxas -v -c "$2" -o "$3" 2> "$4" &
  compiles+=("$!"$'\t'"$4")
}
for i in "${!sources[@]}"; do compile 90 "${sources[$i]}" "$work/k$i.o" "$work/ptxas$i.log"; done
# The attention kernels for sm_80 as well, when their single-body variants are among the sources.
sm80_source=bench/sass/attention_variants.cu
sm80=false
for source in "${sources[@]}"; do [[ "$source" == "$sm80_source" ]] && sm80=true; done
if $sm80; then compile 80 "$sm80_source" "$work/a80.o" "$work/ptxas-sm80.log"; fi
compile_failed=false
for c in "${compiles[@]}"; do
  if ! wait "${c%%$'\t'*}"; then
    cat "${c#*$'\t'}" >&2; compile_failed=true
  fi
done
if $compile_failed; then echo "ptxas-report: a compile failed (above)" >&2; exit 1; fi
for i in "${!sources[@]}"; do cat "$work/ptxas$i.log"; done > "$work/ptxas.log"

# cuobjdump (and the nvdisasm it runs): from $CUOBJDUMP, or pinned wheels in a virtual environment
# in build/sass-tools (Debian's python3 has no pip of its own; python3-venv gives the environment one).
if [[ -z "${CUOBJDUMP:-}" ]]; then
  tools=build/sass-tools
  CUOBJDUMP=$(find "$tools" -name cuobjdump -type f 2>/dev/null | head -1 || true)
  if [[ -z "$CUOBJDUMP" || -z "$(find "$tools" -name nvdisasm -type f 2>/dev/null)" ]]; then
    rm -rf "$tools"
    python3 -m venv "$tools" ||
      { echo "ptxas-report: python3 -m venv failed: install Python 3 with its venv module (Debian: python3-venv)"; exit 1; }
    "$tools/bin/pip" install --quiet --disable-pip-version-check --no-input --no-deps nvidia-cuda-cuobjdump==13.2.86 \
      nvidia-cuda-nvdisasm==13.2.86
    CUOBJDUMP=$(find "$tools" -name cuobjdump -type f | head -1)
  fi
  export PATH="$(dirname "$(find "$tools" -name nvdisasm -type f | head -1)"):$PATH"
fi
# Per function: HMMA instructions and 128-bit global loads.
for i in "${!sources[@]}"; do "$CUOBJDUMP" -sass "$work/k$i.o"; done > "$work/k.sass"
if $sm80; then "$CUOBJDUMP" -sass "$work/a80.o" > "$work/k80.sass"; fi
awk '
  /Function : / { fn = $NF; hmma[fn] += 0; ldg[fn] += 0 }
  /HMMA/ { hmma[fn]++ }
  /LDG\.E\.128/ { ldg[fn]++ }
  END { for (f in hmma) print f, hmma[f], ldg[f] }' "$work/k.sass" > "$work/sass"

# Launch bounds from the objects' ELF: each kernel's ".nv.info.NAME" section holds an
# EIATTR_MAX_THREADS attribute (its value the three block dimensions, in hex) when the kernel has
# __launch_bounds__. (mawk, Debian's awk, has no strtonum: the hex is read by hand.)
for i in "${!sources[@]}"; do "$CUOBJDUMP" -elf "$work/k$i.o"; done |
  awk 'function hex(s,  v, i) { s = tolower(s); sub(/^0x/, "", s); v = 0
                                for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
                                return v }
       /^\.nv\.info\./ { name = substr($1, 10); next }
       /EIATTR_MAX_THREADS/ { bound = 1; next }
       bound && /Value:/ { print name, hex($2) * hex($3) * hex($4); bound = 0 }' | sort -u > "$work/bounds"

# Per kernel of a ptxas log: mangled name, registers, static shared memory, spilled bytes, launch
# bound, HMMA and 128-bit global loads (the last three from the files named, /dev/null for none).
kernel_table() {  # LOG BOUNDS SASS_SUMMARY
  awk -v bounds="$2" -v sass="$3" '
  BEGIN { while ((getline line < bounds) > 0) { split(line, f, " "); maxntid[f[1]] = f[2] }
          while ((getline line < sass) > 0) { split(line, f, " "); hmma[f[1]] = f[2]; ldg[f[1]] = f[3] } }
  /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
  /bytes spill stores/ { spill[fn] = $5 + $9 }
  /Used [0-9]+ registers/ {
    regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
    smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART); sub(/ bytes smem.*/, "", smem) }
    print fn, regs, smem, spill[fn] + 0, (fn in maxntid) ? maxntid[fn] : 0, hmma[fn] + 0, ldg[fn] + 0
  }' "$1" | sort -u
}
kernel_table "$work/ptxas.log" "$work/bounds" "$work/sass" > "$work/table"
if $sm80; then kernel_table "$work/ptxas-sm80.log" /dev/null /dev/null > "$work/table80"; fi

failures=0
printf "%-6s %5s %8s %6s %7s %9s %10s %5s %8s  %s\n" "dtype" "regs" "smem(B)" "spill" "bounds" "warps/SM" "blocks/SM" "HMMA" "LDG.128" "kernel (sm_90)"
while read -r mangled regs smem spill bound hmma ldg; do
  name=$(echo "$mangled" | c++filt)
  args="${name#*<}"; args="${args%%(*}"
  # The storage type from the template arguments; a kernel whose template arguments name no type
  # (attention_mma_forward_kernel<64>) takes it from its parameters.
  [[ "$args" == *float* || "$args" == *double* || "$args" == *bfloat16* ]] || args="${name#*(}"
  dtype="fp32"
  case "$args" in *double*) dtype="fp64" ;; esac
  case "$args" in *bfloat16*) dtype="bf16" ;; esac
  [[ "$name" == *"<"* ]] || dtype="-"
  base="${name%%<*}"; base="${base%%(*}"; base="${base##*::}"; base="${base##* }"
  rounded=$(( (regs + 7) / 8 * 8 )); [[ $rounded -eq 0 ]] && rounded=8
  warps=$(( 65536 / (rounded * 32) )); [[ $warps -gt 64 ]] && warps=64
  blocks="-"
  if [[ "$bound" -gt 0 ]]; then
    by_threads=$(( 2048 / bound ))
    by_regs=$(( 65536 / (rounded * bound) ))
    by_smem=$(( 233472 / (smem + 1024) ))
    blocks=$(( by_threads < by_regs ? by_threads : by_regs )); blocks=$(( blocks < by_smem ? blocks : by_smem ))
    blocks=$(( blocks < 32 ? blocks : 32 ))
  fi
  verdict=""
  if [[ "$spill" -gt 0 && "$dtype" != "fp64" ]]; then verdict="  <- SPILLS"; failures=$((failures + 1)); fi
  if [[ "$bound" -gt 0 && $((regs * bound)) -gt 65536 ]]; then
    verdict="$verdict  <- $regs registers x $bound threads exceeds 65536"; failures=$((failures + 1))
  fi
  for pattern in $TENSOR_CORE_KERNELS; do
    if [[ "$dtype" == "bf16" && "$name" =~ ${pattern//\~/ } && "$hmma" -eq 0 ]]; then
      verdict="$verdict  <- no tensor-core (HMMA) instruction"; failures=$((failures + 1))
    fi
  done
  for pattern in $VECTOR_KERNELS; do
    if [[ "$dtype" == "bf16" && "$name" =~ ${pattern//\~/ } && "$ldg" -eq 0 ]]; then
      verdict="$verdict  <- no 128-bit global load"; failures=$((failures + 1))
    fi
  done
  printf "%-6s %5s %8s %6s %7s %9s %10s %5s %8s  %s%s\n" "$dtype" "$regs" "$smem" "$spill" "${bound/#0/-}" "$warps" "$blocks" "$hmma" "$ldg" "$name" "$verdict"
done < "$work/table"
# Every pattern in the two lists must match a bf16 instantiation (a renamed kernel must not pass
# unchecked). The names are demangled into a file first: `c++filt | grep -q` under pipefail fails
# whenever grep's early exit cuts c++filt's output short (SIGPIPE), a match reported as none.
awk '{print $1}' "$work/table" | c++filt > "$work/names"
for pattern in $TENSOR_CORE_KERNELS $VECTOR_KERNELS; do
  if ! grep -E -q "${pattern//\~/ }" "$work/names"; then
    echo "ptxas-report: no kernel matches '$pattern'"; failures=$((failures + 1))
  fi
done
# sm_80: the attention kernels programs run (Path 0) must not spill there either, but for those
# SM80_SPILLS_ALLOWED names (extended regular expressions against the demangled name, '~' a space;
# figures from nvcc 13):
# - at hd 112, a head dim no Llama-family checkpoint has, dK/dV (40 bytes of spill stores and loads)
#   and dQ (16): a few local loads and stores per tile pair of some 900 and 600 instructions;
# - dK/dV with swizzled rows at hd 128 (what sm_86/sm_89 run there), 44 bytes of spill stores and 52
#   of loads unsplit, 8 and 12 split: since the tile copies' zero-fill became cp.async's ignore-src
#   (no selects) the unsplit kernel spills too, yet its single-body counts, local loads and stores
#   included, fell (interior 996 -> 961 instructions a tile pair, masked 1,358 -> 1,323);
# - dQ with warps of 32 rows at hd 64 (what an A100 runs; sm_86/sm_89 keep 16 rows), 40 bytes of
#   spill stores and 44 of loads unsplit, 52 and 60 split: its interior tile pair takes 641
#   instructions for 192 HMMA (3.34 a HMMA, local loads and stores included), 11% fewer per HMMA
#   than the 16-row kernel's 362 for 96 (model/attention_sass.h counts them);
# - dK/dV with warps of 32 keys at hd 64, 100 bytes of spill stores and loads unsplit, 172 split: no
#   GPU that runs sm_80 code runs it (attention_mma_dkv_row_tiles gives 2 only where an SM holds four
#   57,856-byte blocks, 226 KiB: an H100's, not an A100's 164 KiB or sm_86/sm_89's 100).
# test_attention checks the kernels' results. The single-body variants are instruments, not
# programs: a spill there is listed, not failed (their counts include its local loads and stores).
SM80_SPILLS_ALLOWED="${SM80_SPILLS_ALLOWED-attention_mma_dkv_kernel<112,~0, attention_mma_dq_kernel<112,~0, attention_mma_dkv_kernel<128,~0,~.pv::AttentionMmaRows.1, attention_mma_dq_kernel<64,~0,~[a-z]+,~2> attention_mma_dkv_kernel<64,~0,~.pv::AttentionMmaRows.0,~[a-z]+,~2>}"
if $sm80; then
  echo
  printf "%5s %6s  %s\n" "regs" "spill" "attention kernel (sm_80)"
  while read -r mangled regs smem spill bound hmma ldg; do
    name=$(echo "$mangled" | c++filt)
    [[ "$name" =~ attention_mma_(forward|dkv|dq)_kernel\<[0-9]+,\ ([0-9]) ]] || continue
    verdict=""
    if [[ "${BASH_REMATCH[2]}" != 0 ]]; then
      [[ "$spill" -gt 0 ]] && verdict="  (a single-body variant: spills, counted)"
    elif [[ "$spill" -gt 0 ]]; then
      verdict="  <- SPILLS"
      for pattern in $SM80_SPILLS_ALLOWED; do
        [[ "$name" =~ ${pattern//\~/ } ]] && verdict="  (spills: allowed, SM80_SPILLS_ALLOWED)"
      done
      [[ "$verdict" == *"<-"* ]] && failures=$((failures + 1))
    fi
    printf "%5s %6s  %s%s\n" "$regs" "$spill" "$name" "$verdict"
  done < "$work/table80"
fi

# The attention kernels' tile loops by instruction class, instructions per HMMA and the issue
# ceiling (bench/attention_sass.py; it fails on an inner loop whose trip count it cannot know).
echo
if [[ ${#attention_header[@]} -gt 0 ]]; then
  attention_header+=(--compiler "$("$CUDA_HOME/bin/nvcc" --version | tail -n 1)")
fi
attention_sass=(90="$work/k.sass" --registers 90="$work/table")
if $sm80; then attention_sass+=(80="$work/k80.sass" --registers 80="$work/table80"); fi
python3 bench/attention_sass.py "${attention_sass[@]}" "${attention_header[@]}" || failures=$((failures + 1))
if [[ $failures -gt 0 ]]; then
  echo "ptxas-report: $failures problem(s)"; exit 1
fi
echo "ptxas-report: no bf16/fp32 spills; launch bounds respected; tensor-core and 128-bit-load kernels as required"
