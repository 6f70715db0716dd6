//! The report of `faults`: one table, a row per scenario and row kind with what was injected
//! and the figures, then per row its notes (injection details, the router's counters, the
//! first failures), the scenarios that did not run, and the `worker-kill` headline.
//!
//! Invariants: rendering is pure (rows in, text out); columns are as wide as their widest cell;
//! a figure that could not be read is `?`.

use std::io::Write;

use super::classify::Tally;
use super::inject::{Scenario, Target};
use super::observe::{Snapshot, States};

/// One row that ran.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The scenario.
    pub(crate) scenario: Scenario,
    /// Which hop the clients loaded.
    pub(crate) target: Target,
    /// What was injected (short).
    pub(crate) injected: String,
    /// The requests' classes.
    pub(crate) tally: Tally,
    /// Seconds of load.
    pub(crate) secs: f64,
    /// The client-facing process before the load.
    pub(crate) before: Snapshot,
    /// The same after the load (and the settle checks).
    pub(crate) after: Snapshot,
    /// Workers the router lists after the scenario, of the workers alive: (listed alive, alive,
    /// listed dead).
    pub(crate) listed: Option<(usize, usize, usize)>,
    /// Whether a chat completion through the router came back 200 after the scenario.
    pub(crate) routes_after: Option<bool>,
    /// Details.
    pub(crate) notes: Vec<String>,
}

/// `a→b`, each `?` when unknown.
fn arrow<T>(a: Option<T>, b: Option<T>, f: impl Fn(T) -> String) -> String {
    let s = |v: Option<T>| v.map_or("?".to_owned(), &f);
    format!("{}→{}", s(a), s(b))
}

fn states(a: Option<States>, b: Option<States>) -> String {
    arrow(a, b, |s| s.text())
}

/// The table's header and cells of `row`.
const HEADER: [&str; 14] = [
    "scenario",
    "row",
    "injected",
    "sent",
    "ok",
    "failed",
    "slow",
    "lost",
    "failed by kind",
    "fds",
    "RSS MiB",
    "kv_metrics subs",
    "kv-events subs",
    "after",
];

fn cells(r: &Row) -> Vec<String> {
    let t = &r.tally;
    let after = match (r.listed, r.routes_after) {
        (Some((ok, alive, dead)), routes) => {
            let mut s = format!("lists {ok}/{alive}");
            if dead > 0 {
                s.push_str(&format!(" +{dead} dead"));
            }
            match routes {
                Some(true) => s.push_str(", routes"),
                Some(false) => s.push_str(", NOT routing"),
                None => {}
            }
            s
        }
        (None, Some(false)) => "NOT routing".to_owned(),
        _ => "-".to_owned(),
    };
    let (load, kv) = if r.target == Target::Router {
        (
            states(r.before.load, r.after.load),
            states(r.before.kv, r.after.kv),
        )
    } else {
        ("-".to_owned(), "-".to_owned())
    };
    vec![
        r.scenario.name().to_owned(),
        r.target.label().to_owned(),
        r.injected.clone(),
        t.sent.to_string(),
        t.ok.to_string(),
        t.failed.to_string(),
        t.slow.to_string(),
        t.lost.to_string(),
        t.kinds_text(),
        arrow(r.before.fds, r.after.fds, |n| n.to_string()),
        arrow(r.before.rss_kib, r.after.rss_kib, |k| {
            format!("{:.1}", k as f64 / 1024.0)
        }),
        load,
        kv,
        after,
    ]
}

/// Text columns (left-aligned); the others are right-aligned.
const LEFT: [usize; 4] = [0, 1, 2, 8];

/// Writes `rows` as one table, columns padded to their widest cell.
pub(crate) fn table(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    let mut grid: Vec<Vec<String>> = vec![HEADER.iter().map(|h| (*h).to_owned()).collect()];
    grid.extend(rows.iter().map(cells));
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|c| grid.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for (i, r) in grid.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| {
                let pad = " ".repeat(w - cell.chars().count());
                if LEFT.contains(&c) {
                    format!("{cell}{pad}")
                } else {
                    format!("{pad}{cell}")
                }
            })
            .collect();
        writeln!(out, "{}", line.join(" | ").trim_end())?;
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            writeln!(out, "{}", rule.join("-|-"))?;
        }
    }
    Ok(())
}

/// The whole report: the table, each row's notes, what did not run, and the headline.
pub(crate) fn render(
    out: &mut impl Write,
    rows: &[Row],
    missing: &[(Scenario, Target, String)],
) -> std::io::Result<()> {
    table(out, rows)?;
    for r in rows {
        writeln!(
            out,
            "\n{} / {} ({:.1} s of load):",
            r.scenario.name(),
            r.target.label(),
            r.secs
        )?;
        for n in &r.notes {
            // A note indented by two spaces continues the one before it.
            match n.strip_prefix("  ") {
                Some(more) => writeln!(out, "      {more}")?,
                None => writeln!(out, "  - {n}")?,
            }
        }
    }
    for (s, t, why) in missing {
        writeln!(out, "\n{} / {}: NOT RUN: {why}", s.name(), t.label())?;
    }
    if let Some(h) = headline(rows) {
        writeln!(out, "\n{h}")?;
    }
    Ok(())
}

/// `worker-kill`: whether the router failed no more requests than Dynamo's KV router.
pub(crate) fn headline(rows: &[Row]) -> Option<String> {
    let failed = |t: Target| {
        rows.iter()
            .find(|r| r.scenario == Scenario::WorkerKill && r.target == t)
            .map(|r| r.tally.failed + r.tally.lost)
    };
    let (router, dynamo) = (failed(Target::Router)?, failed(Target::Dynamo)?);
    let verdict = if router <= dynamo { "PASS" } else { "FAIL" };
    Some(format!(
        "worker-kill headline: router failed+lost {router} <= dynamo kv failed+lost {dynamo}: \
         {verdict}"
    ))
}

#[cfg(test)]
mod tests {
    use super::super::classify::{FailKind, Outcome};
    use super::*;

    fn row(scenario: Scenario, target: Target, fails: usize) -> Row {
        let mut tally = Tally::default();
        for _ in 0..10 {
            tally.add(&Outcome::Ok, 0.3);
        }
        for _ in 0..fails {
            tally.add(
                &Outcome::Failed {
                    kind: FailKind::SseError,
                    detail: String::new(),
                },
                0.3,
            );
        }
        let snap = |fds, kib, c| Snapshot {
            fds: Some(fds),
            rss_kib: Some(kib),
            load: Some(States {
                connected: c,
                ..States::default()
            }),
            kv: None,
            listed: None,
        };
        Row {
            scenario,
            target,
            injected: "SIGKILL worker 1 @3.0s".into(),
            tally,
            secs: 9.04,
            before: snap(31, 20480, 4),
            after: snap(33, 21504, 3),
            listed: (target == Target::Router).then_some((3, 3, 0)),
            routes_after: (target == Target::Router).then_some(true),
            notes: vec!["repicks: none".into()],
        }
    }

    #[test]
    fn the_table_lines_up() {
        let rows = [
            row(Scenario::WorkerKill, Target::Dynamo, 3),
            row(Scenario::WorkerKill, Target::Router, 0),
        ];
        let mut out = Vec::new();
        table(&mut out, &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let bars = |l: &str| {
            l.char_indices()
                .filter(|(_, c)| *c == '|')
                .map(|(i, _)| l[..i].chars().count())
                .collect::<Vec<_>>()
        };
        assert_eq!(bars(lines[0]), bars(lines[2]), "{text}");
        assert_eq!(bars(lines[0]), bars(lines[3]), "{text}");
        assert!(lines[2].starts_with("worker-kill | dynamo kv | SIGKILL worker 1 @3.0s |"));
        assert!(lines[2].contains("sse-error=3"));
        assert!(lines[2].contains("31→33"));
        assert!(lines[2].contains("20.0→21.0"));
        assert!(lines[3].contains("4c→3c"));
        assert!(lines[3].contains("?→?"));
        assert!(lines[3].ends_with("lists 3/3, routes"));
    }

    #[test]
    fn the_report_and_its_headline() {
        let rows = [
            row(Scenario::WorkerKill, Target::Dynamo, 3),
            row(Scenario::WorkerKill, Target::Router, 1),
        ];
        let missing = [(
            Scenario::ReloadStorm,
            Target::Router,
            "router not built".to_owned(),
        )];
        let mut out = Vec::new();
        render(&mut out, &rows, &missing).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\nworker-kill / router (9.0 s of load):\n  - repicks: none\n"));
        assert!(text.contains("reload-storm / router: NOT RUN: router not built"));
        assert!(
            text.trim_end()
                .ends_with("router failed+lost 1 <= dynamo kv failed+lost 3: PASS")
        );
        let worse = [
            row(Scenario::WorkerKill, Target::Dynamo, 0),
            row(Scenario::WorkerKill, Target::Router, 2),
        ];
        assert!(headline(&worse).unwrap().ends_with("FAIL"));
        assert_eq!(headline(&worse[..1]), None);
    }
}
