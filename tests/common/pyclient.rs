//! Official Python API clients (`tests/clients/*.py`) run with the fleet venv's python.
//!
//! [`run_script`] runs any script with a deadline (killed after it) and parses every stdout line
//! as JSON; [`OpenAiChat`] drives `tests/clients/openai_chat.py` (the `openai` package: buffered
//! and streamed chat, concurrency, extra headers, per-request timeout) and returns one
//! [`ClientResult`] per request. Failures of requests are data (`ok: false`, `status`, `body`);
//! only a script that crashes or overruns its deadline panics, with its stderr.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::TempDir;
use super::fleet::venv_python;

/// The `openai` chat client script.
pub const OPENAI_CHAT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/openai_chat.py");

/// Runs `script args...` with the venv's python; panics (with stderr) if it exits non-zero or
/// outlives `deadline`. Returns every stdout line parsed as JSON.
pub fn run_script(script: &str, args: &[String], deadline: Duration) -> Vec<Value> {
    let python = venv_python();
    let dir = TempDir::new("pyclient");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(&python)
        .arg(script)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {} {script}: {e}", python.display()));
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let Some(status) = super::wait_bounded(&mut child, deadline) else {
        panic!(
            "{script} {args:?} did not finish within {deadline:?}; stdout so far:\n{}\nstderr:\n{}",
            read(&out_path),
            read(&err_path)
        );
    };
    let stdout = read(&out_path);
    assert!(
        status.success(),
        "{script} {args:?} exited with {status}; stdout:\n{stdout}\nstderr:\n{}",
        read(&err_path)
    );
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{script}: not JSON ({e}): {l}"))
        })
        .collect()
}

/// Which `stream` values to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// Buffered only.
    Buffered,
    /// `stream: true` only.
    Streamed,
    /// Each request both ways.
    Both,
}

/// A run of `tests/clients/openai_chat.py`: every (model, stream) combination `n` times.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    base_url: String,
    models: Vec<String>,
    stream: StreamMode,
    n: u32,
    concurrency: u32,
    max_tokens: u32,
    headers: Vec<(String, String)>,
    timeout: Duration,
    api_key: String,
}

impl OpenAiChat {
    /// Requests to `http://{addr}/v1`: buffered, once, 8 tokens, one at a time, 10 s each.
    pub fn new(addr: SocketAddr, model: &str) -> OpenAiChat {
        OpenAiChat {
            base_url: format!("http://{addr}/v1"),
            models: vec![model.to_string()],
            stream: StreamMode::Buffered,
            n: 1,
            concurrency: 1,
            max_tokens: 8,
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            api_key: "unused".into(),
        }
    }

    /// The client's API key (sent as `Authorization: Bearer`).
    pub fn api_key(mut self, key: &str) -> OpenAiChat {
        self.api_key = key.into();
        self
    }

    /// Another model.
    pub fn model(mut self, model: &str) -> OpenAiChat {
        self.models.push(model.to_string());
        self
    }

    /// Buffered, streamed or both.
    pub fn stream(mut self, mode: StreamMode) -> OpenAiChat {
        self.stream = mode;
        self
    }

    /// Requests per (model, stream).
    pub fn n(mut self, n: u32) -> OpenAiChat {
        self.n = n;
        self
    }

    /// Requests in flight at once.
    pub fn concurrency(mut self, c: u32) -> OpenAiChat {
        self.concurrency = c;
        self
    }

    /// `max_tokens` of every request.
    pub fn max_tokens(mut self, t: u32) -> OpenAiChat {
        self.max_tokens = t;
        self
    }

    /// A header sent on every request (the client's `default_headers`).
    pub fn header(mut self, name: &str, value: &str) -> OpenAiChat {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The client's per-request timeout.
    pub fn timeout(mut self, t: Duration) -> OpenAiChat {
        self.timeout = t;
        self
    }

    /// Runs the script; one result per request, in completion order.
    pub fn run(&self) -> Vec<ClientResult> {
        let mut args = vec![
            "--base-url".to_string(),
            self.base_url.clone(),
            "--stream".into(),
            match self.stream {
                StreamMode::Buffered => "false",
                StreamMode::Streamed => "true",
                StreamMode::Both => "both",
            }
            .into(),
            "--n".into(),
            self.n.to_string(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--max-tokens".into(),
            self.max_tokens.to_string(),
            "--timeout".into(),
            format!("{:.3}", self.timeout.as_secs_f64()),
            "--api-key".into(),
            self.api_key.clone(),
        ];
        for m in &self.models {
            args.push("--model".into());
            args.push(m.clone());
        }
        for (n, v) in &self.headers {
            args.push("--header".into());
            args.push(format!("{n}:{v}"));
        }
        let streams: u32 = if self.stream == StreamMode::Both {
            2
        } else {
            1
        };
        let jobs = self.models.len() as u32 * streams * self.n;
        let waves = jobs.div_ceil(self.concurrency.max(1));
        // Interpreter start and imports take a few seconds on a busy machine.
        let deadline = self.timeout * waves + Duration::from_secs(30);
        let out: Vec<ClientResult> = run_script(OPENAI_CHAT, &args, deadline)
            .into_iter()
            .map(ClientResult)
            .collect();
        assert_eq!(out.len(), jobs as usize, "one line per request: {out:#?}");
        out
    }
}

/// One request's outcome as the client script printed it (see `tests/clients/openai_chat.py`).
#[derive(Debug, Clone)]
pub struct ClientResult(pub Value);

impl ClientResult {
    /// Whether the client got and parsed a successful answer.
    pub fn ok(&self) -> bool {
        self.0["ok"] == Value::Bool(true)
    }

    /// The HTTP status of a failed request (`None` for a transport error or timeout).
    pub fn status(&self) -> Option<u16> {
        self.0["status"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
    }

    /// A disclosed response header (`x-backend`, `x-continuum-*`; lower-case name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.0["headers"][name].as_str()
    }

    /// Every disclosed response header.
    pub fn headers(&self) -> BTreeMap<String, String> {
        self.0["headers"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `x-continuum-worker-instance-id` as a number.
    pub fn worker(&self) -> Option<u64> {
        self.header("x-continuum-worker-instance-id")
            .and_then(|v| v.parse().ok())
    }

    /// `x-continuum-prefill-instance-id` as a number.
    pub fn prefill(&self) -> Option<u64> {
        self.header("x-continuum-prefill-instance-id")
            .and_then(|v| v.parse().ok())
    }

    /// The request's model.
    pub fn model(&self) -> &str {
        self.0["model"].as_str().unwrap_or("")
    }

    /// Whether it was a streamed request.
    pub fn streamed(&self) -> bool {
        self.0["stream"] == Value::Bool(true)
    }

    /// A string field (`text`, `finish_reason`, `body`, ...).
    pub fn str(&self, key: &str) -> Option<&str> {
        self.0[key].as_str()
    }

    /// An integer field (`chunks`, `content_chunks`, `usage_chunks`, ...).
    pub fn int(&self, key: &str) -> Option<u64> {
        self.0[key].as_u64()
    }
}
