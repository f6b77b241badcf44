#!/usr/bin/env bash
# The hostile probe of issue 28, replayed: each row of its table (docs/checkpoints-and-failures.md,
# "When something goes wrong") reproduced as the probe did, with the variants it listed, against the
# host flavour's train (TRAIN=... for another). Every invocation is classified — refused (exit 1 or
# 2 with a message), warned (exit 0 with the expected warning), accepted (exit 0 without a word),
# crashed (a signal), hung (past 60 s) — and the user's files it could destroy are checked after.
# The goal is 0 in the last four counts. About 30 s; not part of `make test` (test_failures holds a
# test per row), a tool for the next probe:   test/hostile_probe.sh
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
T=${TRAIN:-$root/build/host/train}
shakespeare=${SHAKESPEARE:-$root/../shared/data/tinyshakespeare.txt}
W=$(mktemp -d /tmp/polevault_probe.XXXXXX); trap 'rm -rf "$W"' EXIT; cd "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tiny="--steps 2 --warmup 0 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --sample-tokens 0 --eval-interval 0"
n=0; declare -A count
run() {  # EXPECT(refuse|warn:TEXT) NAME -- command...
  local expect=$1 name=$2; shift 3
  local out rc; out=$(timeout 60 "$@" 2>&1); rc=$?
  local cls
  if (( rc == 124 )); then cls=hung
  elif (( rc >= 128 )); then cls=crashed
  elif (( rc != 0 )); then cls=refused
  elif [[ $expect == warn:* ]] && grep -qF -- "${expect#warn:}" <<< "$out"; then cls=warned
  else cls=accepted; fi
  n=$((n+1)); count[$cls]=$(( ${count[$cls]:-0} + 1 ))
  printf '%-9s rc=%-3s %s: %s\n' "$cls" "$rc" "$name" "$({ grep -m1 -iE 'train:|warning:|note:|error|must' <<< "$out" || tail -n1 <<< "$out"; } | cut -c1-150)"
}
lost() { n_lost=$(( ${n_lost:-0} + 1 )); echo "DATA LOST: $*"; }
# Fixtures: a run with checkpoints, an HF export, data of two tokenizers.
$T $tiny --checkpoint-interval 1 --out-dir base > base.log 2>&1 || { echo fixture failed; cat base.log; exit 1; }
$T export base/step_2 --out hf > /dev/null 2>&1 || echo export failed
head -c 300000 "$shakespeare" > text.txt
$T prepare text.txt --vocab 300 --out d300 > /dev/null 2>&1 || echo prepare failed
$T prepare text.txt --vocab 280 --out d280 > /dev/null 2>&1
# 1: metrics write errors (a file-size limit reached while appending metrics)
cp -r base r1; python3 - <<'PY'
import os
p='r1/metrics.jsonl'; size=os.path.getsize(p); target=8*1024*1024-20
line='{"step": 0, "pad": "' + 'x'*(target-size-len('{"step": 0, "pad": ""}\n')) + '"}\n'
open(p,'a').write(line)
PY
run refuse "1 metrics write fails (ulimit -f 8192, metrics.jsonl at its limit)" -- bash -c "ulimit -f 8192; $T --resume r1 --out-dir r1 --steps 4 --extend-schedule"
# 2: --resume with data of another tokenizer
run refuse "2 resume on other tokenizer's data" -- $T --resume base/step_1 --data d280 --out-dir r2
# 3: ranks with different --lr / --seed
run refuse "3 MPMD --lr" -- mpirun --oversubscribe -np 1 $T $tiny --parallel ddp --dtype fp64 --lr 0.001 --out-dir r3 : -np 1 $T $tiny --parallel ddp --dtype fp64 --lr 0.002 --out-dir r3
run refuse "3 MPMD --seed" -- mpirun --oversubscribe -np 1 $T $tiny --parallel ddp --seed 1 --out-dir r3b : -np 1 $T $tiny --parallel ddp --seed 2 --out-dir r3b
# 4: impossible sizes in a checkpoint's config.json, and in an HF directory
for kv in "hidden_size 1000000000" "vocab_size 2000000000" "intermediate_size 2147483647"; do
  set -- $kv; rm -rf c4; cp -r base/step_2 c4
  python3 - c4/config.json $1 $2 <<'PY'
import json,sys; p,k,v=sys.argv[1],sys.argv[2],int(sys.argv[3]); j=json.load(open(p)); j[k]=v; json.dump(j,open(p,'w'))
PY
  run refuse "4 sample checkpoint $1" -- $T sample c4 --max-tokens 2
  rm -rf h4; cp -r hf h4
  python3 - h4/config.json $1 $2 <<'PY'
import json,sys; p,k,v=sys.argv[1],sys.argv[2],int(sys.argv[3]); j=json.load(open(p)); j[k]=v; json.dump(j,open(p,'w'))
PY
  run refuse "4 sample HF dir $1" -- $T sample h4 --max-tokens 2
  run refuse "4 --init-from HF dir $1" -- $T --init-from h4 $tiny --out-dir r4
done
# 5: a million layers
python3 - <<'PY'
import json; j=json.load(open('hf/config.json')); j['num_hidden_layers']=10**6; json.dump(j,open('big.json','w'))
PY
rm -rf h5; cp -r hf h5; cp big.json h5/config.json
run refuse "5 plan --config 1e6 layers" -- $T plan --config big.json
run refuse "5 train --config 1e6 layers" -- $T --config big.json $tiny --out-dir r5
run refuse "5 sample 1e6 layers" -- $T sample h5 --max-tokens 2
run refuse "5 --init-from 1e6 layers" -- $T --init-from h5 $tiny --out-dir r5b
# 6: generation_config.json ids
for v in 1000000000000 "[-5, 2]"; do
  rm -rf h6; cp -r hf h6; echo "{\"eos_token_id\": $v}" > h6/generation_config.json
  run refuse "6 --init-from eos_token_id $v" -- $T --init-from h6 $tiny --out-dir r6
done
# 7: prepare's memory is bounded by design (data/prepare.h), measured on 200 MB and 2 GB inputs
# (docs/training-and-data.md); too slow for this replay.
# 8: symlinked metrics.jsonl; user files named step_2 / step_2.tmp
cp -r base r8; echo precious > elsewhere.txt; rm r8/metrics.jsonl; ln -s $W/elsewhere.txt r8/metrics.jsonl
run refuse "8 metrics.jsonl a link" -- $T --resume r8 --out-dir r8 --steps 4 --extend-schedule
[[ $(cat elsewhere.txt) == precious ]] || lost "elsewhere.txt overwritten through the link"
mkdir -p r8b; echo mine > r8b/step_2; run refuse "8 a user's file step_2" -- $T $tiny --out-dir r8b --checkpoint-interval 1
[[ $(cat r8b/step_2 2>/dev/null) == mine ]] || lost "r8b/step_2 deleted"
mkdir -p r8c; echo mine > r8c/step_2.tmp; run refuse "8 a user's file step_2.tmp" -- $T $tiny --out-dir r8c --checkpoint-interval 1
[[ $(cat r8c/step_2.tmp 2>/dev/null) == mine ]] || lost "r8c/step_2.tmp deleted"
# 9: trainer_state.json edited (step, dtype)
cp -r base r9; python3 - <<'PY'
import json; p='r9/step_2/trainer_state.json'; j=json.load(open(p)); j['step']=1; json.dump(j,open(p,'w'),indent=2)
PY
run refuse "9 trainer_state step 2 -> 1" -- $T --resume r9/step_2 --out-dir r9 --steps 4 --extend-schedule
cp -r base r9b; python3 - <<'PY'
import json; p='r9b/step_2/trainer_state.json'; j=json.load(open(p)); j['dtype']='fp32'; j['options']['dtype']='fp32'; json.dump(j,open(p,'w'),indent=2)
PY
run refuse "9 trainer_state dtype bf16 -> fp32" -- $T --resume r9b/step_2 --out-dir r9b --steps 4 --extend-schedule
# 10: NaN in --init-from weights
rm -rf h10; cp -r hf h10; python3 - <<'PY'
import json,struct
p='h10/model.safetensors'; b=bytearray(open(p,'rb').read()); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n])
t=h['model.embed_tokens.weight']; o=8+n+t['data_offsets'][0]
b[o+40:o+44]=struct.pack('<f',float('nan')) if t['dtype']=='F32' else b[o+40:o+44]
if t['dtype']=='BF16': b[o+40:o+42]=b'\xc0\x7f'
open(p,'wb').write(b)
PY
run refuse "10 NaN in --init-from weights" -- $T --init-from h10 $tiny --out-dir r10
# 11: --top-p 0 with a closing sample
run refuse "11 --top-p 0" -- $T --steps 2 --warmup 0 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --sample-tokens 3 --top-p 0 --eval-interval 0 --out-dir r11
[[ -e r11/step_2 ]] && echo "note: r11 trained before refusing"
# 12: integers
run refuse "12 --steps 2^64" -- $T --steps 18446744073709551616 --out-dir r12
run refuse "12 --seed 2^64" -- $T --seed 18446744073709551616 --out-dir r12
run refuse "12 --seed -1" -- $T --seed -1 --out-dir r12
# 13: absurd values
run refuse "13 --batch 1000000" -- $T --data d300 --steps 1 --warmup 0 --batch 1000000 --micro-batch 2 --seq-len 16 --out-dir r13
run "warn:--eval-batches 10000000" "13 --eval-batches 10000000" -- $T --data d300 --steps 1 --warmup 0 --batch 4 --micro-batch 2 --seq-len 16 --eval-interval 1 --eval-batches 10000000 --sample-tokens 0 --out-dir r13b
run "warn:warning: --lr" "13 --lr 1e30 --dtype fp64" -- $T $tiny --lr 1e30 --dtype fp64 --out-dir r13c
# 14: a gap in the shard numbering
cp -r d300 d14; $T prepare text.txt --vocab 300 --shard-tokens 20000 --out d14b > /dev/null 2>&1; ls d14b | head -3 > /dev/null
if [[ -e d14b/train_000002.pvtokens ]]; then mv d14b/train_000001.pvtokens d14b/x; run refuse "14 shard gap" -- $T --data d14b $tiny --out-dir r14; else echo "14: prepare made one shard (--shard-tokens?)"; fi
# 15: ulimit -f small
run refuse "15 ulimit -f 1000" -- bash -c "ulimit -f 1000; $T $tiny --out-dir r15"
# 16: wrong diagnoses
run refuse "16 sample prompt too long" -- $T sample base/step_2 --prompt "$(head -c 3000 text.txt)" --max-tokens 4
run refuse "16 long --out-dir" -- $T $tiny --out-dir $(printf 'a%.0s' {1..300})
ln -sfn $W/nowhere dangling; run refuse "16 dangling --out-dir" -- $T $tiny --out-dir dangling
rm -rf h16; cp -r hf h16; rm h16/tokenizer.json; ln -s /dev/urandom h16/tokenizer.json
run refuse "16 tokenizer.json -> /dev/urandom" -- $T sample h16 --prompt hi --max-tokens 2
echo
echo "invocations: $n; refused ${count[refused]:-0}, warned ${count[warned]:-0}, silently accepted ${count[accepted]:-0}, crashed ${count[crashed]:-0}, hung ${count[hung]:-0}, data lost ${n_lost:-0}"
