#!/usr/bin/env bash
# tests/fleet/install.sh — installs what the real Dynamo 1.6.1 fleet harness (tests/fleet/fleet.py)
# needs on a fresh Debian machine, as root: etcd (server + etcdctl) from Debian, and a Python venv
# outside the repo with ai-dynamo 1.6.1 (CPU only), its run-time dependencies and the official
# openai / anthropic clients, pinned by tests/fleet/requirements.txt.
#
# Idempotent: a stamp in the venv records the requirements' hash and the interpreter; when both
# match, this is a no-op that returns in well under a second.
#
#   tests/fleet/install.sh             install or confirm (what tests/run.sh calls)
#   tests/fleet/install.sh --resolve   re-resolve requirements.in into requirements.txt (maintainers)
#   tests/fleet/install.sh --print-venv
#
# Environment: CONTINUUM_FLEET_VENV (default $HOME/.cache/continuum-fleet/venv; tests/common/fleet.rs
# uses the same default), CONTINUUM_FLEET_PYTHON (default python3; needs 3.10 to 3.13).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${CONTINUUM_FLEET_VENV:-${HOME:-/root}/.cache/continuum-fleet/venv}
python=${CONTINUUM_FLEET_PYTHON:-python3}
req="$here/requirements.txt"
spec="$here/requirements.in"
stamp="$venv/.continuum-fleet-stamp"
# Bump when the install procedure changes in a way the requirements' hash does not show.
recipe=1

log() { echo "fleet install: $*" >&2; }

if [ "${1:-}" = "--print-venv" ]; then
    echo "$venv"
    exit 0
fi

apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        log "missing $* and no apt-get here: install them by hand"
        exit 1
    fi
    log "apt-get install $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- system packages -------------------------------------------------------------------------
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
if [ ${#need[@]} -gt 0 ]; then
    apt_install "${need[@]}"
fi

# --- interpreter ---------------------------------------------------------------------------------
if ! command -v "$python" >/dev/null 2>&1; then
    apt_install python3 python3-venv
fi
pyver=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
case "$pyver" in
    3.1[0-3].*) ;;
    *) log "$python is Python $pyver; ai-dynamo 1.6.1 needs 3.10 to 3.13 (set CONTINUUM_FLEET_PYTHON)"; exit 1 ;;
esac

# --- venv ----------------------------------------------------------------------------------------
mkdir -p "$(dirname "$venv")"
exec 9>"$(dirname "$venv")/.install.lock"
flock -w 900 9 || { log "another install holds $(dirname "$venv")/.install.lock"; exit 1; }

make_venv() { # $1: directory
    if ! "$python" -m venv --clear "$1" >/dev/null 2>&1; then
        apt_install python3-venv
        "$python" -m venv --clear "$1"
    fi
}

# The modules the harness runs, and the clients later tests import.
check_imports() { # $1: venv
    HOME="$tmp_home" XDG_CACHE_HOME="$tmp_home/.cache" "$1/bin/python" -c '
import dynamo.mocker.main, dynamo.frontend.main, dynamo.llm, dynamo.runtime, openai, anthropic
'
}

tmp_home=$(mktemp -d)
trap 'rm -rf "$tmp_home"' EXIT

if [ "${1:-}" = "--resolve" ]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$tmp_home" "$scratch"' EXIT
    make_venv "$scratch/venv"
    "$scratch/venv/bin/pip" install -q -r "$spec"
    "$scratch/venv/bin/pip" install -q --no-deps ai-dynamo==1.6.1
    check_imports "$scratch/venv"
    {
        echo "# Exact set of the fleet venv, resolved from requirements.in by \`install.sh --resolve\`"
        echo "# with Python $pyver on $(date -u +%Y-%m-%d). Installed with \`pip install --no-deps\`."
        "$scratch/venv/bin/pip" freeze --all --exclude-editable | grep -viE '^(pip|setuptools|wheel)=='
    } >"$req"
    log "wrote $req ($(grep -vc '^#' "$req") packages)"
    exit 0
fi

want="recipe=$recipe python=$pyver req=$(sha256sum "$req" | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

log "creating $venv (Python $pyver; takes about a minute and ~0.8 GB)"
started=$(date +%s)
rm -f "$stamp"
make_venv "$venv"
"$venv/bin/pip" install -q --no-deps --no-input -r "$req"
check_imports "$venv"
echo "$want" >"$stamp"
log "done in $(($(date +%s) - started)) s; $(du -sh "$venv" | cut -f1) in $venv"
