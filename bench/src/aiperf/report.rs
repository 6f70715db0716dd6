//! The rows, endpoints and metrics of `aiperf`, read from AIPerf 0.13's
//! `profile_export_aiperf.json`, and the report: per endpoint, TTFT, inter-token latency and
//! request latency (p50 and p99) of the `dynamo kv` baseline and of the router side by side, the
//! router's ratio to the baseline and what it adds (milliseconds, and as a share of the router's
//! figure). With several rounds every cell is the median over them.
//!
//! Invariant: a figure missing from an export is refused at parse time, never reported as 0.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use super::AiperfOptions;

/// Which path AIPerf measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// AIPerf → `dynamo.frontend --router-mode kv`.
    Dynamo,
    /// AIPerf → continuum-router → `dynamo.frontend --router-mode direct`.
    Router,
}

impl Kind {
    /// The rows of round `round`, alternating which goes first.
    pub(crate) fn order(round: u32) -> [Kind; 2] {
        if round.is_multiple_of(2) {
            [Kind::Router, Kind::Dynamo]
        } else {
            [Kind::Dynamo, Kind::Router]
        }
    }

    /// The row's label in the report.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Dynamo => "dynamo kv",
            Kind::Router => "router",
        }
    }

    /// The label as a file-name part.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Kind::Dynamo => "dynamo-kv",
            Kind::Router => "router",
        }
    }
}

/// The API AIPerf drove (its `--endpoint-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl Endpoint {
    /// Every endpoint, in run order.
    pub(crate) const ALL: [Endpoint; 2] = [Endpoint::Completions, Endpoint::Chat];

    /// AIPerf's `--endpoint-type` value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
    }
}

/// What one AIPerf run measured (milliseconds unless named otherwise).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Metrics {
    pub(crate) ttft_p50: f64,
    pub(crate) ttft_p99: f64,
    pub(crate) itl_p50: f64,
    pub(crate) itl_p99: f64,
    pub(crate) latency_p50: f64,
    pub(crate) latency_p99: f64,
    /// Requests AIPerf counted as completed.
    pub(crate) requests: f64,
    /// Requests that ended in an error.
    pub(crate) errors: f64,
    /// Requests per second over the run.
    pub(crate) throughput: f64,
}

impl Metrics {
    /// Reads an AIPerf 0.13 `profile_export_aiperf.json`.
    pub(crate) fn parse(text: &str) -> Result<Metrics, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let stat = |metric: &str, stat: &str| {
            v.get(metric)
                .and_then(|m| m.get(stat))
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("no `{metric}.{stat}`"))
        };
        let errors = match v.get("error_summary") {
            Some(Value::Array(list)) => list
                .iter()
                .map(|e| e.get("count").and_then(Value::as_f64).unwrap_or(1.0))
                .fold(0.0, |a, b| a + b),
            _ => return Err("no `error_summary` list".into()),
        };
        Ok(Metrics {
            ttft_p50: stat("time_to_first_token", "p50")?,
            ttft_p99: stat("time_to_first_token", "p99")?,
            itl_p50: stat("inter_token_latency", "p50")?,
            itl_p99: stat("inter_token_latency", "p99")?,
            latency_p50: stat("request_latency", "p50")?,
            latency_p99: stat("request_latency", "p99")?,
            requests: stat("request_count", "avg")?,
            errors,
            throughput: stat("request_throughput", "avg")?,
        })
    }
}

/// One AIPerf run of a row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) kind: Kind,
    pub(crate) endpoint: Endpoint,
    pub(crate) round: u32,
    pub(crate) metrics: Metrics,
}

/// The report's first lines: what ran, and how.
pub(crate) fn header(
    out: &mut impl Write,
    opts: &AiperfOptions,
    aiperf: &Path,
) -> std::io::Result<()> {
    writeln!(
        out,
        "aiperf: AIPerf ({}) on a Dynamo 1.6.1 fleet of {} mocker workers (--speedup-ratio {}), \
         a fresh fleet per row; per endpoint {} streamed requests, concurrency {}, synthetic \
         prompts of ~{} tokens, {} output tokens, seed 1; {} round(s)",
        aiperf.display(),
        opts.workers,
        opts.speedup_ratio,
        opts.requests,
        opts.concurrency,
        opts.input_tokens,
        opts.output_tokens,
        opts.rounds,
    )?;
    writeln!(
        out,
        "dynamo kv = AIPerf -> dynamo.frontend --router-mode kv; router = AIPerf -> \
         continuum-router (dynamo.kv on, 1 shard) -> dynamo.frontend --router-mode direct"
    )
}

/// The median of `values` (`None` when empty).
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => values.get(n / 2).copied(),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The median over rounds of `field` for `kind` on `endpoint`.
fn cell(runs: &[Run], kind: Kind, endpoint: Endpoint, field: fn(&Metrics) -> f64) -> Option<f64> {
    median(
        runs.iter()
            .filter(|r| r.kind == kind && r.endpoint == endpoint)
            .map(|r| field(&r.metrics))
            .collect(),
    )
}

type Field = (&'static str, fn(&Metrics) -> f64);

/// The latency rows, in report order.
const LATENCIES: [Field; 6] = [
    ("TTFT p50 (ms)", |m| m.ttft_p50),
    ("TTFT p99 (ms)", |m| m.ttft_p99),
    ("ITL p50 (ms)", |m| m.itl_p50),
    ("ITL p99 (ms)", |m| m.itl_p99),
    ("request latency p50 (ms)", |m| m.latency_p50),
    ("request latency p99 (ms)", |m| m.latency_p99),
];

/// Renders every endpoint's table and what could not be measured.
pub(crate) fn render(
    out: &mut impl Write,
    runs: &[Run],
    missing: &[(Kind, String)],
) -> std::io::Result<()> {
    for endpoint in Endpoint::ALL {
        let rounds = runs
            .iter()
            .filter(|r| r.endpoint == endpoint)
            .map(|r| r.round)
            .max()
            .unwrap_or(0);
        writeln!(
            out,
            "\n{} (streaming; medians over {rounds} round(s))\n",
            endpoint.label()
        )?;
        writeln!(
            out,
            "| metric | dynamo kv | router | router/dynamo | router adds |"
        )?;
        writeln!(out, "|---|---|---|---|---|")?;
        for (name, field) in LATENCIES {
            let d = cell(runs, Kind::Dynamo, endpoint, field);
            let r = cell(runs, Kind::Router, endpoint, field);
            writeln!(
                out,
                "| {name} | {} | {} | {} | {} |",
                fmt(d),
                fmt(r),
                ratio(r, d),
                added(r, d)
            )?;
        }
        let tp = |k| cell(runs, k, endpoint, |m| m.throughput);
        writeln!(
            out,
            "| throughput (req/s) | {} | {} | {} | |",
            fmt(tp(Kind::Dynamo)),
            fmt(tp(Kind::Router)),
            ratio(tp(Kind::Router), tp(Kind::Dynamo))
        )?;
        let done = |k| {
            let sum = |f: fn(&Metrics) -> f64| {
                runs.iter()
                    .filter(|r| r.kind == k && r.endpoint == endpoint)
                    .map(|r| f(&r.metrics))
                    .fold(0.0, |a, b| a + b)
            };
            format!("{:.0} / {:.0}", sum(|m| m.requests), sum(|m| m.errors))
        };
        writeln!(
            out,
            "| requests / errors (all rounds) | {} | {} | | |",
            done(Kind::Dynamo),
            done(Kind::Router)
        )?;
    }
    for (kind, why) in missing {
        writeln!(out, "\n{}: not measured: {why}", kind.label())?;
    }
    Ok(())
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// `router / dynamo`, when both are measured and the baseline is not 0.
fn ratio(router: Option<f64>, dynamo: Option<f64>) -> String {
    match (router, dynamo) {
        (Some(r), Some(d)) if d > 0.0 => format!("{:.2}x", r / d),
        _ => "-".into(),
    }
}

/// What the router adds: `router − dynamo` and its share of the router's figure.
fn added(router: Option<f64>, dynamo: Option<f64>) -> String {
    match (router, dynamo) {
        (Some(r), Some(d)) if r > 0.0 => {
            format!("{:+.2} ms ({:+.0}% of router)", r - d, (r - d) / r * 100.0)
        }
        (Some(r), Some(d)) => format!("{:+.2} ms", r - d),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(ttft: f64, errors: &str) -> String {
        let stat =
            |p50: f64| serde_json::json!({"unit": "ms", "p50": p50, "p99": p50 * 2.0, "avg": p50});
        serde_json::json!({
            "time_to_first_token": stat(ttft),
            "inter_token_latency": stat(1.0),
            "request_latency": stat(ttft + 10.0),
            "request_count": {"unit": "requests", "avg": 64.0},
            "request_throughput": {"unit": "requests/sec", "avg": 20.0},
            "error_summary": serde_json::from_str::<Value>(errors).unwrap(),
        })
        .to_string()
    }

    #[test]
    fn an_export_is_read_and_a_missing_figure_refused() {
        let m = Metrics::parse(&export(12.0, "[]")).unwrap();
        assert_eq!((m.ttft_p50, m.ttft_p99, m.latency_p50), (12.0, 24.0, 22.0));
        assert_eq!((m.requests, m.errors, m.throughput), (64.0, 0.0, 20.0));
        let m = Metrics::parse(&export(1.0, r#"[{"count": 3}, {"x": 1}]"#)).unwrap();
        assert_eq!(m.errors, 4.0);
        let mut v: Value = serde_json::from_str(&export(1.0, "[]")).unwrap();
        v.as_object_mut().unwrap().remove("inter_token_latency");
        let err = Metrics::parse(&v.to_string()).unwrap_err();
        assert!(err.contains("inter_token_latency"), "{err}");
        assert!(Metrics::parse("[]").is_err() && Metrics::parse("{").is_err());
    }

    #[test]
    fn the_table_puts_the_router_beside_its_baseline_with_medians() {
        let run = |kind, round, ttft| Run {
            kind,
            endpoint: Endpoint::Chat,
            round,
            metrics: Metrics::parse(&export(ttft, "[]")).unwrap(),
        };
        let runs = [
            run(Kind::Dynamo, 1, 10.0),
            run(Kind::Router, 1, 11.0),
            run(Kind::Dynamo, 2, 30.0),
            run(Kind::Router, 2, 13.0),
            run(Kind::Dynamo, 3, 20.0),
            run(Kind::Router, 3, 12.5),
        ];
        let mut out = Vec::new();
        render(&mut out, &runs, &[(Kind::Router, "boom".into())]).unwrap();
        let text = String::from_utf8(out).unwrap();
        // Medians: dynamo 20, router 12.5.
        assert!(
            text.contains("| TTFT p50 (ms) | 20.00 | 12.50 | 0.62x | -7.50 ms (-60% of router) |"),
            "{text}"
        );
        assert!(
            text.contains("| requests / errors (all rounds) | 192 / 0 | 192 / 0 | | |"),
            "{text}"
        );
        assert!(
            text.contains("completions (streaming; medians over 0 round(s))"),
            "{text}"
        );
        assert!(text.contains("| TTFT p50 (ms) | - | - | - | - |"), "{text}");
        assert!(text.contains("router: not measured: boom"), "{text}");
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }
}
