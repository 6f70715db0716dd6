#!/usr/bin/env bash
# deploy/demo.sh — the README's first command: the router on 127.0.0.1:8080 in front of a simulated
# Dynamo fleet on loopback (file-store discovery, kv_metrics over ZMTP, a direct-mode shim that
# accepts only correct pins), with a live table of the workers. Installs what the build needs on a
# fresh Debian machine (protoc, for the `dynamo` feature's etcd client), then builds and runs.
#
#   deploy/demo.sh                   # 3 aggregated workers + a prefill/decode pair
#   deploy/demo.sh --workers 50      # more aggregated workers
#   deploy/demo.sh --port 9090
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq protobuf-compiler >/dev/null
    else
        echo "deploy/demo.sh: install protoc (the protobuf compiler) first" >&2
        exit 1
    fi
fi
exec cargo run --release --features demo -- demo "$@"
