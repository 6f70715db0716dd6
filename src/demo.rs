//! `continuum-router demo`: the router in front of a built-in OpenAI-compatible echo backend, all
//! on loopback, so a newcomer sees a request routed without any other setup.
//!
//! The echo backend is deliberately simple (a thread per connection, std I/O): it answers
//! `POST /v1/chat/completions` by echoing the last message, buffered or as an SSE stream when the
//! request says `"stream": true`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;

use continuum_core::config::{Config, NoEnv, report};

/// Largest request body the echo backend reads.
const MAX_BODY: usize = 1 << 20;

/// Run the demo on `port`.
pub(crate) fn run(port: u16) -> ExitCode {
    let backend = match TcpListener::bind("127.0.0.1:0").and_then(|l| Ok((l.local_addr()?, l))) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot start the demo echo backend: {e}");
            return ExitCode::from(1);
        }
    };
    let (backend_addr, listener) = backend;
    std::thread::Builder::new()
        .name("demo-echo".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let _ = std::thread::Builder::new()
                    .name("demo-echo-conn".into())
                    .spawn(move || serve(conn));
            }
        })
        .ok();
    let yaml = format!(
        "server:\n  bind_address: \"127.0.0.1:{port}\"\n  shards: 2\nbackends:\n  - name: demo-echo\n    type: openai\n    url: \"http://{backend_addr}\"\n    models: [\"demo\"]\n"
    );
    let config = match Config::from_yaml(&yaml, &NoEnv) {
        Ok((c, _)) => c,
        Err(e) => {
            eprint!("{}", report::render_lines(&e.errors, &e.warnings));
            return ExitCode::from(1);
        }
    };
    let ready = |addr: std::net::SocketAddr| {
        eprintln!(
            "\ncontinuum-router demo: routing model \"demo\" to a built-in echo backend at {backend_addr}\n\
             try:\n  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    \
             -d '{{\"model\":\"demo\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'\n  \
             curl -sN http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    \
             -d '{{\"model\":\"demo\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'\n  \
             curl -s http://{addr}/metrics | grep continuum_http\nCtrl-C drains and exits.\n"
        );
    };
    match crate::serve::start(config, yaml, None, ready) {
        Ok(_) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Serve one echo-backend connection (keep-alive, Content-Length request bodies).
fn serve(conn: TcpStream) {
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut content_length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        if content_length > MAX_BODY {
            return;
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let text = req["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        let model = req["model"].as_str().unwrap_or("demo").to_string();
        let ok = if req["stream"].as_bool() == Some(true) {
            stream(&mut out, &model, &text)
        } else {
            let body = serde_json::json!({
                "id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": format!("echo: {text}")}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            })
            .to_string();
            write!(
                out,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        if ok.is_err() {
            return;
        }
    }
}

fn stream(out: &mut TcpStream, model: &str, text: &str) -> std::io::Result<()> {
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )?;
    let words: Vec<String> = std::iter::once("echo:".to_string())
        .chain(text.split_whitespace().map(|w| format!(" {w}")))
        .collect();
    for w in words {
        let event = serde_json::json!({
            "id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": null}]
        });
        chunk(out, &format!("data: {event}\n\n"))?;
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    chunk(out, "data: [DONE]\n\n")?;
    out.write_all(b"0\r\n\r\n")
}

fn chunk(out: &mut TcpStream, s: &str) -> std::io::Result<()> {
    write!(out, "{:x}\r\n{s}\r\n", s.len())
}
