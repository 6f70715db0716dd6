#!/usr/bin/env bash
# bench/run.sh — build the router and the bench (release), then run
# `continuum-bench http-hop` with any extra options, e.g.:
#   bench/run.sh --duration 10 --connections 64 --shards 1,2
# Opt-in: `bench/run.sh --fleet [fleet-hop options]` runs `fleet-hop` instead
# (router vs direct-to-frontend on a real Dynamo 1.6.1 fleet): it builds the
# router with `--features dynamo` (needs protoc) and makes sure the fleet venv
# exists (tests/fleet/install.sh, idempotent), e.g.:
#   bench/run.sh --fleet --duration 10 --rounds 3
# Opt-in: `bench/run.sh --sim [sim-hop options]` runs `sim-hop` instead (router
# vs direct-to-shim on the in-process simulated fleet at 10, 100 and 1,000
# workers): it builds the router with `--features dynamo` (needs protoc) but
# needs no venv, e.g.:
#   bench/run.sh --sim --duration 5
# Opt-in: `bench/run.sh --kv-route [kv-route options]` runs `kv-route` instead
# (the router's KV-aware picks vs Dynamo's own KV router and per-conversation
# pinning, each on a fresh Dynamo 1.6.1 mocker fleet): it builds the router
# with `--features dynamo-kv` (needs protoc) and makes sure the fleet venv
# exists, e.g.:
#   bench/run.sh --kv-route --rounds 2
#   bench/run.sh --kv-route --quick          # CI smoke: 2 turns of 4 conversations
# Opt-in: `bench/run.sh --aiperf [aiperf options]` runs `aiperf` instead
# (NVIDIA's AIPerf, pinned, through the router vs Dynamo's KV-routing frontend,
# completions and chat, streaming, each on a fresh Dynamo 1.6.1 mocker fleet):
# it builds the router with `--features dynamo-kv`, makes sure the fleet venv
# and the AIPerf venv exist (bench/aiperf/install.sh, idempotent), e.g.:
#   bench/run.sh --aiperf --rounds 2
# Installs wrk, nginx and protoc when missing (apt-get).
# Invariant: writes nothing into the repo besides cargo's target dir; if the
# router does not build, the baseline (nginx, the direct frontend or shim) is
# still measured and the driver says why the router row is missing (or
# warns that it may be stale).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bench=http-hop
features=()
if [ "${1:-}" = "--kv-index" ]; then
    # `bench/run.sh --kv-index [kv-index-bench options]`: our KV index against
    # dynamo-kv-router 1.6.1's, a separate package (own Cargo.lock and target
    # dir) so Dynamo's crates never enter the router's lock file; see
    # bench/README.md, "kv-index".
    shift
    exec cargo run --release --manifest-path bench/kv-index/Cargo.toml -- "$@"
elif [ "${1:-}" = "--fleet" ]; then
    shift
    bench=fleet-hop
    features=(--features continuum-router/dynamo)
    tests/fleet/install.sh
elif [ "${1:-}" = "--kv-route" ]; then
    shift
    bench=kv-route
    features=(--features continuum-router/dynamo-kv)
    tests/fleet/install.sh
elif [ "${1:-}" = "--aiperf" ]; then
    shift
    bench=aiperf
    features=(--features continuum-router/dynamo-kv)
    tests/fleet/install.sh
    bench/aiperf/install.sh
elif [ "${1:-}" = "--sim" ]; then
    shift
    bench=sim-hop
    features=(--features continuum-router/dynamo)
fi
# System packages the benches drive, installed when missing (a fresh machine has none of them; needs
# root for apt-get, as on CI): wrk is the load generator of every hop bench, nginx the http-hop
# baseline, protoc builds etcd-client for the router's `dynamo` features.
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v nginx >/dev/null 2>&1 || need+=(nginx)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
if ! cargo build --release -p continuum-router "${features[@]}" -p continuum-bench; then
    echo "run.sh: building continuum-router failed; building the bench alone." >&2
    if [ -e "$target/release/continuum-router" ]; then
        echo "run.sh: WARNING: the router row below comes from a STALE $target/release/continuum-router." >&2
    fi
    cargo build --release -p continuum-bench
fi
exec "$target/release/continuum-bench" "$bench" "$@"
