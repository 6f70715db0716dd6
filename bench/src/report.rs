//! Rendering of measurements: one table per scenario (and round) plus
//! router/nginx ratios, and with several rounds or a second router binary a
//! summary: each ratio per round and its median, new/old included.
//!
//! Invariant: pure formatting over [`Measurement`]s; a missing router row
//! prints the reason instead of ratios, never made-up numbers; a ratio
//! whose side is missing is left out of its median.

use std::io::Write;

use crate::cpu::CpuTime;
use crate::wrk::WrkReport;

/// Everything measured for one server in one scenario.
#[derive(Debug, Clone)]
pub(crate) struct Measurement {
    /// `nginx`, `router`, or the other revision's label.
    pub(crate) server: String,
    /// CPUs the server was given.
    pub(crate) server_cpus: usize,
    /// wrk's report of the measured run.
    pub(crate) wrk: WrkReport,
    /// Wall time of the measured run, seconds.
    pub(crate) elapsed: f64,
    /// CPU of the server process tree during the run.
    pub(crate) server_cpu: CpuTime,
    /// CPU of the backend during the run.
    pub(crate) backend_cpu: CpuTime,
    /// CPU of wrk during the run.
    pub(crate) wrk_cpu: CpuTime,
    /// Busy CPU of everything else on the machine during the run.
    pub(crate) other_cpu: f64,
}

impl Measurement {
    /// Requests served per server CPU-second.
    pub(crate) fn req_per_cpu_s(&self) -> f64 {
        let cpu = self.server_cpu.total();
        if cpu > 0.0 {
            self.wrk.requests as f64 / cpu
        } else {
            f64::NAN
        }
    }

    /// Server CPU as a share of the CPUs it was given, percent.
    fn utilisation(&self) -> f64 {
        100.0 * self.server_cpu.total() / (self.elapsed * self.server_cpus as f64)
    }

    fn user_share(&self) -> f64 {
        100.0 * self.server_cpu.user / self.server_cpu.total().max(f64::MIN_POSITIVE)
    }
}

/// Table header, printed once per scenario.
const COLUMNS: &str = "server        req/s      p50      p99  srv cpu-s   util  usr/sys  \
                       req/cpu-s  backend cpu-s  wrk cpu-s  other cpu-s  errors";

/// One router row of a scenario: its name and what was measured, or why not.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    /// `router` or the other revision's label.
    pub(crate) name: &'a str,
    /// The measurement, or why there is none.
    pub(crate) measured: Result<&'a Measurement, &'a str>,
}

/// Prints one scenario: nginx's row, each router's row and, for each router that ran, its ratios
/// to nginx.
pub(crate) fn scenario(
    out: &mut impl Write,
    title: &str,
    nginx: &Measurement,
    routers: &[Row<'_>],
) -> std::io::Result<()> {
    writeln!(out, "\n== {title} ==")?;
    writeln!(out, "{COLUMNS}")?;
    row(out, nginx)?;
    for r in routers {
        match r.measured {
            Ok(m) => row(out, m)?,
            Err(why) => writeln!(out, "{:<8} (not measured: {why})", r.name)?,
        }
    }
    for r in routers {
        if let Ok(m) = r.measured {
            let eff = m.req_per_cpu_s() / nginx.req_per_cpu_s();
            let thr = m.wrk.rps / nginx.wrk.rps;
            let p99 = m.wrk.p99_us / nginx.wrk.p99_us;
            writeln!(
                out,
                "{}/nginx: efficiency (req per CPU-s) {eff:.2}x (higher is better), \
                 throughput {thr:.2}x (higher is better), p99 {p99:.2}x (lower is better)",
                r.name
            )?;
        }
    }
    let measured = routers.iter().filter_map(|r| r.measured.ok());
    for m in std::iter::once(nginx).chain(measured) {
        let errors = m.wrk.non_2xx + m.wrk.socket_errors;
        if errors > 0 {
            writeln!(
                out,
                "warning: {}: {} non-2xx responses, {} socket errors; its figures include failures",
                m.server, m.wrk.non_2xx, m.wrk.socket_errors
            )?;
        }
    }
    Ok(())
}

/// The ratios of one round (NaN where a side is missing).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round {
    /// Router req per CPU-s / nginx's.
    pub(crate) eff: f64,
    /// Router p99 / nginx's.
    pub(crate) p99: f64,
    /// The other revision's req per CPU-s / nginx's.
    pub(crate) old_eff: f64,
    /// The other revision's p99 / nginx's.
    pub(crate) old_p99: f64,
    /// Router req per CPU-s / the other revision's.
    pub(crate) new_old_eff: f64,
    /// Router req/s / the other revision's.
    pub(crate) new_old_thr: f64,
    /// Router p99 / the other revision's.
    pub(crate) new_old_p99: f64,
}

impl Round {
    /// The ratios of a round from nginx's measurement and the routers' (`router` and the other
    /// revision, by name; any other name is the other revision).
    pub(crate) fn of(nginx: &Measurement, routers: &[(&str, Result<Measurement, String>)]) -> Self {
        let find = |new: bool| {
            routers
                .iter()
                .find(|(name, _)| (*name == "router") == new)
                .and_then(|(_, m)| m.as_ref().ok())
        };
        let (new, old) = (find(true), find(false));
        fn ratio(
            a: Option<&Measurement>,
            b: Option<&Measurement>,
            f: fn(&Measurement) -> f64,
        ) -> f64 {
            match (a, b) {
                (Some(a), Some(b)) => f(a) / f(b),
                _ => f64::NAN,
            }
        }
        let eff = |m: &Measurement| m.req_per_cpu_s();
        let p99 = |m: &Measurement| m.wrk.p99_us;
        let thr = |m: &Measurement| m.wrk.rps;
        Round {
            eff: ratio(new, Some(nginx), eff),
            p99: ratio(new, Some(nginx), p99),
            old_eff: ratio(old, Some(nginx), eff),
            old_p99: ratio(old, Some(nginx), p99),
            new_old_eff: ratio(new, old, eff),
            new_old_thr: ratio(new, old, thr),
            new_old_p99: ratio(new, old, p99),
        }
    }
}

/// The median of the finite values of `v` (NaN when there is none): a round whose router did
/// not run leaves its ratio out.
pub(crate) fn median(v: &[f64]) -> f64 {
    crate::numbers::median(v.iter().copied().filter(|x| x.is_finite()).collect())
}

/// Prints the summary of a scenario's rounds: each ratio per round, then its median; the
/// new/old lines only when the other revision was measured.
pub(crate) fn summary(
    out: &mut impl Write,
    title: &str,
    old: &str,
    rounds: &[Round],
) -> std::io::Result<()> {
    writeln!(out, "\n== summary: {title}, {} round(s) ==", rounds.len())?;
    let line = |out: &mut dyn Write, what: &str, f: fn(&Round) -> f64| -> std::io::Result<()> {
        let v: Vec<f64> = rounds.iter().map(f).collect();
        if v.iter().all(|x| !x.is_finite()) {
            return Ok(());
        }
        let each: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
        writeln!(
            out,
            "{what:<40} {:>6.2}x   (rounds: {})",
            median(&v),
            each.join(" ")
        )
    };
    line(out, "router/nginx efficiency (higher better)", |r| r.eff)?;
    line(out, "router/nginx p99 (lower better)", |r| r.p99)?;
    line(out, &format!("{old}/nginx efficiency"), |r| r.old_eff)?;
    line(out, &format!("{old}/nginx p99"), |r| r.old_p99)?;
    line(out, &format!("new/{old} efficiency (higher better)"), |r| {
        r.new_old_eff
    })?;
    line(out, &format!("new/{old} throughput (higher better)"), |r| {
        r.new_old_thr
    })?;
    line(out, &format!("new/{old} p99 (lower better)"), |r| {
        r.new_old_p99
    })?;
    Ok(())
}

fn row(out: &mut impl Write, m: &Measurement) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<8} {:>10.0} {:>8} {:>8} {:>10.2} {:>5.0}% {:>3.0}/{:<3.0}  {:>9.0} {:>14.2} {:>10.2} {:>12.2} {:>7}",
        m.server,
        m.wrk.rps,
        latency(m.wrk.p50_us),
        latency(m.wrk.p99_us),
        m.server_cpu.total(),
        m.utilisation(),
        m.user_share(),
        100.0 - m.user_share(),
        m.req_per_cpu_s(),
        m.backend_cpu.total(),
        m.wrk_cpu.total(),
        m.other_cpu,
        m.wrk.non_2xx + m.wrk.socket_errors,
    )
}

/// Microseconds as wrk would print them.
fn latency(us: f64) -> String {
    if us < 1e3 {
        format!("{us:.0}us")
    } else if us < 1e6 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(server: &str, rps: f64, cpu: f64) -> Measurement {
        Measurement {
            server: server.to_owned(),
            server_cpus: 1,
            wrk: WrkReport {
                requests: (rps * 10.0) as u64,
                rps,
                p50_us: 900.0,
                p99_us: 2500.0,
                non_2xx: 0,
                socket_errors: 0,
            },
            elapsed: 10.0,
            server_cpu: CpuTime {
                user: cpu / 2.0,
                system: cpu / 2.0,
            },
            backend_cpu: CpuTime::default(),
            wrk_cpu: CpuTime::default(),
            other_cpu: 0.0,
        }
    }

    #[test]
    fn ratios_and_missing_router() {
        let mut buf = Vec::new();
        let r = m("router", 2000.0, 10.0);
        let rows = [Row {
            name: "router",
            measured: Ok(&r),
        }];
        scenario(&mut buf, "t", &m("nginx", 1000.0, 10.0), &rows).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("efficiency (req per CPU-s) 2.00x"), "{s}");
        assert!(s.contains("throughput 2.00x"), "{s}");
        assert!(s.contains("900us") && s.contains("2.50ms"), "{s}");

        let mut buf = Vec::new();
        let rows = [Row {
            name: "router",
            measured: Err("no binary"),
        }];
        scenario(&mut buf, "t", &m("nginx", 1000.0, 10.0), &rows).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("not measured: no binary") && !s.contains("router/nginx"));
    }

    #[test]
    fn rounds_give_new_old_ratios_and_medians() {
        let nginx = m("nginx", 1000.0, 10.0);
        // The router serves 1.5x nginx's requests per CPU-s, the old revision 1.2x.
        let round = Round::of(
            &nginx,
            &[
                ("b6d6685", Ok(m("b6d6685", 1200.0, 10.0))),
                ("router", Ok(m("router", 1500.0, 10.0))),
            ],
        );
        assert!((round.eff - 1.5).abs() < 1e-9 && (round.old_eff - 1.2).abs() < 1e-9);
        assert!((round.new_old_eff - 1.25).abs() < 1e-9);
        assert!((round.new_old_p99 - 1.0).abs() < 1e-9);
        // A missing old revision leaves its ratios out, never a made-up figure.
        let alone = Round::of(&nginx, &[("router", Ok(m("router", 1100.0, 10.0)))]);
        assert!(alone.new_old_eff.is_nan() && (alone.eff - 1.1).abs() < 1e-9);
        let failed = Round::of(
            &nginx,
            &[
                ("router", Ok(m("router", 1100.0, 10.0))),
                ("b6d6685", Err("exited".into())),
            ],
        );
        assert!(failed.old_eff.is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, f64::NAN, 1.0]), 2.5);
        assert!(median(&[f64::NAN]).is_nan());
        let mut buf = Vec::new();
        summary(&mut buf, "t", "b6d6685", &[round, alone, round]).unwrap();
        let s = String::from_utf8(buf).unwrap();
        let line = |label: &str| {
            s.lines()
                .find(|l| l.starts_with(label))
                .map(|l| {
                    l[label.len()..]
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        };
        assert_eq!(
            line("router/nginx efficiency"),
            "(higher better) 1.50x (rounds: 1.50 1.10 1.50)",
            "{s}"
        );
        assert_eq!(
            line("new/b6d6685 efficiency"),
            "(higher better) 1.25x (rounds: 1.25 NaN 1.25)",
            "{s}"
        );
        // Without the other revision the new/old lines are left out.
        let mut buf = Vec::new();
        summary(&mut buf, "t", "old", &[alone]).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(
            !s.contains("new/old") && s.contains("router/nginx p99"),
            "{s}"
        );
    }
}
