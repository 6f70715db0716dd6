//! The front of `kv-route`'s `router x2` row: nginx on 127.0.0.1 with a round-robin `upstream` of
//! the router replicas, so the clients' requests (one connection each) alternate replicas and a
//! conversation's turns land on different ones; its config, start and readiness.
//!
//! Invariants: every path nginx writes lives in the bench's temp dir; responses stream through
//! unbuffered (`proxy_buffering off`), so TTFT through the front is the replicas' TTFT plus one
//! loopback hop; response headers (the router's `x-continuum-worker-instance-id`) and request
//! headers (the clients' empty `x-backend`) pass through unchanged; a failed upstream is not
//! retried on the other replica (`proxy_next_upstream off`), so every request's answer comes from
//! the replica it was sent to; the readiness wait is bounded.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe;
use crate::servers::set_log;
use crate::tempdir::TempDir;

/// nginx.conf: listen on `port`, round-robin over the routers on `upstreams`, every path in `dir`.
pub(crate) fn nginx_conf(dir: &Path, port: u16, upstreams: &[u16]) -> String {
    let d = dir.display();
    let servers: String = upstreams
        .iter()
        .map(|p| format!("        server 127.0.0.1:{p} max_fails=0;\n"))
        .collect();
    format!(
        "daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx-replicas.pid;
error_log {d}/nginx-replicas-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream replicas {{
{servers}    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
            proxy_next_upstream off;
        }}
    }}
}}
"
    )
}

/// Starts nginx (`bin`) in front of the routers on `upstreams`, pinned to `cpus`, and waits
/// (within `ready`) until every replica answered a chat completion through it naming its worker.
pub(crate) fn start(
    bin: &Path,
    dir: &TempDir,
    upstreams: &[u16],
    cpus: &[usize],
    chat_body: &str,
    worker_header: &str,
    ready: Duration,
) -> Result<(Supervised, u16), BenchError> {
    let port = probe::free_port()?;
    let conf = dir.write(
        "nginx-replicas.conf",
        &nginx_conf(dir.path(), port, upstreams),
    )?;
    let log = dir.path().join("nginx-replicas-error.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(&log);
    set_log(&mut cmd, &dir.path().join("nginx-replicas-stdio.log"))?;
    let mut nginx = Supervised::spawn("nginx", cmd, cpus, Some(&log))?;
    let deadline = Instant::now() + ready;
    // Round robin: as many answers in a row as replicas, each naming a worker.
    let mut answered = 0;
    loop {
        if crate::signals::interrupted() {
            return Err(BenchError::Interrupted);
        }
        nginx.ensure_running()?;
        let detail = match probe::request(
            port,
            "POST",
            "/v1/chat/completions",
            &[("x-backend", "")],
            chat_body,
        ) {
            Ok(r) if r.status == 200 && r.header(worker_header).is_some() => {
                answered += 1;
                if answered >= upstreams.len() {
                    return Ok((nginx, port));
                }
                continue;
            }
            Ok(r) if r.status == 200 => {
                answered = 0;
                format!("200 without {worker_header}: the front dropped a header")
            }
            Ok(r) => {
                answered = 0;
                format!("answered {}: {}", r.status, r.text())
            }
            Err(e) => {
                answered = 0;
                e.to_string()
            }
        };
        if Instant::now() >= deadline {
            return Err(BenchError::NotReady {
                what: "nginx (router replicas)",
                secs: ready.as_secs(),
                detail,
                log: nginx.log_tail(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_over_both_replicas_unbuffered() {
        let c = nginx_conf(Path::new("/t"), 9000, &[9001, 9002]);
        assert!(c.contains(
            "upstream replicas {\n        server 127.0.0.1:9001 max_fails=0;\n        server \
             127.0.0.1:9002 max_fails=0;\n    }"
        ));
        assert!(c.contains("listen 127.0.0.1:9000;"));
        assert!(c.contains("proxy_buffering off;"));
        assert!(c.contains("proxy_next_upstream off;"));
        assert!(c.contains("pid /t/nginx-replicas.pid;"));
        assert!(
            !c.contains("keepalive"),
            "each request its own upstream connection too"
        );
    }
}
