#!/usr/bin/env bash
# Registers, shared memory and spills of every kernel instantiation, as ptxas compiles them for
# sm_90 (H100). Fails if any bf16 or fp32 instantiation spills (fp64 ones exist for checking and
# may), or if a kernel with __launch_bounds__ needs more registers than its block can have
# (registers x threads > 65536 per block).
#
#   bench/ptxas_report.sh [SOURCE.cu]     (default: bench/kernels_bench.cu, which instantiates
#                                          every kernel of the model for bf16, fp32 and fp64)
set -euo pipefail
cd "$(dirname "$0")/.."
source_file="${1:-bench/kernels_bench.cu}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVCC="$CUDA_HOME/bin/nvcc"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-x cu -std=c++20 -O2 -I. -isystem "$CUDA_HOME/include")
"$NVCC" "${flags[@]}" -gencode arch=compute_90,code=sm_90 -Xptxas -v -c "$source_file" -o "$work/k.o" 2> "$work/ptxas.log"
"$NVCC" "${flags[@]}" -arch=compute_90 -ptx "$source_file" -o "$work/k.ptx"

# Launch bounds from the PTX: ".entry NAME(" ... ".maxntid X, Y, Z".
awk '/^\.(visible )?\.entry/ { name = $NF; sub(/\(.*/, "", name) }
     /\.maxntid/ { gsub(/,/, ""); print name, $2 * $3 * $4 }' "$work/k.ptx" > "$work/bounds"

awk -v bounds="$work/bounds" '
  BEGIN { while ((getline line < bounds) > 0) { split(line, f, " "); maxntid[f[1]] = f[2] } }
  /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
  /bytes spill stores/ { spill[fn] = $5 + $9 }
  /Used [0-9]+ registers/ {
    regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
    smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART); sub(/ bytes smem.*/, "", smem) }
    print fn, regs, smem, spill[fn] + 0, (fn in maxntid) ? maxntid[fn] : 0
  }' "$work/ptxas.log" | sort -u > "$work/table"

failures=0
printf "%-6s %5s %8s %6s %7s  %s\n" "dtype" "regs" "smem(B)" "spill" "bounds" "kernel (sm_90)"
while read -r mangled regs smem spill bound; do
  name=$(echo "$mangled" | c++filt)
  args="${name#*<}"; args="${args%%(*}"
  dtype="fp32"
  case "$args" in *double*) dtype="fp64" ;; esac
  case "$args" in *bfloat16*) dtype="bf16" ;; esac
  [[ "$name" == *"<"* ]] || dtype="-"
  verdict=""
  if [[ "$spill" -gt 0 && "$dtype" != "fp64" ]]; then verdict="  <- SPILLS"; failures=$((failures + 1)); fi
  if [[ "$bound" -gt 0 && $((regs * bound)) -gt 65536 ]]; then
    verdict="$verdict  <- $regs registers x $bound threads exceeds 65536"; failures=$((failures + 1))
  fi
  printf "%-6s %5s %8s %6s %7s  %s%s\n" "$dtype" "$regs" "$smem" "$spill" "${bound/#0/-}" "$name" "$verdict"
done < "$work/table"
if [[ $failures -gt 0 ]]; then
  echo "ptxas-report: $failures problem(s)"; exit 1
fi
echo "ptxas-report: no bf16/fp32 spills; launch bounds respected"
