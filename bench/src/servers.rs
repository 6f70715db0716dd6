//! The two servers under test, nginx and continuum-router: their generated
//! configs and how they are started and judged ready.
//!
//! Invariants: both proxy the same backend on 127.0.0.1 with upstream
//! keep-alive; both get the same CPUs (`cpus`); a server is only returned
//! once it has proxied one chat completion with status 200.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe;
use crate::tempdir::TempDir;

/// Where and how one server runs.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// Worker processes (nginx) or shards (router).
    pub(crate) workers: usize,
    /// CPUs the server may use, one per worker in order.
    pub(crate) cpus: Vec<usize>,
    /// Port the server listens on.
    pub(crate) port: u16,
    /// Port of the backend.
    pub(crate) backend_port: u16,
}

/// nginx.conf for `p`, with every path inside `dir`.
pub(crate) fn nginx_conf(dir: &Path, p: &Placement) -> String {
    let d = dir.display();
    let affinity: Vec<String> = p
        .cpus
        .iter()
        .map(|&c| format!("{:0>width$b}", 1u64 << c, width = p.cpus.len().max(2)))
        .collect();
    format!(
        "daemon off;
master_process on;
worker_processes {workers};
worker_cpu_affinity {affinity};
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
",
        workers = p.workers,
        affinity = affinity.join(" "),
        backend = p.backend_port,
        port = p.port,
    )
}

/// Which router config the hop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouterProfile {
    /// What an operator in front of untrusted clients turns on: a client API key with a rate
    /// budget, and an active health check of the backend.
    Operator,
    /// The backend alone: no keys, no health check (what every revision of the router accepts,
    /// for comparisons with revisions from before those features).
    Plain,
}

impl RouterProfile {
    /// The profile's name on the command line and in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            RouterProfile::Operator => "operator",
            RouterProfile::Plain => "plain",
        }
    }
}

/// A tuning variant of the router, measured beside the default (pinned shards, io_uring) with
/// `http-hop --variant` for docs/tuning.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouterVariant {
    /// No `cpu_affinity` or `control_cpu`, and the process allowed on every CPU: the threads go
    /// where the scheduler puts them.
    Unpinned,
    /// `CONTINUUM_DRIVER=epoll`: monoio's epoll driver instead of io_uring.
    Epoll,
}

impl RouterVariant {
    /// The variant's name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            RouterVariant::Unpinned => "unpinned",
            RouterVariant::Epoll => "epoll",
        }
    }
}

/// Router YAML for `p` under `profile`. The operator profile carries a client API key (with a
/// rate budget) and an active health check on the backend, so the hop pays for what an operator
/// would turn on.
pub(crate) fn router_yaml(
    p: &Placement,
    profile: RouterProfile,
    variant: Option<RouterVariant>,
) -> String {
    let cpus: Vec<String> = p.cpus.iter().map(usize::to_string).collect();
    let pinning = if variant == Some(RouterVariant::Unpinned) {
        String::new()
    } else {
        format!(
            "  cpu_affinity: [{}]\n  control_cpu: {}\n",
            cpus.join(", "),
            p.cpus.first().copied().unwrap_or(0)
        )
    };
    let mut yaml = format!(
        "server:
  bind_address: \"127.0.0.1:{port}\"
  shards: {workers}
{pinning}backends:
  - name: fast
    type: openai
    url: \"http://127.0.0.1:{backend}\"
    models: [\"bench-model\"]
",
        port = p.port,
        workers = p.workers,
        backend = p.backend_port,
    );
    if profile == RouterProfile::Operator {
        yaml.push_str(&format!(
            "    health_check: {{ path: /health, interval: 1s, timeout: 500ms }}
auth:
  keys:
    - {{ name: bench, key_hash: \"{hash}\", requests_per_second: 1000000 }}
",
            hash = crate::probe::BENCH_KEY_HASH,
        ));
    }
    yaml
}

/// Whether the router binary `bin` accepts the `profile` config (`config validate` exits 0): a
/// revision from before client keys or health checks refuses the operator profile.
pub(crate) fn router_accepts(
    bin: &Path,
    dir: &TempDir,
    profile: RouterProfile,
) -> Result<bool, BenchError> {
    let p = Placement {
        workers: 1,
        cpus: vec![0],
        port: 1,
        backend_port: 2,
    };
    let conf = dir.write("validate.yaml", &router_yaml(&p, profile, None))?;
    let status = Command::new(bin)
        .args(["config", "validate", "--config"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(BenchError::io(format!(
            "running {} config validate",
            bin.display()
        )))?;
    Ok(status.success())
}

/// Starts nginx for `p` and waits until it proxies a chat completion.
pub(crate) fn start_nginx(
    bin: &Path,
    dir: &TempDir,
    p: &Placement,
    ready: Duration,
) -> Result<Supervised, BenchError> {
    let conf = dir.write("nginx.conf", &nginx_conf(dir.path(), p))?;
    let log = dir.path().join("nginx-error.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(&log);
    set_log(&mut cmd, &dir.path().join("nginx-stdio.log"))?;
    let mut nginx = Supervised::spawn("nginx", cmd, &p.cpus, Some(&log))?;
    probe::wait_ready(&mut nginx, p.port, probe::CHAT, ready)?;
    Ok(nginx)
}

/// Starts the router for `p`, waits for `GET /health` then for a proxied
/// chat completion, both answering 200.
pub(crate) fn start_router(
    bin: &Path,
    dir: &TempDir,
    p: &Placement,
    profile: RouterProfile,
    variant: Option<RouterVariant>,
    ready: Duration,
) -> Result<Supervised, BenchError> {
    let conf = dir.write("router.yaml", &router_yaml(p, profile, variant))?;
    let log = dir.path().join("router.log");
    let mut cmd = router_command(bin, &conf, &log)?;
    let every_cpu: Vec<usize> = (0..crate::child::available_cpus()).collect();
    let cpus = match variant {
        Some(RouterVariant::Unpinned) => &every_cpu,
        Some(RouterVariant::Epoll) => {
            cmd.env("CONTINUUM_DRIVER", "epoll");
            &p.cpus
        }
        None => &p.cpus,
    };
    let mut router = Supervised::spawn("router", cmd, cpus, Some(&log))?;
    probe::wait_ready(&mut router, p.port, probe::HEALTH, ready)?;
    probe::wait_ready(&mut router, p.port, probe::CHAT, ready)?;
    Ok(router)
}

/// The router's command, for every benchmark that starts one: `bin --config
/// conf`, its log filter `CONTINUUM_LOG=warn` unless the caller set one
/// (per-request logging would measure the logger), stdout and stderr to
/// `log`.
pub(crate) fn router_command(bin: &Path, conf: &Path, log: &Path) -> Result<Command, BenchError> {
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(conf);
    if std::env::var_os("CONTINUUM_LOG").is_none() {
        cmd.env("CONTINUUM_LOG", "warn");
    }
    set_log(&mut cmd, log)?;
    Ok(cmd)
}

/// Sends the child's stdout and stderr to `path` (truncated).
pub(crate) fn set_log(cmd: &mut Command, path: &Path) -> Result<(), BenchError> {
    let open_err = || BenchError::io(format!("opening {}", path.display()));
    let out = File::create(path).map_err(open_err())?;
    let err = out.try_clone().map_err(open_err())?;
    cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(cpus: Vec<usize>) -> Placement {
        Placement {
            workers: cpus.len(),
            cpus,
            port: 8000,
            backend_port: 9000,
        }
    }

    #[test]
    fn nginx_affinity_masks() {
        let one = nginx_conf(Path::new("/t"), &placement(vec![0]));
        assert!(one.contains("worker_processes 1;\nworker_cpu_affinity 01;"));
        let two = nginx_conf(Path::new("/t"), &placement(vec![0, 1]));
        assert!(two.contains("worker_processes 2;\nworker_cpu_affinity 01 10;"));
        assert!(two.contains("keepalive 64;"));
        assert!(two.contains("proxy_set_header Connection \"\";"));
    }

    #[test]
    fn router_yaml_shape() {
        let y = router_yaml(&placement(vec![0, 1]), RouterProfile::Operator, None);
        assert!(y.contains("shards: 2\n  cpu_affinity: [0, 1]\n  control_cpu: 0\n"));
        assert!(y.contains("url: \"http://127.0.0.1:9000\""));
        // The hop runs with auth and health checks on, and the key wrk sends is the configured one.
        let (c, _) = continuum_core::config::Config::from_yaml(&y, &continuum_core::config::NoEnv)
            .unwrap_or_else(|e| panic!("bench router config invalid: {:?}", e.errors));
        assert!(c.backends[0].health_check.is_some());
        let auth = c.auth.expect("auth on");
        assert!(
            auth.keys[0]
                .key_hash
                .matches(crate::probe::BENCH_KEY.as_bytes())
        );
        assert!(
            auth.keys[0].rate.is_some(),
            "the rate budget is exercised too"
        );
        // The plain profile: the same server and backend, no keys and no health check.
        let y = router_yaml(&placement(vec![0]), RouterProfile::Plain, None);
        let (c, _) = continuum_core::config::Config::from_yaml(&y, &continuum_core::config::NoEnv)
            .unwrap_or_else(|e| panic!("plain router config invalid: {:?}", e.errors));
        assert!(c.backends[0].health_check.is_none() && c.auth.is_none());
        // The unpinned variant: the same config without the CPUs.
        let y = router_yaml(
            &placement(vec![0, 1]),
            RouterProfile::Operator,
            Some(RouterVariant::Unpinned),
        );
        assert!(
            y.contains(
                "shards: 2
backends:"
            ),
            "{y}"
        );
        let (c, _) = continuum_core::config::Config::from_yaml(&y, &continuum_core::config::NoEnv)
            .unwrap_or_else(|e| panic!("unpinned router config invalid: {:?}", e.errors));
        assert!(c.server.cpu_affinity.is_empty() && c.server.control_cpu.is_none());
        let epoll = router_yaml(
            &placement(vec![0, 1]),
            RouterProfile::Operator,
            Some(RouterVariant::Epoll),
        );
        assert_eq!(
            epoll,
            router_yaml(&placement(vec![0, 1]), RouterProfile::Operator, None)
        );
        assert!(y.contains("url: \"http://127.0.0.1:9000\""));
    }
}
