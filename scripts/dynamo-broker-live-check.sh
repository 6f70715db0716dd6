#!/usr/bin/env bash
# dynamo-broker-live-check.sh: the read-only live check of a router's broker tunnel (FLEET-06..10).
#
# Role: against a router running `dynamo.load.transport: broker` outside the cluster and the
# `continuum-event-broker` Pods in the workers' namespace, check in order:
#   1. every row of `subscriptions` (GET /admin/dynamo/workers) is `transport: broker`,
#      `connected` and names its broker; report the router's `continuum_dynamo_event_bus_sessions`
#      and each broker Pod's `/metrics` (sessions, streams, refusals by reason), read through the
#      API server's Pod proxy (`kubectl get --raw .../pods/POD:PORT/proxy/metrics`);
#   2. scrape the router's /metrics once per second for --window seconds: the kv_metrics and
#      kv-events counts decoded over the window, the largest gap between applied load samples
#      against --max-staleness-ms, and the share of selections made on fresh load;
#   3. with --probe-image only: time TCP+TLS handshakes to --bus-url from one disposable non-root
#      Pod in the broker namespace and report half the median as the one-way latency estimate.
#
# Invariants:
#   - read-only: without --probe-image it only issues GETs (router HTTP, kubectl get); with it, it
#     creates exactly one Pod (`kubectl run --rm`, deleted when it exits) and nothing else;
#   - the admin token is read from $ROUTER_ADMIN_TOKEN and handed to curl on stdin (`-K -`), never
#     on a command line, and never printed;
#   - exit 0 when every check passes, 1 when one fails (the report says which and why), 2 on a
#     usage error (missing token, unknown flag, missing or invalid value, missing tool);
#   - every network call is bounded (curl --max-time, kubectl --request-timeout).
# Tools: bash, curl, kubectl ($CONTINUUM_KUBECTL overrides the binary), awk, sed, grep, sort.

set -u -o pipefail
export LC_ALL=C # decimal points in curl's timings, awk and sort

PROG=${0##*/}
BROKER_SELECTOR_DEFAULT="app.kubernetes.io/name=continuum-event-broker"
BROKER_METRICS_PORT=9464

usage() {
    cat <<EOF
Usage: ROUTER_ADMIN_TOKEN=... $PROG --namespace NS --router-url URL [options]

Read-only live check of the router's broker tunnel (FLEET-06..10).

Required:
  --namespace NS            the broker's Kubernetes namespace (the workers')
  --router-url URL          the router's HTTP address, https://HOST:PORT (or http://)
  ROUTER_ADMIN_TOKEN        (environment) the router's admin token, sent as a Bearer token

Options:
  --context NAME            kubeconfig context (default: the current one)
  --router-ca FILE          CA bundle (PEM) for a router whose certificate a private CA signed
  --window SECONDS          check 2 scrapes /metrics once per second this long (default 300)
  --max-staleness-ms MS     largest gap allowed between applied load samples (default 3000;
                            use the router's dynamo.load.max_staleness)
  --broker-selector SEL     label selector of the broker Pods
                            (default $BROKER_SELECTOR_DEFAULT)
  --probe-image IMAGE       run check 3 from one disposable non-root Pod of IMAGE
                            (e.g. curlimages/curl:8.11.1); without it nothing is created
  --bus-url URL             the event bus listener, https://HOST:PORT (required with
                            --probe-image)
  --probe-count N           handshakes check 3 times (default 20)
  -h, --help                this text

Example:
  ROUTER_ADMIN_TOKEN=... $PROG \\
      --context <context> --namespace <broker namespace> \\
      --router-url https://<router host>:<port> \\
      --window 300 --max-staleness-ms 3000 \\
      --probe-image curlimages/curl:8.11.1 --bus-url https://<bus host>:<bus port>

Exit status: 0 every check passed, 1 a check failed, 2 usage error.
EOF
}

usage_error() {
    printf '%s: %s (see --help)\n' "$PROG" "$1" >&2
    exit 2
}

# ---- arguments -------------------------------------------------------------------------------

CONTEXT="" NAMESPACE="" ROUTER_URL="" ROUTER_CA="" WINDOW=300 MAX_STALENESS_MS=3000
PROBE_IMAGE="" BUS_URL="" PROBE_COUNT=20 BROKER_SELECTOR=$BROKER_SELECTOR_DEFAULT

while (($# > 0)); do
    flag=$1 value="" inline=0
    case $flag in
        -h | --help) usage; exit 0 ;;
        --*=*) value=${flag#*=}; flag=${flag%%=*}; inline=1 ;;
    esac
    case $flag in
        --context | --namespace | --router-url | --router-ca | --window | --max-staleness-ms | \
            --probe-image | --bus-url | --probe-count | --broker-selector)
            if ((inline == 0)); then
                (($# >= 2)) || usage_error "$flag needs a value"
                value=$2
                shift
            fi
            [[ -n $value ]] || usage_error "$flag needs a value"
            ;;
        *) usage_error "unknown argument: $flag" ;;
    esac
    case $flag in
        --context) CONTEXT=$value ;;
        --namespace) NAMESPACE=$value ;;
        --router-url) ROUTER_URL=${value%/} ;;
        --router-ca) ROUTER_CA=$value ;;
        --window) WINDOW=$value ;;
        --max-staleness-ms) MAX_STALENESS_MS=$value ;;
        --probe-image) PROBE_IMAGE=$value ;;
        --bus-url) BUS_URL=$value ;;
        --probe-count) PROBE_COUNT=$value ;;
        --broker-selector) BROKER_SELECTOR=$value ;;
    esac
    shift
done

[[ -n ${ROUTER_ADMIN_TOKEN:-} ]] || usage_error "ROUTER_ADMIN_TOKEN is not set"
[[ -n $NAMESPACE ]] || usage_error "--namespace is required"
[[ -n $ROUTER_URL ]] || usage_error "--router-url is required"
[[ $ROUTER_URL =~ ^https?://[^/]+$ ]] ||
    usage_error "--router-url must be https://HOST:PORT or http://HOST:PORT"
[[ $WINDOW =~ ^[0-9]+$ ]] && ((WINDOW >= 1)) ||
    usage_error "--window must be a whole number of seconds >= 1"
[[ $MAX_STALENESS_MS =~ ^[0-9]+$ ]] && ((MAX_STALENESS_MS >= 1)) ||
    usage_error "--max-staleness-ms must be a whole number of milliseconds >= 1"
[[ $PROBE_COUNT =~ ^[0-9]+$ ]] && ((PROBE_COUNT >= 1)) ||
    usage_error "--probe-count must be >= 1"
[[ -z $ROUTER_CA || -r $ROUTER_CA ]] ||
    usage_error "--router-ca $ROUTER_CA is not a readable file"
if [[ -n $PROBE_IMAGE ]]; then
    [[ -n $BUS_URL ]] || usage_error "--bus-url is required with --probe-image"
    [[ $BUS_URL =~ ^https://[^/]+(/.*)?$ ]] || usage_error "--bus-url must be https://HOST:PORT"
elif [[ -n $BUS_URL ]]; then
    usage_error "--bus-url is only used with --probe-image"
fi
KUBECTL=${CONTINUUM_KUBECTL:-kubectl}
for tool in curl "$KUBECTL" awk sed grep sort; do
    command -v "$tool" >/dev/null 2>&1 || usage_error "$tool is not installed"
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/broker-live-check.XXXXXX") || exit 2
PROBE_POD=""
cleanup() {
    # The probe Pod is `--rm`: only an interrupted run leaves it behind.
    if [[ -n $PROBE_POD ]]; then
        "$KUBECTL" "${KCTL[@]}" delete pod "$PROBE_POD" --ignore-not-found --wait=false \
            >/dev/null 2>&1 || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

KNS=(-n "$NAMESPACE")
[[ -n $CONTEXT ]] && KNS=(--context "$CONTEXT" "${KNS[@]}")
KCTL=(--request-timeout=20s "${KNS[@]}")
CURL=(curl -sS --connect-timeout 5 --max-time 10)
[[ -n $ROUTER_CA ]] && CURL+=(--cacert "$ROUTER_CA")
FAILED=()

# ---- helpers ---------------------------------------------------------------------------------

# now_ms: wall clock in milliseconds.
now_ms() {
    if [[ -n ${EPOCHREALTIME:-} ]]; then
        local us=${EPOCHREALTIME/[.,]/}
        echo $((10#$us / 1000))
    else
        date +%s%3N
    fi
}

# router_get PATH OUT [admin]: GET on the router into OUT; prints the HTTP status (000: no
# answer, the reason in OUT.err). With `admin`, the token goes to curl on stdin as a header.
router_get() {
    local path=$1 out=$2 admin=${3:-}
    if [[ -n $admin ]]; then
        local t=${ROUTER_ADMIN_TOKEN//\\/\\\\}
        t=${t//\"/\\\"}
        printf 'header = "Authorization: Bearer %s"\n' "$t" |
            "${CURL[@]}" -K - -o "$out" -w '%{http_code}' "$ROUTER_URL$path" 2>"$out.err"
    else
        "${CURL[@]}" -o "$out" -w '%{http_code}' "$ROUTER_URL$path" 2>"$out.err" </dev/null
    fi
}

# JSON on stdin to `path<TAB>value` lines (`subscriptions.0.state<TAB>connected`), scalars only.
JSON_FLATTEN='
function emit(v,   p, d) {
    p = ""
    for (d = 1; d <= depth; d++) p = p (d > 1 ? "." : "") key[d]
    print p "\t" v
}
{ buf = buf $0 "\n" }
END {
    n = length(buf); depth = 0; want_key = 0; i = 1
    while (i <= n) {
        c = substr(buf, i, 1)
        if (c == "{") { key[++depth] = ""; kind[depth] = "o"; want_key = 1; i++ }
        else if (c == "[") { key[++depth] = 0; kind[depth] = "a"; want_key = 0; i++ }
        else if (c == "}" || c == "]") { depth--; want_key = 0; i++ }
        else if (c == ",") { if (kind[depth] == "a") key[depth]++; else want_key = 1; i++ }
        else if (c == ":") { want_key = 0; i++ }
        else if (c == "\"") {
            s = ""
            for (j = i + 1; j <= n; j++) {
                d = substr(buf, j, 1)
                if (d == "\"") break
                if (d == "\\") {
                    e = substr(buf, ++j, 1)
                    s = s (e == "n" || e == "t" || e == "r" ? " " : e == "u" ? "\\u" : e)
                } else s = s d
            }
            i = j + 1
            if (want_key && kind[depth] == "o") { key[depth] = s; want_key = 0 } else emit(s)
        } else if (c ~ /[-0-9a-z]/) {
            for (j = i; j <= n && substr(buf, j, 1) ~ /[-+.0-9a-zA-Z]/; j++) ;
            emit(substr(buf, i, j - i)); i = j
        } else i++
    }
}'

# metric_value NAME FILE: the value of the unlabelled sample NAME in a Prometheus text file.
metric_value() {
    awk -v name="$1" '
        $1 == name { print $2; found = 1; exit }
        END { if (!found) print "absent" }' "$2"
}

say() { printf '%s\n' "$*"; }

# ---- the report ------------------------------------------------------------------------------

say "continuum broker tunnel live check"
say "  router      $ROUTER_URL"
say "  kubernetes  context ${CONTEXT:-(current)}, namespace $NAMESPACE"
say "  brokers     Pods labelled $BROKER_SELECTOR"
say "  window      $WINDOW s, max staleness $MAX_STALENESS_MS ms"
say ""

# ---- check 1: subscriptions through a broker, sessions, the broker Pods' metrics -------------

say "[1/3] subscriptions through a broker (GET /admin/dynamo/workers)"
code=$(router_get /admin/dynamo/workers "$TMP/workers.json" admin)
check1=""
if [[ $code != 200 ]]; then
    case $code in
        000) check1="the router did not answer: $(head -n1 "$TMP/workers.json.err")" ;;
        401) check1="the router refused ROUTER_ADMIN_TOKEN (HTTP 401)" ;;
        *) check1="/admin/dynamo/workers answered HTTP $code: $(head -c 200 "$TMP/workers.json")" ;;
    esac
    say "  $check1"
else
    awk "$JSON_FLATTEN" "$TMP/workers.json" >"$TMP/workers.flat"
    awk -F '\t' -v out="$TMP/check1" '
        $1 ~ /^subscriptions\.[0-9]+\./ {
            split($1, p, "."); r = p[2]
            if (!(r in seen)) { seen[r] = 1; order[++n] = r }
            val[r, p[3]] = $2
        }
        $1 ~ /^broker_coverage\./ { split($1, p, "."); cov[p[2]] = cov[p[2]] " " p[3] " " $2 }
        END {
            printf "  %-11s %-20s %-24s %-10s %-10s %s\n", "family", "publisher", \
                "namespace/component", "state", "transport", "broker"
            bad = 0
            for (k = 1; k <= n; k++) {
                r = order[k]
                b = ((r, "broker") in val) ? val[r, "broker"] : "-"
                printf "  %-11s %-20s %-24s %-10s %-10s %s\n", val[r, "family"], \
                    val[r, "publisher_id"], val[r, "namespace"] "/" val[r, "component"], \
                    val[r, "state"], val[r, "transport"], b
                through = val[r, "transport"] == "broker" && val[r, "state"] == "connected"
                if (!through || b == "-") {
                    why[++bad] = sprintf("%s publisher %s (%s/%s): state %s, transport %s, %s", \
                        val[r, "family"], val[r, "publisher_id"], val[r, "namespace"], \
                        val[r, "component"], val[r, "state"], val[r, "transport"], \
                        b == "-" ? "no broker" : "broker " b)
                }
            }
            for (ns in cov) print "  broker_coverage " ns ":" cov[ns]
            if (n == 0) print "no subscriptions are listed" > out
            else if (bad > 0) {
                print bad " of " n " subscriptions not connected through a broker" > out
                for (k = 1; k <= bad; k++) print "    not connected: " why[k] > out
            } else print "ok " n > out
        }' "$TMP/workers.flat"
    read -r first <"$TMP/check1"
    if [[ $first == ok\ * ]]; then
        check1_ok="${first#ok } subscriptions, all connected through a broker"
    else
        check1=$(cat "$TMP/check1")
    fi
fi

code=$(router_get /metrics "$TMP/metrics.0")
if [[ $code == 200 ]]; then
    sessions=$(metric_value continuum_dynamo_event_bus_sessions "$TMP/metrics.0")
    say "  router: continuum_dynamo_event_bus_sessions $sessions"
else
    say "  router: /metrics answered HTTP $code $(head -n1 "$TMP/metrics.0.err" 2>/dev/null)"
fi

# The broker Pods and their metrics port (the container port named `metrics`, else 9464), one
# `NAME|PHASE|PORT` line each.
jsonpath='{range .items[*]}{.metadata.name}{"|"}{.status.phase}{"|"}'
jsonpath+='{.spec.containers[*].ports[?(@.name=="metrics")].containerPort}{"\n"}{end}'
if "$KUBECTL" "${KCTL[@]}" get pods -l "$BROKER_SELECTOR" -o "jsonpath=$jsonpath" \
    >"$TMP/pods" 2>"$TMP/pods.err" </dev/null; then
    if [[ ! -s $TMP/pods ]]; then
        say "  WARN: no broker Pod matches $BROKER_SELECTOR in namespace $NAMESPACE"
    fi
    while IFS='|' read -r pod phase port; do
        [[ -n $pod ]] || continue
        port=${port%% *}
        port=${port:-$BROKER_METRICS_PORT}
        say "  broker Pod $pod ($phase), metrics port $port:"
        proxy="/api/v1/namespaces/$NAMESPACE/pods/$pod:$port/proxy/metrics"
        if "$KUBECTL" "${KCTL[@]}" get --raw "$proxy" \
            >"$TMP/broker.metrics" 2>"$TMP/broker.err" </dev/null; then
            for m in continuum_event_broker_sessions continuum_event_broker_streams \
                continuum_event_broker_advertised_publishers; do
                say "    $m $(metric_value "$m" "$TMP/broker.metrics")"
            done
            grep '^continuum_event_broker_refusals_total{' "$TMP/broker.metrics" | sed 's/^/    /'
        else
            say "    WARN: metrics unreachable through the Pod proxy: $(head -n1 "$TMP/broker.err")"
        fi
    done <"$TMP/pods"
else
    say "  WARN: cannot list the broker Pods: $(head -n1 "$TMP/pods.err")"
fi

if [[ -z $check1 ]]; then
    say "  PASS: $check1_ok"
else
    say "  FAIL: $check1"
    FAILED+=("check 1 (subscriptions through a broker)")
fi
say ""

# ---- check 2: load freshness over the window -------------------------------------------------

say "[2/3] load freshness: /metrics once per second for $WINDOW s"
# One line per sample: `INDEX MS series value`, or `INDEX MS FAILED` for a scrape that failed.
: >"$TMP/samples"
start=$(now_ms)
for ((i = 0; i <= WINDOW; i++)); do
    wait_ms=$((start + i * 1000 - $(now_ms)))
    if ((wait_ms > 0)); then
        sleep "$(printf '%d.%03d' $((wait_ms / 1000)) $((wait_ms % 1000)))"
    fi
    t=$(now_ms)
    code=$(router_get /metrics "$TMP/scrape")
    if [[ $code == 200 ]]; then
        awk -v i="$i" -v t="$((t - start))" '
            BEGIN { print i, t, "SCRAPED", 0 }
            /^continuum_dynamo_(load_events|kv_events|selection)_total\{/ { print i, t, $1, $2 }
        ' "$TMP/scrape" >>"$TMP/samples"
    else
        echo "$i $((t - start)) FAILED" >>"$TMP/samples"
    fi
done
awk -v max="$MAX_STALENESS_MS" -v out="$TMP/check2" '
    function flush(   s, d) {
        if (cur == "") return
        ok++
        for (s in now) {
            if (ok == 1) { prev[s] = now[s]; continue }
            d = (s in prev) ? now[s] - prev[s] : now[s]
            if (d < 0) { d = now[s]; resets++ }  # the router restarted: a counter from 0
            inc[s] += d; prev[s] = now[s]
        }
        a = "continuum_dynamo_load_events_total{result=\"applied\"}"
        if (ok == 1) last_fresh = t
        else if (inc[a] > seen_applied) {
            if (t - last_fresh > gap) gap = t - last_fresh
            last_fresh = t; seen_applied = inc[a]
        }
        end_t = t
        delete now
        cur = ""
    }
    function label(s, name,   v) {
        if (!match(s, name "=\"[^\"]*\"")) return ""
        v = substr(s, RSTART + length(name) + 2, RLENGTH - length(name) - 3)
        return v
    }
    function family(prefix, title, unit,   s, total, applied, other) {
        total = 0; applied = 0; other = ""
        for (s in inc) {
            if (index(s, prefix "{") != 1) continue
            total += inc[s]
            if (label(s, "result") == "applied") applied += inc[s]
            else if (inc[s] > 0) other = other sprintf(", %s %.0f", label(s, "result"), inc[s])
        }
        printf "  %s: %.0f %s, %.0f applied%s\n", title, total, unit, applied, other
        return applied
    }
    BEGIN { cur = "" }
    ($1 "") != cur { flush(); cur = $1 ""; t = $2 }
    $3 == "FAILED" { failed++; cur = ""; next }
    { now[$3] = $4 }
    END {
        flush()
        scrapes = ok + failed
        printf "  scrapes: %d of %d answered%s\n", ok, scrapes, \
            resets ? sprintf(", %d counter resets (the router restarted)", resets) : ""
        if (ok < 2) { print "fewer than 2 scrapes of /metrics answered" > out; exit }
        applied = family("continuum_dynamo_load_events_total", "kv_metrics frames", "decoded")
        family("continuum_dynamo_kv_events_total", "kv-events", "decoded")
        if (end_t - last_fresh > gap) gap = end_t - last_fresh
        load = 0; rr = 0; other = ""
        for (s in inc) {
            if (index(s, "continuum_dynamo_selection_total{") != 1) continue
            r = label(s, "reason")
            if (r == "load") { load += inc[s]; by_load[label(s, "role")] += inc[s] }
            else if (r == "round_robin_stale") { rr += inc[s]; by_rr[label(s, "role")] += inc[s] }
            else if (inc[s] > 0) other = other sprintf(", %s %s %.0f", label(s, "role"), r, inc[s])
        }
        printf "  selections on fresh load: "
        if (load + rr == 0) printf "no traffic (load 0, round_robin_stale 0)"
        else {
            printf "%.1f%% (load %.0f, round_robin_stale %.0f", 100 * load / (load + rr), load, rr
            for (role in by_load)
                if (by_load[role] + by_rr[role] > 0)
                    printf "; %s %.0f/%.0f", role, by_load[role], by_load[role] + by_rr[role]
            for (role in by_rr)
                if (!(role in by_load) && by_rr[role] > 0) printf "; %s 0/%.0f", role, by_rr[role]
            printf ")"
        }
        if (other != "") printf "; other selections: %s", substr(other, 3)
        printf "\n"
        if (applied == 0) {
            printf "  largest gap between applied load samples: the whole window (none applied)\n"
            print "no kv_metrics frame was applied during the window" > out
            exit
        }
        printf "  largest gap between applied load samples: %d ms (limit %d ms; 1 s scrape " \
            "resolution)\n", gap, max
        if (gap > max) printf "the largest gap, %d ms, exceeds --max-staleness-ms %d\n", \
            gap, max > out
        else print "ok" > out
    }' "$TMP/samples"
check2=$(cat "$TMP/check2" 2>/dev/null)
if [[ $check2 == ok ]]; then
    say "  PASS: load samples kept fresh through the window"
else
    say "  FAIL: ${check2:-the window could not be analysed}"
    FAILED+=("check 2 (load freshness)")
fi
say ""

# ---- check 3: bus latency from the broker namespace ------------------------------------------

if [[ -z $PROBE_IMAGE ]]; then
    say "[3/3] bus latency: skipped (no --probe-image; nothing was created in the cluster)"
else
    say "[3/3] bus latency: $PROBE_COUNT TCP+TLS handshakes to $BUS_URL from namespace $NAMESPACE"
    PROBE_POD="continuum-live-check-$(date +%s)-$$"
    # Non-root (nobody), no privilege escalation, no capabilities, no service account token.
    overrides='{"apiVersion":"v1","spec":{"automountServiceAccountToken":false,'
    overrides+='"securityContext":{"runAsNonRoot":true,"runAsUser":65534,"runAsGroup":65534,'
    overrides+='"seccompProfile":{"type":"RuntimeDefault"}},"containers":[{"name":"'$PROBE_POD'",'
    overrides+='"securityContext":{"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":true,'
    overrides+='"capabilities":{"drop":["ALL"]}}}]}}'
    # -k: the handshake is timed, the certificate is not what is checked here.
    loop='n=0; while [ "$n" -lt "$1" ]; do
curl -sk --http2 -o /dev/null --connect-timeout 5 --max-time 10 \
    -w "%{time_connect} %{time_appconnect}\n" "$0" || true
n=$((n + 1)); done'
    # Bounded: the Pod must run within 2 minutes, each handshake within 10 s.
    bound=()
    command -v timeout >/dev/null 2>&1 && bound=(timeout $((150 + 11 * PROBE_COUNT)))
    ${bound[@]+"${bound[@]}"} "$KUBECTL" "${KNS[@]}" run "$PROBE_POD" --rm -i --quiet \
        --restart=Never --image "$PROBE_IMAGE" \
        --labels app.kubernetes.io/name=continuum-live-check \
        --override-type=strategic --overrides "$overrides" --pod-running-timeout=2m \
        --command -- sh -c "$loop" "$BUS_URL" "$PROBE_COUNT" \
        >"$TMP/probe" 2>"$TMP/probe.err" </dev/null
    probe_rc=$?
    # Removed by `--rm` once kubectl saw it exit; otherwise the exit trap deletes it.
    ((probe_rc == 0)) && PROBE_POD=""
    grep -E '^[0-9]+(\.[0-9]+)? [0-9]+(\.[0-9]+)?$' "$TMP/probe" |
        awk '$2 > 0' >"$TMP/probe.times" || true
    got=$(wc -l <"$TMP/probe.times")
    if ((got == 0)); then
        why=$(grep -v '^$' "$TMP/probe.err" | head -n1)
        say "  no handshake completed (kubectl exit $probe_rc): $why"
        say "  FAIL: no TCP+TLS handshake to $BUS_URL completed"
        FAILED+=("check 3 (bus latency)")
    else
        median() {
            sort -n | awk '{ v[NR] = $1 }
                END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
        }
        connect=$(awk '{ print $1 }' "$TMP/probe.times" | median)
        appconnect=$(awk '{ print $2 }' "$TMP/probe.times" | median)
        awk -v c="$connect" -v a="$appconnect" -v got="$got" -v want="$PROBE_COUNT" 'BEGIN {
            printf "  handshakes completed: %d of %d\n", got, want
            printf "  median TCP connect: %.3f ms; median TCP+TLS (time_appconnect): %.3f ms\n", \
                c * 1000, a * 1000
            # FLEET-10: half the median. time_appconnect spans the TCP and the TLS round trips
            # (and DNS), so this errs high.
            printf "  one-way bus latency estimate (half the median TCP+TLS handshake): " \
                "%.3f ms\n", a * 500
        }'
        say "  PASS: the bus is reachable from namespace $NAMESPACE"
    fi
fi
say ""

if ((${#FAILED[@]} == 0)); then
    say "RESULT: PASS"
    exit 0
fi
result=$(printf '%s, ' "${FAILED[@]}")
say "RESULT: FAIL: ${result%, }"
exit 1
