#!/usr/bin/env bash
# The README's fine-tuning quickstart, run as written, on a stand-in for the model it names.
#
#   test/quickstart.sh [TRAIN]      (TRAIN: build/host/train by default; run from the repository)
#
# The README's block (between "```sh" and "```" after "## Fine-tuning quickstart") is taken from
# README.md itself and run line by line in a scratch directory with only these differences:
#   - M points at a stand-in Hugging Face directory made here: stories260K (../shared/models,
#     converted with `train convert`) with a tokenizer.json of its 512-token size that has Llama 3's
#     special tokens, and the published Llama 3.2 Instruct chat template
#     (test/data/chat_templates/llama-3.2-instruct.jinja) as chat_template.jinja;
#   - ./train is TRAIN; mpirun gets what running as root on this machine needs;
#   - chats.jsonl is a small file of conversations written here.
# Every command must exit 0. Prints "quickstart: N commands ran" at the end, or the failing one.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
train=$(realpath "${1:-$repo/build/host/train}")
stories="$repo/../shared/models/stories260K.bin"
[[ -f $stories ]] || { echo "quickstart: $stories is missing (the shared models directory)"; exit 1; }
work=$(mktemp -d /tmp/polevault_quickstart_XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

# The conversations (the README's example line, and more like it).
python3 - <<'EOF'
import json
with open("chats.jsonl", "w") as f:
    for i in range(48):
        f.write(json.dumps({"messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"What comes after {i}?"},
            {"role": "assistant", "content": f"{i + 1} comes after {i}."}]}) + "\n")
EOF

# The stand-in model: stories260K's weights and shape, a tokenizer of its vocabulary size with the
# template's special tokens (trained here by `train prepare`), the template beside it.
M="$work/models/stand-in"
"$train" convert --from llama2c "$stories" --out "$M" > /dev/null
"$train" prepare chats.jsonl --vocab 512 --chat-format llama3.1 --out tokenizer-source > /dev/null
cp tokenizer-source/tokenizer.json "$M/"
cp "$repo/test/data/chat_templates/llama-3.2-instruct.jinja" "$M/chat_template.jinja"
printf '{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}\n' > "$M/tokenizer_config.json"
rm -rf tokenizer-source

# The README's block, its commands joined across trailing backslashes, comments dropped.
block=$(awk '/^## Fine-tuning quickstart/ {on = 1} on && /^```sh/ {inside = 1; next} inside && /^```/ {exit}
             inside {print}' "$repo/README.md")
[[ -n $block ]] || { echo "quickstart: no \`\`\`sh block under '## Fine-tuning quickstart' in README.md"; exit 1; }
commands=$(printf '%s\n' "$block" | sed -e 's/[[:space:]]#.*$//' -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d' |
           awk '{ if (sub(/\\$/, "")) { line = line $0 } else { print line $0; line = "" } }')
ran=0
while IFS= read -r command; do
  [[ $command == M=* ]] && continue  # the stand-in replaces the model directory
  command=${command//.\/train/$train}
  command=${command//mpirun -np/mpirun --allow-run-as-root --oversubscribe --bind-to none -np}
  echo "quickstart \$ $command"
  if ! M="$M" bash -c "$command" < /dev/null > out.log 2>&1; then  # mpirun would read the list
    cat out.log
    echo "quickstart: this command of README.md's quickstart failed: $command"
    exit 1
  fi
  tail -n 3 out.log | sed 's/^/    /'
  ran=$((ran + 1))
done <<< "$commands"
echo "quickstart: $ran commands ran"
