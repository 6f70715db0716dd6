//! Command-line parsing for `continuum-bench`.
//!
//! Invariant: parsing is pure (no I/O); every accepted option has a
//! bounded, validated value, so the driver never runs an unbounded loop.

use std::path::PathBuf;
use std::time::Duration;

use crate::usage::UsageError;

/// A parsed command line.
#[derive(Debug)]
pub(crate) enum Command {
    /// Print usage.
    Help,
    /// Run the backend on a port until killed.
    Backend {
        /// TCP port on 127.0.0.1.
        port: u16,
    },
    /// Run the router-vs-nginx comparison.
    HttpHop(HopOptions),
    /// Run the router-vs-direct comparison on a real Dynamo fleet.
    FleetHop(crate::fleet_hop::FleetHopOptions),
    /// Run the router-vs-direct comparison on simulated fleets of several sizes.
    SimHop(crate::sim_hop::SimHopOptions),
    /// Compare the router's KV-aware picks with Dynamo's KV router on a real fleet.
    KvRoute(crate::kv_route::KvRouteOptions),
    /// The router for minutes on the simulated fleet under churn: RSS, fds, subscriptions.
    Soak(crate::soak::SoakOptions),
    /// AIPerf through the router vs Dynamo's KV-routing frontend on a real fleet.
    Aiperf(crate::aiperf::AiperfOptions),
    /// Fault injection on a real fleet under a streaming chat load.
    Faults(crate::faults::FaultsOptions),
    /// Measure a discovery resync.
    Resync(crate::resync::ResyncOptions),
    /// Compare the router's kv_metrics SUB path with the zeromq crate's.
    ZmtpIngest(crate::zmtp_ingest::IngestOptions),
    /// `bus-relay`.
    BusRelay(crate::bus_relay::RelayOptions),
    /// `bus-kv`.
    BusKv(crate::bus_kv::KvBusOptions),
    /// Time one pick at several fleet sizes against round-robin.
    Pick(crate::pick::PickOptions),
    /// Time the prompt pipeline per request against `tokenizers` on the whole prompt.
    Prompt(crate::prompt::PromptOptions),
}

/// Options of `http-hop`.
#[derive(Debug, Clone)]
pub(crate) struct HopOptions {
    /// Seconds of measured load per server.
    pub(crate) duration_secs: u64,
    /// Seconds of unmeasured load before each measurement.
    pub(crate) warmup_secs: u64,
    /// wrk connections.
    pub(crate) connections: u32,
    /// wrk threads.
    pub(crate) threads: u32,
    /// Shard counts to run, each 1 or 2.
    pub(crate) shards: Vec<u8>,
    /// Measurements of every server per scenario.
    pub(crate) rounds: u32,
    /// Router binary; `None` means next to the current executable.
    pub(crate) router_bin: Option<PathBuf>,
    /// A second router binary measured beside the first in every round.
    pub(crate) against_bin: Option<PathBuf>,
    /// The second binary's name in the report.
    pub(crate) against_label: String,
    /// The router config; `None`: operator, or plain when `against_bin` refuses operator.
    pub(crate) profile: Option<crate::servers::RouterProfile>,
    /// A tuning variant of the same router measured beside it in every round (instead of
    /// another binary): the node tuning figures of docs/tuning.md.
    pub(crate) variant: Option<crate::servers::RouterVariant>,
    /// nginx binary.
    pub(crate) nginx_bin: PathBuf,
    /// wrk binary.
    pub(crate) wrk_bin: PathBuf,
    /// Seconds a server may take to pass its readiness probe.
    pub(crate) ready_timeout_secs: u64,
}

impl Default for HopOptions {
    fn default() -> Self {
        Self {
            duration_secs: 10,
            warmup_secs: 2,
            connections: 64,
            threads: 1,
            shards: vec![1, 2],
            rounds: 1,
            router_bin: None,
            against_bin: None,
            against_label: "old".to_owned(),
            variant: None,
            profile: None,
            nginx_bin: PathBuf::from("nginx"),
            wrk_bin: PathBuf::from("wrk"),
            ready_timeout_secs: 15,
        }
    }
}

/// Parses the arguments after the program name.
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, UsageError> {
    let mut args = args.into_iter();
    let command = args.next().ok_or(UsageError::MissingCommand)?;
    match command.as_str() {
        "help" | "--help" | "-h" => Ok(Command::Help),
        "backend" => parse_backend(args),
        "http-hop" => parse_hop(args).map(Command::HttpHop),
        "fleet-hop" => parse_fleet_hop(args).map(Command::FleetHop),
        "sim-hop" => parse_sim_hop(args).map(Command::SimHop),
        "kv-route" => parse_kv_route(args).map(Command::KvRoute),
        "soak" => parse_soak(args).map(Command::Soak),
        "aiperf" => parse_aiperf(args).map(Command::Aiperf),
        "faults" => parse_faults(args).map(Command::Faults),
        "resync" => parse_resync(args),
        "zmtp-ingest" => parse_ingest(args).map(Command::ZmtpIngest),
        "bus-relay" => parse_bus_relay(args).map(Command::BusRelay),
        "bus-kv" => parse_bus_kv(args).map(Command::BusKv),
        "pick" => parse_pick(args).map(Command::Pick),
        "prompt" => parse_prompt(args).map(Command::Prompt),
        _ => Err(UsageError::UnknownCommand(command)),
    }
}

fn parse_resync(mut args: impl Iterator<Item = String>) -> Result<Command, UsageError> {
    let mut opts = crate::resync::ResyncOptions::default();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--workers" => {
                let n = number(&flag, value(&flag, &mut args)?, 1, 1_000_000)?;
                opts.workers = u32::try_from(n).unwrap_or(u32::MAX);
            }
            "--rounds" => {
                let n = number(&flag, value(&flag, &mut args)?, 1, 100)?;
                opts.rounds = u32::try_from(n).unwrap_or(1);
            }
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(Command::Resync(opts))
}

fn parse_ingest(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::zmtp_ingest::IngestOptions, UsageError> {
    let mut opts = crate::zmtp_ingest::IngestOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--messages" => {
                opts.messages = number(&flag, v?, 1000, crate::zmtp_ingest::MAX_MESSAGES)?;
            }
            "--batch" => opts.batch = small(&flag, v?, 1, 65_536)? as usize,
            "--timeout" => opts.timeout_secs = number(&flag, v?, 1, 600)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_bus_relay(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::bus_relay::RelayOptions, UsageError> {
    let mut opts = crate::bus_relay::RelayOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--messages" => {
                opts.messages = number(&flag, v?, 1000, crate::bus_relay::MAX_MESSAGES)?;
            }
            "--sessions" => opts.sessions = small(&flag, v?, 1, 4096)? as usize,
            "--streams" => opts.streams = small(&flag, v?, 1, 1024)? as usize,
            "--timeout" => opts.timeout_secs = number(&flag, v?, 1, 600)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_bus_kv(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::bus_kv::KvBusOptions, UsageError> {
    let mut opts = crate::bus_kv::KvBusOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--messages" => {
                opts.messages = number(&flag, v?, 1000, crate::bus_kv::MAX_MESSAGES)?;
            }
            "--paced" => opts.paced = number(&flag, v?, 100, 1_000_000)?,
            "--rate" => opts.rate = number(&flag, v?, 1, 100_000)?,
            "--sessions" => opts.sessions = small(&flag, v?, 1, 4096)? as usize,
            "--streams" => opts.streams = small(&flag, v?, 1, 1024)? as usize,
            "--timeout" => opts.timeout_secs = number(&flag, v?, 1, 600)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_pick(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::pick::PickOptions, UsageError> {
    let mut opts = crate::pick::PickOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--iterations" => opts.iterations = number(&flag, v?, 100, 100_000_000)?,
            "--warmup" => opts.warmup = number(&flag, v?, 0, 100_000_000)?,
            "--seconds" => opts.time = Duration::from_secs(number(&flag, v?, 1, 60)?),
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_prompt(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::prompt::PromptOptions, UsageError> {
    let mut opts = crate::prompt::PromptOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--conversations" => opts.conversations = number(&flag, v?, 1, 64)? as usize,
            "--turns" => opts.turns = number(&flag, v?, 1, 256)? as usize,
            "--rounds" => opts.rounds = number(&flag, v?, 1, 100)? as usize,
            "--model-dir" => opts.model_dir = PathBuf::from(v?),
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_backend(mut args: impl Iterator<Item = String>) -> Result<Command, UsageError> {
    let mut port = None;
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--port" => port = Some(number(&flag, value(&flag, &mut args)?, 1, 65535)?),
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    let port = port.ok_or_else(|| UsageError::MissingValue("--port".into()))?;
    let port = u16::try_from(port).map_err(|_| UsageError::BadValue {
        flag: "--port".into(),
        value: port.to_string(),
        reason: "not a port",
    })?;
    Ok(Command::Backend { port })
}

fn parse_hop(mut args: impl Iterator<Item = String>) -> Result<HopOptions, UsageError> {
    let mut opts = HopOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--duration" => opts.duration_secs = number(&flag, v?, 1, 600)?,
            "--warmup" => opts.warmup_secs = number(&flag, v?, 0, 60)?,
            "--connections" => opts.connections = small(&flag, v?, 1, 10_000)?,
            "--threads" => opts.threads = small(&flag, v?, 1, 64)?,
            "--shards" => opts.shards = shard_list(&flag, v?)?,
            "--rounds" => opts.rounds = small(&flag, v?, 1, 20)?,
            "--router-bin" => opts.router_bin = Some(PathBuf::from(v?)),
            "--against-bin" => opts.against_bin = Some(PathBuf::from(v?)),
            "--against-label" => opts.against_label = label(&flag, v?)?,
            "--profile" => opts.profile = Some(profile(&flag, v?)?),
            "--variant" => opts.variant = Some(variant(&flag, v?)?),
            "--nginx-bin" => opts.nginx_bin = PathBuf::from(v?),
            "--wrk-bin" => opts.wrk_bin = PathBuf::from(v?),
            "--ready-timeout" => opts.ready_timeout_secs = number(&flag, v?, 1, 300)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    if let (Some(v), Some(_)) = (opts.variant, &opts.against_bin) {
        return Err(UsageError::BadValue {
            flag: "--variant".into(),
            value: v.name().into(),
            reason: "measures a variant of this router beside it; not with --against",
        });
    }
    if opts.connections < opts.threads {
        return Err(UsageError::BadValue {
            flag: "--connections".into(),
            value: opts.connections.to_string(),
            reason: "wrk needs at least one connection per thread",
        });
    }
    Ok(opts)
}

/// A report label: 1 to 24 printable ASCII characters without spaces.
fn label(flag: &str, value: String) -> Result<String, UsageError> {
    if (1..=24).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(value)
    } else {
        Err(UsageError::BadValue {
            flag: flag.into(),
            value,
            reason: "1 to 24 printable characters, no spaces",
        })
    }
}

fn variant(flag: &str, value: String) -> Result<crate::servers::RouterVariant, UsageError> {
    use crate::servers::RouterVariant;
    match value.as_str() {
        "unpinned" => Ok(RouterVariant::Unpinned),
        "epoll" => Ok(RouterVariant::Epoll),
        _ => Err(UsageError::BadValue {
            flag: flag.into(),
            value,
            reason: "unpinned or epoll",
        }),
    }
}

fn profile(flag: &str, value: String) -> Result<crate::servers::RouterProfile, UsageError> {
    use crate::servers::RouterProfile;
    match value.as_str() {
        "operator" => Ok(RouterProfile::Operator),
        "plain" => Ok(RouterProfile::Plain),
        _ => Err(UsageError::BadValue {
            flag: flag.into(),
            value,
            reason: "operator or plain",
        }),
    }
}

fn parse_fleet_hop(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::fleet_hop::FleetHopOptions, UsageError> {
    let mut opts = crate::fleet_hop::FleetHopOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--duration" => opts.duration_secs = number(&flag, v?, 1, 600)?,
            "--warmup" => opts.warmup_secs = number(&flag, v?, 0, 60)?,
            "--connections" => opts.connections = connection_list(&flag, v?)?,
            "--rounds" => opts.rounds = small(&flag, v?, 1, 20)?,
            "--workers" => opts.workers = small(&flag, v?, 1, 8)?,
            "--max-tokens" => opts.max_tokens = small(&flag, v?, 1, 4096)?,
            "--speedup-ratio" => opts.speedup_ratio = number(&flag, v?, 1, 1_000_000)?,
            "--router-bin" => opts.router_bin = Some(PathBuf::from(v?)),
            "--wrk-bin" => opts.wrk_bin = PathBuf::from(v?),
            "--python" => opts.python = Some(PathBuf::from(v?)),
            "--fleet-script" => opts.fleet_script = PathBuf::from(v?),
            "--ready-timeout" => opts.ready_timeout_secs = number(&flag, v?, 1, 300)?,
            "--router-cpu" => opts.router_cpu = small(&flag, v?, 0, 1)? as usize,
            "--nice" => opts.nice = nice(&flag, v?)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_sim_hop(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::sim_hop::SimHopOptions, UsageError> {
    let mut opts = crate::sim_hop::SimHopOptions::default();
    while let Some(flag) = args.next() {
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--workers" => opts.workers = worker_list(&flag, v?)?,
            "--duration" => opts.duration_secs = number(&flag, v?, 1, 600)?,
            "--warmup" => opts.warmup_secs = number(&flag, v?, 0, 60)?,
            "--connections" => opts.connections = connection_list(&flag, v?)?,
            "--rounds" => opts.rounds = small(&flag, v?, 1, 20)?,
            "--max-tokens" => opts.max_tokens = small(&flag, v?, 1, 4096)?,
            "--publish-ms" => opts.publish_ms = number(&flag, v?, 0, 60_000)?,
            "--idle" => opts.idle_secs = number(&flag, v?, 1, 60)?,
            "--router-bin" => opts.router_bin = Some(PathBuf::from(v?)),
            "--wrk-bin" => opts.wrk_bin = PathBuf::from(v?),
            "--ready-timeout" => opts.ready_timeout_secs = number(&flag, v?, 1, 600)?,
            "--router-cpu" => opts.router_cpu = small(&flag, v?, 0, 1)? as usize,
            "--router-nofile" => opts.router_nofile = Some(number(&flag, v?, 16, 1 << 20)?),
            "--nice" => opts.nice = nice(&flag, v?)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_soak(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::soak::SoakOptions, UsageError> {
    let mut opts = crate::soak::SoakOptions::default();
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            opts.quick();
            continue;
        }
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--minutes" => opts.minutes = minutes(&flag, v?)?,
            "--churn-secs" => opts.churn_secs = number(&flag, v?, 0, 3600)?,
            "--workers" => opts.workers = number(&flag, v?, 2, 1000)? as usize,
            "--connections" => opts.connections = small(&flag, v?, 1, 256)?,
            "--rate" => opts.rate = Some(number(&flag, v?, 1, 1_000_000)?),
            "--load-percent" => opts.load_percent = small(&flag, v?, 1, 100)?,
            "--calibrate-secs" => opts.calibrate_secs = number(&flag, v?, 1, 60)?,
            "--sample-secs" => opts.sample_secs = number(&flag, v?, 1, 300)?,
            "--warmup" => opts.warmup_secs = Some(number(&flag, v?, 0, 3600)?),
            "--max-tokens" => opts.max_tokens = small(&flag, v?, 1, 4096)?,
            "--publish-ms" => opts.publish_ms = number(&flag, v?, 0, 60_000)?,
            "--router-bin" => opts.router_bin = Some(PathBuf::from(v?)),
            "--ready-timeout" => opts.ready_timeout_secs = number(&flag, v?, 1, 600)?,
            "--router-cpu" => opts.router_cpu = small(&flag, v?, 0, 1)? as usize,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

/// Minutes as a decimal, 0.1 to 1440.
fn minutes(flag: &str, value: String) -> Result<f64, UsageError> {
    match value.parse::<f64>() {
        Ok(m) if (0.1..=1440.0).contains(&m) => Ok(m),
        _ => Err(bad(
            flag,
            value,
            "expected minutes from 0.1 to 1440, e.g. 0.5",
        )),
    }
}

fn parse_kv_route(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::kv_route::KvRouteOptions, UsageError> {
    let mut opts = crate::kv_route::KvRouteOptions::default();
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            opts.quick();
            continue;
        }
        if flag == "--broker" {
            opts.rows = crate::kv_route::Rows::WithBroker;
            continue;
        }
        if flag == "--peers" {
            opts.gossip = crate::kv_route::Gossip::On;
            continue;
        }
        if opts.fleet.flag(
            &flag,
            || value(&flag, &mut args),
            |f, v| number(f, v, 1, 600),
        )? {
            continue;
        }
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--workers" => opts.workers = small(&flag, v?, 1, 8)?,
            "--speedup-ratio" => opts.speedup_ratio = number(&flag, v?, 1, 1_000_000)?,
            "--conversations" => opts.conversations = number(&flag, v?, 1, 64)? as usize,
            "--turns" => opts.turns = number(&flag, v?, 1, 64)? as usize,
            "--max-tokens" => opts.max_tokens = small(&flag, v?, 1, 4096)?,
            "--seed" => opts.seed = number(&flag, v?, 0, u64::MAX)?,
            "--rounds" => opts.rounds = small(&flag, v?, 1, 10)?,
            "--request-timeout" => opts.request_timeout_secs = number(&flag, v?, 1, 600)?,
            "--row-timeout" => opts.row_timeout_secs = number(&flag, v?, 1, 3600)?,
            "--replicas" => opts.replicas = small(&flag, v?, 1, 2)?,
            "--nginx-bin" => opts.nginx_bin = PathBuf::from(v?),
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_aiperf(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::aiperf::AiperfOptions, UsageError> {
    let mut opts = crate::aiperf::AiperfOptions::default();
    while let Some(flag) = args.next() {
        if opts.fleet.flag(
            &flag,
            || value(&flag, &mut args),
            |f, v| number(f, v, 1, 600),
        )? {
            continue;
        }
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--requests" => opts.requests = small(&flag, v?, 1, 10_000)?,
            "--concurrency" => opts.concurrency = small(&flag, v?, 1, 256)?,
            "--input-tokens" => opts.input_tokens = small(&flag, v?, 1, 100_000)?,
            "--output-tokens" => opts.output_tokens = small(&flag, v?, 1, 4096)?,
            "--workers" => opts.workers = small(&flag, v?, 1, 8)?,
            "--speedup-ratio" => opts.speedup_ratio = number(&flag, v?, 1, 1_000_000)?,
            "--rounds" => opts.rounds = small(&flag, v?, 1, 10)?,
            "--aiperf-bin" => opts.aiperf_bin = Some(PathBuf::from(v?)),
            "--run-timeout" => opts.run_timeout_secs = number(&flag, v?, 1, 3600)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    Ok(opts)
}

fn parse_faults(
    mut args: impl Iterator<Item = String>,
) -> Result<crate::faults::FaultsOptions, UsageError> {
    let mut opts = crate::faults::FaultsOptions::default();
    let mut named: Vec<crate::faults::Scenario> = Vec::new();
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            opts.quick();
            continue;
        }
        if opts.fleet.flag(
            &flag,
            || value(&flag, &mut args),
            |f, v| number(f, v, 1, 600),
        )? {
            continue;
        }
        let v = value(&flag, &mut args);
        match flag.as_str() {
            "--scenario" => {
                let v = v?;
                for name in v.split(',') {
                    let Some(s) = crate::faults::Scenario::parse(name.trim()) else {
                        return Err(bad(
                            &flag,
                            v.clone(),
                            "expected worker-kill, worker-stop, shim-kill, etcd-restart, \
                             etcd-compact, publisher-flap or reload-storm (comma separated)",
                        ));
                    };
                    if !named.contains(&s) {
                        named.push(s);
                    }
                }
            }
            "--workers" => opts.workers = small(&flag, v?, 2, 8)?,
            "--seed" => opts.seed = number(&flag, v?, 0, u64::MAX)?,
            "--conversations" => opts.conversations = number(&flag, v?, 1, 64)? as usize,
            "--turns" => opts.turns = number(&flag, v?, 1, 64)? as usize,
            "--max-tokens" => opts.max_tokens = small(&flag, v?, 1, 4096)?,
            "--request-timeout" => opts.request_timeout_secs = number(&flag, v?, 1, 600)?,
            "--lease-ttl" => opts.lease_ttl_secs = number(&flag, v?, 1, 60)?,
            "--flap-secs" => opts.flap_secs = number(&flag, v?, 2, 600)?,
            _ => return Err(UsageError::UnknownFlag(flag)),
        }
    }
    if !named.is_empty() {
        opts.scenarios = named;
    }
    Ok(opts)
}

/// Fleet sizes: 1 to 5,000 each, strictly ascending.
fn worker_list(flag: &str, value: String) -> Result<Vec<usize>, UsageError> {
    let mut list: Vec<usize> = Vec::new();
    for part in value.split(',') {
        match part.trim().parse::<usize>() {
            Ok(n) if (1..=5000).contains(&n) && list.last().is_none_or(|&l| l < n) => list.push(n),
            _ => {
                return Err(bad(
                    flag,
                    value,
                    "expected ascending fleet sizes, comma separated, each 1 to 5000",
                ));
            }
        }
    }
    Ok(list)
}

fn nice(flag: &str, value: String) -> Result<i32, UsageError> {
    match value.parse::<i32>() {
        Ok(n) if (-20..=19).contains(&n) => Ok(n),
        _ => Err(bad(flag, value, "expected a nice value from -20 to 19")),
    }
}

fn connection_list(flag: &str, value: String) -> Result<Vec<u32>, UsageError> {
    let mut list = Vec::new();
    for part in value.split(',') {
        match part.trim().parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => list.push(n),
            _ => {
                return Err(bad(
                    flag,
                    value,
                    "expected a comma separated list of connection counts, each 1 to 1024",
                ));
            }
        }
    }
    Ok(list)
}

fn value(flag: &str, args: &mut impl Iterator<Item = String>) -> Result<String, UsageError> {
    args.next()
        .ok_or_else(|| UsageError::MissingValue(flag.to_owned()))
}

fn number(flag: &str, value: String, min: u64, max: u64) -> Result<u64, UsageError> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(bad(flag, value, "out of range")),
        Err(_) => Err(bad(flag, value, "not a non-negative integer")),
    }
}

fn small(flag: &str, value: String, min: u32, max: u32) -> Result<u32, UsageError> {
    let n = number(flag, value, u64::from(min), u64::from(max))?;
    u32::try_from(n).map_err(|_| bad(flag, n.to_string(), "out of range"))
}

fn shard_list(flag: &str, value: String) -> Result<Vec<u8>, UsageError> {
    let mut shards = Vec::new();
    for part in value.split(',') {
        match part.trim() {
            "1" => shards.push(1),
            "2" => shards.push(2),
            _ => {
                return Err(bad(
                    flag,
                    value,
                    "expected a comma separated list of 1 and 2",
                ));
            }
        }
    }
    Ok(shards)
}

fn bad(flag: &str, value: String, reason: &'static str) -> UsageError {
    UsageError::BadValue {
        flag: flag.to_owned(),
        value,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn hop_defaults_and_overrides() {
        let Ok(Command::HttpHop(o)) = parse(args("http-hop --duration 3 --shards 2")) else {
            panic!("expected http-hop");
        };
        assert_eq!(o.duration_secs, 3);
        assert_eq!(o.shards, vec![2]);
        assert_eq!(o.connections, 64);
        assert_eq!(
            (o.rounds, o.against_bin.as_deref(), o.profile),
            (1, None, None)
        );
        let Ok(Command::HttpHop(o)) = parse(args(
            "http-hop --rounds 3 --against-bin /x/old --against-label b6d6685 --profile plain",
        )) else {
            panic!("expected http-hop");
        };
        assert_eq!(o.rounds, 3);
        assert_eq!(o.against_bin, Some(PathBuf::from("/x/old")));
        assert_eq!(o.against_label, "b6d6685");
        assert_eq!(o.profile, Some(crate::servers::RouterProfile::Plain));
        for bad in [
            "http-hop --rounds 0",
            "http-hop --rounds 21",
            "http-hop --profile fast",
            "http-hop --against-label",
            "http-hop --variant pinned",
            "http-hop --variant epoll --against-bin /x/old",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
        let Ok(Command::HttpHop(o)) = parse(args("http-hop --variant unpinned")) else {
            panic!("expected http-hop");
        };
        assert_eq!(o.variant, Some(crate::servers::RouterVariant::Unpinned));
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(args("http-hop --duration 0")).is_err());
        assert!(parse(args("http-hop --shards 3")).is_err());
        assert!(parse(args("http-hop --duration")).is_err());
        assert!(parse(args("backend")).is_err());
        assert!(parse(args("nope")).is_err());
    }

    #[test]
    fn bus_kv_options() {
        let Ok(Command::BusKv(o)) = parse(args("bus-kv --messages 5000 --paced 200 --rate 500"))
        else {
            panic!("expected bus-kv");
        };
        assert_eq!((o.messages, o.paced, o.rate), (5000, 200, 500));
        assert!(parse(args("bus-kv --rate 0")).is_err());
        assert!(parse(args("bus-kv --paced 99")).is_err());
        assert!(parse(args("bus-kv --bogus 1")).is_err());
    }

    #[test]
    fn bus_relay_options() {
        let Ok(Command::BusRelay(o)) = parse(args("bus-relay --messages 5000 --streams 8")) else {
            panic!("expected bus-relay");
        };
        assert_eq!((o.messages, o.streams, o.sessions), (5000, 8, 64));
        assert!(parse(args("bus-relay --streams 0")).is_err());
        assert!(parse(args("bus-relay --streams 1025")).is_err());
        assert!(parse(args("bus-relay --sessions 4097")).is_err());
    }

    #[test]
    fn zmtp_ingest_options() {
        let Ok(Command::ZmtpIngest(o)) = parse(args("zmtp-ingest --messages 5000 --batch 64"))
        else {
            panic!("expected zmtp-ingest");
        };
        assert_eq!((o.messages, o.batch, o.timeout_secs), (5000, 64, 60));
        assert!(parse(args("zmtp-ingest --messages 10")).is_err());
        assert!(parse(args("zmtp-ingest --batch 0")).is_err());
        assert!(parse(args("zmtp-ingest --timeout 601")).is_err());
    }

    #[test]
    fn pick_options() {
        let Ok(Command::Pick(o)) = parse(args("pick --iterations 5000 --seconds 1")) else {
            panic!("expected pick");
        };
        assert_eq!(
            (o.iterations, o.warmup, o.time),
            (5000, 20_000, Duration::from_secs(1))
        );
        assert!(parse(args("pick --iterations 10")).is_err());
        assert!(parse(args("pick --seconds 0")).is_err());
        assert!(parse(args("pick --workers 10")).is_err());
    }

    #[test]
    fn fleet_hop_options() {
        let Ok(Command::FleetHop(o)) = parse(args("fleet-hop")) else {
            panic!("expected fleet-hop");
        };
        assert_eq!((o.duration_secs, o.warmup_secs, o.rounds), (10, 2, 1));
        assert_eq!(o.connections, vec![1, 8]);
        assert_eq!((o.workers, o.max_tokens, o.speedup_ratio), (2, 4, 1000));
        assert!(o.fleet_script.ends_with("tests/fleet/fleet.py"));
        let Ok(Command::FleetHop(o)) = parse(args(
            "fleet-hop --duration 3 --connections 1,4,16 --rounds 3 --workers 1 --max-tokens 8 \
             --python /v/bin/python --warmup 0 --nice -10",
        )) else {
            panic!("expected fleet-hop");
        };
        assert_eq!((o.duration_secs, o.warmup_secs, o.rounds), (3, 0, 3));
        assert_eq!(o.connections, vec![1, 4, 16]);
        assert_eq!((o.workers, o.max_tokens), (1, 8));
        assert_eq!(o.python, Some(PathBuf::from("/v/bin/python")));
        assert_eq!(o.nice, -10);
        for bad in [
            "fleet-hop --connections 0",
            "fleet-hop --connections 1,x",
            "fleet-hop --rounds 0",
            "fleet-hop --workers 9",
            "fleet-hop --duration 0",
            "fleet-hop --shards 1",
            "fleet-hop --router-cpu 2",
            "fleet-hop --nice -21",
            "fleet-hop --nice x",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn sim_hop_options() {
        let Ok(Command::SimHop(o)) = parse(args("sim-hop")) else {
            panic!("expected sim-hop");
        };
        assert_eq!(o.workers, vec![10, 100, 1000]);
        assert_eq!(o.connections, vec![1, 8]);
        assert_eq!((o.duration_secs, o.warmup_secs, o.rounds), (10, 2, 2));
        assert_eq!(
            (o.max_tokens, o.publish_ms, o.ready_timeout_secs),
            (4, 500, 60)
        );
        assert_eq!((o.router_cpu, o.router_nofile, o.nice), (0, None, 0));
        let Ok(Command::SimHop(o)) = parse(args(
            "sim-hop --workers 5,50,2000 --duration 3 --warmup 0 --connections 4 --rounds 3 \
             --max-tokens 1 --publish-ms 0 --router-nofile 1024 --router-cpu 1 --nice -5 \
             --router-bin /r --wrk-bin /w --ready-timeout 120 --idle 5",
        )) else {
            panic!("expected sim-hop");
        };
        assert_eq!(o.workers, vec![5, 50, 2000]);
        assert_eq!((o.duration_secs, o.warmup_secs, o.rounds), (3, 0, 3));
        assert_eq!(o.connections, vec![4]);
        assert_eq!((o.max_tokens, o.publish_ms), (1, 0));
        assert_eq!((o.router_nofile, o.router_cpu, o.nice), (Some(1024), 1, -5));
        assert_eq!(o.router_bin, Some(PathBuf::from("/r")));
        assert_eq!(o.wrk_bin, PathBuf::from("/w"));
        assert_eq!((o.ready_timeout_secs, o.idle_secs), (120, 5));
        for bad in [
            "sim-hop --workers 0",
            "sim-hop --workers 100,10",
            "sim-hop --workers 10,10",
            "sim-hop --workers 5001",
            "sim-hop --workers 10,x",
            "sim-hop --workers",
            "sim-hop --connections 0",
            "sim-hop --rounds 21",
            "sim-hop --router-nofile 8",
            "sim-hop --router-cpu 2",
            "sim-hop --idle 0",
            "sim-hop --shards 1",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn soak_options() {
        let Ok(Command::Soak(o)) = parse(args("soak")) else {
            panic!("expected soak");
        };
        assert_eq!(
            (o.minutes, o.churn_secs, o.workers, o.rate),
            (30.0, 1, 16, None)
        );
        let Ok(Command::Soak(o)) = parse(args(
            "soak --minutes 0.5 --churn-secs 2 --rate 900 --workers 4",
        )) else {
            panic!("expected soak");
        };
        assert_eq!(
            (o.minutes, o.churn_secs, o.rate, o.workers),
            (0.5, 2, Some(900), 4)
        );
        let Ok(Command::Soak(o)) = parse(args("soak --quick --sample-secs 3")) else {
            panic!("expected soak");
        };
        assert_eq!((o.minutes, o.sample_secs), (0.5, 3));
        for bad in [
            "soak --minutes 0",
            "soak --minutes x",
            "soak --minutes 1441",
            "soak --workers 1",
            "soak --sample-secs 0",
            "soak --rate",
            "soak --duration 3",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn kv_route_options() {
        let Ok(Command::KvRoute(o)) = parse(args("kv-route")) else {
            panic!("expected kv-route");
        };
        assert_eq!((o.workers, o.speedup_ratio, o.rounds), (4, 1, 1));
        assert_eq!(
            (o.conversations, o.turns, o.max_tokens, o.seed),
            (8, 8, 16, 1)
        );
        assert!(o.fleet.fleet_script.ends_with("tests/fleet/fleet.py"));
        assert!(o.fleet.model_dir.ends_with("shared/fixtures/tiny-model"));
        let Ok(Command::KvRoute(o)) = parse(args("kv-route --quick --rounds 2 --seed 7")) else {
            panic!("expected kv-route");
        };
        assert_eq!((o.conversations, o.turns, o.rounds, o.seed), (4, 2, 2, 7));
        let Ok(Command::KvRoute(o)) = parse(args("kv-route --quick --turns 3")) else {
            panic!("expected kv-route");
        };
        assert_eq!((o.conversations, o.turns), (4, 3));
        assert_eq!(o.replicas, 1);
        let Ok(Command::KvRoute(o)) = parse(args("kv-route --quick --replicas 2")) else {
            panic!("expected kv-route");
        };
        assert_eq!((o.replicas, o.turns), (2, 2));
        assert_eq!(o.gossip, crate::kv_route::Gossip::Off);
        let Ok(Command::KvRoute(o)) = parse(args("kv-route --replicas 2 --peers")) else {
            panic!("--peers")
        };
        assert_eq!(o.gossip, crate::kv_route::Gossip::On);
        for bad in [
            "kv-route --replicas 0",
            "kv-route --replicas 3",
            "kv-route --workers 0",
            "kv-route --workers 9",
            "kv-route --turns 0",
            "kv-route --conversations 65",
            "kv-route --rounds 11",
            "kv-route --seed",
            "kv-route --duration 3",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn faults_options() {
        let Ok(Command::Faults(o)) = parse(args("faults")) else {
            panic!("expected faults");
        };
        assert_eq!(o.scenarios.len(), 7);
        assert_eq!(
            (o.workers, o.conversations, o.turns, o.max_tokens),
            (4, 8, 6, 16)
        );
        assert_eq!(
            (o.request_timeout_secs, o.lease_ttl_secs, o.flap_secs),
            (60, 3, 60)
        );
        let Ok(Command::Faults(o)) = parse(args("faults --quick --seed 7")) else {
            panic!("expected faults");
        };
        let names: Vec<&str> = o.scenarios.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["worker-kill", "reload-storm"]);
        assert_eq!((o.conversations, o.turns, o.seed), (2, 3, 7));
        let Ok(Command::Faults(o)) = parse(args(
            "faults --scenario etcd-restart,worker-kill --scenario etcd-restart --flap-secs 5",
        )) else {
            panic!("expected faults");
        };
        let names: Vec<&str> = o.scenarios.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["etcd-restart", "worker-kill"]);
        assert_eq!(o.flap_secs, 5);
        // --scenario wins over --quick's list, whatever the order.
        let Ok(Command::Faults(o)) = parse(args("faults --scenario shim-kill --quick")) else {
            panic!("expected faults");
        };
        assert_eq!(o.scenarios.len(), 1);
        for bad in [
            "faults --scenario nope",
            "faults --scenario",
            "faults --workers 1",
            "faults --workers 9",
            "faults --turns 0",
            "faults --flap-secs 1",
            "faults --lease-ttl 0",
            "faults --duration 3",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn aiperf_options() {
        let Ok(Command::Aiperf(o)) = parse(args("aiperf")) else {
            panic!("expected aiperf");
        };
        assert_eq!((o.workers, o.speedup_ratio, o.rounds), (2, 1, 1));
        assert_eq!(
            (o.requests, o.concurrency, o.input_tokens, o.output_tokens),
            (64, 8, 512, 32)
        );
        let Ok(Command::Aiperf(o)) = parse(args(
            "aiperf --requests 10 --concurrency 2 --rounds 3 --aiperf-bin /x/aiperf --python /p",
        )) else {
            panic!("expected aiperf");
        };
        assert_eq!((o.requests, o.concurrency, o.rounds), (10, 2, 3));
        assert_eq!(
            o.aiperf_bin.as_deref(),
            Some(std::path::Path::new("/x/aiperf"))
        );
        for bad in [
            "aiperf --requests 0",
            "aiperf --requests 10001",
            "aiperf --concurrency 257",
            "aiperf --rounds 11",
            "aiperf --workers 9",
            "aiperf --output-tokens",
            "aiperf --duration 3",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn backend_port() {
        assert!(matches!(
            parse(args("backend --port 8080")),
            Ok(Command::Backend { port: 8080 })
        ));
    }
}
