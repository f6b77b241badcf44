#!/usr/bin/env bash
# docs/memory.md's "what fits" table, from `train plan`: Llama models at micro-batch 1 x 4096 tokens,
# bf16, full fine-tuning, LoRA (r 16) and QLoRA (r 16, NF4), per rank (the largest rank for mp),
# without and with activation checkpointing.
#
#   bench/plan_table.sh            (TRAIN defaults to ./train; any backend: nothing is allocated)
set -euo pipefail
train="${TRAIN:-./train}"
# --parallel and --offload given: the plans are of these options, not of a layout --parallel auto
# would choose (with its own offload and checkpointing); --compare lists every strategy's anyway.
common="--micro-batch 1 --batch 8 --seq-len 4096 --offload none"
fewest() {  # "zero3 / pp" from the plan's "smallest world size that fits" line (pp: naive model parallel)
  sed -n 's/^smallest world size that fits: //p' | tr ',' '\n' |
    awk '$1 == "zero3" { z = $2 } $1 == "pp" { m = $2 } END { printf "%s / %s", (z && z != "none") ? z : "—", (m && m != "none") ? m : "—" }'
}
# A plan that does not fit exits 1; its table is still what this reads.
plan() { "$train" plan "$@" || true; }
echo "| Model | Fine-tuning | ddp at 8 ranks | zero3 at 8 ranks | zero3 at 8, checkpointing | fewest ranks on 80 GB, checkpointing: zero3 / pp | on 24 GB |"
echo "|---|---|---|---|---|---|---|"
for model in llama-2-7b llama-3.1-8b codellama-34b llama-2-70b; do
  for ft in full lora qlora; do
    case $ft in full) f="" ;; lora) f="--lora-rank 16" ;; qlora) f="--lora-rank 16 --quantize nf4" ;; esac
    plain=$(plan --preset $model $common $f --ranks 8 --parallel zero3 --compare --no-checkpoint-activations)
    ckpt=$(plan --preset $model $common $f --ranks 8 --parallel zero3 --compare --checkpoint-activations)
    ddp=$(echo "$plain" | awk '$1 == "ddp" && $4 == "per" { print $2 " " $3 }')
    z3=$(echo "$plain" | awk '$1 == "zero3" && $4 == "per" { print $2 " " $3 }')
    z3c=$(echo "$ckpt" | awk '$1 == "zero3" && $4 == "per" { print $2 " " $3 }')
    on80=$(echo "$ckpt" | fewest)
    on24=$(plan --preset $model $common $f --checkpoint-activations --gpu-memory rtx4090-24 | fewest)
    echo "| $model | $ft | $ddp | $z3 | $z3c | $on80 | $on24 |"
  done
done
