#!/usr/bin/env bash
# End-to-end training throughput of `train` on whichever backend it was built for, in tokens/s
# (the mean over all steps but the first, which pays for warm-up), from the run's metrics.jsonl:
#
#   1. the default run's model and batch (built-in corpus, 0.8M parameters, 16 x 64 tokens)
#   2. tinyshakespeare prepared with a 4096-token BPE and the host-11m preset (11M parameters,
#      8 x 256 tokens per step), a few steps
#
#   bench/train_throughput.sh [TEXT_FILE]    default ../shared/data/tinyshakespeare.txt
# Environment: TRAIN (default ./train), STEPS_DEFAULT (30), STEPS_LARGE (4), OUT (a temp dir).
set -euo pipefail
train="${TRAIN:-./train}"
text="${1:-../shared/data/tinyshakespeare.txt}"
out="${OUT:-$(mktemp -d /tmp/polevault_bench.XXXXXX)}"
steps_default="${STEPS_DEFAULT:-30}"
steps_large="${STEPS_LARGE:-4}"

# mean tokens_per_s over steps 2.. of a metrics.jsonl
mean_rate() {
  awk -F'"tokens_per_s": ' '/tokens_per_s/ { split($2, a, ","); n++; if (n > 1) { s += a[1]; k++ } }
                           END { if (k) printf "%.0f", s / k; else print "n/a" }' "$1"
}

"$train" --steps "$steps_default" --sample-tokens 0 --eval-interval 0 --out-dir "$out/default" > "$out/default.log"
echo "default run (0.8M parameters, batch 16 x 64, bf16): $(mean_rate "$out/default/metrics.jsonl") tokens/s over steps 2..$steps_default"

if [[ -f "$text" ]]; then
  start=$(date +%s)
  "$train" prepare "$text" --out "$out/shakespeare" --vocab 4096 > "$out/prepare.log"
  echo "prepare $(basename "$text") with a 4096-token BPE: $(( $(date +%s) - start )) s"
  "$train" --data "$out/shakespeare" --preset host-11m --steps "$steps_large" --batch 8 --micro-batch 8 --seq-len 256 \
    --warmup 1 --eval-interval 0 --sample-tokens 0 --out-dir "$out/large" > "$out/large.log"
  echo "host-11m on $(basename "$text") (11M parameters, batch 8 x 256, bf16): $(mean_rate "$out/large/metrics.jsonl") tokens/s over steps 2..$steps_large"
else
  echo "skipping the host-11m run: $text not found (pass a text file)"
fi
[[ -z "${OUT:-}" ]] && rm -rf "$out"
exit 0
