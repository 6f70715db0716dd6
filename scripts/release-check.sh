#!/usr/bin/env bash
# scripts/release-check.sh — what CI checks of the official release binary (issue 37, BUILD-03,
# CFG-30): scripts/build-release.sh builds it, `version` lists all three Dynamo features, and the
# binary validates and starts with every template in deploy/config-templates/ (bound to a loopback
# port; it must answer GET /health within 15 s, whatever its discovery source can reach here).
#
#   scripts/release-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-release.sh >/dev/null
bin=$(scripts/build-release.sh --print)
features=$("$bin" version | sed -n 's/^features: //p')
if [ "$features" != "dynamo dynamo-kv dynamo-event-bus" ]; then
    echo "release-check: the release binary has features '$features'" >&2
    exit 1
fi
echo "release-check: $("$bin" version | sed -n 1p), features: $features"
tmp=$(mktemp -d)
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
for t in deploy/config-templates/*.yaml; do
    name=$(basename "$t")
    "$bin" config validate --config "$t" >"$tmp/validate.log" || {
        cat "$tmp/validate.log" >&2
        echo "release-check: $name does not validate" >&2
        exit 1
    }
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    sed "s/0\.0\.0\.0:8080/127.0.0.1:$port/" "$t" >"$tmp/$name"
    CONTINUUM_LOG=warn "$bin" --config "$tmp/$name" >"$tmp/$name.log" 2>&1 &
    pid=$!
    ok=""
    for _ in $(seq 1 150); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
            ok=1
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$ok" ]; then
        cat "$tmp/$name.log" >&2
        echo "release-check: the release binary did not serve /health with $name" >&2
        exit 1
    fi
    kill -TERM "$pid"
    if ! wait "$pid"; then
        cat "$tmp/$name.log" >&2
        echo "release-check: with $name the router did not exit 0 on SIGTERM" >&2
        exit 1
    fi
    pid=""
    echo "release-check: $name validates, serves /health and drains"
done
