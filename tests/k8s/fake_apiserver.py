"""A fake Kubernetes API server for end-to-end tests (standard library only): read-only for API
clients, scripted through a plain-HTTP control port.

The model (resources, selectors, the store of objects, events and watches) is `kube_model.py`
next to this file; this file serves it over HTTP.

Usage: fake_apiserver.py --cert CERT.pem --key KEY.pem --token TOKEN [--history N] [--user NAME]

Binds 127.0.0.1 on two ephemeral ports, the API (HTTPS, ALPN `http/1.1`) and the control port
(HTTP), and prints one JSON line `{"port": N, "control_port": M}` once both listen. Threads are
daemons; the process ends when its stdin closes (the test dropped it) or it is killed.

The API answers as kube-apiserver does for `pods` (v1), `endpointslices` (discovery.k8s.io/v1)
and the custom resource `dynamoworkermetadatas` (nvidia.com/v1alpha1), all namespaced, plus
`namespaces` (get, list) for kubectl. Every request needs `Authorization: Bearer TOKEN` (else
401 `Status`). Discovery (`/api`, `/apis`, `/api/v1`, `/apis/G[/V]`) is the legacy documents,
also when aggregated discovery is asked for; `/version`; `/openapi/*` is 404 (kubectl copes).
- list (`GET .../namespaces/NS/RES`, or `.../RES` for all): sorted by namespace and name;
  built-in items carry no `kind`/`apiVersion`, custom-resource items do and their list always
  has `metadata.continue`; `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, `k`, `!k`),
  `fieldSelector` (`metadata.name`, `metadata.namespace`, some Pod fields), `limit` +
  `continue` (all pages from the first page's snapshot; `remainingItemCount` only without
  selectors; a token older than 64 snapshots or a compaction: 410 Expired), `resourceVersion`
  (newer than the server's: 504 after 3 s); get (`.../RES/NAME`): the object, or 404;
- watch (`watch=true|1`): chunked `application/json`, one `{"type","object"}` per line. Without
  a resourceVersion (or `0`) ADDED for every match first; from one, the events after it out of a
  bounded per-resource history (older than it or a compaction: an ERROR event, 410 Expired).
  An object leaving / entering the selector is DELETED / ADDED. `timeoutSeconds` ends it
  cleanly (default 1800 s); `allowWatchBookmarks=true` gets a BOOKMARK after each
  `bookmark_period` of quiet (default 5 s) and when commanded; `sendInitialEvents=true` ends
  the initial events with a BOOKMARK annotated `k8s.io/initial-events-end: "true"`;
- a verb the verb table denies: 403 with RBAC's message; a method other than GET: 405;
- the Pod proxy subresource, GET only (`GET /api/v1/namespaces/NS/pods/[http:]NAME[:PORT]/proxy
  [/PATH]`, RBAC verb `get` on `pods/proxy`): when the Pod NS/NAME is stored, the GET is
  forwarded to `127.0.0.1:PORT/PATH` (query string included; port 80 when none) and its status,
  `Content-Type` and body are relayed; a Pod that is not stored is 404 `pods "NAME" not found`,
  a port nothing answers on 503 ServiceUnavailable (`error trying to reach service: ...`), an
  `https:` scheme 503 too (this fake does not proxy TLS). A test affordance: a real API server
  forwards to the Pod's IP (`status.podIP`); here the Pods' processes run on loopback, so the
  stored Pod only decides whether the proxy answers, and its IP is ignored.

Control port (JSON; 200 `{"ok": true, ...}`, else 400/404 `{"ok": false, "error"}`):
`POST /objects {"resource","namespace","object"}` upserts (ADDED/MODIFIED) and returns it
(`"objects": [...]` instead upserts each, in order, and returns their count);
`POST /delete {"resource","namespace","name"}` (DELETED); `POST /fault {"resource","kind",
"seconds","count"}`: the next `count` (default 1; 0 = until kind `none`) watches of that resource
get `gone` (HTTP 410 + Status), `stall` (headers, then nothing until the client leaves), `eof`
(the initial events, then a close without the last chunk), `close_after` (a clean end after
`seconds`) or `error_event` (an ERROR 410 event, then a clean end); `POST /slow_pages
{"delay_ms"}`; `POST /verbs {"allow": [...]}`; `POST /bookmark {"resource","all"?}` (to the
watches that allow bookmarks, or all); `POST /bookmark_period {"seconds"}` (0 = never);
`POST /compact {"resource"?}` (drops the history and list snapshots, as etcd compaction);
`GET /stats`: per resource the request counts `gets`, `lists`, `watches`, `proxies` (Pod proxy
GETs, `pods` only), `open_watches`, `objects`, the query parameters of the last list / watch
(`last_list`, `last_watch`) and of the last 64 (`list_log`, `watch_log`); `requests`: every API
request by HTTP method (`{"GET": n, "POST": m, ...}`, counted before authentication, so a refused
write shows too); `rejected_401`, `rejected_403`, `resource_version`.
"""

import argparse
import collections
import http.client
import http.server
import json
import re
import select
import socket
import ssl
import sys
import threading
import time
import traceback
import urllib.parse
import uuid

from kube_model import (DEFAULT_WATCH_TIMEOUT, PARAMS, RESOURCES, VERBS, VERSION, ApiError,
                        Store, Watcher, bad_request, expired, for_list, namespace_object,
                        parse_bool, parse_field_selector, parse_label_selector, parse_uint,
                        status)


# ---- the API -----------------------------------------------------------------------------

def discovery(path):
    """The discovery document at `path`, or None."""
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]}
    groups = {r["group"]: r["version"] for r in RESOURCES.values()}
    versions = {g: {"groupVersion": f"{g}/{v}", "version": v} for g, v in groups.items() if g}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [gv], "preferredVersion": gv} for g, gv in versions.items()]}
    if path.startswith("/apis/") and path[6:] in versions:
        gv = versions[path[6:]]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": path[6:], "versions": [gv],
                "preferredVersion": gv}
    for g, v in groups.items():
        gv = f"{g}/{v}" if g else v
        if path != ("/api/v1" if not g else f"/apis/{gv}"):
            continue
        res = [{"name": "namespaces", "singularName": "namespace", "namespaced": False,
                "kind": "Namespace", "verbs": ["get"], "shortNames": ["ns"]}] if not g \
            else []
        for name, r in RESOURCES.items():
            if r["group"] == g:
                res.append({"name": name, "singularName": r["singular"], "namespaced": True,
                            "kind": r["kind"], "verbs": list(VERBS),
                            **({"shortNames": r["short"]} if r["short"] else {}),
                            **({"categories": r["categories"]} if r["categories"] else {})})
        return {"kind": "APIResourceList", **({"apiVersion": "v1"} if g else {}),
                "groupVersion": gv, "resources": res}
    return None


def route(path):
    """(resource, namespace or None, name or None) of a resource path, or None."""
    segs = [s for s in path.split("/") if s]
    for name, r in RESOURCES.items():
        prefix = ["api", "v1"] if not r["group"] else ["apis", r["group"], r["version"]]
        if segs[:len(prefix)] != prefix:
            continue
        rest = segs[len(prefix):]
        if rest == [name]:
            return name, None, None
        if len(rest) in (3, 4) and rest[0] == "namespaces" and rest[2] == name:
            return name, rest[1], rest[3] if len(rest) == 4 else None
    return None


# `/api/v1/namespaces/NS/pods/[SCHEME:]NAME[:PORT]/proxy[/PATH]`: the Pod proxy subresource.
PROXY_RE = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<target>[^/:]+(?::[^/:]*){0,2})"
                      r"/proxy(?P<rest>/.*)?")

NOT_FOUND = status(404, "NotFound", "the server could not find the requested resource", {})


def qualified(resource):
    group = RESOURCES[resource]["group"]
    return f"{resource}.{group}" if group else resource


def details_of(resource, name):
    group = RESOURCES[resource]["group"]
    return {**({"name": name} if name else {}), **({"group": group} if group else {}),
            "kind": resource}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send_body(self, code, body, content_type="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ApiHandler(Handler):
    def setup(self):
        self.request.do_handshake()
        super().setup()

    def send_response(self, code, message=None):
        # kube-apiserver sends no `Server` header.
        self.log_request(code)
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.send_header("Cache-Control", "no-cache, private")

    def send_json(self, code, obj):
        self.send_body(code, (json.dumps(obj, separators=(",", ":")) + "\n").encode())

    def authorized(self):
        scheme, _, tok = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and tok.strip() == self.server.token:
            return True
        with STORE.cond:
            STORE.rejected["401"] += 1
        self.send_json(401, status(401, "Unauthorized", "Unauthorized"))
        return False

    def do_GET(self):
        STORE.count_method("GET")
        try:
            if self.authorized():
                self.serve_get()
        except ApiError as e:
            self.send_json(e.status["code"], e.status)
        except (OSError, ValueError):
            self.close_connection = True

    def refuse_method(self):
        STORE.count_method(self.command)
        try:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.authorized():
                self.send_json(405, status(405, "MethodNotAllowed", "the server does not allow "
                                           "this method on the requested resource", {}))
        except (OSError, ValueError):
            self.close_connection = True

    do_POST = do_PUT = do_PATCH = do_DELETE = refuse_method

    def serve_get(self):
        url = urllib.parse.urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        if path == "/version":
            return self.send_json(200, VERSION)
        if path in ("/healthz", "/livez", "/readyz"):
            return self.send_body(200, b"ok", "text/plain; charset=utf-8")
        doc = discovery(path)
        if doc is not None:
            return self.send_json(200, doc)
        if path.startswith("/api/v1/namespaces/") and path.count("/") == 4:
            return self.namespace(path[len("/api/v1/namespaces/"):])
        proxied = PROXY_RE.fullmatch(url.path)
        if proxied:
            return self.pod_proxy(*proxied.group("ns", "target", "rest"), url.query)
        r = route(path)
        if r is None:
            return self.send_json(404, NOT_FOUND)
        resource, ns, name = r
        watch = parse_bool(q.get("watch", ""))
        verb = "get" if name else "watch" if watch else "list"  # a get ignores `watch`
        if verb not in STORE.allowed:
            return self.forbidden(resource, ns, name, verb)
        if name:
            return self.get_one(resource, ns, name)
        STORE.count(resource, verb, dict({k: q.get(k) for k in PARAMS}, namespace=ns))
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), resource)
        if watch:
            return WatchStream(self, resource, ns, q, labels, fields).run()
        return self.list(resource, ns, q, labels, fields)

    def namespace(self, name):
        """kubectl asks for the namespace after a NotFound, to word its message."""
        with STORE.cond:
            known = name in STORE.namespaces
        if not known:
            return self.send_json(404, status(404, "NotFound", f'namespaces "{name}" not found',
                                              {"name": name, "kind": "namespaces"}))
        self.send_json(200, namespace_object(name))

    def pod_proxy(self, ns, target, rest, query):
        """GET through the Pod proxy subresource, to loopback (see the module's docstring)."""
        parts = target.split(":")
        scheme = parts.pop(0) if len(parts) == 3 else "http"
        name, port = parts[0], parts[1] if len(parts) == 2 else "80"
        if "get" not in STORE.allowed:
            with STORE.cond:
                STORE.rejected["403"] += 1
            return self.send_json(403, status(403, "Forbidden", (
                f'pods "{name}" is forbidden: User "{self.server.user}" cannot get resource '
                f'"pods/proxy" in API group "" in the namespace "{ns}"'),
                {"name": name, "kind": "pods"}))
        STORE.count("pods", "proxy")
        with STORE.cond:
            known = (ns, name) in STORE.objects["pods"]
        if not known:
            return self.send_json(404, status(404, "NotFound", f'pods "{name}" not found',
                                              {"name": name, "kind": "pods"}))
        unreachable = status(503, "ServiceUnavailable", "error trying to reach service: "
                             f"dial tcp 127.0.0.1:{port}: connect: connection refused")
        if scheme != "http" or not port.isdigit() or not 0 < int(port) < 65536:
            return self.send_json(503, unreachable)
        conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
        try:
            conn.request("GET", (rest or "/") + (f"?{query}" if query else ""),
                         headers={"Accept": self.headers.get("Accept") or "*/*"})
            resp = conn.getresponse()
            body, code = resp.read(), resp.status
            ctype = resp.getheader("Content-Type") or "application/octet-stream"
        except OSError:
            return self.send_json(503, unreachable)
        finally:
            conn.close()
        self.send_body(code, body, ctype)

    def forbidden(self, resource, ns, name, verb):
        what = f'{qualified(resource)} "{name}"' if name else qualified(resource)
        where = f'in the namespace "{ns}"' if ns is not None else "at the cluster scope"
        with STORE.cond:
            STORE.rejected["403"] += 1
        self.send_json(403, status(403, "Forbidden", (
            f'{what} is forbidden: User "{self.server.user}" cannot {verb} resource '
            f'"{resource}" in API group "{RESOURCES[resource]["group"]}" {where}'),
            details_of(resource, name)))

    def get_one(self, resource, ns, name):
        STORE.count(resource, "get")
        with STORE.cond:
            obj = STORE.objects[resource].get((ns, name))
        if obj is None:
            return self.send_json(404, status(404, "NotFound", f'{qualified(resource)} "{name}" '
                                              "not found", details_of(resource, name)))
        self.send_json(200, obj)

    def list(self, resource, ns, q, labels, fields):
        limit = parse_uint(q.get("limit"), "limit") or 0
        want, cont = parse_uint(q.get("resourceVersion")), q.get("continue")
        if cont and want:
            raise bad_request("specifying resource version is not allowed when using continue")
        err = STORE.wait_rv(want) if want else None
        if err:
            return self.send_json(504, err)
        with STORE.cond:
            rv, items, token, left = STORE.list_page(resource, ns, cont, labels, fields, limit)
            delay = STORE.page_delay
        if delay:
            time.sleep(delay)
        r = RESOURCES[resource]
        meta = {"resourceVersion": str(rv)}
        if token or r["crd"]:
            meta["continue"] = token or ""
        if left is not None and not labels and not fields:
            meta["remainingItemCount"] = left
        self.send_json(200, {"kind": r["kind"] + "List", "apiVersion": r["api_version"],
                             "metadata": meta, "items": [for_list(resource, o) for o in items]})


class WatchStream:
    """One watch request: its fault, registration and initial events, then the event loop."""

    def __init__(self, handler, resource, ns, q, labels, fields):
        self.h, self.resource, self.q = handler, resource, q
        self.watcher = Watcher(ns, labels, fields, parse_bool(q.get("allowWatchBookmarks", "")))
        self.timeout = float(parse_uint(q.get("timeoutSeconds"), "timeoutSeconds")
                             or DEFAULT_WATCH_TIMEOUT)
        self.want = parse_uint(q.get("resourceVersion")) or None  # "0" is "any", as unset
        self.initial_end = parse_bool(q.get("sendInitialEvents", ""))

    def run(self):
        fault = STORE.take_fault(self.resource)
        kind = fault["kind"] if fault else None
        with STORE.cond:
            too_old = expired(f"too old resource version: {self.want or 0} ({STORE.rv})")
        if kind == "gone":
            return self.h.send_json(410, too_old)
        err = STORE.wait_rv(self.want) if self.want else None
        self.h.send_response(200)
        self.h.send_header("Content-Type", "application/json")
        self.h.send_header("Transfer-Encoding", "chunked")
        self.h.end_headers()
        self.h.wfile.flush()
        with STORE.cond:
            STORE.stats[self.resource]["open_watches"] += 1
        try:
            if err or kind == "error_event":
                self.chunk({"type": "ERROR", "object": err or too_old})
            elif kind == "stall":
                while self.client_alive(0.25):
                    pass
                return
            else:
                seconds = float(fault.get("seconds") or 0) if kind == "close_after" else None
                self.stream(kind == "eof", seconds)
                if kind == "eof":
                    return
            self.h.wfile.write(b"0\r\n\r\n")
            self.h.wfile.flush()
        finally:
            with STORE.cond:
                STORE.watchers[self.resource].discard(self.watcher)
                STORE.stats[self.resource]["open_watches"] -= 1
            if kind in ("eof", "stall"):
                self.h.close_connection = True
                try:
                    self.h.connection.shutdown(socket.SHUT_RDWR)  # no TLS close_notify either
                except OSError:
                    pass

    def register(self):
        """Registers the watcher and queues its initial events (under the lock)."""
        w, r, want = self.watcher, self.resource, self.want
        if want is not None and want < STORE.compacted[r]:
            w.push({"type": "ERROR", "object": expired(
                f"too old resource version: {want} ({STORE.compacted[r] + 1})")})
            return False
        if want is None:
            for _, o in sorted(STORE.objects[r].items()):
                if w.matches(o):
                    w.push({"type": "ADDED", "object": o})
            if self.initial_end:
                w.push(STORE.bookmark(r, {"k8s.io/initial-events-end": "true"}))
        else:
            for rv, typ, obj, prev in STORE.history[r]:
                if rv > want:
                    w.offer(typ, obj, prev)
        STORE.watchers[r].add(w)
        return True

    def stream(self, initial_only, seconds):
        deadline = time.monotonic() + (self.timeout if seconds is None
                                       else min(self.timeout, seconds))
        w = self.watcher
        with STORE.cond:
            live = self.register()
        last_write = time.monotonic()
        while True:
            with STORE.cond:
                if not w.queue and live and not initial_only:
                    STORE.cond.wait(min(0.25, max(0.0, deadline - time.monotonic())))
                period = STORE.bookmark_period
                if (w.bookmarks and 0 < period <= time.monotonic() - last_write
                        and not w.queue):
                    w.queue.append(STORE.bookmark(self.resource))
                batch, overflow = list(w.queue), w.overflow
                w.queue.clear()
            for ev in batch:
                self.chunk(ev)
                last_write = time.monotonic()
            if not live or initial_only or overflow or time.monotonic() >= deadline:
                return
            if not self.client_alive(0):
                raise ConnectionResetError("the watch client left")

    def chunk(self, ev):
        data = (json.dumps(ev, separators=(",", ":")) + "\n").encode()
        self.h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.h.wfile.flush()

    def client_alive(self, wait):
        """False once the client closed its side (it sends nothing while it watches)."""
        conn = self.h.connection
        try:
            if not select.select([conn], [], [], wait)[0]:
                return True
            conn.settimeout(0.05)
            try:
                return conn.recv(1) != b""
            finally:
                conn.settimeout(None)
        except (socket.timeout, ssl.SSLWantReadError):
            return True
        except (OSError, ValueError):
            return False


# ---- the control port --------------------------------------------------------------------

class ControlHandler(Handler):
    def reply(self, code, obj):
        self.send_body(code, json.dumps(obj).encode())

    def do_GET(self):
        if self.path != "/stats":
            return self.reply(404, {"ok": False, "error": f"no control path {self.path}"})
        with STORE.cond:
            out = {"ok": True, "resource_version": str(STORE.rv),
                   "rejected_401": STORE.rejected["401"], "rejected_403": STORE.rejected["403"],
                   "requests": dict(STORE.methods)}
            for r, st in STORE.stats.items():
                out[r] = {k: list(v) if isinstance(v, collections.deque) else v
                          for k, v in st.items()}
                out[r]["objects"] = len(STORE.objects[r])
        self.reply(200, out)

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))
                              or b"{}")
            code, out = control(self.path, body)
            self.reply(code, out)
        except (ValueError, KeyError, TypeError) as e:
            self.reply(400, {"ok": False, "error": f"{type(e).__name__}: {e}"})


FAULTS = ("gone", "stall", "eof", "close_after", "error_event")
CONTROL_PATHS = ["/objects", "/delete", "/fault", "/bookmark",  # these name a resource
                 "/compact", "/slow_pages", "/verbs", "/bookmark_period"]


def control(path, body):
    """(status, answer) of one control command."""
    if path not in CONTROL_PATHS:
        return 404, {"ok": False, "error": f"no control path {path}"}
    r = body.get("resource")
    if r not in RESOURCES and (path in CONTROL_PATHS[:4] or r is not None):
        raise ValueError(f"unknown resource {r!r}; one of {sorted(RESOURCES)}")
    ns = body.get("namespace", "dynamo")
    if not isinstance(ns, str) or not ns:
        raise ValueError("namespace must be a non-empty string")
    if path == "/objects":
        if isinstance(body.get("objects"), list):
            # Many at once (a large fleet): each one an event, as separate puts would be.
            for obj in body["objects"]:
                if not isinstance(obj, dict):
                    raise ValueError("objects must hold JSON objects")
                STORE.upsert(r, ns, obj)
            return 200, {"ok": True, "count": len(body["objects"])}
        if not isinstance(body.get("object"), dict):
            raise ValueError("object must be a JSON object")
        return 200, {"ok": True, "object": STORE.upsert(r, ns, body["object"])}
    if path == "/delete":
        gone = STORE.delete(r, ns, body["name"])
        if gone is None:
            return 404, {"ok": False, "error": f"no {r} {ns}/{body['name']}"}
        return 200, {"ok": True, "object": gone}
    with STORE.cond:
        if path == "/fault":
            if body["kind"] == "none":
                STORE.faults[r].clear()
            elif body["kind"] in FAULTS:
                STORE.faults[r].append({"kind": body["kind"], "count": int(body.get("count", 1)),
                                        "seconds": float(body.get("seconds") or 0)})
            else:
                raise ValueError(f"unknown fault kind {body['kind']!r}; one of {FAULTS}")
            return 200, {"ok": True, "pending": len(STORE.faults[r])}
        if path == "/slow_pages":
            STORE.page_delay = float(body["delay_ms"]) / 1000.0
            return 200, {"ok": True}
        if path == "/verbs":
            if not set(body["allow"]) <= set(VERBS):
                raise ValueError(f"verbs must be among {VERBS}")
            STORE.allowed = set(body["allow"])
            return 200, {"ok": True, "allow": sorted(STORE.allowed)}
        if path == "/bookmark":
            sent = 0
            for w in STORE.watchers[r]:
                if w.bookmarks or body.get("all"):
                    w.push(STORE.bookmark(r))
                    sent += 1
            STORE.cond.notify_all()
            return 200, {"ok": True, "sent": sent}
        if path == "/bookmark_period":
            STORE.bookmark_period = float(body["seconds"])
            return 200, {"ok": True}
        if path == "/compact":
            for c in [r] if r else list(RESOURCES):
                STORE.history[c].clear()
                STORE.compacted[c] = STORE.rv
            STORE.snapshots.clear()
            return 200, {"ok": True, "resource_version": str(STORE.rv)}
    raise AssertionError(path)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that rejected our certificate or left: nothing to report. Anything else is a
        # bug of this fake: on stderr, with the test's output.
        if not isinstance(sys.exc_info()[1], (OSError, EOFError)):
            traceback.print_exc()


STORE = None


def main():
    global STORE
    ap = argparse.ArgumentParser(description="a fake kube-apiserver for tests")
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--history", type=int, default=10_000, help="events kept per resource")
    ap.add_argument("--user", default="system:serviceaccount:dynamo:continuum-router")
    args = ap.parse_args()
    STORE = Store(max(1, args.history))
    api = Server(("127.0.0.1", 0), ApiHandler)
    api.token, api.user = args.token, args.user
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    ctx.set_alpn_protocols(["http/1.1"])
    # The handshake runs in the connection's thread, so a client that rejects the certificate
    # never stalls the accept loop.
    api.socket = ctx.wrap_socket(api.socket, server_side=True, do_handshake_on_connect=False)
    control_server = Server(("127.0.0.1", 0), ControlHandler)
    for s in (api, control_server):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(json.dumps({"port": api.server_address[1],
                      "control_port": control_server.server_address[1]}), flush=True)
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
