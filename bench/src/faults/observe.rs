//! What `faults` reads about the process in front of the clients (the router; in the `dynamo
//! kv` row, the frontend) before and after a scenario: its open file descriptors
//! (`/proc/PID/fd`), its resident memory (`VmRSS` of `/proc/PID/status`), and for the router
//! its subscriptions by state (`continuum_dynamo_load_subscriptions{state,transport}` for
//! `kv_metrics`, `continuum_dynamo_kv_subscriptions{state,transport}` for `kv-events`, summed
//! over transports) and the workers `/admin/dynamo/workers` lists.
//!
//! Invariants: every read is one bounded request or one `/proc` read; what cannot be read is
//! `None` (shown `?`), never an error; the parsers are pure.

use std::fmt::Write as _;

use crate::router_probe::{get, listed_worker_ids};

/// Subscriptions of one family by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct States {
    /// `connected`.
    pub(crate) connected: u64,
    /// `connecting`.
    pub(crate) connecting: u64,
    /// `pending`.
    pub(crate) pending: u64,
    /// `backoff`.
    pub(crate) backoff: u64,
}

impl States {
    /// `4c`, or with the other states: `3c 1b` (`c`onnected, connec`t`ing, `p`ending,
    /// `b`ackoff); `0` when there are none.
    pub(crate) fn text(&self) -> String {
        let mut s = String::new();
        for (n, tag) in [
            (self.connected, 'c'),
            (self.connecting, 't'),
            (self.pending, 'p'),
            (self.backoff, 'b'),
        ] {
            if n > 0 {
                if !s.is_empty() {
                    s.push(' ');
                }
                let _ = write!(s, "{n}{tag}");
            }
        }
        if s.is_empty() { "0".to_owned() } else { s }
    }
}

/// One look at the process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Open file descriptors.
    pub(crate) fds: Option<usize>,
    /// Resident set, KiB.
    pub(crate) rss_kib: Option<u64>,
    /// The router's `kv_metrics` subscriptions.
    pub(crate) load: Option<States>,
    /// The router's `kv-events` subscriptions.
    pub(crate) kv: Option<States>,
    /// The worker ids the router lists.
    pub(crate) listed: Option<Vec<u64>>,
}

/// Looks at process `pid`; at the router on `router_port` too, if given.
pub(crate) fn snapshot(pid: i32, router_port: Option<u16>) -> Snapshot {
    let mut s = Snapshot {
        fds: fd_count(pid),
        rss_kib: std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|t| vm_rss_kib(&t)),
        ..Snapshot::default()
    };
    if let Some(port) = router_port {
        if let Ok(m) = get(port, "/metrics") {
            let m = String::from_utf8_lossy(&m);
            s.load = Some(states(&m, "continuum_dynamo_load_subscriptions"));
            s.kv = Some(states(&m, "continuum_dynamo_kv_subscriptions"));
        }
        s.listed = listed(port);
    }
    s
}

/// The worker ids the router on `port` lists, if it answers.
pub(crate) fn listed(port: u16) -> Option<Vec<u64>> {
    get(port, "/admin/dynamo/workers")
        .ok()
        .map(|b| listed_worker_ids(&b))
}

/// Entries of `/proc/PID/fd`.
pub(crate) fn fd_count(pid: i32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count())
}

/// `VmRSS` (KiB) of a `/proc/PID/status` text.
pub(crate) fn vm_rss_kib(status: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix("VmRSS:")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The value of label `label` in a sample line's label set (`{a="x",b="y"}`).
fn label_of<'a>(labels: &'a str, label: &str) -> Option<&'a str> {
    let key = format!("{label}=\"");
    let mut rest = labels;
    loop {
        let at = rest.find(&key)?;
        // A whole label name: at the start or after `{` or `,`.
        let whole = at == 0 || matches!(rest.as_bytes()[at - 1], b'{' | b',');
        let value = &rest[at + key.len()..];
        if whole {
            return value.split('"').next();
        }
        rest = value;
    }
}

/// Per value of `label`, the sum of the samples of metric `name` (over its other labels), in
/// first-seen order.
pub(crate) fn by_label(metrics: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let Some(end) = rest.strip_prefix('{').and_then(|r| r.find('}')) else {
            continue;
        };
        let labels = &rest[..end + 2];
        let Some(v) = rest[end + 2..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let Some(key) = label_of(labels, label) else {
            continue;
        };
        match out.iter_mut().find(|(k, _)| k == key) {
            Some((_, sum)) => *sum += v,
            None => out.push((key.to_owned(), v)),
        }
    }
    out
}

/// The subscriptions of gauge `name` by state, summed over transports.
pub(crate) fn states(metrics: &str, name: &str) -> States {
    let mut s = States::default();
    for (state, n) in by_label(metrics, name, "state") {
        let n = n.max(0.0) as u64;
        match state.as_str() {
            "connected" => s.connected += n,
            "connecting" => s.connecting += n,
            "pending" => s.pending += n,
            "backoff" => s.backoff += n,
            _ => {}
        }
    }
    s
}

/// `after - before` of counter `name` per value of `label` (values of `after`; missing in
/// `before` = 0), the non-zero ones as `value=N, ...`, or `none` (an absent counter is 0).
pub(crate) fn counter_delta(before: &str, after: &str, name: &str, label: &str) -> String {
    let b = by_label(before, name, label);
    let parts: Vec<String> = by_label(after, name, label)
        .into_iter()
        .filter_map(|(k, a)| {
            let was = b.iter().find(|(l, _)| *l == k).map_or(0.0, |(_, n)| *n);
            let d = (a - was).max(0.0) as u64;
            (d > 0).then(|| format!("{k}={d}"))
        })
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# HELP continuum_dynamo_load_subscriptions kv_metrics subscriptions by state.\n\
        # TYPE continuum_dynamo_load_subscriptions gauge\n\
        continuum_dynamo_load_subscriptions{state=\"pending\",transport=\"direct\"} 0\n\
        continuum_dynamo_load_subscriptions{state=\"connecting\",transport=\"direct\"} 0\n\
        continuum_dynamo_load_subscriptions{state=\"connected\",transport=\"direct\"} 3\n\
        continuum_dynamo_load_subscriptions{state=\"backoff\",transport=\"direct\"} 1\n\
        continuum_dynamo_load_subscriptions{state=\"connected\",transport=\"broker\"} 1\n\
        continuum_dynamo_kv_subscriptions{state=\"connected\",transport=\"direct\"} 4\n\
        continuum_dynamo_repicks_total{reason=\"connect_failed\"} 3\n\
        continuum_dynamo_repicks_total{reason=\"stream_reset\"} 1\n";

    #[test]
    fn reads_vm_rss() {
        let status =
            "Name:\tcontinuum-route\nVmPeak:\t  123 kB\nVmRSS:\t   20480 kB\nThreads:\t4\n";
        assert_eq!(vm_rss_kib(status), Some(20480));
        assert_eq!(vm_rss_kib("Name: x\n"), None);
        assert_eq!(vm_rss_kib("VmRSS: lots kB\n"), None);
        // This process has both.
        let me = std::process::id() as i32;
        assert!(fd_count(me).is_some_and(|n| n >= 3));
        let text = std::fs::read_to_string(format!("/proc/{me}/status")).unwrap();
        assert!(vm_rss_kib(&text).is_some_and(|k| k > 0));
    }

    #[test]
    fn subscription_states_sum_over_transports() {
        let load = states(METRICS, "continuum_dynamo_load_subscriptions");
        assert_eq!(
            load,
            States {
                connected: 4,
                connecting: 0,
                pending: 0,
                backoff: 1
            }
        );
        assert_eq!(load.text(), "4c 1b");
        let kv = states(METRICS, "continuum_dynamo_kv_subscriptions");
        assert_eq!(kv.text(), "4c");
        assert_eq!(States::default().text(), "0");
        // A metric whose name extends another is not read as it.
        assert_eq!(
            states(METRICS, "continuum_dynamo_load_subscription").text(),
            "0"
        );
    }

    #[test]
    fn counter_deltas() {
        let before = "continuum_dynamo_repicks_total{reason=\"connect_failed\"} 1\n";
        assert_eq!(
            counter_delta(before, METRICS, "continuum_dynamo_repicks_total", "reason"),
            "connect_failed=2, stream_reset=1"
        );
        assert_eq!(
            counter_delta("", "", "continuum_dynamo_repicks_total", "reason"),
            "none"
        );
        // A label name ending in another's is not it.
        assert_eq!(
            label_of("{xreason=\"a\",reason=\"b\"}", "reason"),
            Some("b")
        );
        assert_eq!(label_of("{state=\"a\"}", "reason"), None);
    }
}
