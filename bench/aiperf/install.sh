#!/usr/bin/env bash
# bench/aiperf/install.sh — installs NVIDIA's AIPerf (PyPI `aiperf`, pinned with its whole
# dependency set by bench/aiperf/requirements.txt) into its own venv outside the repo, for
# `continuum-bench aiperf` (bench/run.sh --aiperf) and tests/openai_fleet.rs. Its own venv, not the
# fleet's: AIPerf's dependencies (pydantic, numpy, pandas, ...) are resolved on their own and never
# shift the pins of ai-dynamo's venv.
#
# Idempotent: a stamp in the venv records the requirements' hash and the interpreter; when both
# match, this is a no-op that returns in well under a second.
#
#   bench/aiperf/install.sh              install or confirm (tests/run.sh and bench/run.sh call it)
#   bench/aiperf/install.sh --resolve    re-resolve requirements.in into requirements.txt
#   bench/aiperf/install.sh --print-bin  the aiperf executable
#
# Environment: CONTINUUM_AIPERF_VENV (default $HOME/.cache/continuum-aiperf/venv; the bench and the
# tests use the same default), CONTINUUM_AIPERF_PYTHON (default python3; 3.10 or newer).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${CONTINUUM_AIPERF_VENV:-${HOME:-/root}/.cache/continuum-aiperf/venv}
python=${CONTINUUM_AIPERF_PYTHON:-python3}
req="$here/requirements.txt"
spec="$here/requirements.in"
stamp="$venv/.continuum-aiperf-stamp"
recipe=1

log() { echo "aiperf install: $*" >&2; }

if [ "${1:-}" = "--print-bin" ]; then
    echo "$venv/bin/aiperf"
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

if ! command -v "$python" >/dev/null 2>&1; then
    apt_install python3 python3-venv
fi
pyver=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
case "$pyver" in
    3.1[0-9].*) ;;
    *) log "$python is Python $pyver; AIPerf needs 3.10 or newer (set CONTINUUM_AIPERF_PYTHON)"; exit 1 ;;
esac

mkdir -p "$(dirname "$venv")"
exec 9>"$(dirname "$venv")/.install.lock"
flock -w 900 9 || { log "another install holds $(dirname "$venv")/.install.lock"; exit 1; }

make_venv() { # $1: directory
    if ! "$python" -m venv --clear "$1" >/dev/null 2>&1; then
        apt_install python3-venv
        "$python" -m venv --clear "$1"
    fi
}

check() { # $1: venv
    "$1/bin/aiperf" --version >/dev/null
}

if [ "${1:-}" = "--resolve" ]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    make_venv "$scratch/venv"
    "$scratch/venv/bin/pip" install -q -r "$spec"
    check "$scratch/venv"
    {
        echo "# Exact set of the AIPerf venv, resolved from requirements.in by \`install.sh --resolve\`"
        echo "# with Python $pyver on $(date -u +%Y-%m-%d). Installed with \`pip install --no-deps\`."
        "$scratch/venv/bin/pip" freeze --all --exclude-editable | grep -viE '^(pip|setuptools|wheel)=='
    } >"$req"
    log "wrote $req ($(grep -vc '^#' "$req") packages)"
    exit 0
fi

want="recipe=$recipe python=$pyver req=$(sha256sum "$req" | cut -d' ' -f1)"
if [ -x "$venv/bin/aiperf" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

log "creating $venv (Python $pyver; takes about a minute and ~1.2 GB)"
started=$(date +%s)
rm -f "$stamp"
make_venv "$venv"
"$venv/bin/pip" install -q --no-deps --no-input -r "$req"
check "$venv"
echo "$want" >"$stamp"
log "done in $(($(date +%s) - started)) s; $(du -sh "$venv" | cut -f1) in $venv"
