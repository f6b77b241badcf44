#!/usr/bin/env bash
# docs/memory.md's "what fits" table, from `train plan`: Llama models at micro-batch 1 x 4096 tokens,
# bf16, full fine-tuning, LoRA (r 16) and QLoRA (r 16, NF4), per rank (the largest rank for mp),
# without and with activation checkpointing.
#
#   bench/plan_table.sh            (TRAIN defaults to ./train; any backend: nothing is allocated)
set -euo pipefail
train="${TRAIN:-./train}"
common="--micro-batch 1 --batch 8 --seq-len 4096"
fewest() {  # "zero3 / mp" from the plan's "smallest world size that fits" line
  sed -n 's/^smallest world size that fits: //p' | tr ',' '\n' |
    awk '$1 == "zero3" { z = $2 } $1 == "mp" { m = $2 } END { printf "%s / %s", (z && z != "none") ? z : "—", (m && m != "none") ? m : "—" }'
}
echo "| Model | Fine-tuning | ddp at 8 ranks | zero3 at 8 ranks | zero3 at 8, checkpointing | fewest ranks on 80 GB, checkpointing: zero3 / mp | on 24 GB |"
echo "|---|---|---|---|---|---|---|"
for model in llama-2-7b llama-3.1-8b codellama-34b llama-2-70b; do
  for ft in full lora qlora; do
    case $ft in full) f="" ;; lora) f="--lora-rank 16" ;; qlora) f="--lora-rank 16 --quantize nf4" ;; esac
    plain=$("$train" plan --preset $model $common $f --ranks 8 --compare)
    ckpt=$("$train" plan --preset $model $common $f --ranks 8 --compare --checkpoint-activations)
    ddp=$(echo "$plain" | awk '$1 == "ddp" && $4 == "per" { print $2 " " $3 }')
    z3=$(echo "$plain" | awk '$1 == "zero3" && $4 == "per" { print $2 " " $3 }')
    z3c=$(echo "$ckpt" | awk '$1 == "zero3" && $4 == "per" { print $2 " " $3 }')
    on80=$(echo "$ckpt" | fewest)
    on24=$("$train" plan --preset $model $common $f --checkpoint-activations --gpu-memory rtx4090-24 | fewest)
    echo "| $model | $ft | $ddp | $z3 | $z3c | $on80 | $on24 |"
  done
done
