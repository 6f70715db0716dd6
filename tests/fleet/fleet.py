#!/usr/bin/env python3
"""Runs a REAL NVIDIA Dynamo 1.6.1 fleet on loopback for tests: etcd, mocker workers, frontends.

Run it with the fleet venv's python (tests/fleet/install.sh creates it):

    $VENV/bin/python tests/fleet/fleet.py --agg tiny-agg:1 --disagg tiny-disagg:1:1 [--lease-ttl 3]

What it does:
  1. etcd on free loopback ports with a data dir in a fresh temp dir;
  2. one `python -m dynamo.mocker` process per worker (own process group, own env: DYN_NAMESPACE,
     etcd discovery, TCP request plane, ZMQ event plane, every DYN_*_HOST on 127.0.0.1, HOME and
     XDG_CACHE_HOME in the temp dir, hub access off), block size 64 like the fixtures;
  3. `python -m dynamo.frontend --router-mode direct` on free HTTP ports: by default one frontend per
     namespace, scoped with `--namespace` (`--frontends shared` runs one unscoped frontend instead;
     Dynamo 1.6.1 direct mode works either way);
  4. waits until every worker's `v1/instances` and `v1/mdc` keys are in etcd (and its kv_metrics
     channel, briefly) and every frontend lists its models (disaggregated: prefill router active);
  5. prints ONE line of JSON describing the fleet on stdout, then serves commands on stdin, one per
     line, each answered with one JSON line:
         kill <instance id, hex or decimal> [SIGKILL|SIGTERM|SIGINT|SIGSTOP|SIGCONT]   (default SIGTERM)
         add [NS/]MODEL                           one more aggregated worker (NS default `agg`),
                                                  answered once it is registered in etcd
         status                                   the fleet JSON again, with `alive` per process
         etcd kill [SIGNAL]                       signal etcd (default SIGKILL; waits for its exit)
         etcd restart                             start etcd again on the same data dir and ports,
                                                  answered once it is healthy (at most 15 s)
         quit                                     tear down and exit
  6. tears everything down (SIGTERM, then SIGKILL, to each process group; temp dir removed) when
     stdin closes, on `quit`, or on SIGTERM / SIGINT / SIGHUP. Children also get SIGKILL if this
     process dies (PR_SET_PDEATHSIG).

Worker specs: `--agg [NS/]MODEL:N` (namespace `agg` by default), `--disagg [NS/]MODEL:P:D` (namespace
`disagg` by default: P prefill workers, component `prefill`; D decode workers, component `backend`).
Errors go to stderr with the tail of the failing process's log; the exit code is then 1.
Everything listens on 127.0.0.1, except that Dynamo 1.6.1 binds its ZMQ PUB sockets on 0.0.0.0
(advertised as 127.0.0.1; not configurable); every wait is bounded.

Other releases (tests/fleet/install.sh VERSION; tests/compat/run.sh): the differences are branched
on the installed ai-dynamo version, each naming its release (DYNAMO_RELEASE below). 1.4.2 and 1.5.1
advertise their ZMQ publishers on the machine's first routable address, not 127.0.0.1.
"""

import argparse
import base64
import ctypes
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The shared fixtures sit beside the repo (../shared), on developer machines and in CI.
DEFAULT_MODEL_PATH = os.environ.get("CONTINUUM_FLEET_MODEL_PATH") or os.path.normpath(
    os.path.join(REPO, "..", "shared", "fixtures", "tiny-model")
)
LOOPBACK = "127.0.0.1"
SIGNALS = {
    "SIGKILL": signal.SIGKILL,
    "SIGTERM": signal.SIGTERM,
    "SIGINT": signal.SIGINT,
    "SIGSTOP": signal.SIGSTOP,
    "SIGCONT": signal.SIGCONT,
}


def dynamo_release():
    """The installed ai-dynamo release as (major, minor, patch), e.g. (1, 6, 1); a nightly such as
    1.7.0.dev20261026 is (1, 7, 0). (0, 0, 0) when it cannot be read."""
    try:
        text = importlib.metadata.version("ai-dynamo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown", (0, 0, 0)
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return text, tuple(int(g) for g in m.groups()) if m else (0, 0, 0)


DYNAMO_VERSION, DYNAMO_RELEASE = dynamo_release()
# Before 1.6 (seen on 1.4.2 and 1.5.1) a worker publishes its card with `hf://MODEL-NAME/FILE`
# paths instead of the local files, and the frontend resolves them in its Hugging Face cache
# (offline here): the fleet gives the frontends a cache holding each served name.
CARD_PATHS_ARE_HUB_NAMES = DYNAMO_RELEASE < (1, 6, 0)
# Before 1.6 (1.4.2, 1.5.1) DYN_TCP_RESPONSE_STREAM_HOST names a network INTERFACE, not an
# address: "127.0.0.1" fails every model with "Interface not found: 127.0.0.1"; `lo` is loopback.
RESPONSE_STREAM_HOST = "lo" if DYNAMO_RELEASE < (1, 6, 0) else LOOPBACK




def prefill_router_active(frontend_log, model):
    """Whether a frontend's log says its prefill router for `model` is active."""
    if DYNAMO_RELEASE < (1, 5, 0):
        # 1.4.2 has no "Prefill router target activated" line. It may also log "P/D routing
        # remains disabled because the sole prefill endpoint does not match the cached
        # activation" when the decode card is seen first, and then activates anyway.
        return f'Prefill worker registered and router activated successfully model_name="{model}"' in frontend_log
    return f"Prefill router target activated model_name={model}" in frontend_log


class FleetError(Exception):
    pass


class Shutdown(Exception):
    pass


def log(msg):
    print(f"fleet: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup():
    # Own session/process group (start_new_session does setsid first); die with the parent.
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            lines = f.read().decode("utf-8", "replace").splitlines()[-n:]
        return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines)
    except OSError as e:
        return f"(no log: {e})"


def read_log(path):
    try:
        with open(path, "rb") as f:
            return re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode("utf-8", "replace"))
    except OSError:
        return ""


class Proc:
    """A child process in its own process group, logging to a file."""

    def __init__(self, name, argv, env, log_path, cwd):
        self.name = name
        self.argv = argv
        self.log = log_path
        self.killed_with = None
        with open(log_path, "ab") as out:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_child_setup,
            )
        self.pid = self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def signal_group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def group_gone(self):
        try:
            os.killpg(self.pid, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False


def stop_all(procs, grace):
    """SIGTERM every group, wait up to `grace` s, then SIGKILL what is left; reap everything."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        if p.alive():
            p.signal_group(signal.SIGCONT)
            p.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        p.wait(deadline - time.monotonic())
    for p in procs:
        if not p.alive() and p.group_gone():
            continue
        p.signal_group(signal.SIGKILL)
    deadline = time.monotonic() + 5
    for p in procs:
        p.wait(deadline - time.monotonic())
        while not p.group_gone() and time.monotonic() < deadline:
            time.sleep(0.05)


# --- etcd over its v3 HTTP/JSON gateway (no client library needed) -------------------------------


class Etcd:
    def __init__(self, endpoint):
        self.endpoint = endpoint

    def _post(self, path, body, timeout=3):
        req = urllib.request.Request(
            self.endpoint + path,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def healthy(self):
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def get_prefix(self, prefix):
        """{key: value} for every key under `prefix` (values as str)."""
        key = prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        out = self._post(
            "/v3/kv/range",
            {"key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode()},
        )
        kvs = {}
        for kv in out.get("kvs", []):
            k = base64.b64decode(kv["key"]).decode()
            v = base64.b64decode(kv.get("value", "")).decode("utf-8", "replace")
            kvs[k] = v
        return kvs


# --- which process listens on a port (maps etcd registrations to worker processes) ------------------


def listening_ports_by_inode():
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] != "0A":  # LISTEN
                        continue
                    ports[parts[9]] = int(parts[1].rsplit(":", 1)[1], 16)
        except OSError:
            pass
    return ports


def ports_of(pid, by_inode):
    ports = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return ports
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            port = by_inode.get(target[8:-1])
            if port is not None:
                ports.add(port)
    return ports


def json_records(table, prefix):
    """The (key, parsed JSON value) pairs of `table` under `prefix`; unparsable values skipped."""
    for key, val in table.items():
        if not key.startswith(prefix):
            continue
        try:
            yield key, json.loads(val)
        except ValueError:
            continue


def port_of_endpoint(text):
    m = re.search(r":(\d+)(?:/|$)", text)
    return int(m.group(1)) if m else None


# --- the fleet ------------------------------------------------------------------------------------


def parse_spec(text, kind):
    ns = kind
    if "/" in text:
        ns, text = text.split("/", 1)
    parts = text.split(":")
    want = 2 if kind == "agg" else 3
    if len(parts) != want or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        form = "[NS/]MODEL:N" if kind == "agg" else "[NS/]MODEL:PREFILL:DECODE"
        raise FleetError(f"--{kind} {text!r}: expected {form}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", ns):
        raise FleetError(f"--{kind}: bad namespace {ns!r}")
    counts = [int(p) for p in parts[1:]]
    if kind == "agg":
        if counts[0] < 1:
            raise FleetError(f"--agg {text!r}: need at least one worker")
        return [(ns, parts[0], "aggregated", "backend", counts[0])]
    if counts[0] < 1 or counts[1] < 1:
        raise FleetError(f"--disagg {text!r}: need at least one prefill and one decode worker")
    return [
        (ns, parts[0], "prefill", "prefill", counts[0]),
        (ns, parts[0], "decode", "backend", counts[1]),
    ]


class Fleet:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="continuum-fleet-")
        self.etcd_proc = None
        self.etcd = None
        self.workers = []  # dicts with "proc"
        self.frontends = []  # dicts with "proc"
        self.started_at = time.monotonic()

    # environment shared by Dynamo processes
    def dyn_env(self, name, namespace=None):
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DYN_", "ETCD_", "NATS_", "HF_", "TRANSFORMERS_", "VLLM_"))
        }
        home = os.path.join(self.dir, "home", name)
        os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
        env.update(
            {
                "HOME": home,
                "XDG_CACHE_HOME": os.path.join(home, ".cache"),
                "TMPDIR": home,
                "DYN_DISCOVERY_BACKEND": "etcd",
                "ETCD_ENDPOINTS": self.etcd.endpoint,
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_EVENT_PLANE": "zmq",
                "DYN_TCP_RPC_HOST": LOOPBACK,
                "DYN_TCP_RESPONSE_STREAM_HOST": RESPONSE_STREAM_HOST,
                "DYN_EVENT_PLANE_HOST": LOOPBACK,
                "DYN_SYSTEM_HOST": LOOPBACK,
                "DYN_HTTP_HOST": LOOPBACK,
                "DYN_HTTP_RPC_HOST": LOOPBACK,
                # Cards stay in etcd (`v1/mdc/...`) as in the fixtures; silences a warning.
                "DYN_SELF_HOST_METADATA": "0",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "PYTHONUNBUFFERED": "1",
                "NO_COLOR": "1",
            }
        )
        if CARD_PATHS_ARE_HUB_NAMES:
            env["HF_HUB_CACHE"] = self.hub_cache()
        if self.args.lease_ttl:
            env["ETCD_LEASE_TTL"] = str(self.args.lease_ttl)
        if namespace:
            env["DYN_NAMESPACE"] = namespace
        if self.args.dyn_log:
            env["DYN_LOG"] = self.args.dyn_log
        return env

    def hub_cache(self, more=()):
        """A Hugging Face hub cache (HF_HUB_CACHE) in the temp dir holding the fixture model under
        every model name of the fleet (`add` may bring a new one): 1.4.2 and 1.5.1 frontends
        look their cards' `hf://NAME/FILE` paths up there. Files are symlinks."""
        cache = os.path.join(self.dir, "hf-hub")
        names = {w["model"] for w in self.workers} | set(more)
        for name in names:
            repo = os.path.join(cache, "models--" + name.replace("/", "--"))
            snapshot = os.path.join(repo, "snapshots", "0" * 40)
            if os.path.isdir(snapshot):
                continue
            os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
            os.makedirs(snapshot, exist_ok=True)
            for f in os.listdir(self.args.model_path):
                os.symlink(os.path.join(self.args.model_path, f), os.path.join(snapshot, f))
            with open(os.path.join(repo, "refs", "main"), "w") as out:
                out.write("0" * 40)
        return cache

    def deadline(self):
        return self.started_at + self.args.startup_timeout

    def check_deadline(self, what, proc=None):
        if time.monotonic() > self.deadline():
            extra = f"\n--- {proc.log} (tail) ---\n{tail(proc.log)}" if proc else ""
            raise FleetError(f"timed out after {self.args.startup_timeout}s waiting for {what}{extra}")

    def check_alive(self, procs):
        for p in procs:
            if not p.alive():
                raise FleetError(
                    f"{p.name} (pid {p.pid}) exited with {p.popen.returncode} during startup\n"
                    f"--- {p.log} (tail) ---\n{tail(p.log)}"
                )

    # 1. etcd
    def start_etcd(self):
        last = None
        for attempt in range(3):
            client, peer = free_port(), free_port()
            data = os.path.join(self.dir, f"etcd-data-{attempt}")
            env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
            argv = [
                self.args.etcd,
                "--name", "fleet",
                "--data-dir", data,
                "--listen-client-urls", f"http://{LOOPBACK}:{client}",
                "--advertise-client-urls", f"http://{LOOPBACK}:{client}",
                "--listen-peer-urls", f"http://{LOOPBACK}:{peer}",
                "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{peer}",
                "--initial-cluster", f"fleet=http://{LOOPBACK}:{peer}",
                "--initial-cluster-state", "new",
            ]  # fmt: skip
            proc = Proc("etcd", argv, env, os.path.join(self.dir, "etcd.log"), self.dir)
            etcd = Etcd(f"http://{LOOPBACK}:{client}")
            until = min(self.deadline(), time.monotonic() + 15)
            while time.monotonic() < until and proc.alive():
                if etcd.healthy():
                    self.etcd_proc, self.etcd = proc, etcd
                    return
                time.sleep(0.1)
            last = f"etcd did not become healthy (exit {proc.popen.poll()})\n{tail(proc.log)}"
            stop_all([proc], 2)
        raise FleetError(last)

    # 2. workers
    def start_workers(self):
        a = self.args
        specs = []
        for s in a.agg:
            specs += parse_spec(s, "agg")
        for s in a.disagg:
            specs += parse_spec(s, "disagg")
        if not specs:
            raise FleetError("nothing to run: give --agg and/or --disagg")
        seen = {}
        for ns, model, _role, _comp, _n in specs:
            if seen.setdefault(model, ns) != ns:
                raise FleetError(f"model {model} given in two namespaces")
        mode_of = {}
        for ns, model, role, _comp, _n in specs:
            kind = "agg" if role == "aggregated" else "disagg"
            if mode_of.setdefault((ns, model), kind) != kind:
                raise FleetError(f"model {model} given as both agg and disagg")
        for ns, model, role, comp, n in specs:
            for _ in range(n):
                self.spawn_worker(ns, model, role, comp)

    def spawn_worker(self, ns, model, role, comp):
        a = self.args
        name = f"worker{len(self.workers) + 1}-{ns}-{role}"
        argv = [
            sys.executable, "-m", "dynamo.mocker",
            "--model-path", a.model_path,
            "--model-name", model,
            "--endpoint", f"dyn://{ns}.{comp}.generate",
            "--block-size", str(a.block_size),
        ]  # fmt: skip
        if role != "aggregated":
            argv += ["--disaggregation-mode", role]
        if a.speedup_ratio is not None:
            argv += ["--speedup-ratio", str(a.speedup_ratio)]
        argv += shlex.split(a.mocker_args) if a.mocker_args else []
        log_path = os.path.join(self.dir, f"{name}.log")
        if CARD_PATHS_ARE_HUB_NAMES:
            self.hub_cache([model])
        proc = Proc(name, argv, self.dyn_env(name, ns), log_path, self.dir)
        w = {"namespace": ns, "component": comp, "role": role, "model": model, "proc": proc}
        self.workers.append(w)
        return w

    def add_worker(self, spec):
        """`add [NS/]MODEL`: one more aggregated worker, registered (instance, card and
        kv_metrics channel in etcd) before the reply; bounded by --startup-timeout."""
        try:
            [(ns, model, role, comp, _n)] = parse_spec(spec + ":1", "agg")
        except FleetError as e:
            return {"ok": False, "cmd": "add", "error": str(e)}
        for other in self.workers:
            if other["model"] == model and other["namespace"] != ns:
                return {"ok": False, "cmd": "add", "error": f"model {model} is in {other['namespace']}"}
        w = self.spawn_worker(ns, model, role, comp)
        until = time.monotonic() + self.args.startup_timeout
        while time.monotonic() < until and w["proc"].alive():
            self.fill_worker(
                w,
                self.etcd.get_prefix("v1/instances/"),
                self.etcd.get_prefix("v1/mdc/"),
                self.etcd.get_prefix("v1/event_channels/"),
                listening_ports_by_inode(),
            )
            if "card" in w and w.get("kv_metrics") is not None:
                return {"ok": True, "cmd": "add", "worker": self.describe()["workers"][-1]}
            time.sleep(0.1)
        return {"ok": False, "cmd": "add", "error": f"{w['proc'].name} did not register\n{tail(w['proc'].log)}"}

    def frontend_plan(self):
        namespaces = []
        for w in self.workers:
            if w["namespace"] not in namespaces:
                namespaces.append(w["namespace"])
        if self.args.frontends == "shared":
            return [(None, namespaces)] * self.args.frontend_replicas
        return [(ns, [ns]) for ns in namespaces for _ in range(self.args.frontend_replicas)]

    # 3. frontends
    def spawn_frontend(self, index, scope, serves):
        port = free_port()
        name = f"frontend{index}-{scope or 'shared'}"
        argv = [
            sys.executable, "-m", "dynamo.frontend",
            "--router-mode", "direct",
            "--http-host", LOOPBACK,
            "--http-port", str(port),
        ]  # fmt: skip
        if scope:
            argv += ["--namespace", scope]
        argv += shlex.split(self.args.frontend_args) if self.args.frontend_args else []
        log_path = os.path.join(self.dir, f"{name}.log")
        proc = Proc(name, argv, self.dyn_env(name, scope), log_path, self.dir)
        return {"scope": scope, "namespaces": serves, "url": f"http://{LOOPBACK}:{port}", "proc": proc}

    def start_frontends(self):
        for i, (scope, serves) in enumerate(self.frontend_plan(), 1):
            self.frontends.append(self.spawn_frontend(i, scope, serves))

    # 4. readiness
    def wait_workers(self):
        pending = list(self.workers)
        kv_grace_until = None
        while True:
            self.check_alive([w["proc"] for w in self.workers] + [self.etcd_proc])
            instances = self.etcd.get_prefix("v1/instances/")
            mdc = self.etcd.get_prefix("v1/mdc/")
            channels = self.etcd.get_prefix("v1/event_channels/")
            by_inode = listening_ports_by_inode()
            for w in self.workers:
                self.fill_worker(w, instances, mdc, channels, by_inode)
            pending = [w for w in self.workers if "instance_id" not in w or "card" not in w]
            if not pending:
                missing_kv = [w for w in self.workers if w.get("kv_metrics") is None]
                if not missing_kv:
                    return
                # kv_metrics registers last; give it a few seconds, then report null.
                kv_grace_until = kv_grace_until or time.monotonic() + 5
                if time.monotonic() > kv_grace_until:
                    return
            elif time.monotonic() > self.deadline():
                w = pending[0]
                self.check_deadline(f"{w['proc'].name} to register in etcd", w["proc"])
            time.sleep(0.1)

    def fill_worker(self, w, instances, mdc, channels, by_inode):
        ports = ports_of(w["proc"].pid, by_inode)
        if not ports:
            return
        ns, comp = w["namespace"], w["component"]
        if "instance_id" not in w:
            prefix = f"v1/instances/{ns}/{comp}/generate/"
            for key, v in json_records(instances, prefix):
                tcp = v.get("transport", {}).get("tcp", "")
                if port_of_endpoint(tcp) in ports:
                    w["instance_id"] = int(v["instance_id"])
                    w["instance_id_hex"] = key.rsplit("/", 1)[1]
                    w["tcp"] = tcp.split("/", 1)[0]
        if "instance_id" in w and "card" not in w:
            key = f"v1/mdc/{ns}/{comp}/generate/{w['instance_id_hex']}"
            if key in mdc:
                try:
                    w["card"] = json.loads(mdc[key]).get("card_json", {})
                except ValueError:
                    pass
        pubs = {}
        prefix = f"v1/event_channels/namespace/{ns}/component/{comp}/endpoint/generate/topic/"
        for key, v in json_records(channels, prefix):
            ep = v.get("transport", {}).get("config", {}).get("endpoint", "")
            if port_of_endpoint(ep) in ports:
                topic = key[len(prefix) :].split("/", 1)[0]
                pubs[topic] = {"endpoint": ep, "publisher_id": v.get("instance_id"), "key": key}
        w["publishers"] = pubs
        w["kv_metrics"] = pubs.get("kv_metrics", {}).get("endpoint")

    def wait_frontends(self):
        models_of_ns = {}
        for w in self.workers:
            models_of_ns.setdefault(w["namespace"], set()).add(w["model"])
        disagg_models = {w["model"] for w in self.workers if w["role"] != "aggregated"}
        restarts = 0
        for i, fe in enumerate(self.frontends):
            want = set().union(*(models_of_ns[ns] for ns in fe["namespaces"]))
            while True:
                if not fe["proc"].alive():
                    # Most likely the port was taken between probing and binding: retry once or twice.
                    if restarts >= 2:
                        self.check_alive([fe["proc"]])
                    restarts += 1
                    log(f"{fe['proc'].name} exited ({fe['proc'].popen.returncode}); restarting on another port")
                    fe = self.frontends[i] = self.spawn_frontend(
                        i + 1, fe["scope"], fe["namespaces"]
                    )
                    continue
                self.check_alive([self.etcd_proc])
                listed = self.frontend_models(fe["url"])
                if listed is not None and want <= listed:
                    text = read_log(fe["proc"].log)
                    if all(prefill_router_active(text, m) for m in want & disagg_models):
                        fe["models"] = sorted(listed)
                        break
                self.check_deadline(f"{fe['proc'].name} to list {sorted(want)}", fe["proc"])
                time.sleep(0.1)

    @staticmethod
    def frontend_models(url):
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                return {m["id"] for m in json.loads(r.read()).get("data", [])}
        except (OSError, ValueError, KeyError, urllib.error.HTTPError):
            return None

    # 5. description
    def describe(self, with_alive=False):
        def worker_json(w):
            card = w.get("card", {})
            out = {
                "namespace": w["namespace"],
                "component": w["component"],
                "endpoint": "generate",
                "role": w["role"],
                "worker_type": card.get("worker_type"),
                "model": w["model"],
                "instance_id": w.get("instance_id"),
                "instance_id_hex": w.get("instance_id_hex"),
                "pid": w["proc"].pid,
                "tcp": w.get("tcp"),
                "kv_metrics": w.get("kv_metrics"),
                "publishers": {
                    t: {"endpoint": p["endpoint"], "publisher_id": p["publisher_id"]}
                    for t, p in sorted(w.get("publishers", {}).items())
                },
                "log": w["proc"].log,
            }
            if with_alive:
                out["alive"] = w["proc"].alive()
                out["killed_with"] = w["proc"].killed_with
            return out

        frontends = {}
        fe_list = []
        for fe in self.frontends:
            for ns in fe["namespaces"]:
                frontends.setdefault(ns, []).append(fe["url"])
            item = {
                "url": fe["url"],
                "namespace": fe["scope"],
                "serves": fe["namespaces"],
                "models": fe.get("models", []),
                "pid": fe["proc"].pid,
                "log": fe["proc"].log,
            }
            if with_alive:
                item["alive"] = fe["proc"].alive()
            fe_list.append(item)
        models = {}
        for w in self.workers:
            m = models.setdefault(
                w["model"],
                {"namespace": w["namespace"], "mode": "agg" if w["role"] == "aggregated" else "disagg"},
            )
            m.setdefault(w["role"], []).append(w.get("instance_id"))
        return {
            "etcd": {
                "endpoint": self.etcd.endpoint,
                "pid": self.etcd_proc.pid,
                "log": self.etcd_proc.log,
                **({"alive": self.etcd_proc.alive()} if with_alive else {}),
            },
            "frontends": frontends,
            "frontend_processes": fe_list,
            "workers": [worker_json(w) for w in self.workers],
            "models": models,
            "dynamo_version": DYNAMO_VERSION,
            "dir": self.dir,
            "block_size": self.args.block_size,
            "lease_ttl_secs": self.args.lease_ttl,
            "model_path": self.args.model_path,
            "python": sys.executable,
            "fleet_pid": os.getpid(),
            "startup_secs": round(self.ready_secs, 3),
        }

    # 6. commands
    def command(self, line):
        words = line.split()
        if not words:
            return None
        cmd = words[0].lower()
        if cmd == "status":
            return {"ok": True, "cmd": "status", "fleet": self.describe(with_alive=True)}
        if cmd == "quit":
            raise Shutdown()
        if cmd == "add":
            if len(words) != 2:
                return {"ok": False, "cmd": "add", "error": "usage: add [NS/]MODEL"}
            return self.add_worker(words[1])
        if cmd == "etcd":
            return self.etcd_command(words[1:])
        if cmd == "kill":
            if len(words) not in (2, 3):
                return {"ok": False, "cmd": "kill", "error": "usage: kill <instance id> [SIGNAL]"}
            target = words[1].lower()
            sig_name = words[2].upper() if len(words) == 3 else "SIGTERM"
            if not sig_name.startswith("SIG"):
                sig_name = "SIG" + sig_name
            sig = SIGNALS.get(sig_name)
            if sig is None:
                return {"ok": False, "cmd": "kill", "error": f"unknown signal {words[2]}"}
            match = [
                w
                for w in self.workers
                if w.get("instance_id_hex") == target.removeprefix("0x")
                or str(w.get("instance_id")) == target
            ]
            if not match:
                return {"ok": False, "cmd": "kill", "error": f"no worker with instance id {words[1]}"}
            w = match[0]
            p = w["proc"]
            was_alive = p.alive()
            p.killed_with = sig_name
            p.signal_group(sig)
            code = None
            if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                code = p.wait(10)
                if code is None and sig != signal.SIGKILL:
                    return {
                        "ok": False,
                        "cmd": "kill",
                        "error": f"pid {p.pid} still running 10 s after {sig_name}",
                        "instance_id": w.get("instance_id"),
                        "instance_id_hex": w.get("instance_id_hex"),
                        "pid": p.pid,
                    }
            return {
                "ok": True,
                "cmd": "kill",
                "instance_id": w.get("instance_id"),
                "instance_id_hex": w.get("instance_id_hex"),
                "pid": p.pid,
                "signal": sig_name,
                "was_alive": was_alive,
                "exit": code,
                "at_unix": time.time(),
            }
        return {"ok": False, "cmd": cmd, "error": "unknown command (add, kill, status, quit)"}

    def etcd_command(self, words):
        """`etcd kill [SIGNAL]` (default SIGKILL) and `etcd restart`: the same argv, so the same
        data dir and ports; every wait bounded."""
        usage = {"ok": False, "cmd": "etcd", "error": "usage: etcd kill [SIGNAL] | etcd restart"}
        if not words or words[0].lower() not in ("kill", "restart"):
            return usage
        p = self.etcd_proc
        if words[0].lower() == "kill":
            if len(words) > 2:
                return usage
            sig_name = words[1].upper() if len(words) == 2 else "SIGKILL"
            if not sig_name.startswith("SIG"):
                sig_name = "SIG" + sig_name
            sig = SIGNALS.get(sig_name)
            if sig is None:
                return {"ok": False, "cmd": "etcd", "error": f"unknown signal {words[1]}"}
            was_alive = p.alive()
            p.killed_with = sig_name
            p.signal_group(sig)
            code = p.wait(10) if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT) else None
            return {
                "ok": True, "cmd": "etcd", "action": "kill", "pid": p.pid, "signal": sig_name,
                "was_alive": was_alive, "exit": code, "at_unix": time.time(),
            }  # fmt: skip
        if len(words) != 1:
            return usage
        if p.alive():
            return {"ok": False, "cmd": "etcd", "error": f"etcd (pid {p.pid}) is still running"}
        started = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        proc = Proc("etcd", p.argv, env, p.log, self.dir)
        self.etcd_proc = proc
        until = started + 15
        while time.monotonic() < until and proc.alive():
            if self.etcd.healthy():
                return {
                    "ok": True, "cmd": "etcd", "action": "restart", "pid": proc.pid,
                    "endpoint": self.etcd.endpoint, "secs": round(time.monotonic() - started, 3),
                    "at_unix": time.time(),
                }  # fmt: skip
            time.sleep(0.1)
        return {
            "ok": False, "cmd": "etcd",
            "error": f"etcd did not become healthy again (exit {proc.popen.poll()})\n{tail(proc.log)}",
        }  # fmt: skip

    def start(self):
        self.start_etcd()
        self.start_workers()
        self.start_frontends()
        self.wait_workers()
        self.wait_frontends()
        self.ready_secs = time.monotonic() - self.started_at

    def teardown(self):
        stop_all([fe["proc"] for fe in self.frontends], 5)
        stop_all([w["proc"] for w in self.workers], 5)
        stop_all([self.etcd_proc], 5)
        if self.args.keep:
            log(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agg", action="append", default=[], metavar="[NS/]MODEL:N")
    ap.add_argument("--disagg", action="append", default=[], metavar="[NS/]MODEL:P:D")
    ap.add_argument("--speedup-ratio", type=float, default=None, help="passed to every mocker")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--model-path", default=DEFAULT_MODEL_PATH)
    ap.add_argument("--mocker-args", default="", help="extra arguments for every mocker (one string)")
    ap.add_argument("--frontend-args", default="", help="extra arguments for every frontend (one string)")
    ap.add_argument("--frontends", choices=["per-namespace", "shared"], default="per-namespace")
    ap.add_argument("--frontend-replicas", type=int, default=1, help="frontends per namespace (or shared)")
    ap.add_argument("--lease-ttl", type=int, default=None, help="ETCD_LEASE_TTL of every process (Dynamo default 30)")
    ap.add_argument("--startup-timeout", type=float, default=60)
    ap.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    ap.add_argument("--dyn-log", default=None, help="DYN_LOG for every Dynamo process (e.g. debug)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) after teardown")
    args = ap.parse_args()
    args.model_path = os.path.abspath(args.model_path)
    if not os.path.isfile(os.path.join(args.model_path, "tokenizer.json")):
        log(
            f"no model at {args.model_path} (need tokenizer.json: ../shared/fixtures/tiny-model beside "
            "the repo, or --model-path, or CONTINUUM_FLEET_MODEL_PATH)"
        )
        return 1
    if not os.path.exists(args.etcd):
        log(f"no etcd binary at {args.etcd}: run tests/fleet/install.sh")
        return 1

    def on_signal(signum, _frame):
        raise Shutdown()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    fleet = Fleet(args)
    code = 0
    try:
        fleet.start()
        print(json.dumps(fleet.describe()), flush=True)
        log(f"ready in {fleet.ready_secs:.1f}s: {len(fleet.workers)} workers, {len(fleet.frontends)} frontends; dir {fleet.dir}")
        for line in sys.stdin:
            reply = fleet.command(line.strip())
            if reply is not None:
                print(json.dumps(reply), flush=True)
    except Shutdown:
        pass
    except FleetError as e:
        log(f"error: {e}")
        code = 1
    except BrokenPipeError:
        pass
    finally:
        # Signals during teardown must not interrupt it.
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        fleet.teardown()
    return code


if __name__ == "__main__":
    sys.exit(main())
