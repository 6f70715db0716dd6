//! `http-hop`: the same backend behind nginx and behind continuum-router,
//! loaded by the same wrk, on the same CPUs, one after the other.
//!
//! With `--rounds N` every server is measured N times per scenario,
//! interleaved (nginx, then the routers); with `--against-bin` a second
//! router binary (another revision) is measured in every round beside the
//! first, the two alternating which runs first, and the summary prints each
//! ratio per round with its median, new/old included.
//!
//! Invariants: the backend and wrk are pinned to CPU 1, the server under
//! test to CPU 0 (1 worker/shard) or CPUs 0-1 (2); only one server runs at
//! a time; both routers run the same config; every child is owned by a
//! [`Supervised`] and torn down on any exit path; a router failure is
//! reported and never hides the nginx baseline.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::cli::HopOptions;
use crate::cpu;
use crate::error::BenchError;
use crate::probe;
use crate::report::{self, Measurement};
use crate::servers::{self, Placement, RouterProfile, RouterVariant};
use crate::tempdir::TempDir;
use crate::wrk::{self, WrkRun};

/// CPU the backend and wrk are pinned to.
const LOAD_CPU: usize = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server<'a> {
    Nginx,
    /// A router binary, its name in the report and the tuning variant it runs as.
    Router(&'a Path, &'a str, Option<RouterVariant>),
}

/// Shared state of one `http-hop` run.
#[derive(Debug)]
struct Hop<'a> {
    opts: &'a HopOptions,
    dir: &'a TempDir,
    backend: Supervised,
    backend_port: u16,
    profile: RouterProfile,
}

/// Runs every requested scenario and prints the report on stdout.
pub(crate) fn run(opts: &HopOptions) -> Result<(), BenchError> {
    if child::available_cpus() < 2 {
        eprintln!("warning: fewer than 2 CPUs available; pinning to CPU 1 will fail");
    }
    let dir = TempDir::new()?;
    dir.write("post.lua", &wrk::post_lua())?;
    let router_bin = child::sibling_or(opts.router_bin.as_deref(), "continuum-router")?;
    let router_missing = missing(
        &router_bin,
        "run `cargo build --release -p continuum-router` (or bench/run.sh)",
    );
    if let Some(why) = &router_missing {
        eprintln!("router: {why}. Reporting the nginx baseline only.");
    }
    // A variant is the same binary in the other revision's place.
    let against = match opts.variant {
        Some(_) => Some(router_bin.as_path()),
        None => opts.against_bin.as_deref(),
    };
    let against_missing = against.and_then(|b| {
        missing(
            b,
            "build that revision first (bench/run.sh --against REV does)",
        )
    });
    if let Some(why) = &against_missing {
        eprintln!("{}: {why}.", opts.against_label);
    }
    let profile = choose_profile(opts, &dir, against.filter(|_| against_missing.is_none()))?;

    let backend_port = probe::free_port()?;
    let backend = start_backend(&dir, backend_port, opts.ready_timeout_secs)?;
    let mut hop = Hop {
        opts,
        dir: &dir,
        backend,
        backend_port,
        profile,
    };

    let mut out = std::io::stdout().lock();
    let w = BenchError::io("writing the report");
    writeln!(
        out,
        "http-hop: wrk -t{} -c{} -d{}s (+{} s warm-up) POST /v1/chat/completions; \
         backend and wrk pinned to CPU {LOAD_CPU}; router config: {}; {} round(s); \
         1-min loadavg at start: {}",
        opts.threads,
        opts.connections,
        opts.duration_secs,
        opts.warmup_secs,
        profile.name(),
        opts.rounds,
        cpu::loadavg().map_or("?".into(), |l| format!("{l:.2}")),
    )
    .map_err(w)?;
    let label: &str = match opts.variant {
        Some(v) => v.name(),
        None => &opts.against_label,
    };
    for &shards in &opts.shards {
        let title = title(shards);
        let mut rounds = Vec::new();
        for round in 1..=opts.rounds {
            if crate::signals::interrupted() {
                return Err(BenchError::Interrupted);
            }
            eprintln!("{title}, round {round}: nginx ...");
            let nginx = hop.measure(Server::Nginx, shards)?;
            let mut routers = vec![(Server::Router(&router_bin, "router", None), &router_missing)];
            if let Some(bin) = against {
                routers.push((Server::Router(bin, label, opts.variant), &against_missing));
                // The two revisions alternate which runs first, so neither always follows nginx.
                if round % 2 == 0 {
                    routers.reverse();
                }
            }
            let mut measured = Vec::new();
            for (server, why_missing) in routers {
                let Server::Router(_, name, _) = server else {
                    continue;
                };
                let m = match why_missing {
                    Some(why) => Err(why.clone()),
                    None => {
                        eprintln!("{title}, round {round}: {name} ...");
                        match hop.measure(server, shards) {
                            Ok(m) => Ok(m),
                            Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                            Err(e) => {
                                eprintln!("{name} failed: {e}");
                                Err(format!("{name} failed: {}", first_line(&e.to_string())))
                            }
                        }
                    }
                };
                measured.push((name, m));
            }
            // Report order: the router first, the other revision second, whatever ran first.
            measured.sort_by_key(|(name, _)| *name != "router");
            let round_title = if opts.rounds > 1 {
                format!("{title} (round {round} of {})", opts.rounds)
            } else {
                title.clone()
            };
            let rows: Vec<report::Row<'_>> = measured
                .iter()
                .map(|(name, m)| report::Row {
                    name,
                    measured: m.as_ref().map_err(String::as_str),
                })
                .collect();
            report::scenario(&mut out, &round_title, &nginx, &rows)
                .map_err(BenchError::io("writing the report"))?;
            rounds.push(report::Round::of(&nginx, &measured));
        }
        if opts.rounds > 1 || against.is_some() {
            report::summary(&mut out, &title, label, &rounds)
                .map_err(BenchError::io("writing the report"))?;
        }
    }
    Ok(())
}

/// Why `bin` cannot be measured, if it cannot.
fn missing(bin: &Path, hint: &str) -> Option<String> {
    (!bin.is_file()).then(|| format!("{} not found; {hint}", bin.display()))
}

/// The router config of the run: the one asked for, else operator unless the other binary
/// refuses it (a revision from before client keys and health checks), then plain for both.
fn choose_profile(
    opts: &HopOptions,
    dir: &TempDir,
    against: Option<&Path>,
) -> Result<RouterProfile, BenchError> {
    if let Some(p) = opts.profile {
        return Ok(p);
    }
    let Some(bin) = against else {
        return Ok(RouterProfile::Operator);
    };
    if servers::router_accepts(bin, dir, RouterProfile::Operator)? {
        return Ok(RouterProfile::Operator);
    }
    eprintln!(
        "{}: refuses the operator config (no client keys or health checks in that revision); \
         both routers run the plain config",
        opts.against_label
    );
    Ok(RouterProfile::Plain)
}

impl Hop<'_> {
    /// Starts `server` on `shards` CPUs, warms it up, measures one wrk run.
    fn measure(&mut self, server: Server<'_>, shards: u8) -> Result<Measurement, BenchError> {
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
            Server::Router(bin, _, variant) => {
                servers::start_router(bin, self.dir, &p, self.profile, variant, ready)?
            }
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
                Server::Nginx => "nginx".to_owned(),
                Server::Router(_, name, _) => name.to_owned(),
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
