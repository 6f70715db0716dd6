#!/usr/bin/env bash
# tests/compat/run.sh — the router's real-fleet end-to-end tests against several Dynamo releases,
# and a compatibility table (docs/compatibility.md holds the last one).
#
#   tests/compat/run.sh [VERSION...]    default: 1.4.2 1.5.1 1.6.1 1.7.0.dev20261026
#
# For each release: tests/fleet/install.sh VERSION (its own venv and pins; 1.6.1 is the default
# venv), then every real-fleet test binary (tests/*_fleet.rs and tests/fleet_smoke.rs), one at a
# time with --test-threads=1 and CONTINUUM_FLEET_VENV set to that venv (tests/common/fleet.rs
# reads it). The binaries are built ONCE, first, by `cargo test --all-features --no-run --test
# NAME ...` (the profile and features of tests/run.sh, so the build is shared with it) and then
# run directly: every release runs the very same binaries even if the tree changes meanwhile.
#
# Prints the table (rows: FILE::TEST; columns: releases; PASS / FAIL / SKIP, SKIP being an
# #[ignore]d test) and a per-release summary by area. Raw logs and the table stay in
# $CONTINUUM_COMPAT_OUT (default target/compat, never committed): VERSION/BINARY.log per binary,
# results.tsv, table.md. Every wait is bounded: CONTINUUM_COMPAT_TEST_TIMEOUT (default 1500 s)
# per test binary, the tests' own deadlines inside it.
#
# Environment: CONTINUUM_COMPAT_TESTS (space-separated binary names; default all of them).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
    versions=(1.4.2 1.5.1 1.6.1 1.7.0.dev20261026)
fi
out=${CONTINUUM_COMPAT_OUT:-$repo/target/compat}
per_binary=${CONTINUUM_COMPAT_TEST_TIMEOUT:-1500}
log() { echo "compat: $*" >&2; }

if [ -n "${CONTINUUM_COMPAT_TESTS:-}" ]; then
    read -r -a tests <<<"$CONTINUUM_COMPAT_TESTS"
else
    tests=()
    for f in tests/fleet_smoke.rs tests/*_fleet.rs; do
        tests+=("$(basename "$f" .rs)")
    done
fi

# --- install every release first: a release that cannot be installed is reported, not run -------
usable=()
for v in "${versions[@]}"; do
    if tests/fleet/install.sh "$v"; then
        usable+=("$v")
    else
        log "ai-dynamo $v could not be installed: its column is FAIL (install)"
    fi
done
# AIPerf, as tests/run.sh does (tests/openai_fleet.rs).
bench/aiperf/install.sh

# --- build once ------------------------------------------------------------------------------------
mkdir -p "$out"
test_args=()
for t in "${tests[@]}"; do
    test_args+=(--test "$t")
done
log "building ${#tests[@]} test binaries (cargo test --all-features --no-run)"
cargo test --all-features --no-run --message-format=json-render-diagnostics "${test_args[@]}" \
    >"$out/build.jsonl"
python3 - "$out/build.jsonl" >"$out/binaries.tsv" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and "test" in m["target"]["kind"]:
        print(f'{m["target"]["name"]}\t{m["executable"]}')
PY
{
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "tree changes: $(git status --porcelain 2>/dev/null | wc -l) paths"
    echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out/provenance.txt"

# --- run -------------------------------------------------------------------------------------------
: >"$out/results.tsv"
for v in "${versions[@]}"; do
    mkdir -p "$out/$v"
    if ! printf '%s\n' "${usable[@]}" | grep -qxF "$v"; then
        for t in "${tests[@]}"; do
            printf '%s\t%s\t*\tFAIL\tinstall\n' "$v" "$t" >>"$out/results.tsv"
        done
        continue
    fi
    venv=$(tests/fleet/install.sh --print-venv "$v")
    for t in "${tests[@]}"; do
        bin=$(awk -F'\t' -v t="$t" '$1 == t { print $2 }' "$out/binaries.tsv" | tail -1)
        if [ -z "$bin" ]; then
            log "no binary for $t"
            printf '%s\t%s\t*\tFAIL\tbuild\n' "$v" "$t" >>"$out/results.tsv"
            continue
        fi
        log "$v: $t"
        started=$(date +%s)
        set +e
        CONTINUUM_FLEET_VENV=$venv CARGO_MANIFEST_DIR=$repo timeout -k 30 "$per_binary" \
            "$bin" --test-threads=1 --show-output >"$out/$v/$t.log" 2>&1 </dev/null
        code=$?
        set -e
        took=$(($(date +%s) - started))
        "$bin" --list --format terse 2>/dev/null | sed -n 's/: test$//p' >"$out/$v/$t.list"
        python3 - "$v" "$t" "$out/$v/$t.log" "$out/$v/$t.list" "$code" "$took" \
            >>"$out/results.tsv" <<'PY'
import re, sys
version, binary, log_path, list_path, code, took = sys.argv[1:]
text = open(log_path, errors="replace").read()
seen = {}
for m in re.finditer(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", text, re.M):
    seen[m.group(1)] = {"ok": "PASS", "FAILED": "FAIL", "ignored": "SKIP"}[m.group(2)]
# A test that does not apply to this release prints `compat-skip: WHY` and returns; libtest's
# --show-output prints a passing test's stdout under `---- NAME stdout ----`.
for m in re.finditer(r"^---- (\S+) stdout ----\n(.*?)(?=^---- |^successes:|\Z)", text, re.M | re.S):
    if "compat-skip:" in m.group(2) and seen.get(m.group(1)) == "PASS":
        seen[m.group(1)] = "SKIP"
names = [n.strip() for n in open(list_path) if n.strip()] or sorted(seen)
why = "timeout" if code in ("124", "137") else f"exit {code}"
for name in names:
    result = seen.get(name)
    note = f"{took}s" if result else f"no result ({why})"
    print(f"{version}\t{binary}\t{name}\t{result or 'FAIL'}\t{note}")
PY
        log "$v: $t done in ${took}s (exit $code)"
    done
done

# --- table -----------------------------------------------------------------------------------------
python3 - "$out/results.tsv" "${versions[@]}" >"$out/table.md" <<'PY'
import sys
path, versions = sys.argv[1], sys.argv[2:]
cells, rows = {}, []
for line in open(path):
    v, binary, name, result, note = line.rstrip("\n").split("\t")
    row = f"{binary}::{name}"
    if row not in rows:
        rows.append(row)
    cells[(row, v)] = result
# One area per test: a file's area unless the test is named.
AREAS = ["discovery", "load samples", "pins agg", "pins disagg", "KV picks with hash parity", "ingress"]
BY_FILE = {
    "discovery_fleet": "discovery",
    "load_fleet": "load samples",
    "backends_fleet": "pins agg",
    "kv_conditional_fleet": "pins disagg",
    "kv_fleet": "KV picks with hash parity",
    "kv_pick_fleet": "KV picks with hash parity",
    "kv_explain_fleet": "KV picks with hash parity",
    "kv_token_data_fleet": "KV picks with hash parity",
    "completions_fleet": "KV picks with hash parity",
    "ingress_fleet": "ingress",
    "openai_fleet": "ingress",
    "shim_fleet": "pins agg",
    "fleet_smoke": "pins disagg",
}
BY_TEST = {
    "fleet_smoke::a_killed_worker_leaves_etcd_when_its_lease_expires": "discovery",
    "openai_fleet::the_models_list_follows_the_real_fleet_as_workers_come_and_go": "discovery",
    "shim_fleet::a_sigkilled_worker_stops_being_picked_within_the_lease_bound": "discovery",
    "shim_fleet::concurrent_streams_spread_over_the_workers_by_load": "load samples",
    "kv_pick_fleet::an_unpinned_tokenizer_is_never_loaded_and_selection_stays_load_based": "load samples",
    "shim_fleet::without_prefill_workers_the_disaggregated_model_fails_fast_and_classified": "pins disagg",
    "completions_fleet::every_prompt_shape_is_pinned_buffered_and_streamed_with_the_official_client": "pins agg",
}
def area(row):
    return BY_TEST.get(row) or BY_FILE.get(row.split("::")[0], "other")
width = max(len(r) for r in rows) if rows else 10
print("| test | area | " + " | ".join(versions) + " |")
print("|---|---|" + "---|" * len(versions))
for row in sorted(rows, key=lambda r: (AREAS.index(area(r)) if area(r) in AREAS else 99, r)):
    print(f"| `{row}` | {area(row)} | " + " | ".join(cells.get((row, v), "-") for v in versions) + " |")
print()
print("| area | " + " | ".join(versions) + " |")
print("|---|" + "---|" * len(versions))
for a in AREAS + ["other"]:
    members = [r for r in rows if area(r) == a]
    if not members:
        continue
    out = []
    for v in versions:
        got = [cells.get((r, v)) for r in members]
        passed = sum(g == "PASS" for g in got)
        skipped = sum(g == "SKIP" for g in got)
        out.append(f"{passed}/{len(members) - skipped} pass" + (f", {skipped} skip" if skipped else ""))
    print(f"| {a} | " + " | ".join(out) + " |")
PY
cat "$out/table.md"
log "logs and results in $out"
if grep -q $'\tFAIL\t' "$out/results.tsv"; then
    exit 1
fi
