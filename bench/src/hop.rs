//! `http-hop`: the same backend behind nginx and behind continuum-router,
//! loaded by the same wrk, on the same CPUs, one after the other.
//!
//! Invariants: the backend and wrk are pinned to CPU 1, the server under
//! test to CPU 0 (1 worker/shard) or CPUs 0-1 (2); only one server runs at
//! a time; every child is owned by a [`Supervised`] and torn down on any
//! exit path; a router failure is reported and never hides the nginx
//! baseline.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::cli::HopOptions;
use crate::cpu;
use crate::error::BenchError;
use crate::probe;
use crate::report::{self, Measurement};
use crate::servers::{self, Placement};
use crate::tempdir::TempDir;
use crate::wrk::{self, WrkRun};

/// CPU the backend and wrk are pinned to.
const LOAD_CPU: usize = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Nginx,
    Router,
}

/// Shared state of one `http-hop` run.
#[derive(Debug)]
struct Hop<'a> {
    opts: &'a HopOptions,
    dir: &'a TempDir,
    backend: Supervised,
    backend_port: u16,
}

/// Runs every requested scenario and prints the report on stdout.
pub(crate) fn run(opts: &HopOptions) -> Result<(), BenchError> {
    if child::available_cpus() < 2 {
        eprintln!("warning: fewer than 2 CPUs available; pinning to CPU 1 will fail");
    }
    let dir = TempDir::new()?;
    dir.write("post.lua", &wrk::post_lua())?;
    let router_bin = child::sibling_or(opts.router_bin.as_deref(), "continuum-router")?;
    let router_missing = (!router_bin.is_file()).then(|| {
        format!(
            "{} not found; run `cargo build --release -p continuum-router` (or bench/run.sh)",
            router_bin.display()
        )
    });
    if let Some(why) = &router_missing {
        eprintln!("router: {why}. Reporting the nginx baseline only.");
    }

    let backend_port = probe::free_port()?;
    let backend = start_backend(&dir, backend_port, opts.ready_timeout_secs)?;
    let mut hop = Hop {
        opts,
        dir: &dir,
        backend,
        backend_port,
    };

    let mut out = std::io::stdout().lock();
    let w = BenchError::io("writing the report");
    writeln!(
        out,
        "http-hop: wrk -t{} -c{} -d{}s (+{} s warm-up) POST /v1/chat/completions; \
         backend and wrk pinned to CPU {LOAD_CPU}; 1-min loadavg at start: {}",
        opts.threads,
        opts.connections,
        opts.duration_secs,
        opts.warmup_secs,
        cpu::loadavg().map_or("?".into(), |l| format!("{l:.2}")),
    )
    .map_err(w)?;
    for &shards in &opts.shards {
        let title = title(shards);
        eprintln!("{title}: nginx ...");
        if crate::signals::interrupted() {
            return Err(BenchError::Interrupted);
        }
        let nginx = hop.measure(Server::Nginx, shards, &router_bin)?;
        let router = match &router_missing {
            Some(why) => Err(why.clone()),
            None => {
                eprintln!("{title}: router ...");
                match hop.measure(Server::Router, shards, &router_bin) {
                    Ok(m) => Ok(m),
                    Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                    Err(e) => {
                        eprintln!("router failed: {e}");
                        Err(format!("router failed: {e}"))
                    }
                }
            }
        };
        report::scenario(
            &mut out,
            &title,
            &nginx,
            router.as_ref().map_err(|e| first_line(e)),
        )
        .map_err(BenchError::io("writing the report"))?;
    }
    Ok(())
}

impl Hop<'_> {
    /// Starts `server` on `shards` CPUs, warms it up, measures one wrk run.
    fn measure(
        &mut self,
        server: Server,
        shards: u8,
        router_bin: &std::path::Path,
    ) -> Result<Measurement, BenchError> {
        let o = self.opts;
        let p = Placement {
            workers: usize::from(shards),
            cpus: (0..usize::from(shards)).collect(),
            port: probe::free_port()?,
            backend_port: self.backend_port,
        };
        let ready = Duration::from_secs(o.ready_timeout_secs);
        let mut srv = match server {
            Server::Nginx => servers::start_nginx(&o.nginx_bin, self.dir, &p, ready)?,
            Server::Router => servers::start_router(router_bin, self.dir, &p, ready)?,
        };
        let load_cpus = [LOAD_CPU];
        let script = self.dir.path().join("post.lua");
        let mut run = WrkRun {
            bin: &o.wrk_bin,
            port: p.port,
            threads: o.threads,
            connections: o.connections,
            secs: o.warmup_secs,
            cpus: &load_cpus,
            script: &script,
        };
        if o.warmup_secs > 0 {
            run.run(self.dir)?;
        }
        run.secs = o.duration_secs;
        srv.ensure_running()?;

        let (srv0, be0) = (cpu::tree(srv.pid())?, cpu::tree(self.backend.pid())?);
        let (machine0, reaped0, t0) =
            (cpu::machine_busy()?, cpu::reaped_children(), Instant::now());
        let wrk = run.run(self.dir)?;
        let elapsed = t0.elapsed().as_secs_f64();
        let (machine1, reaped1) = (cpu::machine_busy()?, cpu::reaped_children());
        let server_cpu = cpu::tree(srv.pid())?.since(srv0);
        let backend_cpu = cpu::tree(self.backend.pid())?.since(be0);
        srv.ensure_running()?;
        self.backend.ensure_running()?;

        let wrk_cpu = reaped1.since(reaped0);
        let other = machine1.since(machine0).total()
            - server_cpu.total()
            - backend_cpu.total()
            - wrk_cpu.total();
        Ok(Measurement {
            server: match server {
                Server::Nginx => "nginx",
                Server::Router => "router",
            },
            server_cpus: p.cpus.len(),
            wrk,
            elapsed,
            server_cpu,
            backend_cpu,
            wrk_cpu,
            other_cpu: other.max(0.0),
        })
    }
}

fn start_backend(dir: &TempDir, port: u16, ready_secs: u64) -> Result<Supervised, BenchError> {
    let exe = std::env::current_exe().map_err(BenchError::io("locating continuum-bench"))?;
    let log = dir.path().join("backend.log");
    let mut cmd = Command::new(exe);
    cmd.arg("backend").arg("--port").arg(port.to_string());
    servers::set_log(&mut cmd, &log)?;
    let mut backend = Supervised::spawn("backend", cmd, &[LOAD_CPU], Some(&log))?;
    probe::wait_ready(
        &mut backend,
        port,
        probe::CHAT,
        Duration::from_secs(ready_secs),
    )?;
    Ok(backend)
}

fn title(shards: u8) -> String {
    if shards == 1 {
        format!("1 worker/shard: server on CPU 0; backend + wrk on CPU {LOAD_CPU}")
    } else {
        format!(
            "2 workers/shards: server on CPUs 0,1; backend + wrk share CPU {LOAD_CPU} \
             with the server"
        )
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}
