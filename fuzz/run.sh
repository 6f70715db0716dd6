#!/usr/bin/env bash
# Run every fuzz target of continuum-core for a bounded time and summarize.
#
#   fuzz/run.sh [seconds-per-target]        (default 30)
#
# Environment:
#   FUZZ_TARGETS="a b"   run only these targets (default: every target in fuzz/fuzz_targets)
#   FUZZ_SANITIZER=none  (default) builds on the stable toolchain as is;
#                        `address` (AddressSanitizer) needs -Zsanitizer, which stable accepts
#                        only with RUSTC_BOOTSTRAP=1: the script sets it for that case
#   FUZZ_CORPUS_DIR=dir  where the growing corpora live (default fuzz/corpus, git-ignored)
#   FUZZ_JOBS=n          cargo build jobs (default 1: the machine is shared)
#
# The committed seeds in fuzz/seeds/<target> are read, never written; fuzz/dicts/<target>.dict,
# when present, is passed as a libFuzzer dictionary. New corpus entries go to
# $FUZZ_CORPUS_DIR/<target>, crash inputs to fuzz/artifacts/<target> (both git-ignored); logs to
# fuzz/target/logs/<sanitizer>. Exit status is 1 when any target crashed or failed to run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
secs=${1:-30}
sanitizer=${FUZZ_SANITIZER:-none}
corpus_root=${FUZZ_CORPUS_DIR:-$here/corpus}
export CARGO_BUILD_JOBS=${FUZZ_JOBS:-1}
targets=${FUZZ_TARGETS:-$(cd "$here/fuzz_targets" && ls ./*.rs | sed 's|^\./||; s|\.rs$||')}

if [ "$sanitizer" != none ]; then
    export RUSTC_BOOTSTRAP=1
    target_dir_args=(--target-dir "$here/target/san-$sanitizer")
else
    target_dir_args=()
fi

# Longest input per target: big enough to reach the codecs' own limits (4 KiB chunk-size lines,
# 8 KiB trailers, 64 KiB heads, 16,389-byte kv_metrics frames, a kv-events batch at its 128-event
# or 8192-hash cap), small enough to keep executions fast.
max_len() {
    case $1 in
        http1_request) echo 20000 ;;
        http1_chunked) echo 12000 ;;
        config_yaml) echo 8192 ;;
        zmtp_sub) echo 20000 ;;
        dynamo_frames) echo 20000 ;;
        kv_events) echo 20000 ;;
        *) echo 8192 ;;
    esac
}

logs=$here/target/logs/$sanitizer
mkdir -p "$logs"
cd "$here/.."
cargo fuzz build --sanitizer "$sanitizer" "${target_dir_args[@]}" >"$logs/build.log" 2>&1 || {
    echo "build failed, see $logs/build.log" >&2
    tail -20 "$logs/build.log" >&2
    exit 1
}

status=0
printf '%-16s %12s %8s %8s  %s\n' target executions exec/s crashes note
for t in $targets; do
    corpus=$corpus_root/$t
    artifacts=$here/artifacts/$t
    mkdir -p "$corpus" "$artifacts"
    seeds=()
    [ -d "$here/seeds/$t" ] && seeds=("$here/seeds/$t")
    dict=()
    [ -f "$here/dicts/$t.dict" ] && dict=(-dict="$here/dicts/$t.dict")
    before=$(find "$artifacts" -type f | wc -l)
    log=$logs/$t.log
    rc=0
    cargo fuzz run --sanitizer "$sanitizer" "${target_dir_args[@]}" "$t" "$corpus" "${seeds[@]}" \
        -- -max_total_time="$secs" -timeout=10 -max_len="$(max_len "$t")" \
        -artifact_prefix="$artifacts/" -print_final_stats=1 "${dict[@]}" >"$log" 2>&1 || rc=$?
    after=$(find "$artifacts" -type f | wc -l)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    crashes=$((after - before))
    note=""
    if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
        status=1
        note="rc=$rc; $(grep -m1 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" || true)"
        note="$note $(grep -oE 'Test unit written to [^ ]+' "$log" | tail -1 || true)"
    fi
    printf '%-16s %12s %8s %8s  %s\n' "$t" "${execs:-?}" "${speed:-?}" "$crashes" "$note"
done
echo "logs: $logs   corpora: $corpus_root   crash inputs: $here/artifacts"
exit $status
