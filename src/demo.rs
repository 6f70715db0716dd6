//! `continuum-router demo`: the router in front of a simulated Dynamo fleet, all on loopback, so
//! a newcomer sees discovery, load signals and the picker at work without any other setup.
//!
//! The fleet is `continuum_sim` (in-process): namespace `demo` with model `demo-agg` on
//! `--workers` aggregated workers (3 by default) and `demo-disagg` on one prefill and two decode
//! workers, registered in a temporary Dynamo file store, each publishing `kv_metrics` over ZMTP,
//! behind one direct-mode frontend shim that needs valid pins. The router reads the store
//! (`dynamo.discovery.source: file`), subscribes to every publisher, and sends requests to the
//! shim (`dynamo.shim.backends`). Every second a table of the workers goes to stderr: load, the
//! age of their last sample, and how many requests the shim served on each.
//!
//! Invariant: the fleet outlives the router (the table thread is stopped and joined before the
//! fleet is dropped), and dropping it removes the temporary store.

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use continuum_core::config::{NoEnv, report};
use continuum_sim::{SimFleet, SimSpec, WorkerStats};

/// The simulated namespace.
const NAMESPACE: &str = "demo";
/// The aggregated model.
const AGG_MODEL: &str = "demo-agg";
/// The disaggregated model.
const DISAGG_MODEL: &str = "demo-disagg";
/// Rows of the table before the rest is summed up.
const MAX_ROWS: usize = 16;

/// The router config of the demo: the shim as an internal backend, discovery from `root`.
pub(crate) fn config_yaml(port: u16, root: &Path, shim: SocketAddr) -> String {
    // A JSON string is a valid YAML double-quoted scalar.
    let root = serde_json::to_string(&root.to_string_lossy()).unwrap_or_default();
    format!(
        "server:
  bind_address: \"127.0.0.1:{port}\"
  shards: 2
backends:
  - name: demo-shim
    type: openai
    url: \"http://{shim}\"
    models: [\"{AGG_MODEL}\", \"{DISAGG_MODEL}\"]
    internal: true
disaggregated_serving:
  enabled: true
dynamo:
  enabled: true
  discovery:
    source: file
    file:
      root: {root}
      namespaces: [{NAMESPACE}]
  load:
    direct_allow_cidrs: [\"127.0.0.0/8\"]
  shim:
    backends: [demo-shim]
"
    )
}

/// Run the demo on `port` with `agg_workers` aggregated workers.
pub(crate) fn run(port: u16, agg_workers: usize) -> ExitCode {
    let fleet = match SimFleet::start(SimSpec::demo(agg_workers)) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("error: cannot start the simulated fleet: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(shim) = fleet.shim_addr(NAMESPACE) else {
        eprintln!("error: the simulated fleet has no {NAMESPACE} shim");
        return ExitCode::from(1);
    };
    let yaml = config_yaml(port, fleet.root(), shim);
    let loaded = match continuum_control::load_config(&yaml, &NoEnv) {
        Ok(l) => l,
        Err(e) => {
            eprint!("{}", report::render_lines(&e.errors, &e.warnings));
            return ExitCode::from(1);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut table = None;
    let ready = |addr: SocketAddr| {
        let _ = writeln!(std::io::stderr(), "{}", banner(addr, &fleet, shim));
        let (fleet, stop) = (fleet.clone(), stop.clone());
        table = std::thread::Builder::new()
            .name("demo-table".into())
            .spawn(move || show_table(&fleet, &stop))
            .ok();
    };
    let result = crate::serve::start(loaded, yaml, None, ready);
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = table {
        let _ = t.join();
    }
    drop(fleet);
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

/// What the demo prints once the router listens.
fn banner(addr: SocketAddr, fleet: &SimFleet, shim: SocketAddr) -> String {
    let workers = fleet.workers().len();
    let mut s = format!(
        "\ncontinuum-router demo: a simulated Dynamo fleet of {workers} workers in namespace \
         \"{NAMESPACE}\"\n  file store {}\n  frontend shim http://{shim} (answers only requests \
         pinned to a live worker, 400 otherwise)\n\ntry:\n",
        fleet.root().display()
    );
    let body = |model: &str, stream: bool| {
        let stream = if stream { ",\"stream\":true" } else { "" };
        format!(
            "-d '{{\"model\":\"{model}\"{stream},\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'"
        )
    };
    for model in [AGG_MODEL, DISAGG_MODEL] {
        for (flags, stream) in [("-s", false), ("-sN", true)] {
            let _ = writeln!(
                s,
                "  curl {flags} http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    {}",
                body(model, stream)
            );
        }
    }
    let _ = writeln!(
        s,
        "  for i in $(seq 40); do curl -s -o /dev/null http://{addr}/v1/chat/completions \\\n    \
         -H 'content-type: application/json' {} & done; wait   # watch the picks spread\n  \
         curl -s http://{addr}/admin/dynamo/workers\n  curl -s http://{addr}/metrics | grep continuum_",
        body(AGG_MODEL, false)
    );
    if !cfg!(feature = "dynamo") {
        s.push_str(
            "\nnote: this build has no `dynamo` feature, so the router cannot read the simulated \
             fleet;\n      run `deploy/demo.sh` (or `cargo run --release --features dynamo -- demo`) to see it route.\n",
        );
    }
    s.push_str("Ctrl-C drains and exits. Worker table every second below.\n");
    s
}

/// Prints the table every second until `stop`; redraws in place on a terminal.
fn show_table(fleet: &SimFleet, stop: &AtomicBool) {
    let tty = std::io::stderr().is_terminal();
    let mut previous_lines = 0usize;
    let mut previous_picks = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_secs(1));
        let stats = fleet.stats();
        let picks: u64 = stats.iter().map(|s| s.picks).sum();
        let text = render_table(&stats, picks.saturating_sub(previous_picks));
        previous_picks = picks;
        let mut out = std::io::stderr().lock();
        if tty && previous_lines > 0 {
            let _ = write!(out, "\x1b[{previous_lines}A\x1b[J");
        }
        // Not eprint!: a closed stderr must not abort the process (and skip the fleet's cleanup).
        let _ = out.write_all(text.as_bytes());
        previous_lines = text.lines().count();
    }
}

/// The table: one row per worker (at most [`MAX_ROWS`], the rest summed), then totals.
pub(crate) fn render_table(stats: &[WorkerStats], picks_last_second: u64) -> String {
    let mut s = format!(
        "{:<17} {:<12} {:<10} {:>6} {:>12} {:>13} {:>6} {:>7}\n",
        "worker", "model", "role", "active", "kv blocks", "prefill toks", "fresh", "picks"
    );
    for w in stats.iter().take(MAX_ROWS) {
        let (blocks, tokens) = w.published.map_or(("-".to_owned(), "-".to_owned()), |p| {
            (
                p.kv_used_blocks.to_string(),
                p.active_prefill_tokens.to_string(),
            )
        });
        let fresh = match (w.alive, w.since_publish) {
            (false, _) => "gone".to_owned(),
            (true, Some(d)) => format!("{:.1}s", d.as_secs_f64()),
            (true, None) => "-".to_owned(),
        };
        let _ = writeln!(
            s,
            "{:<17} {:<12} {:<10} {:>6} {:>12} {:>13} {:>6} {:>7}",
            w.info.instance_id.hex(),
            w.info.model,
            w.info.role.as_str(),
            w.active,
            blocks,
            tokens,
            fresh,
            w.picks
        );
    }
    let rest = stats.get(MAX_ROWS..).unwrap_or(&[]);
    if !rest.is_empty() {
        let _ = writeln!(
            s,
            "... {} more workers: active {}, picks {}",
            rest.len(),
            rest.iter().map(|w| u64::from(w.active)).sum::<u64>(),
            rest.iter().map(|w| w.picks).sum::<u64>()
        );
    }
    let _ = writeln!(
        s,
        "total: active {}, picks {} ({picks_last_second} in the last second)",
        stats.iter().map(|w| u64::from(w.active)).sum::<u64>(),
        stats.iter().map(|w| w.picks).sum::<u64>()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use continuum_core::config::Config;
    use continuum_core::config::dynamo::DiscoverySource;

    #[test]
    fn the_demo_config_is_valid() {
        let shim: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let root = Path::new("/tmp/continuum-sim \"quoted\" root");
        let (c, warnings) = Config::from_yaml(&config_yaml(8080, root, shim), &NoEnv).unwrap();
        assert!(c.dynamo.enabled);
        let d = &c.dynamo.discovery;
        assert_eq!(d.source, DiscoverySource::File);
        assert_eq!(d.file.root.as_deref(), root.to_str());
        assert_eq!(d.file.namespaces, [NAMESPACE]);
        assert_eq!(c.dynamo.namespaces(), [NAMESPACE]);
        assert!(c.disaggregated_serving.enabled);
        let shim_backends: Vec<&str> = c
            .dynamo
            .shim
            .backends
            .iter()
            .map(|b| b.0.as_str())
            .collect();
        assert_eq!(shim_backends, ["demo-shim"]);
        let b = &c.backends[0];
        assert!(b.internal);
        assert_eq!(b.models, [AGG_MODEL, DISAGG_MODEL]);
        assert_eq!((b.url.host.as_str(), b.url.port), ("127.0.0.1", 41234));
        // The one warning is the intended one: the shim is hidden from plain model routing.
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(
            warnings[0].to_string().contains("internal"),
            "{warnings:#?}"
        );
    }

    #[test]
    fn the_table_sums_what_it_does_not_list() {
        let fleet = SimFleet::start(SimSpec::demo(MAX_ROWS + 2)).unwrap();
        let text = render_table(&fleet.stats(), 0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + MAX_ROWS + 2, "{text}");
        assert!(
            lines[1].contains("demo-agg") && lines[1].contains("aggregated"),
            "{text}"
        );
        assert!(
            lines[MAX_ROWS + 1].starts_with("... 5 more workers"),
            "{text}"
        );
        assert!(
            lines[MAX_ROWS + 2].starts_with("total: active 0, picks 0"),
            "{text}"
        );
    }
}
