//! The command line's help text and its errors: a leaf both the parser (`cli`) and the error
//! type (`error`) use, so neither depends on the other.

/// Help text printed on `help` and on every usage error.
pub(crate) const USAGE: &str = "\
usage:
  continuum-bench http-hop [options]   router hop vs nginx hop, same backend, same load
  continuum-bench fleet-hop [options]  router vs direct-to-frontend on a real Dynamo fleet (needs the fleet venv)
  continuum-bench sim-hop [options]    router vs direct-to-shim on the simulated fleet at 10, 100, 1000 workers
  continuum-bench soak [options]       the router for --minutes at ~80% of its maximum rate on the simulated
                                       fleet while workers join and leave: RSS drift, fds, subscriptions, errors
  continuum-bench kv-route [options]   KV-aware picks of the router vs Dynamo's own KV router, and per-
                                       conversation pinning, on a real Dynamo fleet (needs the fleet venv)
  continuum-bench aiperf [options]     NVIDIA's AIPerf through the router vs Dynamo's KV-routing frontend on a
                                       real Dynamo fleet: TTFT, ITL, latency (needs the fleet and AIPerf venvs)
  continuum-bench faults [options]     fault injection (workers, frontends, etcd killed, stopped, compacted;
                                       reload storms) on a real Dynamo fleet under a streaming chat load
  continuum-bench backend --port N     the fast OpenAI-ish backend alone (pinning is up to you)
  continuum-bench resync [--workers N] [--rounds N]
                                       discovery resync time and registry memory (default 16384 workers)
  continuum-bench zmtp-ingest [--messages N] [--batch N] [--timeout SECS]
                                       router kv_metrics SUB path vs the zeromq crate's SubSocket
  continuum-bench bus-relay [--messages N] [--sessions N] [--streams N] [--timeout SECS]
                                       one stream through the event bus listener into a shard's ZMTP
                                       driver vs the same driver on direct TCP; memory per idle session
                                       and stream
  continuum-bench pick [--iterations N] [--warmup N] [--seconds SECS]
                                       one pick alone (p50/p99) at 10, 100, 1000 workers vs round-robin
  continuum-bench prompt [--conversations N] [--turns N] [--rounds N] [--model-dir DIR]
                                       the prompt pipeline (render + tokenize + hash) per request, with and
                                       without the segment cache, vs tokenizers on the whole prompt
  continuum-bench help

http-hop options:
  --duration SECS      measured wrk run per server (default 10, max 600)
  --warmup SECS        unmeasured wrk run before each measurement (default 2, 0 = none)
  --connections N      wrk connections (default 64)
  --threads N          wrk threads (default 1)
  --shards LIST        scenarios to run, comma separated, each 1 or 2 (default 1,2)
  --rounds N           measurements of every server per scenario, interleaved (default 1, max 20);
                       with more than one, a summary gives each ratio per round and its median
  --router-bin PATH    router binary (default: continuum-router next to this binary)
  --against-bin PATH   a second router binary (another revision) measured in every round beside
                       the first, its order alternating; the summary adds new/old ratios
  --against-label TEXT its name in the report (default: old)
  --profile NAME       the router's config: operator (a client API key with a rate budget and a
                       1 s health check, the default) or plain (neither); with --against-bin and
                       no --profile, plain when the other binary refuses the operator config
  --variant NAME       measure a tuning variant of the same router beside it in every round, as
                       --against-bin does another binary: unpinned (no cpu_affinity or
                       control_cpu, the process free on every CPU) or epoll
                       (CONTINUUM_DRIVER=epoll); the summary's new/NAME ratios are the figures of
                       docs/tuning.md (not with --against-bin)
  --nginx-bin PATH     nginx binary (default: nginx on PATH)
  --wrk-bin PATH       wrk binary (default: wrk on PATH)
  --ready-timeout SECS how long a server may take to pass its probe (default 15)

fleet-hop options:
  --duration SECS      measured wrk run per path (default 10, max 600)
  --warmup SECS        unmeasured wrk run before each measurement (default 2, 0 = none)
  --connections LIST   wrk connection counts, comma separated, one comparison each (default 1,8)
  --rounds N           direct/router pairs per connection count (default 1, max 20)
  --workers N          mocker workers of the aggregated model (default 2, max 8)
  --max-tokens N       max_tokens of every request (default 4)
  --speedup-ratio N    the mockers' --speedup-ratio (default 1000)
  --router-bin PATH    router built with --features dynamo (default: continuum-router next to this binary)
  --wrk-bin PATH       wrk binary (default: wrk on PATH)
  --python PATH        the fleet venv's python (default: $CONTINUUM_FLEET_VENV or
                       ~/.cache/continuum-fleet/venv, then bin/python)
  --fleet-script PATH  tests/fleet/fleet.py (default: the one of this source tree)
  --ready-timeout SECS how long the fleet, then the router, may take to be ready (default 60)
  --router-cpu 0|1     the router's CPU (default 0; the fleet and wrk are on CPU 1, so 1 = one CPU for all)
  --nice N             nice value of every process of the run, e.g. -10 on a machine shared with
                       builds (default 0 = unchanged; negative needs root or CAP_SYS_NICE)

sim-hop options:
  --workers LIST       fleet sizes, comma separated, ascending (default 10,100,1000; max 5000);
                       the first is the baseline of the scaling ratios
  --duration SECS      measured wrk run per path (default 10, max 600)
  --warmup SECS        unmeasured wrk run before each measurement (default 2, 0 = none)
  --connections LIST   wrk connection counts, comma separated, one comparison each (default 1,8)
  --rounds N           direct/router pairs per fleet size and connection count (default 2, max 20)
  --max-tokens N       max_tokens of every request and the sim's completion tokens (default 4)
  --publish-ms N       periodic kv_metrics of every simulated worker, ms (default 500; 0 = only
                       on load changes, as Dynamo)
  --idle SECS          window without load measuring the router's idle CPU, per fleet (default 5)
  --router-bin PATH    router built with --features dynamo (default: continuum-router next to this binary)
  --wrk-bin PATH       wrk binary (default: wrk on PATH)
  --ready-timeout SECS how long the router may take to be ready, per fleet (default 60)
  --router-cpu 0|1     the router's CPU (default 0; the sim and wrk are on CPU 1)
  --router-nofile N    the router's soft RLIMIT_NOFILE (default: inherited from the bench)
  --nice N             nice value of every process of the run (default 0 = unchanged)

soak options:
  --minutes M          minutes of soak load, a decimal (default 30; 0.1 to 1440)
  --quick              the CI smoke: --minutes 0.5, --sample-secs 2, --calibrate-secs 2 (later flags apply)
  --churn-secs N       every N s a worker joins and the oldest leaves (default 1; 0 = no churn)
  --workers N          fleet size, held by the churn (default 16, 2 to 1000)
  --connections N      keep-alive client threads, calibration and soak (default 8)
  --rate N             drive N req/s and skip the calibration (default: --load-percent of the maximum)
  --load-percent N     percent of the calibrated maximum rate to drive (default 80)
  --calibrate-secs N   closed-loop calibration of the maximum rate through the router (default 5)
  --sample-secs N      seconds between samples of the router (default 10)
  --warmup SECS        seconds of the soak not judged (default: min(60, a quarter of the run))
  --max-tokens N       max_tokens of every request and the sim's completion tokens (default 4)
  --publish-ms N       periodic kv_metrics of every simulated worker, ms (default 500)
  --router-bin PATH    router built with --features dynamo (default: continuum-router next to this binary)
  --ready-timeout SECS how long the router may take to be ready (default 60)
  --router-cpu 0|1     the router's CPU (default 0; the sim and the clients are on the other)

kv-route options (every row on a fresh fleet):
  --workers N          mocker workers of each fleet (default 4, max 8)
  --speedup-ratio N    the mockers' --speedup-ratio (default 1)
  --conversations N    concurrent conversations, one client thread each (default 8, max 64)
  --turns N            turns per conversation (default 8, max 64)
  --max-tokens N       max_tokens of every request (default 16)
  --seed N             workload seed (default 1)
  --rounds N           repetitions of the three rows, order alternating (default 1, max 10)
  --quick              CI smoke sizes: 2 turns of 4 conversations (later flags still apply)
  --router-bin PATH    router built with --features dynamo-kv (default: continuum-router next to this binary)
  --python PATH        the fleet venv's python (default as fleet-hop)
  --fleet-script PATH  tests/fleet/fleet.py (default: the one of this source tree)
  --model-dir DIR      the tiny model whose tokenizer artifacts the router pins
                       (default: ../shared/fixtures/tiny-model)
  --ready-timeout SECS how long each fleet, then the router, may take to be ready (default 60)
  --request-timeout SECS  socket timeout of every request (default 60)
  --row-timeout SECS   wall time of one row's load (default 600)
  --replicas 2         also run the `router x2` row: 2 router kv replicas (each its own port and CPU)
                       behind nginx round robin, the clients hitting nginx (default 1 = no such row; max 2)
  --nginx-bin PATH     nginx binary of that row (default: nginx on PATH)
  --peers              that row's replicas share their dispatches (dynamo.peers over loopback UDP)

faults options (every row on a fresh fleet):
  --scenario LIST      worker-kill, worker-stop, shim-kill, etcd-restart, etcd-compact, publisher-flap,
                       reload-storm, comma separated (default all; wins over --quick's list)
  --workers N          mocker workers of each fleet (default 4, min 2, max 8)
  --conversations N    concurrent clients, one conversation at a time each (default 8, max 64)
  --turns N            turns per conversation (default 6, max 64)
  --max-tokens N       max_tokens of every request (default 16)
  --seed N             workload seed (default 1)
  --request-timeout SECS  socket timeout and deadline of every request (default 60)
  --lease-ttl SECS     fleet.py --lease-ttl (default 3)
  --flap-secs SECS     how long publisher-flap flaps (default 60)
  --quick              CI smoke: worker-kill and reload-storm, 2 conversations of 3 turns
  --router-bin PATH, --python PATH, --fleet-script PATH, --model-dir DIR, --ready-timeout SECS  as kv-route

zmtp-ingest options:
  --messages N         messages per subscriber (default 2000000, min 1000)
  --batch N            messages per publisher write (default 1024)
  --timeout SECS       how long each subscriber may take (default 60, max 600)

bus-relay options:
  --messages N         messages per side (default 2000000, min 1000)
  --sessions N         idle sessions in the memory figure (default 64, max 4096)
  --streams N          idle streams in the memory figure (default 512, max 1024)
  --timeout SECS       how long each side may take (default 60, max 600)

aiperf options (every row on a fresh fleet; completions then chat, streaming):
  --requests N         AIPerf --request-count per endpoint and row (default 64, max 10000)
  --concurrency N      AIPerf --concurrency (default 8, max 256)
  --input-tokens N     AIPerf --synthetic-input-tokens-mean (default 512)
  --output-tokens N    AIPerf --output-tokens-mean (default 32)
  --workers N          mocker workers (default 2, max 8)
  --speedup-ratio N    the mockers' --speedup-ratio (default 1)
  --rounds N           repetitions of both rows, alternating their order (default 1, max 10)
  --router-bin PATH    router built with --features dynamo-kv (default: next to this binary)
  --aiperf-bin PATH    aiperf (default: $CONTINUUM_AIPERF_VENV or ~/.cache/continuum-aiperf/venv, bin/aiperf)
  --python PATH, --fleet-script PATH, --model-dir DIR, --ready-timeout SECS  as kv-route
  --run-timeout SECS   wall time of one AIPerf run (default 600)

pick options (per row, i.e. per fleet size and operation):
  --iterations N       measured operations at most (default 200000, min 100)
  --warmup N           untimed operations before measuring (default 20000)
  --seconds SECS       wall time at most (default 2, max 60)";

/// A malformed command line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
    /// No subcommand was given.
    #[error("missing subcommand")]
    MissingCommand,
    /// The subcommand is unknown.
    #[error("unknown subcommand `{0}`")]
    UnknownCommand(String),
    /// A flag is unknown for this subcommand.
    #[error("unknown flag `{0}`")]
    UnknownFlag(String),
    /// A flag that needs a value was last on the line.
    #[error("flag `{0}` needs a value")]
    MissingValue(String),
    /// A flag's value did not parse or is out of range.
    #[error("bad value `{value}` for `{flag}`: {reason}")]
    BadValue {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}
