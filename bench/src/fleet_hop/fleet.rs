//! The real Dynamo 1.6.1 fleet of `fleet-hop`: `tests/fleet/fleet.py` run
//! by the fleet venv's python, the one JSON line it prints once the fleet is
//! ready, its stdin commands ([`Fleet::command`]: one line out, one JSON line back), and its
//! teardown.
//!
//! Invariants: fleet.py runs pinned to the load CPUs, and its etcd, mockers
//! and frontend inherit that mask; its JSON line is awaited at most the
//! ready timeout; dropping a [`Fleet`] closes fleet.py's stdin (its
//! documented teardown), waits at most [`TEARDOWN`], then kills it (its
//! children die with it by `PR_SET_PDEATHSIG`) and removes its temp dir if
//! that was left behind.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::child::Supervised;
use crate::error::BenchError;
use crate::servers::set_log;

/// How long fleet.py may take to tear the fleet down after its stdin closes.
const TEARDOWN: Duration = Duration::from_secs(30);

/// What went wrong with fleet.py's description of the fleet.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FleetError {
    /// The line was not JSON.
    #[error("fleet.py printed a line that is not JSON ({source}): {line}")]
    NotJson {
        /// The line.
        line: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A field the bench needs is missing or has the wrong type.
    #[error("fleet.py's JSON lacks {0}")]
    Missing(String),
    /// A URL is not `http://127.0.0.1:PORT`.
    #[error("fleet.py's frontend URL `{0}` is not http://127.0.0.1:PORT")]
    Url(String),
    /// The fleet venv's python is missing.
    #[error("no fleet python at {}: run tests/fleet/install.sh, or pass --python", .0.display())]
    NoPython(PathBuf),
    /// fleet.py is missing.
    #[error("no fleet.py at {}: pass --fleet-script", .0.display())]
    NoScript(PathBuf),
    /// A request pinned by the bench was not answered 200 by the frontend.
    #[error("the frontend did not answer a request pinned with {pins} with 200: {detail}")]
    PinnedRequest {
        /// The pin headers.
        pins: String,
        /// The last outcome.
        detail: String,
    },
    /// The frontend process is gone.
    #[error("the frontend (pid {pid}) has exited")]
    FrontendExited {
        /// Its pid.
        pid: i32,
    },
    /// A stdin command was not answered with a JSON line in time.
    #[error("fleet.py command `{cmd}`: {detail}")]
    Command {
        /// The command line.
        cmd: String,
        /// What went wrong.
        detail: String,
    },
    /// fleet.py closed stdout or timed out without describing the fleet.
    #[error("fleet.py gave no fleet description within {secs} s{log}")]
    NoDescription {
        /// How long the driver waited.
        secs: u64,
        /// Tail of fleet.py's stderr, prefixed with a newline, or empty.
        log: String,
    },
}

impl From<FleetError> for crate::error::BenchError {
    fn from(e: FleetError) -> Self {
        Self::stage(crate::error::Stage::Fleet, e)
    }
}

/// One aggregated worker of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Worker {
    /// Dynamo instance id (the decimal pin value).
    pub(crate) instance_id: u64,
    /// Pid of its `dynamo.mocker` process.
    pub(crate) pid: i32,
}

/// What the bench needs from fleet.py's JSON line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FleetInfo {
    /// etcd client URL.
    pub(crate) etcd_endpoint: String,
    /// Dynamo namespace of the model.
    pub(crate) namespace: String,
    /// Base URL of the namespace's `dynamo.frontend --router-mode direct`.
    pub(crate) frontend_url: String,
    /// Its port on 127.0.0.1.
    pub(crate) frontend_port: u16,
    /// Pid of the frontend process.
    pub(crate) frontend_pid: i32,
    /// The frontend's log file (stdout and stderr), in fleet.py's temp dir.
    pub(crate) frontend_log: PathBuf,
    /// The model's aggregated workers, in fleet.py's order.
    pub(crate) workers: Vec<Worker>,
    /// fleet.py's temp dir (logs, etcd data).
    pub(crate) dir: PathBuf,
}

/// How to start the fleet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FleetSpec<'a> {
    /// The fleet venv's python.
    pub(crate) python: &'a Path,
    /// `tests/fleet/fleet.py`.
    pub(crate) script: &'a Path,
    /// Aggregated model to serve.
    pub(crate) model: &'a str,
    /// Mocker workers.
    pub(crate) workers: u32,
    /// `--speedup-ratio` of every mocker.
    pub(crate) speedup_ratio: u64,
    /// Extra arguments of every frontend (fleet.py's `--frontend-args`, one
    /// string; argparse keeps the last of a repeated flag, so
    /// `--router-mode kv` overrides fleet.py's `direct`); empty = none.
    pub(crate) frontend_args: &'a str,
    /// CPUs fleet.py (and so the whole fleet) is pinned to.
    pub(crate) cpus: &'a [usize],
    /// How long the fleet may take to be ready.
    pub(crate) ready_timeout: Duration,
    /// fleet.py's stderr.
    pub(crate) log: &'a Path,
}

/// A running fleet, torn down on drop.
#[derive(Debug)]
pub(crate) struct Fleet {
    proc: Option<Supervised>,
    stdin: Option<ChildStdin>,
    /// fleet.py's stdout lines after its description (the replies to [`Fleet::command`]).
    replies: Receiver<String>,
    info: FleetInfo,
}

impl Fleet {
    /// Starts fleet.py and waits for its description of the ready fleet.
    pub(crate) fn start(spec: &FleetSpec<'_>) -> Result<Self, BenchError> {
        Self::start_with(spec, &[])
    }

    /// [`start`](Self::start) with more fleet.py arguments (e.g. `--lease-ttl 3`).
    pub(crate) fn start_with(spec: &FleetSpec<'_>, extra: &[String]) -> Result<Self, BenchError> {
        let mut cmd = Command::new(spec.python);
        cmd.arg(spec.script)
            .arg("--agg")
            .arg(format!("{}:{}", spec.model, spec.workers))
            .arg("--speedup-ratio")
            .arg(spec.speedup_ratio.to_string())
            .arg("--startup-timeout")
            .arg(spec.ready_timeout.as_secs().to_string());
        if !spec.frontend_args.is_empty() {
            cmd.arg(format!("--frontend-args={}", spec.frontend_args));
        }
        cmd.args(extra);
        set_log(&mut cmd, spec.log)?;
        let (mut proc, stdin, stdout) =
            Supervised::spawn_piped("fleet.py", cmd, spec.cpus, Some(spec.log))?;
        let (tx, rx) = mpsc::channel();
        // Forwards every line (the description, then the command replies) until fleet.py exits;
        // once the receiver is gone, just drains.
        std::thread::Builder::new()
            .name("fleet-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            })
            .map_err(BenchError::io("starting the fleet.py reader thread"))?;
        let deadline = Instant::now() + spec.ready_timeout + Duration::from_secs(5);
        let line = loop {
            if crate::signals::interrupted() {
                return Err(BenchError::Interrupted);
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => break line,
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    proc.ensure_running()?;
                }
                Err(_) => {
                    // Closed stdout: fleet.py is exiting; let it finish its teardown.
                    let _ = proc.reaped_within(Duration::from_secs(10));
                    proc.ensure_running()?;
                    return Err(FleetError::NoDescription {
                        secs: spec.ready_timeout.as_secs(),
                        log: proc.log_tail(),
                    }
                    .into());
                }
            }
        };
        let info = match parse_info(&line, spec.model) {
            Ok(info) => info,
            Err(e) => {
                // Let fleet.py tear its fleet down (EOF) before it is killed.
                drop(stdin);
                let _ = proc.reaped_within(TEARDOWN);
                return Err(e.into());
            }
        };
        Ok(Self {
            proc: Some(proc),
            stdin: Some(stdin),
            replies: rx,
            info,
        })
    }

    /// Sends one command line on fleet.py's stdin (e.g. `kill <id> SIGKILL`, `status`,
    /// `etcd restart`) and returns its JSON reply, waiting at most `timeout`. A reply with
    /// `"ok": false` is an error.
    pub(crate) fn command(&mut self, line: &str, timeout: Duration) -> Result<Value, BenchError> {
        let fail = |detail: String| -> BenchError {
            FleetError::Command {
                cmd: line.to_owned(),
                detail,
            }
            .into()
        };
        // Replies nobody waited for (a timed-out command's) are stale now.
        while self.replies.try_recv().is_ok() {}
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(fail("stdin already closed".into()));
        };
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| fail(format!("writing: {e}")))?;
        let deadline = Instant::now() + timeout;
        let reply = loop {
            if crate::signals::interrupted() {
                return Err(BenchError::Interrupted);
            }
            match self.replies.recv_timeout(Duration::from_millis(100)) {
                Ok(reply) => break reply,
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(fail(format!("no reply within {} s", timeout.as_secs())));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(fail("fleet.py closed its stdout".into()));
                }
            }
        };
        let v: Value = serde_json::from_str(&reply)
            .map_err(|e| fail(format!("reply is not JSON ({e}): {reply}")))?;
        if v["ok"] != Value::Bool(true) {
            return Err(fail(format!("refused: {}", v["error"])));
        }
        Ok(v)
    }

    /// The fleet's description.
    pub(crate) fn info(&self) -> &FleetInfo {
        &self.info
    }

    /// Errors if fleet.py or the frontend has exited.
    pub(crate) fn ensure_running(&mut self) -> Result<(), BenchError> {
        if let Some(p) = &mut self.proc {
            p.ensure_running()?;
        }
        if !Path::new(&format!("/proc/{}", self.info.frontend_pid)).exists() {
            return Err(FleetError::FrontendExited {
                pid: self.info.frontend_pid,
            }
            .into());
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // EOF on stdin is fleet.py's signal to stop every process and remove its dir.
        drop(self.stdin.take());
        if let Some(mut p) = self.proc.take() {
            if !p.reaped_within(TEARDOWN) {
                eprintln!(
                    "fleet.py still running {} s after its stdin closed; killing it",
                    TEARDOWN.as_secs()
                );
            }
            drop(p);
        }
        let dir = &self.info.dir;
        let ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("continuum-fleet-"));
        if ours && dir.exists() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Extracts the model's namespace, frontend, workers and etcd from fleet.py's
/// JSON line.
pub(crate) fn parse_info(line: &str, model: &str) -> Result<FleetInfo, FleetError> {
    let v: Value = serde_json::from_str(line).map_err(|source| FleetError::NotJson {
        line: line.chars().take(500).collect(),
        source,
    })?;
    let missing = |what: &str| FleetError::Missing(what.to_owned());
    let str_at = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .ok_or_else(|| missing(p))
    };
    let namespace = str_at(&format!("/models/{model}/namespace"))?.to_owned();
    let frontend_url = str_at(&format!("/frontends/{namespace}/0"))?.to_owned();
    let frontend_port = frontend_url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| FleetError::Url(frontend_url.clone()))?;
    let frontend = v
        .get("frontend_processes")
        .and_then(Value::as_array)
        .and_then(|fes| fes.iter().find(|fe| fe["url"] == frontend_url.as_str()));
    let frontend_pid = frontend
        .and_then(|fe| pid(&fe["pid"]))
        .ok_or_else(|| missing("the pid of the frontend process"))?;
    let frontend_log = frontend
        .and_then(|fe| fe["log"].as_str())
        .map(PathBuf::from)
        .ok_or_else(|| missing("the log of the frontend process"))?;
    let workers: Vec<Worker> = v
        .get("workers")
        .and_then(Value::as_array)
        .ok_or_else(|| missing("workers"))?
        .iter()
        .filter(|w| w["model"] == model && w["role"] == "aggregated")
        .map(|w| {
            Ok(Worker {
                instance_id: w["instance_id"]
                    .as_u64()
                    .ok_or_else(|| missing("a worker's instance_id"))?,
                pid: pid(&w["pid"]).ok_or_else(|| missing("a worker's pid"))?,
            })
        })
        .collect::<Result<_, FleetError>>()?;
    if workers.is_empty() {
        return Err(missing(&format!("aggregated workers of {model}")));
    }
    Ok(FleetInfo {
        etcd_endpoint: str_at("/etcd/endpoint")?.to_owned(),
        namespace,
        frontend_url,
        frontend_port,
        frontend_pid,
        frontend_log,
        workers,
        dir: PathBuf::from(str_at("/dir")?),
    })
}

fn pid(v: &Value) -> Option<i32> {
    v.as_i64().and_then(|p| i32::try_from(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"etcd": {"endpoint": "http://127.0.0.1:36957", "pid": 28800},
        "frontends": {"agg": ["http://127.0.0.1:37695"]},
        "frontend_processes": [{"url": "http://127.0.0.1:37695", "namespace": "agg", "pid": 28837,
          "log": "/tmp/continuum-fleet-byyfyqfj/frontend1-agg.log"}],
        "workers": [
          {"namespace": "agg", "role": "aggregated", "model": "tiny-agg",
           "instance_id": 545958299087899693, "pid": 28834},
          {"namespace": "agg", "role": "aggregated", "model": "tiny-agg",
           "instance_id": 545958299087899669, "pid": 28836}],
        "models": {"tiny-agg": {"namespace": "agg", "mode": "agg"}},
        "dir": "/tmp/continuum-fleet-byyfyqfj"}"#;

    #[test]
    fn parses_the_fleet_line() {
        let info = parse_info(&LINE.replace('\n', " "), "tiny-agg").unwrap();
        assert_eq!(info.namespace, "agg");
        assert_eq!(info.frontend_port, 37695);
        assert_eq!(info.frontend_pid, 28837);
        assert_eq!(
            info.frontend_log,
            PathBuf::from("/tmp/continuum-fleet-byyfyqfj/frontend1-agg.log")
        );
        assert_eq!(info.etcd_endpoint, "http://127.0.0.1:36957");
        assert_eq!(
            info.workers,
            vec![
                Worker {
                    instance_id: 545_958_299_087_899_693,
                    pid: 28834
                },
                Worker {
                    instance_id: 545_958_299_087_899_669,
                    pid: 28836
                },
            ]
        );
    }

    #[test]
    fn rejects_other_models_and_garbage() {
        assert!(matches!(
            parse_info(LINE, "other"),
            Err(FleetError::Missing(_))
        ));
        assert!(matches!(
            parse_info("fleet: ready", "tiny-agg"),
            Err(FleetError::NotJson { .. })
        ));
        let remote = LINE.replace("http://127.0.0.1:37695", "http://10.0.0.1:37695");
        assert!(matches!(
            parse_info(&remote, "tiny-agg"),
            Err(FleetError::Url(_))
        ));
    }
}
