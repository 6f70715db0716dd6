"""The fake Kubernetes API server's model (`fake_apiserver.py` serves it): the resource table,
`Status` objects, label and field selectors as kube-apiserver parses them, and the `Store` —
objects, the global resourceVersion counter, the bounded per-resource event history, open
watches and their queues, list snapshots for paging, faults and request statistics, all under
one condition variable. Objects are never mutated once stored. Standard library only.
"""

import base64
import collections
import datetime
import json
import re
import threading
import time
import uuid


def spec(group, version, kind, singular, short=(), categories=(), crd=False):
    return {"group": group, "version": version, "kind": kind, "singular": singular,
            "short": list(short), "categories": list(categories), "crd": crd,
            "api_version": f"{group}/{version}" if group else version}


RESOURCES = {
    "pods": spec("", "v1", "Pod", "pod", ["po"], ["all"]),
    "endpointslices": spec("discovery.k8s.io", "v1", "EndpointSlice", "endpointslice"),
    "dynamoworkermetadatas": spec("nvidia.com", "v1alpha1", "DynamoWorkerMetadata",
                                  "dynamoworkermetadata", crd=True),
}
VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.4",
           "gitCommit": "59526cd4867447956156ae3a602fcbac10a2c335", "gitTreeState": "clean",
           "buildDate": "2025-04-22T16:02:27Z", "goVersion": "go1.23.6", "compiler": "gc",
           "platform": "linux/amd64"}
VERBS = ["get", "list", "watch"]
BUILTIN_NAMESPACES = ["default", "dynamo", "kube-node-lease", "kube-public", "kube-system"]
DEFAULT_WATCH_TIMEOUT = 1800.0
SNAPSHOTS, LOG_KEEP, QUEUE_LIMIT = 64, 64, 100_000
PARAMS = ["limit", "continue", "resourceVersion", "resourceVersionMatch", "timeoutSeconds",
          "labelSelector", "fieldSelector", "allowWatchBookmarks", "sendInitialEvents", "watch"]


def status(code, reason, message, details=None):
    """A `Status` object as kube-apiserver encodes it."""
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason}
    if details is not None:
        s["details"] = details
    s["code"] = code
    return s


def expired(message):
    return status(410, "Expired", message)


class ApiError(Exception):
    def __init__(self, st):
        super().__init__(st["message"])
        self.status = st


def bad_request(message):
    return ApiError(status(400, "BadRequest", message))


def parse_bool(v):
    """Go's strconv.ParseBool, as the server parses `watch` and friends."""
    if v not in BOOLS:
        raise bad_request(f'strconv.ParseBool: parsing "{v}": invalid syntax')
    return BOOLS[v]


BOOLS = {**dict.fromkeys(["1", "t", "T", "TRUE", "true", "True"], True),
         **dict.fromkeys(["", "0", "f", "F", "FALSE", "false", "False"], False)}


def parse_uint(v, what="resourceVersion"):
    if v in (None, ""):
        return None
    if not v.isdigit():
        raise bad_request(f'{what}: Invalid value: "{v}": strconv.ParseUint: parsing '
                          f'"{v}": invalid syntax')
    return int(v)


# ---- selectors ---------------------------------------------------------------------------

KEY = (r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
       r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
SET_RE = re.compile(rf"\s*({KEY})\s+(in|notin)\s*\(([^()]*)\)\s*")
EQ_RE = re.compile(rf"\s*({KEY})\s*(==|!=|=)\s*({VALUE})\s*")
NOT_RE = re.compile(rf"\s*!\s*({KEY})\s*")
EXISTS_RE = re.compile(rf"\s*({KEY})\s*")


def split_top(s):
    """Splits at the commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in s:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    return parts + ["".join(cur)]


def parse_label_selector(s):
    """The (key, op, values) requirements of a label selector; ApiError 400 as the server."""
    if s is None or s.strip() == "":
        return []
    reqs = []
    for part in split_top(s):
        if m := SET_RE.fullmatch(part):
            vals = {v.strip() for v in m.group(3).split(",")}
            if vals == {""} or any(not re.fullmatch(VALUE, v) for v in vals):
                raise bad_request(f"unable to parse requirement: values set can't be empty "
                                  f"or invalid: {part.strip()!r}")
            reqs.append((m.group(1), m.group(2), vals))
        elif m := EQ_RE.fullmatch(part):
            reqs.append((m.group(1), "notin" if m.group(2) == "!=" else "in", {m.group(3)}))
        elif m := NOT_RE.fullmatch(part):
            reqs.append((m.group(1), "!", set()))
        elif m := EXISTS_RE.fullmatch(part):
            reqs.append((m.group(1), "exists", set()))
        else:
            raise bad_request(f"unable to parse requirement: found '{part.strip()}', "
                              f"expected: a valid label selector requirement")
    return reqs


def labels_match(reqs, obj):
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, vals in reqs:
        has = key in labels
        ok = {"in": has and labels.get(key) in vals, "notin": not has or labels[key] not in vals,
              "exists": has, "!": not has}[op]
        if not ok:
            return False
    return True


FIELDS = ["metadata.name", "metadata.namespace"]
POD_FIELDS = ["spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
              "spec.serviceAccountName", "status.phase", "status.podIP"]


def dig(obj, path):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj if isinstance(obj, str) else ""


def parse_field_selector(s, resource):
    if s is None or s.strip() == "":
        return []
    known = FIELDS + (POD_FIELDS if resource == "pods" else [])
    reqs = []
    for part in s.split(","):
        m = re.fullmatch(r"\s*([^=!\s]+)\s*(==|!=|=)\s*([^,]*?)\s*", part)
        if not m:
            raise bad_request(f"invalid selector: '{s}'; can't understand '{part}'")
        if m.group(1) not in known:
            raise bad_request(f"field label not supported: {m.group(1)}")
        reqs.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return reqs


def fields_match(reqs, obj):
    return all((dig(obj, path) == want) == eq for path, eq, want in reqs)


# ---- the store ---------------------------------------------------------------------------

class Watcher:
    """One open watch: its filter and the queue of events to write (filled under the lock)."""

    def __init__(self, namespace, labels, fields, bookmarks):
        self.namespace, self.labels, self.fields = namespace, labels, fields
        self.bookmarks, self.queue, self.overflow = bookmarks, collections.deque(), False

    def matches(self, obj):
        if obj is None:
            return False
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        return labels_match(self.labels, obj) and fields_match(self.fields, obj)

    def offer(self, typ, obj, prev):
        """Queues what this watch sees of one event (the watch cache's filter semantics)."""
        now, before = self.matches(obj), self.matches(prev if typ == "MODIFIED" else obj)
        if typ == "MODIFIED" and now != before:
            typ = "ADDED" if now else "DELETED"
            if not now:  # the previous content, at the event's version
                rv = obj["metadata"]["resourceVersion"]
                obj = dict(prev, metadata=dict(prev["metadata"], resourceVersion=rv))
        if now or before:
            self.push({"type": typ, "object": obj})

    def push(self, event):
        if len(self.queue) >= QUEUE_LIMIT:
            self.overflow = True  # a watcher that cannot keep up is closed, as the cache does
        else:
            self.queue.append(event)


def new_stats():
    return {"gets": 0, "lists": 0, "watches": 0, "proxies": 0, "open_watches": 0,
            "last_list": None, "last_watch": None, "list_log": collections.deque(maxlen=LOG_KEEP),
            "watch_log": collections.deque(maxlen=LOG_KEEP)}


class Store:
    """Everything, under one condition variable; objects are never mutated once stored."""

    def __init__(self, history):
        self.cond, self.rv, self.history_max = threading.Condition(), 1, history
        self.objects = {r: {} for r in RESOURCES}  # (namespace, name) -> object
        self.history = {r: collections.deque() for r in RESOURCES}  # (rv, type, obj, prev)
        self.compacted = {r: 0 for r in RESOURCES}  # events up to this version are gone
        self.watchers = {r: set() for r in RESOURCES}
        self.faults = {r: [] for r in RESOURCES}
        self.snapshots, self.next_snapshot = collections.OrderedDict(), 1  # list pages
        self.allowed, self.page_delay, self.bookmark_period = set(VERBS), 0.0, 5.0
        self.stats = {r: new_stats() for r in RESOURCES}
        self.rejected = {"401": 0, "403": 0}
        self.methods = collections.Counter()  # API requests by HTTP method
        self.namespaces = set(BUILTIN_NAMESPACES)

    def record(self, resource, typ, obj, prev):
        h = self.history[resource]
        if len(h) >= self.history_max:
            self.compacted[resource] = max(self.compacted[resource], h.popleft()[0])
        h.append((self.rv, typ, obj, prev))
        for w in self.watchers[resource]:
            w.offer(typ, obj, prev)
        self.cond.notify_all()

    def upsert(self, resource, namespace, obj):
        meta = dict(obj.get("metadata") or {})
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("object.metadata.name must be a non-empty string")
        with self.cond:
            old = self.objects[resource].get((namespace, name))
            self.rv += 1
            meta.update(namespace=namespace, resourceVersion=str(self.rv))
            if old is None:
                meta["uid"] = str(uuid.UUID(int=(0x4B << 120) | self.rv, version=4))
                meta.setdefault("creationTimestamp", now_rfc3339())
            else:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            rest = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion", "metadata")}
            new = {"kind": RESOURCES[resource]["kind"],
                   "apiVersion": RESOURCES[resource]["api_version"], "metadata": meta, **rest}
            self.objects[resource][(namespace, name)] = new
            self.namespaces.add(namespace)
            self.record(resource, "MODIFIED" if old else "ADDED", new, old)
            return new

    def delete(self, resource, namespace, name):
        with self.cond:
            old = self.objects[resource].pop((namespace, name), None)
            if old is None:
                return None
            self.rv += 1  # the DELETED object carries the version of its deletion
            gone = dict(old, metadata=dict(old["metadata"], resourceVersion=str(self.rv)))
            self.record(resource, "DELETED", gone, old)
            return gone

    def wait_rv(self, want):
        """None once the store reached version `want`; after 3 s, the 504 the cache answers."""
        deadline = time.monotonic() + 3.0
        with self.cond:
            while self.rv < want:
                left = deadline - time.monotonic()
                if left <= 0:
                    cause = {"reason": "ResourceVersionTooLarge",
                             "message": "Too large resource version"}
                    return status(504, "Timeout", f"Too large resource version: {want}, "
                                  f"current: {self.rv}", {"causes": [cause],
                                                          "retryAfterSeconds": 1})
                self.cond.wait(left)
        return None

    def list_page(self, resource, namespace, cont, labels, fields, limit):
        """(rv, items, continue token, remaining) of one page (under the lock)."""
        if cont:
            try:
                tok = json.loads(base64.urlsafe_b64decode(cont + "=" * (-len(cont) % 4)))
                sid, off = int(tok["snap"]), int(tok["off"])
            except (ValueError, KeyError, TypeError):
                raise bad_request(f"continue key is not valid: {cont}") from None
            if sid not in self.snapshots:
                raise ApiError(expired(
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."))
            rv, items = self.snapshots[sid]
        else:
            sid, off, rv = 0, 0, self.rv
            items = [o for (ns, _), o in sorted(self.objects[resource].items())
                     if (namespace is None or ns == namespace)
                     and labels_match(labels, o) and fields_match(fields, o)]
        if not limit or off + limit >= len(items):
            return rv, items[off:], None, None
        if not sid:
            sid, self.next_snapshot = self.next_snapshot, self.next_snapshot + 1
            self.snapshots[sid] = (rv, items)
            while len(self.snapshots) > SNAPSHOTS:
                self.snapshots.popitem(last=False)
        nxt = off + limit
        token = base64.urlsafe_b64encode(json.dumps(
            {"v": "meta.k8s.io/v1", "rv": rv, "start": items[nxt]["metadata"]["name"] + "\x00",
             "snap": sid, "off": nxt}, separators=(",", ":")).encode()).decode().rstrip("=")
        return rv, items[off:nxt], token, len(items) - nxt

    def bookmark(self, resource, annotations=None):
        meta = {"resourceVersion": str(self.rv), **({"annotations": annotations}
                                                    if annotations else {})}
        return {"type": "BOOKMARK", "object": {"kind": RESOURCES[resource]["kind"],
                                               "apiVersion": RESOURCES[resource]["api_version"],
                                               "metadata": meta}}

    def take_fault(self, resource):
        with self.cond:
            faults = self.faults[resource]
            if not faults:
                return None
            f = faults[0]
            if f["count"] > 0:
                f["count"] -= 1
                if f["count"] == 0:
                    faults.pop(0)
            return f

    def count(self, resource, verb, params=None):
        with self.cond:
            st = self.stats[resource]
            st[{"get": "gets", "list": "lists", "watch": "watches", "proxy": "proxies"}[verb]] += 1
            if params is not None:
                st[f"last_{verb}"] = params
                st[f"{verb}_log"].append(params)


    def count_method(self, method):
        with self.cond:
            self.methods[method] += 1


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


START = now_rfc3339()


def for_list(resource, obj):
    """A list item as the real server encodes it: built-in items carry no TypeMeta."""
    if RESOURCES[resource]["crd"]:
        return obj
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def namespace_object(name):
    return {"kind": "Namespace", "apiVersion": "v1", "metadata": {
        "name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "ns/" + name)),
        "resourceVersion": "1", "creationTimestamp": START,
        "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
