//! A real libzmq publisher for load tests: `tests/zmq/publisher.py` (pyzmq from the fleet venv,
//! libzmq 4.3.5) on a random loopback port, driven through stdin/stdout JSON lines. The test can
//! wait until the router's SUB socket has subscribed, then send any multipart message (captured
//! Dynamo frames or generated ones). Killed on drop.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// A running pyzmq XPUB publisher.
pub struct ZmqPublisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The loopback port it is bound to.
    pub port: u16,
}

impl std::fmt::Debug for ZmqPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqPublisher")
            .field("port", &self.port)
            .finish()
    }
}

impl ZmqPublisher {
    /// Start a publisher (the fleet venv must be installed: `tests/fleet/install.sh`).
    pub fn start() -> ZmqPublisher {
        let python = super::fleet::venv_python();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/zmq/publisher.py");
        let mut child = Command::new(&python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} {script}: {e} (run tests/fleet/install.sh)",
                    python.display()
                )
            });
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut p = ZmqPublisher {
            child,
            stdin,
            stdout,
            port: 0,
        };
        let port = p.command(json!({"cmd": "port"}))["port"]
            .as_u64()
            .expect("port");
        p.port = u16::try_from(port).expect("port fits");
        p
    }

    /// `tcp://127.0.0.1:<port>`, as a worker record advertises it.
    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    fn command(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").expect("write to publisher");
        self.stdin.flush().expect("flush publisher");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read publisher");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("publisher answered {line:?}: {e}"))
    }

    /// Wait until a subscriber subscribed; returns the topic, or `None` after `timeout`.
    pub fn wait_subscribed(&mut self, timeout: Duration) -> Option<String> {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let v = self.command(json!({"cmd": "wait_subscribed", "timeout_ms": ms}));
        (v["subscribed"] == true).then(|| v["topic"].as_str().unwrap_or("").to_owned())
    }

    /// Send one multipart message.
    pub fn send(&mut self, frames: &[&[u8]]) {
        let hex: Vec<String> = frames
            .iter()
            .map(|f| f.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        let v = self.command(json!({"cmd": "send", "frames": hex}));
        assert_eq!(v["sent"], frames.len(), "{v}");
    }
}

impl Drop for ZmqPublisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
