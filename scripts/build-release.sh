#!/usr/bin/env bash
# scripts/build-release.sh — the official release binary (BUILD-01..04): continuum-router with
# every Dynamo feature (`dynamo`, `dynamo-kv`, `dynamo-event-bus`: cargo feature `release`), built
# with the release profile (panic = "abort", fat LTO) from the locked dependency set. Installs
# `protoc` (etcd-client needs it at build time, BUILD-01) when it is missing and apt-get is here.
#
#   scripts/build-release.sh            build; prints the binary's path and what it was built with
#   scripts/build-release.sh --print    print the binary's path only (no build)
#
# Environment: CARGO_TARGET_DIR as cargo reads it (default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-target}/release/continuum-router"
if [ "${1:-}" = "--print" ]; then
    echo "$bin"
    exit 0
fi
if [ $# -gt 0 ]; then
    echo "usage: scripts/build-release.sh [--print]" >&2
    exit 2
fi
if ! command -v protoc >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        echo "build-release: installing protoc (protobuf-compiler)" >&2
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq protobuf-compiler >/dev/null
    else
        echo "build-release: protoc is missing: install the protobuf compiler (macOS: brew install protobuf)" >&2
        exit 1
    fi
fi
cargo build --release --locked -p continuum-router --features release
"$bin" version
echo "$bin"
