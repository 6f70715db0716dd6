#!/usr/bin/env bash
# bench/run.sh — build the router and the bench (release), then run
# `continuum-bench http-hop` with any extra options, e.g.:
#   bench/run.sh --duration 10 --connections 64 --shards 1,2
# Opt-in: `bench/run.sh --fleet [fleet-hop options]` runs `fleet-hop` instead
# (router vs direct-to-frontend on a real Dynamo 1.6.1 fleet): it builds the
# router with `--features dynamo` (needs protoc) and makes sure the fleet venv
# exists (tests/fleet/install.sh, idempotent), e.g.:
#   bench/run.sh --fleet --duration 10 --rounds 3
# Opt-in: `bench/run.sh --bus-relay [bus-relay options]` runs `bus-relay` (one
# stream relayed through the event bus listener into a shard's ZMTP driver vs
# the same driver on direct TCP; the listener's memory per idle session and
# stream), e.g.
#   bench/run.sh --bus-relay --messages 200000 --sessions 4 --streams 8   # CI smoke
# Opt-in: `bench/run.sh --bus-kv [bus-kv options]` runs `bus-kv` (kv-events
# applied to a KV index through a broker and the listener vs direct TCP:
# throughput, event-to-visible latency, broker CPU, memory), e.g.
#   bench/run.sh --bus-kv --messages 20000 --paced 500 --sessions 4 --streams 8   # CI smoke
# Opt-in: `bench/run.sh --sim [sim-hop options]` runs `sim-hop` instead (router
# vs direct-to-shim on the in-process simulated fleet at 10, 100 and 1,000
# workers): it builds the router with `--features dynamo` (needs protoc) but
# needs no venv, e.g.:
#   bench/run.sh --sim --duration 5
# Opt-in: `bench/run.sh --soak [soak options]` runs `soak` instead (the router
# at ~80% of its maximum rate for --minutes on the simulated fleet while workers
# join and leave every --churn-secs: RSS drift, fds, subscriptions, errors; no
# venv), e.g.:
#   bench/run.sh --soak --minutes 2
#   bench/run.sh --soak --quick              # CI smoke: half a minute
# Opt-in: `bench/run.sh --kv-route [kv-route options]` runs `kv-route` instead
# (the router's KV-aware picks vs Dynamo's own KV router and per-conversation
# pinning, each on a fresh Dynamo 1.6.1 mocker fleet): it builds the router
# with `--features dynamo-kv` (needs protoc) and makes sure the fleet venv
# exists, e.g.:
#   bench/run.sh --kv-route --rounds 2
#   bench/run.sh --kv-route --quick          # CI smoke: 2 turns of 4 conversations
#   bench/run.sh --kv-route --broker         # and a row over a real event broker
#   bench/run.sh --kv-route --replicas 2     # and a row of two routers behind nginx
# Opt-in: `bench/run.sh --faults [faults options]` runs `faults` instead (fault
# injection on fresh Dynamo 1.6.1 mocker fleets under a streaming chat load: workers,
# frontends and etcd killed, stopped or compacted, reload storms): it builds the router
# like --kv-route and makes sure the fleet venv exists, e.g.:
#   bench/run.sh --faults --quick            # CI smoke: worker-kill and reload-storm
#   bench/run.sh --faults --scenario etcd-restart,shim-kill
# Opt-in: `bench/run.sh --aiperf [aiperf options]` runs `aiperf` instead
# (NVIDIA's AIPerf, pinned, through the router vs Dynamo's KV-routing frontend,
# completions and chat, streaming, each on a fresh Dynamo 1.6.1 mocker fleet):
# it builds the router with `--features dynamo-kv`, makes sure the fleet venv
# and the AIPerf venv exist (bench/aiperf/install.sh, idempotent), e.g.:
#   bench/run.sh --aiperf --rounds 2
# Regressions: `bench/run.sh --against REV [http-hop options]` builds revision
# REV (any git revision) into its own target dir (target/against, the binary
# cached per commit), then measures both routers with the same config in
# every round, interleaved with nginx, and prints each figure as new/REV, e.g.:
#   bench/run.sh --against b6d6685 --rounds 3 --shards 1,2
# Run it against the commit before your change whenever you touch the request
# path (shards/src/http, shards/src/dispatch, the runtime), and quote it.
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
packages=()
against=""
if [ "${1:-}" = "--against" ]; then
    if [ -z "${2:-}" ]; then
        echo "run.sh: --against needs a revision, e.g. --against HEAD~1" >&2
        exit 2
    fi
    against=$2
    shift 2
fi
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
    # `--broker` adds a row whose subscriptions a real continuum-event-broker relays.
    features=(--features continuum-router/dynamo-kv --features continuum-router/dynamo-event-bus)
    packages=(-p continuum-event-broker)
    tests/fleet/install.sh
elif [ "${1:-}" = "--faults" ]; then
    shift
    bench=faults
    features=(--features continuum-router/dynamo-kv --features continuum-router/dynamo-event-bus)
    tests/fleet/install.sh
elif [ "${1:-}" = "--aiperf" ]; then
    shift
    bench=aiperf
    features=(--features continuum-router/dynamo-kv)
    tests/fleet/install.sh
    bench/aiperf/install.sh
elif [ "${1:-}" = "--bus-relay" ]; then
    # One stream through the event bus listener vs direct TCP, and the listener's memory per
    # idle session and stream (bench/README.md, "bus-relay").
    shift
    bench=bus-relay
elif [ "${1:-}" = "--bus-kv" ]; then
    # kv-events applied to a KV index through the event bus (a broker, the listener) vs direct
    # TCP: throughput, event-to-visible latency, broker CPU and memory (bench/README.md, "bus-kv").
    shift
    bench=bus-kv
elif [ "${1:-}" = "--sim" ]; then
    shift
    bench=sim-hop
    features=(--features continuum-router/dynamo)
elif [ "${1:-}" = "--soak" ]; then
    # The router for minutes on the simulated fleet under churn (bench/README.md, "soak"); built
    # with --kv-route's features (a superset of the `dynamo` it needs), so the two share a build.
    shift
    bench=soak
    features=(--features continuum-router/dynamo-kv --features continuum-router/dynamo-event-bus)
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
if ! cargo build --release -p continuum-router "${features[@]}" "${packages[@]}" -p continuum-bench; then
    echo "run.sh: building continuum-router failed; building the bench alone." >&2
    if [ -e "$target/release/continuum-router" ]; then
        echo "run.sh: WARNING: the router row below comes from a STALE $target/release/continuum-router." >&2
    fi
    cargo build --release -p continuum-bench
fi
extra=()
if [ -n "$against" ]; then
    if [ "$bench" != http-hop ]; then
        echo "run.sh: --against compares http-hop runs only" >&2
        exit 2
    fi
    sha=$(git rev-parse --verify --quiet "$against^{commit}") || {
        echo "run.sh: $against is not a revision of this repository" >&2
        exit 2
    }
    short=$(git rev-parse --short "$sha")
    adir="$(cd "$(dirname "$target")" && pwd)/$(basename "$target")/against"
    abin="$adir/bin/$sha/continuum-router"
    if [ ! -x "$abin" ]; then
        # The revision's own tree and Cargo.lock, built in one target dir shared by every
        # revision compared (dependencies are built once), its binary kept per commit. `tar -m`:
        # the files get the time of extraction, not the commit's, so cargo never takes another
        # revision's build of the workspace crates (same names, same target dir) for fresh.
        src="$adir/src/$sha"
        rm -rf "$src"
        mkdir -p "$src" "$(dirname "$abin")"
        git archive "$sha" | tar -x -m -C "$src"
        echo "run.sh: building $short into $adir/target" >&2
        CARGO_TARGET_DIR="$adir/target" cargo build --release \
            --manifest-path "$src/Cargo.toml" -p continuum-router
        cp "$adir/target/release/continuum-router" "$abin.tmp"
        mv "$abin.tmp" "$abin"
        rm -rf "$src"
    fi
    extra=(--against-bin "$abin" --against-label "$short")
fi
exec "$target/release/continuum-bench" "$bench" "${extra[@]}" "$@"
