//! [`FakeApiServer`]: a fake Kubernetes API server (`tests/k8s/fake_apiserver.py`) on loopback
//! for the Kubernetes discovery tests, with the objects the Dynamo operator creates, and the
//! real `kubectl` to prove the fake's fidelity.
//!
//! The fake serves HTTPS with a certificate for `127.0.0.1` / `localhost` issued by a test CA
//! ([`TestCa`]) and wants a bearer token; [`FakeApiServer::kubeconfig`] writes a kubeconfig
//! (namespace `dynamo`) that both kubectl and the `kube` crate read. Objects are written, watch
//! faults commanded and request statistics read through its plain-HTTP control port, with
//! the raw client of [`super::client`]. The process is killed on drop (its stdin closing also
//! ends it); a server dropped while its test panics prints the tail of its stderr.
//!
//! kubectl is `$CONTINUUM_KUBECTL`, else `kubectl` on the PATH (`tests/run.sh` installs the
//! Debian `kubernetes-client` when there is none). Every wait is bounded by a deadline.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::CliOutput;
use super::client::{request_bytes, roundtrip};
use super::config::TempDir;
use super::fleet::venv_dir;
use super::pki::TestCa;
use super::router::RouterProcess;
use super::{MockBackend, STEP, chat, chat_body};

/// The fake API server's script.
pub const FAKE_APISERVER: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/k8s/fake_apiserver.py");
/// The Kubernetes namespace the operator's objects live in (and the kubeconfig's context).
pub const NAMESPACE: &str = "dynamo";
/// The user the fake's 403 messages name (the router's service account).
pub const USER: &str = "system:serviceaccount:dynamo:continuum-router";
/// `pods`.
pub const PODS: &str = "pods";
/// `endpointslices` (discovery.k8s.io/v1).
pub const ENDPOINT_SLICES: &str = "endpointslices";
/// `dynamoworkermetadatas` (nvidia.com/v1alpha1), the operator's custom resource.
pub const WORKER_METADATAS: &str = "dynamoworkermetadatas";
/// The port the builders' containers and EndpointSlices name (`system`).
pub const SYSTEM_PORT: u16 = 9090;
/// Bound on one kubectl run.
pub const KUBECTL_WITHIN: Duration = Duration::from_secs(30);
/// How long the fake may take to print its ports.
const START_WITHIN: Duration = Duration::from_secs(20);

/// The kubectl binary: `$CONTINUUM_KUBECTL`, else `kubectl`.
pub fn kubectl_bin() -> String {
    std::env::var("CONTINUUM_KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

/// The python that runs the fake: the fleet venv's when installed, else `python3` (the fake
/// needs only the standard library).
fn python() -> PathBuf {
    let venv = venv_dir().join("bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Makes a spawned child die with the thread that spawned it (even if the test binary is
/// killed).
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A running fake API server; killed on drop.
#[derive(Debug)]
pub struct FakeApiServer {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    control: SocketAddr,
    token: String,
    ca_pem: PathBuf,
    kubeconfig: PathBuf,
    // Last field: removed after the child is gone.
    dir: TempDir,
}

impl FakeApiServer {
    /// Generates a CA and a server certificate, starts the fake with a fresh token and waits
    /// (bounded) until it listens. It keeps the last 10,000 events of each resource.
    pub fn start() -> FakeApiServer {
        FakeApiServer::start_with_history(10_000)
    }

    /// As [`FakeApiServer::start`], keeping only the last `events` events of each resource (a
    /// watch from an older resourceVersion gets an ERROR 410 Expired event).
    pub fn start_with_history(events: usize) -> FakeApiServer {
        let dir = TempDir::new("kube");
        let ca = TestCa::new(dir.path(), "ca", "continuum fake kube-apiserver CA");
        let cert = ca.server(dir.path(), "apiserver", &["127.0.0.1", "localhost"]);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let token = format!(
            "fake-{:x}{:x}{:x}",
            nanos,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr log");
        let mut cmd = Command::new(python());
        cmd.arg(FAKE_APISERVER)
            .arg("--cert")
            .arg(&cert.cert)
            .arg("--key")
            .arg(&cert.key)
            .arg("--token")
            .arg(&token)
            .arg("--history")
            .arg(events.to_string())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {FAKE_APISERVER}: {e}"));
        let stdout = child.stdout.take().expect("fake apiserver stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(START_WITHIN) {
            Ok(l) if !l.trim().is_empty() => l,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let err =
                    std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
                panic!("the fake apiserver did not report its ports ({other:?}); stderr:\n{err}");
            }
        };
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("fake apiserver said {line:?}: {e}"));
        let port = |k: &str| -> u16 {
            v[k].as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or_else(|| panic!("fake apiserver line lacks {k}: {line}"))
        };
        let mut server = FakeApiServer {
            stdin: child.stdin.take(),
            child,
            port: port("port"),
            control: SocketAddr::from(([127, 0, 0, 1], port("control_port"))),
            token,
            ca_pem: ca.pem.clone(),
            kubeconfig: PathBuf::new(),
            dir,
        };
        server.kubeconfig = server.kubeconfig_with_token(&server.token.clone());
        server
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The API port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The control port's address.
    pub fn control_addr(&self) -> SocketAddr {
        self.control
    }

    /// The bearer token the fake accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The CA certificate (PEM) that signed the fake's server certificate.
    pub fn ca_pem(&self) -> &Path {
        &self.ca_pem
    }

    /// The fake's temp dir (certificates, kubeconfigs, its stderr, kubectl's cache).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kubeconfig (cluster `fake` with `server` and `certificate-authority`, user
    /// `continuum-router` with the token, context namespace `dynamo`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig like [`FakeApiServer::kubeconfig`] with another token (a wrong one).
    pub fn kubeconfig_with_token(&self, token: &str) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let q = |s: &str| Value::String(s.to_owned()).to_string();
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\nusers:\n- name: continuum-router\n  user:\n    token: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: continuum-router\n    \
             namespace: {NAMESPACE}\ncurrent-context: fake\npreferences: {{}}\n",
            q(&self.url()),
            q(&self.ca_pem.display().to_string()),
            q(token)
        );
        let name = format!("kubeconfig-{}.yaml", NEXT.fetch_add(1, Ordering::SeqCst));
        self.dir.write(&name, &yaml)
    }

    /// Everything the fake wrote to stderr so far (tracebacks of its own bugs).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    // ---- the control port ---------------------------------------------------------------

    /// `POST path` with a JSON body on the control port; panics unless it answers 200 ok.
    pub fn control(&self, path: &str, body: &Value) -> Value {
        let raw = body.to_string();
        let req = request_bytes(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(raw.as_bytes()),
        );
        let resp = roundtrip(self.control, &req)
            .unwrap_or_else(|e| panic!("control POST {path} {raw}: {e}"));
        let v = resp.json();
        assert!(
            resp.status == 200 && v["ok"] == true,
            "control POST {path} {raw}: {} {v}",
            resp.status
        );
        v
    }

    /// Upserts `object` (ADDED when new, else MODIFIED) into `resource` in `namespace`;
    /// returns it as stored (with its `resourceVersion`, `uid`, `kind`, `apiVersion`).
    pub fn put(&self, resource: &str, namespace: &str, object: &Value) -> Value {
        self.control(
            "/objects",
            &json!({"resource": resource, "namespace": namespace, "object": object}),
        )["object"]
            .clone()
    }

    /// Upserts many objects (in batches of 2,000), each its own ADDED or MODIFIED event.
    pub fn put_many(&self, resource: &str, namespace: &str, objects: &[Value]) {
        for batch in objects.chunks(2000) {
            let done = self.control(
                "/objects",
                &json!({"resource": resource, "namespace": namespace, "objects": batch}),
            );
            assert_eq!(done["count"].as_u64(), Some(batch.len() as u64), "{done}");
        }
    }

    /// Deletes an object (DELETED with its last state); returns that state.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> Value {
        self.control(
            "/delete",
            &json!({"resource": resource, "namespace": namespace, "name": name}),
        )["object"]
            .clone()
    }

    /// Commands a fault for the next `count` watch requests of `resource` (0: until
    /// [`FakeApiServer::clear_faults`]): `gone` (HTTP 410), `stall` (headers, then silence),
    /// `eof` (the initial events, then a close without the last chunk), `close_after` (a clean
    /// end after `seconds`) or `error_event` (an ERROR 410 Expired event, then a clean end).
    pub fn fault(&self, resource: &str, kind: &str, seconds: u64, count: u32) {
        self.control(
            "/fault",
            &json!({"resource": resource, "kind": kind, "seconds": seconds, "count": count}),
        );
    }

    /// Drops the pending faults of `resource`.
    pub fn clear_faults(&self, resource: &str) {
        self.control("/fault", &json!({"resource": resource, "kind": "none"}));
    }

    /// Every list page waits `ms` milliseconds before it is answered.
    pub fn slow_pages(&self, ms: u64) {
        self.control("/slow_pages", &json!({ "delay_ms": ms }));
    }

    /// The verbs (`get`, `list`, `watch`) the token may use on the three resources; the
    /// others answer 403 Forbidden.
    pub fn allow_verbs(&self, verbs: &[&str]) {
        self.control("/verbs", &json!({ "allow": verbs }));
    }

    /// Sends a BOOKMARK now to every open watch of `resource` that allowed bookmarks; returns
    /// how many got one.
    pub fn bookmark(&self, resource: &str) -> u64 {
        self.control("/bookmark", &json!({ "resource": resource }))["sent"]
            .as_u64()
            .unwrap_or(0)
    }

    /// Seconds of quiet after which a watch that allowed bookmarks gets one (0: never;
    /// default 5).
    pub fn bookmark_period(&self, seconds: f64) {
        self.control("/bookmark_period", &json!({ "seconds": seconds }));
    }

    /// Drops the event history (of `resource`, or of all) and every list snapshot, as an etcd
    /// compaction: watches from an older resourceVersion and old continue tokens get 410.
    /// Returns the current resourceVersion.
    pub fn compact(&self, resource: Option<&str>) -> String {
        self.control("/compact", &json!({ "resource": resource }))["resource_version"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// `GET /stats`: per resource the request counts `gets`, `lists`, `watches`, `proxies` (Pod
    /// proxy GETs), the `open_watches` and `objects` now, `last_list`, `last_watch`, `list_log`,
    /// `watch_log` (query parameters, null when absent, and `namespace`); `requests` (every API
    /// request by HTTP method), `rejected_401`, `rejected_403`, `resource_version`.
    pub fn stats(&self) -> Value {
        let resp = roundtrip(self.control, &request_bytes("GET", "/stats", &[], None))
            .unwrap_or_else(|e| panic!("control GET /stats: {e}"));
        assert_eq!(resp.status, 200, "GET /stats: {}", resp.text());
        resp.json()
    }

    /// Polls [`FakeApiServer::stats`] until `pred` holds; returns those stats. Panics with the
    /// last stats after `timeout`.
    pub fn wait_stats(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.stats();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "fake apiserver stats never matched within {timeout:?}: {s}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `resource` has exactly `n` open watches.
    pub fn wait_open_watches(&self, resource: &str, n: u64, timeout: Duration) -> Value {
        self.wait_stats(timeout, |s| s[resource]["open_watches"].as_u64() == Some(n))
    }

    // ---- kubectl ------------------------------------------------------------------------

    fn kubectl_command(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(kubectl_bin());
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kube-cache"))
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        die_with_parent(&mut cmd);
        cmd
    }

    /// `kubectl --kubeconfig <kubeconfig()> args...`, killed after [`KUBECTL_WITHIN`].
    pub fn kubectl(&self, args: &[&str]) -> CliOutput {
        self.kubectl_with(&self.kubeconfig, args)
    }

    /// `kubectl` with another kubeconfig (see [`FakeApiServer::kubeconfig_with_token`]).
    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str]) -> CliOutput {
        super::run_bounded(self.kubectl_command(kubeconfig, args), KUBECTL_WITHIN)
    }

    /// `kubectl args...` (e.g. `get pods -w -o name`) left running; its stdout lines are read
    /// with [`KubectlWatch::next_line`]. Killed on drop.
    pub fn kubectl_watch(&self, args: &[&str]) -> KubectlWatch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let err_path = self.dir.path().join(format!(
            "kubectl-watch-{}.err",
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let mut child = self
            .kubectl_command(&self.kubeconfig, args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err_path).expect("kubectl stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {}: {e}", kubectl_bin()));
        let stdout = child.stdout.take().expect("kubectl stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        KubectlWatch {
            child,
            lines: rx,
            err_path,
            args: args.join(" "),
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- fake apiserver stderr (last 40 lines) ----\n{}\n---- end ----",
                tail(&self.stderr(), 40)
            );
        }
    }
}

/// A running `kubectl` whose stdout is read line by line; killed on drop.
#[derive(Debug)]
pub struct KubectlWatch {
    child: Child,
    lines: Receiver<String>,
    err_path: PathBuf,
    args: String,
}

impl KubectlWatch {
    /// The next stdout line, or `None` if none came within `timeout` or stdout closed.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// The next line, panicking with kubectl's stderr if none came within `timeout`.
    pub fn expect_line(&mut self, timeout: Duration) -> String {
        self.next_line(timeout).unwrap_or_else(|| {
            panic!(
                "`kubectl {}` printed no line within {timeout:?}; stderr: {}",
                self.args,
                self.stderr()
            )
        })
    }

    /// The next JSON value on stdout, compact (one line) or indented (several), within
    /// `timeout`; `Err` with what was read when there is none.
    pub fn next_json(&mut self, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        let mut buf = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.next_line(left) else {
                return Err(format!(
                    "no complete JSON value within {timeout:?}; read {buf:?}; stderr: {}",
                    self.stderr()
                ));
            };
            buf.push_str(&line);
            buf.push('\n');
            match serde_json::from_str::<Value>(&buf) {
                Ok(v) => return Ok(v),
                Err(e) if e.is_eof() => {}
                Err(e) => return Err(format!("not JSON ({e}): {buf:?}")),
            }
        }
    }

    /// What kubectl wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err_path).unwrap_or_default()
    }

    /// Waits (bounded) for kubectl to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for KubectlWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- objects as the Dynamo operator makes them --------------------------------------------

/// A stable pod IP for `name` (10.244.x.y), shared by [`operator_pod`] and [`endpoint_slice`].
pub fn pod_ip(name: &str) -> String {
    let h = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("10.244.{}.{}", (h >> 8) % 256, 1 + h % 254)
}

/// A Pod in namespace `dynamo` as the Dynamo operator labels its workers:
/// `nvidia.com/dynamo-discovery-backend: kubernetes`, `nvidia.com/dynamo-discovery-enabled:
/// "true"`, `nvidia.com/dynamo-namespace`, `nvidia.com/dynamo-component-type`, and when given
/// `nvidia.com/dynamo-sub-component-type` and `nvidia.com/dynamo-component`; one container;
/// `Running` with `Ready` True, or `Pending` with `Ready` False; `status.podIP` from
/// [`pod_ip`].
pub fn operator_pod(
    name: &str,
    dynamo_namespace: &str,
    component_type: &str,
    sub_component_type: Option<&str>,
    component: Option<&str>,
    ready: bool,
) -> Value {
    let mut labels = json!({
        "nvidia.com/dynamo-discovery-backend": "kubernetes",
        "nvidia.com/dynamo-discovery-enabled": "true",
        "nvidia.com/dynamo-namespace": dynamo_namespace,
        "nvidia.com/dynamo-component-type": component_type,
    });
    if let Some(s) = sub_component_type {
        labels["nvidia.com/dynamo-sub-component-type"] = json!(s);
    }
    if let Some(c) = component {
        labels["nvidia.com/dynamo-component"] = json!(c);
    }
    let flag = if ready { "True" } else { "False" };
    let started = "2026-12-01T10:00:00Z";
    let ip = pod_ip(name);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1",
                "env": [{"name": "DYN_NAMESPACE", "value": dynamo_namespace}],
                "ports": [{"name": "system", "containerPort": SYSTEM_PORT, "protocol": "TCP"}],
            }],
            "nodeName": "node-1",
            "restartPolicy": "Always",
            "serviceAccountName": "dynamo-worker",
        },
        "status": {
            "phase": if ready { "Running" } else { "Pending" },
            "hostIP": "192.168.0.10",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": started,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": started},
                {"type": "Ready", "status": flag, "lastTransitionTime": started},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": started},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
            ],
            "containerStatuses": [{
                "name": "main",
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1",
                "state": if ready {
                    json!({"running": {"startedAt": started}})
                } else {
                    json!({"waiting": {"reason": "ContainerCreating"}})
                },
            }],
        },
    })
}

/// An EndpointSlice (discovery.k8s.io/v1, IPv4) of `service` in namespace `dynamo`, labelled
/// as the operator's (`nvidia.com/dynamo-discovery-backend`, `-enabled`,
/// `kubernetes.io/service-name`), with one endpoint per `(pod name, ready)`: its [`pod_ip`],
/// `conditions.ready` and a `targetRef` to the Pod.
pub fn endpoint_slice(name: &str, service: &str, pods: &[(&str, bool)]) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, ready)| {
            json!({
                "addresses": [pod_ip(pod)],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "nodeName": "node-1",
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NAMESPACE},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {
                "nvidia.com/dynamo-discovery-backend": "kubernetes",
                "nvidia.com/dynamo-discovery-enabled": "true",
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "system", "port": SYSTEM_PORT, "protocol": "TCP"}],
    })
}

/// A `DynamoWorkerMetadata` (nvidia.com/v1alpha1) named after its worker Pod, with `spec.data`
/// as given (Dynamo's planner reads `spec.data.model_cards`).
pub fn worker_metadata(pod_name: &str, data: &Value) -> Value {
    json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoWorkerMetadata",
        "metadata": {"name": pod_name, "namespace": NAMESPACE},
        "spec": {"data": data},
    })
}

/// Puts a worker Pod of Dynamo namespace `dyn_ns` into namespace `dynamo`; returns it stored.
pub fn put_worker(
    api: &FakeApiServer,
    name: &str,
    dyn_ns: &str,
    sub: Option<&str>,
    up: bool,
) -> Value {
    api.put(PODS, NAMESPACE, &worker(name, dyn_ns, sub, up))
}

/// A worker Pod (component `VllmWorker`) of Dynamo namespace `dyn_ns`.
pub fn worker(name: &str, dyn_ns: &str, sub: Option<&str>, ready: bool) -> Value {
    operator_pod(name, dyn_ns, "worker", sub, Some("VllmWorker"), ready)
}

/// An object's `metadata.resourceVersion` as a number.
pub fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `text` as JSON, or a panic naming it.
pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// Whether `st` is a `Status` with this reason and code.
pub fn is_status(st: &Value, reason: &str, code: u64) -> bool {
    st["kind"] == "Status" && st["reason"] == reason && st["code"] == code
}

/// Curl's exit code, stdout and stderr.
pub type Curl = (Option<i32>, String, String);

/// `curl -sS -N` of `path` on the fake with its token, bounded by `--max-time`.
pub fn curl(api: &FakeApiServer, path: &str, extra: &[&str], max_secs: u64) -> Curl {
    curl_as(api, api.token(), path, extra, max_secs)
}

/// [`curl`] with another token.
pub fn curl_as(
    api: &FakeApiServer,
    token: &str,
    path: &str,
    extra: &[&str],
    max_secs: u64,
) -> Curl {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let out_path = api
        .dir()
        .join(format!("curl-{}.out", NEXT.fetch_add(1, Ordering::SeqCst)));
    let err_path = out_path.with_extension("err");
    let mut child = Command::new("curl")
        .args(["-sS", "-N", "--max-time", &max_secs.to_string(), "--cacert"])
        .arg(api.ca_pem())
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .args(extra)
        .arg(format!("{}{path}", api.url()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn curl");
    let Some(status) = super::wait_bounded(&mut child, Duration::from_secs(max_secs + 10)) else {
        panic!("curl {path} outlived its --max-time {max_secs}");
    };
    let read = |p| std::fs::read_to_string(p).unwrap_or_default();
    (status.code(), read(&out_path), read(&err_path))
}

// ---- the router's view of a Kubernetes-discovered fleet -----------------------------------

/// Dynamo's id of a Pod (DISC-HASH-01), computed here the way upstream does (`std`'s
/// `DefaultHasher` over the name, low 53 bits).
pub fn pod_id(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish() & 0x001F_FFFF_FFFF_FFFF
}

/// The decimal worker ids `GET /admin/dynamo/workers` lists.
pub fn worker_ids(r: &RouterProcess) -> BTreeSet<u64> {
    let v = r.get("/admin/dynamo/workers").json();
    v["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter_map(|w| w["worker_id"].as_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the router lists exactly the workers of these Pods; returns how long it took.
pub fn wait_workers(r: &RouterProcess, pods: &[&str], within: Duration) -> Duration {
    let want: BTreeSet<u64> = pods.iter().map(|n| pod_id(n)).collect();
    let t0 = Instant::now();
    loop {
        let got = worker_ids(r);
        if got == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "workers {got:?}, want {want:?} within {within:?}; stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `n` chat requests for `model` through the router, each answered 200 by `shim`, and
/// returns the decimal `x-dynamo-worker-instance-id` each reached the shim with.
pub fn pinned_ids(r: &RouterProcess, shim: &MockBackend, model: &str, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let resp = chat(r.addr(), &chat_body(model, &format!("hi {i}"), false), &[]);
            assert_eq!(resp.status, 200, "{}", resp.text());
            let req = shim.wait_requests(i + 1, STEP).pop().unwrap();
            req.header("x-dynamo-worker-instance-id")
                .expect("pinned")
                .parse()
                .expect("decimal")
        })
        .collect()
}

/// A router (shim: `shim`, disaggregated serving on) over the fake with `source` and this
/// body of `dynamo.discovery.kubernetes` (indented by six spaces), credentials from its
/// kubeconfig, publishers on loopback allowed.
pub fn router_over(
    api: &FakeApiServer,
    shim: &MockBackend,
    source: &str,
    kubernetes: &str,
) -> RouterProcess {
    let mut cfg = super::RouterConfig::default().backend("fe", &shim.url(), &[]);
    cfg.disaggregated_serving = true;
    cfg.extra_yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: {source}\n    kubernetes:\n\
         {kubernetes}  load:\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  shim:\n    backends: [fe]\n"
    );
    cfg.env = vec![(
        "KUBECONFIG".into(),
        api.kubeconfig().to_string_lossy().into_owned(),
    )];
    RouterProcess::start(&cfg)
}
