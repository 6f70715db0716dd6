#!/usr/bin/env bash
# tests/fleet/install.sh — installs what the real Dynamo fleet harness (tests/fleet/fleet.py) needs
# on a fresh Debian machine, as root: etcd (server + etcdctl) from Debian, and a Python venv
# outside the repo with ai-dynamo (CPU only), its run-time dependencies and the official
# openai / anthropic clients. The default release is 1.6.1, pinned by tests/fleet/requirements.txt;
# another release VERSION (tests/compat/run.sh: 1.4.2, 1.5.1, 1.7.0.dev20261026) gets its own venv
# and its own pins, tests/fleet/requirements-VERSION.txt.
#
# Idempotent: a stamp in the venv records the requirements' hash and the interpreter; when both
# match, this is a no-op that returns in well under a second.
#
#   tests/fleet/install.sh [VERSION]              install or confirm (tests/run.sh: no VERSION)
#   tests/fleet/install.sh --resolve [VERSION]    re-resolve the pins (maintainers): 1.6.1 from
#                                                 requirements.in into requirements.txt; another
#                                                 release from its ai-dynamo wheel's Requires-Dist
#                                                 into requirements-VERSION.txt
#   tests/fleet/install.sh --print-venv [VERSION]
#
# Environment: CONTINUUM_FLEET_VENV (the 1.6.1 venv; default $HOME/.cache/continuum-fleet/venv,
# tests/common/fleet.rs uses the same default; another release's venv is always
# $HOME/.cache/continuum-fleet/venv-VERSION), CONTINUUM_FLEET_PYTHON (default python3; needs 3.10
# to 3.13, 3.11 or later for 1.7).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
default_version=1.6.1
mode=install
case "${1:-}" in
    --resolve | --print-venv) mode=${1#--}; shift ;;
esac
version=${1:-$default_version}
if [ $# -gt 1 ] || ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+([.a-z0-9]*)$ ]]; then
    echo "usage: $0 [--resolve | --print-venv] [VERSION (default $default_version)]" >&2
    exit 2
fi
cache=${HOME:-/root}/.cache/continuum-fleet
if [ "$version" = "$default_version" ]; then
    venv=${CONTINUUM_FLEET_VENV:-$cache/venv}
    req="$here/requirements.txt"
else
    venv=$cache/venv-$version
    req="$here/requirements-$version.txt"
fi
python=${CONTINUUM_FLEET_PYTHON:-python3}
spec="$here/requirements.in"
stamp="$venv/.continuum-fleet-stamp"
# Bump when the install procedure changes in a way the requirements' hash does not show.
recipe=1

log() { echo "fleet install: $*" >&2; }

if [ "$mode" = print-venv ]; then
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
    *) log "$python is Python $pyver; ai-dynamo $version needs 3.10 to 3.13 (set CONTINUUM_FLEET_PYTHON)"; exit 1 ;;
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

if [ "$mode" = resolve ]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$tmp_home" "$scratch"' EXIT
    make_venv "$scratch/venv"
    if [ "$version" = "$default_version" ]; then
        resolved_from="requirements.in"
    else
        # No requirements.in per release: the spec is that release's ai-dynamo Requires-Dist (no
        # extras; markers evaluated here) minus aisimulate, plus what requirements.in adds to
        # 1.6.1's (modules imported but not declared, and the official clients). Every other
        # package is held at its 1.6.1 pin (requirements.txt) where the release's ai-dynamo and
        # ai-dynamo-runtime allow it, so that a difference in the table is Dynamo's. certifi's
        # floor is dropped: 1.7.0.dev20261026 asks for >=2026.10.23, newer than any certifi on
        # PyPI here, and a CA bundle's date does not matter on loopback.
        "$scratch/venv/bin/pip" download -q --no-deps -d "$scratch/wheel" \
            "ai-dynamo==$version" "ai-dynamo-runtime==$version"
        "$scratch/venv/bin/python" - "$scratch" "$here/requirements.txt" <<'PY'
import email.parser, glob, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as canon
scratch, pins_path = sys.argv[1:]
def requires(pattern):
    [path] = glob.glob(f"{scratch}/wheel/{pattern}")
    with zipfile.ZipFile(path) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(whl.read(meta).decode())
    reqs = [Requirement(line) for line in msg.get_all("Requires-Dist") or []]
    return [r for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]
spec, limits = [], {}
for r in requires("ai_dynamo-*.whl") + requires("ai_dynamo_runtime-*.whl"):
    if canon(r.name) == "certifi":
        r.specifier = type(r.specifier)("")
    limits.setdefault(canon(r.name), []).append(r.specifier)
    if canon(r.name) != "aisimulate":
        spec.append(f"{r.name}{r.specifier}")
spec += ["pyyaml", "packaging", "openai", "anthropic"]
constraints = []
for line in open(pins_path):
    if line.startswith("#") or "==" not in line:
        continue
    name, pin = line.strip().split("==", 1)
    if canon(name) in ("ai-dynamo", "ai-dynamo-runtime"):
        continue
    if all(s.contains(pin, prereleases=True) for s in limits.get(canon(name), [])):
        constraints.append(f"{canon(name)}=={pin}")  # pip names it so in its conflicts
open(f"{scratch}/requirements.in", "w").write("\n".join(spec) + "\n")
open(f"{scratch}/constraints.txt", "w").write("\n".join(constraints) + "\n")
PY
        spec="$scratch/requirements.in"
        constraints=(-c "$scratch/constraints.txt")
        resolved_from="ai-dynamo $version's Requires-Dist (minus aisimulate; any certifi) plus pyyaml,
# packaging, openai and anthropic, other packages held at requirements.txt's pins where allowed,"
    fi
    # A 1.6.1 pin that conflicts with the release below the top level (pydantic-core under the
    # pydantic that ai-dynamo-runtime 1.4.2 caps) is let go, one pip run at a time.
    for attempt in 1 2 3 4 5 6 7 8 9; do
        if out=$("$scratch/venv/bin/pip" install -r "$spec" "${constraints[@]}" 2>&1); then
            break
        fi
        drop=$(grep -oE 'requested \(constraint\) [A-Za-z0-9_.-]+==' <<<"$out" | cut -d' ' -f3 | sed 's/==$//' || true)
        if [ ${#constraints[@]} -eq 0 ] || [ -z "$drop" ] || [ "$attempt" = 9 ]; then
            echo "$out" >&2
            exit 1
        fi
        log "letting go of the 1.6.1 pin of ${drop//$'\n'/ }"
        awk -F== -v drop="$drop" 'BEGIN { n = split(drop, d, "\n"); for (i = 1; i <= n; i++) skip[d[i]] = 1 }
            !($1 in skip)' "$scratch/constraints.txt" >"$scratch/constraints.next"
        mv "$scratch/constraints.next" "$scratch/constraints.txt"
    done
    "$scratch/venv/bin/pip" install -q --no-deps "ai-dynamo==$version"
    check_imports "$scratch/venv"
    {
        echo "# Exact set of the fleet venv, resolved from $resolved_from by \`install.sh --resolve\`"
        echo "# with Python $pyver on $(date -u +%Y-%m-%d). Installed with \`pip install --no-deps\`."
        "$scratch/venv/bin/pip" freeze --all --exclude-editable | grep -viE '^(pip|setuptools|wheel)=='
    } >"$req"
    log "wrote $req ($(grep -vc '^#' "$req") packages)"
    exit 0
fi

if [ ! -f "$req" ]; then
    log "no pins for ai-dynamo $version: run $0 --resolve $version first"
    exit 1
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
