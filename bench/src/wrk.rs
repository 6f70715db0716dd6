//! Running wrk against a server and parsing its `--latency` report.
//!
//! Invariants: wrk always runs pinned (see the caller) and bounded: it is
//! killed if it outlives its duration by [`OVERRUN`]; a report without
//! requests/sec, p50 or p99 is an error, never a zero.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe::{BENCH_KEY, CHAT_BODY};
use crate::servers::set_log;
use crate::tempdir::TempDir;

/// Slack wrk gets past `-d` before it is killed.
const OVERRUN: Duration = Duration::from_secs(15);

/// The Lua script making every wrk request a chat completion.
pub(crate) fn post_lua() -> String {
    format!(
        "wrk.method = \"POST\"\n\
         wrk.path = \"/v1/chat/completions\"\n\
         wrk.headers[\"Content-Type\"] = \"application/json\"\n\
         wrk.headers[\"Authorization\"] = \"Bearer {BENCH_KEY}\"\n\
         wrk.body = '{CHAT_BODY}'\n"
    )
}

/// A Lua `done()` that prints p50 and p99 in whole microseconds, for
/// [`parse`] to prefer over wrk's 2-decimal table.
pub(crate) const PRECISE_LATENCY_LUA: &str = "\
function done(summary, latency, requests)
  io.write(string.format(\"latency-us p50 %d p99 %d\\n\",
    latency:percentile(50), latency:percentile(99)))
end
";

/// What one wrk run measured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WrkReport {
    /// Completed requests.
    pub(crate) requests: u64,
    /// Requests per second as wrk computed it.
    pub(crate) rps: f64,
    /// Median latency, microseconds.
    pub(crate) p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub(crate) p99_us: f64,
    /// Responses with a status outside 2xx/3xx.
    pub(crate) non_2xx: u64,
    /// connect + read + write + timeout socket errors.
    pub(crate) socket_errors: u64,
}

/// One wrk invocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WrkRun<'a> {
    /// wrk binary.
    pub(crate) bin: &'a Path,
    /// Target port on 127.0.0.1.
    pub(crate) port: u16,
    /// `-t`.
    pub(crate) threads: u32,
    /// `-c`.
    pub(crate) connections: u32,
    /// `-d`, seconds.
    pub(crate) secs: u64,
    /// CPUs wrk is pinned to.
    pub(crate) cpus: &'a [usize],
    /// The Lua script (`-s`).
    pub(crate) script: &'a Path,
}

impl WrkRun<'_> {
    /// Runs wrk to completion and parses its report; its output goes to
    /// `wrk.out` in `dir`.
    pub(crate) fn run(&self, dir: &TempDir) -> Result<WrkReport, BenchError> {
        let out = dir.path().join("wrk.out");
        let mut cmd = Command::new(self.bin);
        cmd.arg(format!("-t{}", self.threads))
            .arg(format!("-c{}", self.connections))
            .arg(format!("-d{}s", self.secs))
            .arg("--latency")
            .arg("-s")
            .arg(self.script)
            .arg(format!(
                "http://127.0.0.1:{}/v1/chat/completions",
                self.port
            ));
        set_log(&mut cmd, &out)?;
        let mut wrk = Supervised::spawn("wrk", cmd, self.cpus, Some(&out))?;
        let deadline = Instant::now() + Duration::from_secs(self.secs) + OVERRUN;
        let status = wrk.wait_until(deadline)?;
        drop(wrk);
        let text = std::fs::read_to_string(&out)
            .map_err(BenchError::io(format!("reading {}", out.display())))?;
        match status {
            Some(s) if s.success() => parse(&text),
            Some(s) => Err(BenchError::WrkFailed {
                status: s.to_string(),
                stderr: text,
            }),
            None => Err(BenchError::WrkFailed {
                status: format!(
                    "killed after {} s",
                    (Duration::from_secs(self.secs) + OVERRUN).as_secs()
                ),
                stderr: text,
            }),
        }
    }
}

/// Parses wrk's stdout (with `--latency`).
pub(crate) fn parse(text: &str) -> Result<WrkReport, BenchError> {
    let missing = |field| BenchError::WrkParse {
        field,
        output: text.to_owned(),
    };
    let mut r = WrkReport {
        requests: 0,
        rps: f64::NAN,
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        non_2xx: 0,
        socket_errors: 0,
    };
    let mut precise: Option<(f64, f64)> = None;
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => r.rps = v.parse().map_err(|_| missing("Requests/sec"))?,
            ["50%", v] => r.p50_us = duration_us(v).ok_or_else(|| missing("50% latency"))?,
            ["99%", v] => r.p99_us = duration_us(v).ok_or_else(|| missing("99% latency"))?,
            // Printed by a script's `done()` (see `PRECISE_LATENCY_LUA`): whole
            // microseconds, so it replaces the 10 us resolution of the table.
            ["latency-us", "p50", a, "p99", b] => {
                precise = Some((
                    a.parse().map_err(|_| missing("latency-us p50"))?,
                    b.parse().map_err(|_| missing("latency-us p99"))?,
                ));
            }
            [n, "requests", "in", ..] => r.requests = n.parse().map_err(|_| missing("requests"))?,
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                r.non_2xx = n.parse().map_err(|_| missing("Non-2xx"))?;
            }
            ["Socket", "errors:", rest @ ..] => {
                r.socket_errors = rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum();
            }
            _ => {}
        }
    }
    if r.rps.is_nan() {
        return Err(missing("Requests/sec"));
    }
    if let Some((p50, p99)) = precise {
        (r.p50_us, r.p99_us) = (p50, p99);
    }
    if r.p50_us.is_nan() || r.p99_us.is_nan() {
        return Err(missing("latency distribution (was --latency passed?)"));
    }
    Ok(r)
}

/// `"1.23ms"` → 1230.0 (µs). wrk prints us, ms, s, m and h.
fn duration_us(v: &str) -> Option<f64> {
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => return None,
    };
    Some(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Running 10s test @ http://127.0.0.1:8080/v1/chat/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.52ms  300.00us  12.00ms   90.00%
    Req/Sec    42.10k     1.20k   45.00k    70.00%
  Latency Distribution
     50%    1.50ms
     75%    1.60ms
     90%    1.80ms
     99%    2.50ms
  419000 requests in 10.00s, 150.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 7
Requests/sec:  41900.12
Transfer/sec:     15.00MB
";

    #[test]
    fn parses_latency_report() {
        let r = parse(SAMPLE).unwrap();
        assert_eq!(r.requests, 419_000);
        assert!((r.rps - 41_900.12).abs() < 1e-6);
        assert!((r.p50_us - 1500.0).abs() < 1e-6);
        assert!((r.p99_us - 2500.0).abs() < 1e-6);
        assert_eq!((r.non_2xx, r.socket_errors), (7, 3));
    }

    #[test]
    fn precise_latency_line_wins() {
        let text = format!("{SAMPLE}latency-us p50 1503 p99 2468\n");
        let r = parse(&text).unwrap();
        assert!((r.p50_us - 1503.0).abs() < 1e-9);
        assert!((r.p99_us - 2468.0).abs() < 1e-9);
        assert!(PRECISE_LATENCY_LUA.contains("latency-us p50 %d p99 %d\\n"));
    }

    #[test]
    fn missing_latency_is_an_error() {
        assert!(parse("Requests/sec: 10\n").is_err());
    }

    #[test]
    fn units() {
        assert_eq!(duration_us("250.00us"), Some(250.0));
        assert_eq!(duration_us("1.00s"), Some(1e6));
        assert_eq!(duration_us("abc"), None);
    }
}
