#!/usr/bin/env bash
# Runs each fuzz target given (build/fuzz/fuzz_<reader>) for FUZZ_SECONDS on its committed
# corpus fuzz/corpus/<reader>/, and prints one line per target and a closing `N passed, M failed`
# (a target passes when libFuzzer found nothing: no crash, sanitizer report, timeout or
# out-of-memory). What a run finds new goes to build/fuzz/corpus/<reader>/ (the committed corpus
# is only read); a failing input to build/fuzz/artifacts/<reader>/, named in the log
# build/fuzz/logs/<reader>.log.
#
#   FUZZ_SECONDS   seconds per target (default 10)
#   FUZZ_RUNS      stop a target after this many executions (or FUZZ_SECONDS, whichever comes first)
#   FUZZ_FLAGS     more libFuzzer flags (e.g. -jobs=2, -seed=1)
#
# Limits for every target: -rss_limit_mb=2048 and -malloc_limit_mb=512 (no reader may allocate
# more for inputs of at most max_len bytes: that is a finding), -timeout=10 s per input, and the
# max_len below, chosen per format to hold its seeds.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A max_len=(
  [safetensors]=16384 [config_json]=4096 [tokenizer_json]=65536 [trainer_state]=4096 [shard]=8192
  [examples]=4096 [llama2c]=16384 [peft_config]=4096 [bnb_checkpoint]=8192
)
seconds=${FUZZ_SECONDS:-10}
passed=0 failed=0
for bin in "$@"; do
  reader=$(basename "$bin"); reader=${reader#fuzz_}
  work=build/fuzz/corpus/$reader artifacts=build/fuzz/artifacts/$reader log=build/fuzz/logs/$reader.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  limit=(-max_total_time="$seconds")
  [[ -n ${FUZZ_RUNS:-} ]] && limit+=(-runs="$FUZZ_RUNS")
  rc=0
  # shellcheck disable=SC2086
  "$bin" "${limit[@]}" -max_len="${max_len[$reader]:-4096}" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" ${FUZZ_FLAGS:-} "$work" "fuzz/corpus/$reader" > "$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    echo "fuzz $reader: ok, ${execs:-?} executions (${rate:-?}/s), no findings"
  else
    failed=$((failed + 1))
    echo "fuzz $reader: FAILED (exit $rc) after ${execs:-?} executions; see $log:"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz finding|.*runtime error|artifact_prefix|Test unit written)' "$log" | head -n 8
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
