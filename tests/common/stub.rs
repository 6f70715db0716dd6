//! [`StubBackend`]: an OpenAI-compatible backend in its own process (`tests/backends/
//! openai_stub.py`), so a test can freeze it with SIGSTOP: its kernel still accepts connections,
//! it never answers, as a hung replica does.
//!
//! The process is killed when the value drops (continued first, so a stopped one dies too).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;

use super::STEP;
use super::fleet::venv_python;

/// The stub's script.
pub const STUB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/backends/openai_stub.py");

/// One stub backend process.
#[derive(Debug)]
pub struct StubBackend {
    child: Child,
    addr: SocketAddr,
    name: String,
    scheme: &'static str,
}

impl StubBackend {
    /// Start a stub named `name` (the content of its completions); waits until it listens.
    pub fn start(name: &str) -> StubBackend {
        Self::spawn(name, None)
    }

    /// Start a stub serving HTTPS with the PEM certificate chain and key at these paths.
    pub fn start_tls(name: &str, cert: &Path, key: &Path) -> StubBackend {
        Self::spawn(name, Some((cert, key)))
    }

    fn spawn(name: &str, tls: Option<(&Path, &Path)>) -> StubBackend {
        let mut cmd = Command::new(venv_python());
        cmd.arg(STUB).arg(name);
        if let Some((cert, key)) = tls {
            cmd.arg("--tls").arg(cert).arg(key);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {STUB}: {e}"));
        let stdout = child.stdout.take().expect("stub stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(STEP)
            .unwrap_or_else(|e| panic!("stub {name} did not report its port: {e:?}"));
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("stub said {line:?}: {e}"));
        let port = v["port"].as_u64().expect("port") as u16;
        StubBackend {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            name: name.into(),
            scheme: if tls.is_some() { "https" } else { "http" },
        }
    }

    /// `http://127.0.0.1:<port>` (`https://` for a TLS stub).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig}) on stub {}", self.name);
    }

    /// Freeze it (SIGSTOP): connections are still accepted by the kernel, nothing answers.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        // kill(2) returns before the process has stopped: wait until /proc says it has (`T`).
        let stat = format!("/proc/{}/stat", self.child.id());
        let deadline = std::time::Instant::now() + STEP;
        while std::fs::read_to_string(&stat).ok().and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('T'))
        }) != Some(true)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "stub {} never stopped",
                self.name
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Let it run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }
}

impl Drop for StubBackend {
    fn drop(&mut self) {
        // SAFETY: as in `signal`.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
