//! `Fleet`: a REAL NVIDIA Dynamo 1.6.1 fleet on loopback (etcd, `dynamo.mocker` workers,
//! `dynamo.frontend --router-mode direct`), run by `tests/fleet/fleet.py` with the fleet venv's
//! python (`tests/fleet/install.sh` creates it; `tests/run.sh` calls that first).
//!
//! `Fleet::start` spawns the script, waits (bounded) for its one JSON line and parses it into
//! [`FleetInfo`]; [`Fleet::kill`] sends `kill <instance hex> <SIGNAL>` on the script's stdin and
//! returns its JSON answer. Dropping a `Fleet` closes that stdin, which tears the fleet down
//! (process groups, temp dir); a fleet dropped while its test is panicking first prints the tail
//! of the script's stderr and of every frontend and worker log.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::{RouterConfig, TempDir};

/// The fleet script.
pub const FLEET_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fleet/fleet.py");
/// The installer to run when the venv is missing.
pub const INSTALL_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fleet/install.sh");

/// The fleet venv: `$CONTINUUM_FLEET_VENV`, else `$HOME/.cache/continuum-fleet/venv` (the same
/// default as `tests/fleet/install.sh`).
pub fn venv_dir() -> PathBuf {
    if let Some(v) = std::env::var_os("CONTINUUM_FLEET_VENV") {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/continuum-fleet/venv")
}

/// The ai-dynamo release installed in the fleet venv, as `(major, minor, patch)` (from its
/// `ai_dynamo-VERSION.dist-info`; a nightly `1.7.0.devN` is `(1, 7, 0)`), without starting a
/// fleet: for a test of one release's behaviour to skip on others.
pub fn installed_release() -> (u32, u32, u32) {
    let lib = venv_dir().join("lib");
    let dist = std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .map(|py| py.path().join("site-packages"))
        .flat_map(|site| std::fs::read_dir(site).into_iter().flatten().flatten())
        .find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("ai_dynamo-")?
                .strip_suffix(".dist-info")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    release_of(&dist)
}

/// `"1.7.0.dev20261026"` as `(1, 7, 0)`; missing parts are 0.
fn release_of(version: &str) -> (u32, u32, u32) {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Marks the running test as not applying to this fleet's Dynamo release: the compatibility run
/// (tests/compat/run.sh, which reads this line from the test's stdout) shows it as SKIP rather
/// than PASS. The test returns after calling it.
#[allow(clippy::print_stdout)] // the marker is for libtest's captured stdout
pub fn compat_skip(why: &str) {
    println!("compat-skip: {why}");
}

/// The venv's python; panics with how to install it when missing.
pub fn venv_python() -> PathBuf {
    let python = venv_dir().join("bin/python");
    assert!(
        python.exists() && venv_dir().join(".continuum-fleet-stamp").exists(),
        "the Dynamo fleet venv is missing or incomplete at {}: run {INSTALL_SCRIPT} \
         (tests/run.sh runs it before cargo test; it needs root for apt-get and PyPI access)",
        venv_dir().display()
    );
    python
}

/// What to run. Namespaces default to `agg` / `disagg`, as in the fixtures.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    args: Vec<String>,
    /// Bound for the whole startup (etcd, workers registered, frontends listing models).
    pub startup_timeout: Duration,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec::new()
    }
}

impl FleetSpec {
    /// An empty fleet (add workers with [`FleetSpec::agg`] / [`FleetSpec::disagg`]).
    pub fn new() -> FleetSpec {
        FleetSpec {
            args: Vec::new(),
            startup_timeout: Duration::from_secs(60),
        }
    }

    /// `n` aggregated workers serving `model` in namespace `agg`.
    pub fn agg(self, model: &str, n: u32) -> FleetSpec {
        self.arg("--agg", &format!("{model}:{n}"))
    }

    /// `n` aggregated workers serving `model` in namespace `ns`.
    pub fn agg_in(self, ns: &str, model: &str, n: u32) -> FleetSpec {
        self.arg("--agg", &format!("{ns}/{model}:{n}"))
    }

    /// `prefill` prefill workers (component `prefill`) and `decode` decode workers (component
    /// `backend`) serving `model` in namespace `disagg`.
    pub fn disagg(self, model: &str, prefill: u32, decode: u32) -> FleetSpec {
        self.arg("--disagg", &format!("{model}:{prefill}:{decode}"))
    }

    /// As [`FleetSpec::disagg`], in namespace `ns`.
    pub fn disagg_in(self, ns: &str, model: &str, prefill: u32, decode: u32) -> FleetSpec {
        self.arg("--disagg", &format!("{ns}/{model}:{prefill}:{decode}"))
    }

    /// `--speedup-ratio` for every mocker.
    pub fn speedup_ratio(self, ratio: f64) -> FleetSpec {
        self.arg("--speedup-ratio", &ratio.to_string())
    }

    /// `ETCD_LEASE_TTL` (seconds) of every Dynamo process; Dynamo's default is 30.
    pub fn lease_ttl(self, secs: u32) -> FleetSpec {
        self.arg("--lease-ttl", &secs.to_string())
    }

    /// One unscoped frontend for every namespace instead of one per namespace.
    pub fn shared_frontend(mut self) -> FleetSpec {
        self.args.push("--frontends".into());
        self.args.push("shared".into());
        self
    }

    /// `n` frontends per namespace (or `n` shared ones).
    pub fn frontend_replicas(self, n: u32) -> FleetSpec {
        self.arg("--frontend-replicas", &n.to_string())
    }

    /// Extra arguments for every mocker, as one shell-quoted string
    /// (e.g. `"--num-gpu-blocks-override 24"`).
    pub fn mocker_args(self, args: &str) -> FleetSpec {
        self.arg_eq("--mocker-args", args)
    }

    /// Extra arguments for every frontend, as one shell-quoted string.
    pub fn frontend_args(self, args: &str) -> FleetSpec {
        self.arg_eq("--frontend-args", args)
    }

    /// Any other `fleet.py` option with a value.
    pub fn arg(mut self, name: &str, value: &str) -> FleetSpec {
        self.args.push(name.into());
        self.args.push(value.into());
        self
    }

    fn arg_eq(mut self, name: &str, value: &str) -> FleetSpec {
        self.args.push(format!("{name}={value}"));
        self
    }
}

/// A worker's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Aggregated (component `backend`).
    Aggregated,
    /// Disaggregated prefill (component `prefill`).
    Prefill,
    /// Disaggregated decode (component `backend`, card `worker_type: "decode"`).
    Decode,
}

/// One event-plane publisher of a worker (a ZMQ PUB endpoint registered in etcd).
#[derive(Debug, Clone)]
pub struct Publisher {
    /// `tcp://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The publisher id (the hex suffix of its `v1/event_channels/...` key, here in decimal).
    pub publisher_id: u64,
}

/// One mocker worker, as registered in etcd.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Dynamo namespace (`agg`, `disagg`, ...).
    pub namespace: String,
    /// Component: `backend` (aggregated, decode) or `prefill`.
    pub component: String,
    /// Role.
    pub role: Role,
    /// Served model name.
    pub model: String,
    /// Instance id (the etcd lease id) in decimal, as `x-dynamo-worker-instance-id` wants it.
    pub instance_id: u64,
    /// The same id in lower-case hex, as in the etcd keys.
    pub instance_id_hex: String,
    /// Process id (also its process group id).
    pub pid: u32,
    /// TCP request-plane address `127.0.0.1:PORT`.
    pub tcp: String,
    /// The `kv_metrics` ZMQ publisher endpoint, if registered.
    pub kv_metrics: Option<String>,
    /// Every registered publisher by topic (`kv_metrics`, `kv-events`, `forward-pass-metrics`,
    /// `active_sequences_events`).
    pub publishers: BTreeMap<String, Publisher>,
    /// The worker's log file (inside the fleet's temp dir).
    pub log: PathBuf,
}

/// One frontend process.
#[derive(Debug, Clone)]
pub struct Frontend {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its socket address.
    pub addr: SocketAddr,
    /// The `--namespace` it is scoped to (`None` for a shared frontend).
    pub namespace: Option<String>,
    /// Models it listed when the fleet became ready.
    pub models: Vec<String>,
    /// Process id.
    pub pid: u32,
    /// Log file.
    pub log: PathBuf,
}

/// The fleet as `fleet.py` described it.
#[derive(Debug, Clone)]
pub struct FleetInfo {
    /// `http://127.0.0.1:PORT` of etcd (client URL; its v3 JSON gateway answers there too).
    pub etcd_endpoint: String,
    /// Frontend URLs per namespace.
    pub frontends: BTreeMap<String, Vec<String>>,
    /// Frontend processes.
    pub frontend_processes: Vec<Frontend>,
    /// Workers in start order.
    pub workers: Vec<Worker>,
    /// The fleet's temp dir (logs, etcd data, HOMEs); removed at teardown.
    pub dir: PathBuf,
    /// `ETCD_LEASE_TTL` given to the workers, if any (Dynamo's default is 30 s).
    pub lease_ttl_secs: Option<u64>,
    /// KV block size of the mockers.
    pub block_size: u64,
    /// Seconds from script start to ready.
    pub startup_secs: f64,
    /// The whole JSON line.
    pub raw: Value,
}

fn s(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("fleet JSON: `{key}` missing or not a string in {v}"))
        .to_string()
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("fleet JSON: `{key}` missing or not an integer in {v}"))
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("frontend url {url}: {e}"))
}

impl Worker {
    /// One worker of `fleet.py`'s JSON.
    pub fn parse(w: &Value) -> Worker {
        Worker {
            namespace: s(w, "namespace"),
            component: s(w, "component"),
            role: match s(w, "role").as_str() {
                "aggregated" => Role::Aggregated,
                "prefill" => Role::Prefill,
                "decode" => Role::Decode,
                other => panic!("fleet JSON: unknown role {other}"),
            },
            model: s(w, "model"),
            instance_id: u(w, "instance_id"),
            instance_id_hex: s(w, "instance_id_hex"),
            pid: u32::try_from(u(w, "pid")).unwrap(),
            tcp: s(w, "tcp"),
            kv_metrics: w["kv_metrics"].as_str().map(str::to_string),
            publishers: w["publishers"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(topic, p)| {
                            let publisher = Publisher {
                                endpoint: s(p, "endpoint"),
                                publisher_id: u(p, "publisher_id"),
                            };
                            (topic.clone(), publisher)
                        })
                        .collect()
                })
                .unwrap_or_default(),
            log: PathBuf::from(s(w, "log")),
        }
    }
}

impl FleetInfo {
    /// Parses the JSON line printed by `fleet.py`.
    pub fn parse(line: &str) -> FleetInfo {
        let raw: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("fleet.py printed a line that is not JSON ({e}): {line}"));
        let workers = raw["workers"]
            .as_array()
            .unwrap_or_else(|| panic!("fleet JSON: no workers array in {raw}"))
            .iter()
            .map(Worker::parse)
            .collect();
        let frontends = raw["frontends"]
            .as_object()
            .unwrap_or_else(|| panic!("fleet JSON: no frontends object in {raw}"))
            .iter()
            .map(|(ns, urls)| {
                let urls = urls
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                (ns.clone(), urls)
            })
            .collect();
        let frontend_processes = raw["frontend_processes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|f| Frontend {
                        url: s(f, "url"),
                        addr: addr_of(&s(f, "url")),
                        namespace: f["namespace"].as_str().map(str::to_string),
                        models: f["models"]
                            .as_array()
                            .map(|m| {
                                m.iter()
                                    .filter_map(Value::as_str)
                                    .map(str::to_string)
                                    .collect()
                            })
                            .unwrap_or_default(),
                        pid: u32::try_from(u(f, "pid")).unwrap(),
                        log: PathBuf::from(s(f, "log")),
                    })
                    .collect()
            })
            .unwrap_or_default();
        FleetInfo {
            etcd_endpoint: s(&raw["etcd"], "endpoint"),
            frontends,
            frontend_processes,
            workers,
            dir: PathBuf::from(s(&raw, "dir")),
            lease_ttl_secs: raw["lease_ttl_secs"].as_u64(),
            block_size: u(&raw, "block_size"),
            startup_secs: raw["startup_secs"].as_f64().unwrap_or(0.0),
            raw,
        }
    }
}

/// A running fleet; torn down on drop.
pub struct Fleet {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr_path: PathBuf,
    /// What `fleet.py` reported.
    pub info: FleetInfo,
    // Last field: removed after the fleet is gone.
    scratch: TempDir,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("pid", &self.child.id())
            .field("info", &self.info)
            .finish()
    }
}

/// Bound for one command answer from `fleet.py` (a kill waits up to 10 s for the exit).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

impl Fleet {
    /// Starts the fleet and waits until it is ready (every worker registered, every frontend
    /// listing its models); panics with the script's stderr if it fails or times out.
    pub fn start(spec: &FleetSpec) -> Fleet {
        let python = venv_python();
        let scratch = TempDir::new("fleet");
        let stderr_path = scratch.path().join("fleet.stderr");
        let stderr = std::fs::File::create(&stderr_path).expect("create fleet stderr file");
        let timeout = spec.startup_timeout;
        let mut child = Command::new(&python)
            .arg(FLEET_SCRIPT)
            .args(&spec.args)
            .arg("--startup-timeout")
            .arg(timeout.as_secs().max(1).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} {FLEET_SCRIPT}: {e}", python.display()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("fleet stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // The script bounds its own startup; allow for teardown after a failure on top.
        let first = lines.recv_timeout(timeout + Duration::from_secs(30));
        let line = match first {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!(
                    "fleet.py did not report a ready fleet ({}; exit {status:?}); its stderr:\n{err}",
                    match e {
                        RecvTimeoutError::Timeout => "timed out",
                        RecvTimeoutError::Disconnected => "stdout closed",
                    }
                );
            }
        };
        let info = FleetInfo::parse(&line);
        Fleet {
            child,
            stdin,
            lines,
            stderr_path,
            info,
            scratch,
        }
    }

    /// A router config over this fleet: per namespace, one plain backend `fe-<ns>` (its first
    /// frontend, serving that namespace's models; also the unified fallback) and a shim pool of
    /// it; etcd discovery of those namespaces; direct `kv_metrics` subscriptions to the fleet's
    /// publisher addresses ([`Fleet::publisher_cidrs`]: loopback on 1.6.1);
    /// disaggregated serving on.
    pub fn router_config(&self) -> RouterConfig {
        let mut models: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (model, m) in self.info.raw["models"].as_object().into_iter().flatten() {
            if let Some(ns) = m["namespace"].as_str() {
                models.entry(ns).or_default().push(model);
            }
        }
        let mut cfg = RouterConfig::default();
        let mut pools = String::new();
        for (ns, urls) in &self.info.frontends {
            let url = urls
                .first()
                .unwrap_or_else(|| panic!("no frontend for {ns}"));
            let served = models.get(ns.as_str()).cloned().unwrap_or_default();
            cfg = cfg.backend(&format!("fe-{ns}"), url, &served);
            pools.push_str(&format!(
                "      - {{ namespace: {ns}, backends: [fe-{ns}] }}\n"
            ));
        }
        let namespaces: Vec<&str> = self.info.frontends.keys().map(String::as_str).collect();
        let cidrs: Vec<String> = self
            .publisher_cidrs()
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect();
        cfg.disaggregated_serving = true;
        cfg.extra_yaml = format!(
            "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: \
             [\"{}\"]\n      namespaces: [{}]\n  load:\n    direct_allow_cidrs: [{}]\n  \
             shim:\n    pools:\n{pools}",
            self.info.etcd_endpoint,
            namespaces.join(", "),
            cidrs.join(", ")
        );
        cfg
    }

    /// The fleet's ai-dynamo release as `(major, minor, patch)` (a nightly `1.7.0.devN` is
    /// `(1, 7, 0)`); `(0, 0, 0)` when fleet.py could not read it.
    pub fn release(&self) -> (u32, u32, u32) {
        release_of(self.info.raw["dynamo_version"].as_str().unwrap_or_default())
    }

    /// Where the router may dial this fleet's publishers: loopback, and each other address a
    /// worker advertises (Dynamo before 1.6 has no event-plane host setting: its workers bind
    /// `0.0.0.0` and advertise the host's first routable address, FLEET-05), each as a `/32`.
    pub fn publisher_cidrs(&self) -> Vec<String> {
        let mut cidrs = vec!["127.0.0.0/8".to_string()];
        for w in &self.info.workers {
            for p in w.publishers.values() {
                let host = p
                    .endpoint
                    .trim_start_matches("tcp://")
                    .rsplit_once(':')
                    .map_or("", |(h, _)| h);
                if let Ok(ip) = host.parse::<std::net::Ipv4Addr>()
                    && !ip.is_loopback()
                {
                    let cidr = format!("{ip}/32");
                    if !cidrs.contains(&cidr) {
                        cidrs.push(cidr);
                    }
                }
            }
        }
        cidrs
    }

    /// Workers serving `model`.
    pub fn workers_of(&self, model: &str) -> Vec<&Worker> {
        self.info
            .workers
            .iter()
            .filter(|w| w.model == model)
            .collect()
    }

    /// The first worker serving `model` in `role`; panics if none.
    pub fn worker(&self, model: &str, role: Role) -> &Worker {
        self.info
            .workers
            .iter()
            .find(|w| w.model == model && w.role == role)
            .unwrap_or_else(|| panic!("no {role:?} worker for {model} in the fleet"))
    }

    /// The first frontend serving namespace `ns`.
    pub fn frontend(&self, ns: &str) -> SocketAddr {
        let url = self
            .info
            .frontends
            .get(ns)
            .and_then(|v| v.first())
            .unwrap_or_else(|| panic!("no frontend for namespace {ns}: {:?}", self.info.frontends));
        addr_of(url)
    }

    /// Every frontend serving namespace `ns`.
    pub fn frontends(&self, ns: &str) -> Vec<SocketAddr> {
        self.info
            .frontends
            .get(ns)
            .map(|v| v.iter().map(|u| addr_of(u)).collect())
            .unwrap_or_default()
    }

    /// Sends one command line to `fleet.py` and returns its JSON answer.
    pub fn command(&mut self, line: &str) -> Value {
        let stdin = self.stdin.as_mut().expect("fleet stdin open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write `{line}` to fleet.py: {e}"));
        let answer = self
            .lines
            .recv_timeout(COMMAND_TIMEOUT)
            .unwrap_or_else(|e| panic!("no answer from fleet.py to `{line}`: {e:?}"));
        serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("fleet.py answer to `{line}` is not JSON ({e}): {answer}"))
    }

    /// Sends `signal` (`SIGKILL`, `SIGTERM`, `SIGINT`, `SIGSTOP`, `SIGCONT`) to the worker's
    /// process group; for KILL/TERM/INT waits (up to 10 s) until it exited. Panics unless the
    /// answer is ok; returns it (`pid`, `exit`, `at_unix`, ...).
    pub fn kill(&mut self, instance_id_hex: &str, signal: &str) -> Value {
        let answer = self.command(&format!("kill {instance_id_hex} {signal}"));
        assert_eq!(
            answer["ok"],
            Value::Bool(true),
            "fleet.py refused `kill {instance_id_hex} {signal}`: {answer}"
        );
        answer
    }

    /// Starts one more aggregated worker of `model` in namespace `ns` (`fleet.py`'s `add`) and
    /// returns it once it is registered in etcd; it is also added to `info.workers`.
    pub fn add(&mut self, ns: &str, model: &str) -> Worker {
        let answer = self.command(&format!("add {ns}/{model}"));
        assert_eq!(
            answer["ok"],
            Value::Bool(true),
            "fleet.py refused `add {ns}/{model}`: {answer}"
        );
        let w = Worker::parse(&answer["worker"]);
        self.info.workers.push(w.clone());
        w
    }

    /// The fleet JSON again, with `alive` per process.
    pub fn status(&mut self) -> Value {
        self.command("status")["fleet"].clone()
    }

    /// Every etcd key under `prefix` (via `etcdctl`).
    pub fn etcd_keys(&self, prefix: &str) -> Vec<String> {
        let out = self.etcdctl(&["get", "--prefix", prefix, "--keys-only"]);
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The keys still attached to lease `instance_id_hex` (empty once it expired or was revoked).
    pub fn lease_keys(&self, instance_id_hex: &str) -> Vec<String> {
        let out = self.etcdctl(&["lease", "timetolive", instance_id_hex, "--keys"]);
        if out.contains("already expired") {
            return Vec::new();
        }
        match out.find("attached keys([") {
            Some(i) => out[i + 15..]
                .trim_end()
                .trim_end_matches("])")
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            None => panic!("unexpected etcdctl lease timetolive output: {out}"),
        }
    }

    /// Polls until no key of lease `instance_id_hex` is left in etcd (lease keys and every key
    /// whose last segment is that id); returns how long that took, or `Err` with what is left
    /// after `within`.
    pub fn wait_lease_gone(
        &self,
        instance_id_hex: &str,
        within: Duration,
    ) -> Result<Duration, Vec<String>> {
        let start = Instant::now();
        loop {
            let mut left = self.lease_keys(instance_id_hex);
            left.extend(
                self.etcd_keys("v1/")
                    .into_iter()
                    .filter(|k| k.ends_with(&format!("/{instance_id_hex}"))),
            );
            if left.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(left);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn etcdctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&self.info.etcd_endpoint)
            .arg("--command-timeout=5s")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run etcdctl (tests/fleet/install.sh installs it): {e}"));
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The script's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The last `n` lines of a log file, ANSI colours removed.
    pub fn log_tail(path: &Path, n: usize) -> String {
        let clean = Fleet::log_text(path);
        let lines: Vec<&str> = clean.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// A log file's text, ANSI colours removed.
    pub fn log_text(path: &Path) -> String {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut clean = String::with_capacity(text.len());
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' && chars.peek() == Some(&'[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                clean.push(c);
            }
        }
        clean
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- fleet.py stderr ---\n{}", self.stderr());
            for f in &self.info.frontend_processes {
                eprintln!(
                    "--- {} (tail) ---\n{}",
                    f.log.display(),
                    Fleet::log_tail(&f.log, 15)
                );
            }
            for w in &self.info.workers {
                eprintln!(
                    "--- {} (tail) ---\n{}",
                    w.log.display(),
                    Fleet::log_tail(&w.log, 10)
                );
            }
        }
        // EOF on stdin: fleet.py tears everything down and exits.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    // Its children die with it (PR_SET_PDEATHSIG).
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let _ = std::fs::remove_dir_all(&self.info.dir);
    }
}
