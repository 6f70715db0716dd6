#!/usr/bin/env bash
# tests/run.sh — the README's test command: installs what the tests need on a fresh machine,
# then runs every test of the workspace (unit, property and end-to-end on loopback).
# Safe to re-run; installs only what is missing. Needs root for apt-get (as on CI).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages used by tests. (None beyond the Rust toolchain yet; later milestones add
# etcd-server and the Dynamo fleet here.)
need=()
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

cargo test --workspace --all-targets "$@"
