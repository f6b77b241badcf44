#!/usr/bin/env bash
# Records, and compares, everything a refactoring must not change: the losses, learning rates,
# gradient norms and validation losses of a set of `train` runs and the sha256 of every
# safetensors file of their checkpoints. Run it with the old binary, then with the new one, and
# compare the two records:
#
#   bench/bitexact.sh record OLD_TRAIN /tmp/before    # e.g. a worktree of the commit before
#   bench/bitexact.sh record build/host/train /tmp/after
#   bench/bitexact.sh compare /tmp/before /tmp/after    # prints each difference; exits 1 on any
#
# The runs: the default run (250 steps, every default) on a fixed data directory prepared from
# TEXT (default ../shared/data/tinyshakespeare.txt), so edits to the README, docs/ and headers (the
# built-in corpus) do not move it; fp64 and bf16 runs of 4 steps under every strategy at 1, 2 and
# 4 ranks (pp also under GPipe with 2 in flight, 1F1B over 8 micro-batches and interleaved at 2
# ranks; two 1F1B stages each replicated over 2 ranks under zero1 and under zero3 with a shard
# group of 1; bf16 also with stochastic rounding and fp32 gradient accumulation); and resumes across strategies and world sizes (zero3@4 -> ddp@2, pp@4 -> zero2@2,
# ddp@2 -> single@1). BITEXACT_QUICK=1 leaves out the default run (3-4 minutes of the ~6).
# Timings (tokens/s, ms) are not compared; device bytes are listed separately and only reported.
set -euo pipefail

usage() { sed -n '2,12p' "$0" >&2; exit 2; }
[[ $# -ge 1 ]] || usage

record() {
    local train; train=$(realpath "$1")
    local out="$2"
    local text="${TEXT:-$(dirname "$0")/../../shared/data/tinyshakespeare.txt}"
    text=$(realpath "$text")
    rm -rf "$out"; mkdir -p "$out"; out=$(realpath "$out")
    local work="$out/work"; mkdir -p "$work"; cd "$work"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
    "$train" prepare "$text" --out data --vocab 512 > /dev/null

    # run NAME RANKS FLAGS...: one run; its step lines' numbers and its checkpoints' hashes.
    run() {
        local name="$1" ranks="$2"; shift 2
        local launcher=()
        if [[ $ranks -gt 1 ]]; then
            launcher=(timeout 600 mpirun -np "$ranks" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
                      -x POLEVAULT_HOST_WORKERS=1 -x OPENBLAS_NUM_THREADS=1)
        fi
        "${launcher[@]}" "$train" --data data --out-dir "runs/$name" "$@" > "$out/$name.log" 2>&1 \
            || { echo "run $name failed:"; tail -20 "$out/$name.log"; exit 1; }
        echo "  $name"
    }
    local short=(--steps 4 --warmup 1 --batch 8 --seq-len 32 --eval-interval 2 --eval-batches 2
                 --checkpoint-interval 2 --sample-tokens 8)
    echo "recording with $train into $out"
    if [[ -z "${BITEXACT_QUICK:-}" ]]; then run default 1; fi
    for dtype in fp64 bf16; do
        run "single-$dtype" 1 "${short[@]}" --dtype "$dtype"
        for ranks in 2 4; do
            for p in ddp zero1 zero2 zero3 pp; do
                run "$p$ranks-$dtype" "$ranks" "${short[@]}" --dtype "$dtype" --parallel "$p"
            done
        done
        run "pp4-gpipe-$dtype" 4 "${short[@]}" --dtype "$dtype" --parallel pp --pipeline-schedule gpipe --in-flight 2 --micro-batch 2
        run "pp4-1f1b-$dtype" 4 "${short[@]}" --dtype "$dtype" --parallel pp --micro-batch 1
        run "pp2-interleaved-$dtype" 2 "${short[@]}" --dtype "$dtype" --parallel pp --pipeline-schedule interleaved --micro-batch 2
        run "pp2-zero1-$dtype" 4 "${short[@]}" --dtype "$dtype" --parallel zero1 --pipeline-stages 2 --micro-batch 2
        run "pp2-hybrid-zero3-$dtype" 4 "${short[@]}" --dtype "$dtype" --parallel zero3 --pipeline-stages 2 --shard-group 1 --micro-batch 2
        # Resumes across strategies and world sizes: stop at step 2, continue elsewhere.
        run "resume-zero3-ddp-$dtype" 4 "${short[@]}" --dtype "$dtype" --parallel zero3 --stop-after 2
        run "resume-zero3-ddp-$dtype" 2 --resume "runs/resume-zero3-ddp-$dtype" --parallel ddp
        run "resume-pp-zero2-$dtype" 4 "${short[@]}" --dtype "$dtype" --parallel pp --stop-after 2
        run "resume-pp-zero2-$dtype" 2 --resume "runs/resume-pp-zero2-$dtype" --parallel zero2
        run "resume-ddp-single-$dtype" 2 "${short[@]}" --dtype "$dtype" --parallel ddp --stop-after 2
        run "resume-ddp-single-$dtype" 1 --resume "runs/resume-ddp-single-$dtype" --parallel single
    done
    run single-bf16-sr-acc 1 "${short[@]}" --stochastic-rounding --fp32-grad-accumulation --micro-batch 2
    run zero1-2-bf16-sr-acc 2 "${short[@]}" --stochastic-rounding --fp32-grad-accumulation --micro-batch 2 --parallel zero1

    # The record: numbers from metrics.jsonl (timings dropped), sha256 of every tensor file,
    # the final sample's text; memory apart.
    local name
    for d in runs/*/; do
        name=$(basename "$d")
        sed -E 's/, "tokens_per_s": [^,}]*//; s/, "ms": [^,}]*//; s/, "mfu": [^,}]*//; s/, "device_bytes": [^,}]*//; s/, "device_peak_bytes": [^,}]*//' \
            "$d/metrics.jsonl" | sed "s|^|$name |" >> "$out/metrics.txt"
        grep -o '"device[a-z_]*bytes": [0-9]*' "$d/metrics.jsonl" | sed "s|^|$name |" >> "$out/memory.txt" || true
        (cd "$d" && find . -name '*.safetensors' | sort | xargs sha256sum) | sed "s|^|$name |" >> "$out/tensors.txt"
        # The text after "sample (...)": identical bits give identical text.
        sed -n '/^sample (/,$p' "$out/$name.log" | sed "s|^|$name |" >> "$out/samples.txt"
    done
    rm -rf "$work"
    echo "$(wc -l < "$out/metrics.txt") metric lines, $(wc -l < "$out/tensors.txt") tensor files recorded"
}

compare() {
    local a="$1" b="$2" rc=0
    for f in metrics.txt tensors.txt samples.txt; do
        if diff -u "$a/$f" "$b/$f" > /tmp/bitexact.diff; then
            echo "$f: identical ($(wc -l < "$a/$f") lines)"
        else
            echo "$f: DIFFERENT"; cat /tmp/bitexact.diff; rc=1
        fi
    done
    if diff -q "$a/memory.txt" "$b/memory.txt" > /dev/null; then
        echo "memory.txt: identical (reported only)"
    else
        echo "memory.txt: differs (reported only):"; diff "$a/memory.txt" "$b/memory.txt" | head -40 || true
    fi
    return $rc
}

case "$1" in
    record) [[ $# -eq 3 ]] || usage; record "$2" "$3" ;;
    compare) [[ $# -eq 3 ]] || usage; compare "$2" "$3" ;;
    *) usage ;;
esac
