//! `EtcdServer`: a real single-member etcd (`/usr/bin/etcd`) for the discovery end-to-end tests.
//!
//! Each server listens on free loopback client and peer ports, keeps its data in a temp dir and
//! logs to a file there; it is killed (and the dir removed) on drop, and a server dropped while
//! its test panics prints the tail of its log. It can be stopped and restarted on the same
//! ports and data dir, optionally serves TLS with certificates generated here (CA, server cert
//! for `127.0.0.1` / `localhost`, client cert for `--client-cert-auth`), and can have auth
//! enabled with a root user and a `reader` user that may only READ keys under `v1/`.
//!
//! Data is written with `etcdctl` (`ETCDCTL_API=3`), never through the router: put, put under a
//! lease, delete, compact, load the Dynamo fixture dump. Every wait is bounded by a deadline.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::config::TempDir;
use super::pki::TestCa;

/// The etcd server binary (Debian `etcd-server`; `tests/run.sh` installs it).
pub const ETCD_BIN: &str = "/usr/bin/etcd";
/// The etcd client binary (Debian `etcd-client`).
pub const ETCDCTL_BIN: &str = "/usr/bin/etcdctl";
/// How long etcd may take to answer a health check after spawning.
pub const READY_WITHIN: Duration = Duration::from_secs(20);
/// Bound on one etcdctl run.
const ETCDCTL_WITHIN: Duration = Duration::from_secs(20);

/// The password of etcd's `root` user once [`EtcdServer::enable_auth`] ran.
pub const ROOT_PASSWORD: &str = "root-secret-e2e";
/// The read-only user created by [`EtcdServer::enable_auth`].
pub const READER_USER: &str = "reader";
/// Its role: READ permission on the prefix `v1/` only.
pub const READER_ROLE: &str = "dynamo-reader";

/// PEM files of a test PKI, all inside the server's temp dir.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate (trusted by etcd for client certs and by clients for the server).
    pub ca_cert: PathBuf,
    /// The server certificate (SANs `127.0.0.1`, `localhost`).
    pub server_cert: PathBuf,
    /// The server key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA.
    pub client_cert: PathBuf,
    /// The client key.
    pub client_key: PathBuf,
}

/// How to start an [`EtcdServer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct EtcdOptions {
    /// Serve clients over TLS and require client certificates (`--client-cert-auth`).
    pub tls: bool,
}

/// A running (or stopped) etcd; killed and cleaned up on drop.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    tls: Option<TlsFiles>,
    reader_password: Option<String>,
    // Last field: removed after the child is gone.
    dir: TempDir,
}

impl EtcdServer {
    /// A plain-HTTP etcd on free loopback ports.
    pub fn start() -> EtcdServer {
        EtcdServer::start_with(EtcdOptions::default())
    }

    /// An etcd started with `opts`. Retries on other ports if the first ones were taken.
    pub fn start_with(opts: EtcdOptions) -> EtcdServer {
        let mut last = String::new();
        for _ in 0..3 {
            let dir = TempDir::new("etcd");
            let tls = opts.tls.then(|| write_test_pki(dir.path()));
            let mut server = EtcdServer {
                child: None,
                client_port: super::free_port(),
                peer_port: super::free_port(),
                tls,
                reader_password: None,
                dir,
            };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start: {last}");
    }

    /// The client URL (`http://` or `https://` with `127.0.0.1` and the client port).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The client port (kept across [`EtcdServer::restart`]).
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The TLS files, when started with TLS.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Everything etcd logged so far (all incarnations).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Whether the process is running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills etcd (SIGKILL, as a crash) and reaps it. Data dir and ports are kept.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data dir (stopping it first if running); returns
    /// once it answers a health check.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn_and_wait() {
            panic!("etcd restart on the same ports failed: {e}");
        }
    }

    /// Starts etcd again on the same data dir but serving clients on `client_port` (e.g. a port
    /// nobody else knows, for maintenance while clients see an outage); later restarts keep it.
    pub fn restart_on_port(&mut self, client_port: u16) {
        self.stop();
        self.client_port = client_port;
        if let Err(e) = self.spawn_and_wait() {
            panic!("etcd restart on client port {client_port} failed: {e}");
        }
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let data = self.dir.path().join("data");
        let client_url = self.endpoint();
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("etcd log file: {e}"))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(ETCD_BIN);
        cmd.arg("--name")
            .arg("e2e")
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("e2e={peer_url}"))
            .arg("--initial-cluster-token")
            .arg(format!("e2e-{}", self.client_port))
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca_cert)
                .arg("--client-cert-auth");
        }
        // Never outlive the test thread that started it, even if the test binary is killed.
        // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn {ETCD_BIN}: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(c) = &mut self.child
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "etcd exited with {status} on {client_url}; log:\n{}",
                    tail(&self.log(), 40)
                ));
            }
            let last = match self.try_etcdctl(&["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!(
                    "etcd not healthy within {READY_WITHIN:?} on {client_url} (last: {last}); \
                     log:\n{}",
                    tail(&self.log(), 40)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `etcdctl <args>` against this server (as root once auth is on); its stdout, or
    /// `Err` with its stderr.
    pub fn try_etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(ETCDCTL_BIN);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["--dial-timeout=3s", "--command-timeout=10s"]);
        if let Some(t) = &self.tls {
            cmd.arg(format!("--cacert={}", t.ca_cert.display()))
                .arg(format!("--cert={}", t.client_cert.display()))
                .arg(format!("--key={}", t.client_key.display()));
        }
        if self.reader_password.is_some() {
            cmd.arg(format!("--user=root:{ROOT_PASSWORD}"));
        }
        cmd.args(args);
        run_bounded(cmd, ETCDCTL_WITHIN)
    }

    /// Runs `etcdctl <args>`; panics (with etcd's log) if it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        self.try_etcdctl(args).unwrap_or_else(|e| {
            panic!(
                "etcdctl {args:?} failed: {e}\netcd log:\n{}",
                tail(&self.log(), 30)
            )
        })
    }

    /// `put key value`.
    pub fn put(&self, key: &str, value: &str) {
        self.etcdctl(&["put", key, value]);
    }

    /// Grants a lease of `ttl_secs` and puts every pair under it; returns the lease id (hex).
    pub fn put_with_lease(&self, pairs: &[(&str, &str)], ttl_secs: u64) -> String {
        let out = self.etcdctl(&["lease", "grant", &ttl_secs.to_string()]);
        // "lease 694da22dbf578e29 granted with TTL(2s)"
        let id = out
            .split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("unexpected `lease grant` output {out:?}"))
            .to_owned();
        for (k, v) in pairs {
            self.etcdctl(&["put", k, v, &format!("--lease={id}")]);
        }
        id
    }

    /// Renews lease `id` (hex, as [`EtcdServer::put_with_lease`] returned it) once to its full
    /// TTL.
    pub fn keep_alive_once(&self, id: &str) {
        self.etcdctl(&["lease", "keep-alive", "--once", id]);
    }

    /// `del key`; returns how many keys were deleted.
    pub fn delete(&self, key: &str) -> u64 {
        let out = self.etcdctl(&["del", key]);
        out.trim().parse().unwrap_or(0)
    }

    /// The current store revision.
    pub fn revision(&self) -> i64 {
        let out = self.etcdctl(&["endpoint", "status", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("endpoint status JSON {out:?}: {e}"));
        v[0]["Status"]["header"]["revision"]
            .as_i64()
            .unwrap_or_else(|| panic!("no revision in {v}"))
    }

    /// Compacts the history up to the current revision (`compact <rev> --physical`); returns
    /// that revision.
    pub fn compact(&self) -> i64 {
        let rev = self.revision();
        self.etcdctl(&["compact", &rev.to_string(), "--physical"]);
        rev
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> bool {
        !self.etcdctl(&["get", key, "--keys-only"]).trim().is_empty()
    }

    /// Puts every pair of a dump file (a key line, then a value line).
    pub fn load_dump(&self, path: &Path) -> Vec<(String, String)> {
        let pairs = read_dump(path);
        for (k, v) in &pairs {
            self.put(k, v);
        }
        pairs
    }

    /// Enables auth: a `root` user (password [`ROOT_PASSWORD`]), a [`READER_USER`] with
    /// `reader_password` whose role [`READER_ROLE`] may only READ the prefix `v1/`, then
    /// `auth enable`. Later etcdctl runs of this harness authenticate as root.
    pub fn enable_auth(&mut self, reader_password: &str) {
        self.etcdctl(&[
            "user",
            "add",
            "root",
            &format!("--new-user-password={ROOT_PASSWORD}"),
        ]);
        self.etcdctl(&["role", "add", READER_ROLE]);
        self.etcdctl(&[
            "role",
            "grant-permission",
            READER_ROLE,
            "--prefix=true",
            "read",
            "v1/",
        ]);
        self.etcdctl(&[
            "user",
            "add",
            READER_USER,
            &format!("--new-user-password={reader_password}"),
        ]);
        self.etcdctl(&["user", "grant-role", READER_USER, READER_ROLE]);
        self.etcdctl(&["auth", "enable"]);
        self.reader_password = Some(reader_password.to_owned());
    }

    /// Runs etcdctl as the reader user (for checking what its role allows).
    pub fn etcdctl_as_reader(&self, args: &[&str]) -> Result<String, String> {
        let pw = self.reader_password.as_deref().expect("enable_auth first");
        let mut cmd = Command::new(ETCDCTL_BIN);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["--dial-timeout=3s", "--command-timeout=10s"])
            .arg(format!("--user={READER_USER}:{pw}"));
        if let Some(t) = &self.tls {
            cmd.arg(format!("--cacert={}", t.ca_cert.display()))
                .arg(format!("--cert={}", t.client_cert.display()))
                .arg(format!("--key={}", t.client_key.display()));
        }
        cmd.args(args);
        run_bounded(cmd, ETCDCTL_WITHIN)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "---- etcd log (last 30 lines) ----\n{}\n---- end etcd log ----",
                tail(&self.log(), 30)
            );
        }
    }
}

/// The pairs of a dump file: a key line, then a value line.
pub fn read_dump(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read dump {}: {e}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len() % 2,
        0,
        "{}: expected a key line then a value line",
        path.display()
    );
    lines
        .chunks(2)
        .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
        .collect()
}

/// Runs `cmd` with stdout/stderr captured to files, killing it after `within`.
fn run_bounded(mut cmd: Command, within: Duration) -> Result<String, String> {
    let dir = TempDir::new("etcdctl");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let out = File::create(&out_path).map_err(|e| e.to_string())?;
    let err = File::create(&err_path).map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot spawn etcdctl: {e}"))?;
    let Some(status) = super::wait_bounded(&mut child, within) else {
        return Err(format!("etcdctl did not exit within {within:?}"));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        Err(format!("{status}: {stderr}{stdout}"))
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Generates a CA, a server certificate for `127.0.0.1` / `localhost` and a client
/// certificate, and writes them as PEM files into `dir`.
fn write_test_pki(dir: &Path) -> TlsFiles {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let ca = TestCa::new(dir, "ca", "continuum e2e test CA");
    // etcd's own gRPC gateway dials the server with the server certificate, so it also needs
    // client auth.
    let server = ca.issue(
        dir,
        "server",
        "etcd e2e server",
        &["127.0.0.1", "localhost"],
        &[ServerAuth, ClientAuth],
    );
    let client = ca.issue(dir, "client", "continuum-router e2e", &[], &[ClientAuth]);
    TlsFiles {
        ca_cert: ca.pem,
        server_cert: server.cert,
        server_key: server.key,
        client_cert: client.cert,
        client_key: client.key,
    }
}
