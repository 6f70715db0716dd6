//! Rendering of measurements: one table per scenario plus router/nginx
//! ratios.
//!
//! Invariant: pure formatting over [`Measurement`]s; a missing router row
//! prints the reason instead of ratios, never made-up numbers.

use std::io::Write;

use crate::cpu::CpuTime;
use crate::wrk::WrkReport;

/// Everything measured for one server in one scenario.
#[derive(Debug, Clone)]
pub(crate) struct Measurement {
    /// `nginx` or `router`.
    pub(crate) server: &'static str,
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

/// Prints one scenario: its rows and, if the router ran, the ratios.
pub(crate) fn scenario(
    out: &mut impl Write,
    title: &str,
    nginx: &Measurement,
    router: Result<&Measurement, &str>,
) -> std::io::Result<()> {
    writeln!(out, "\n== {title} ==")?;
    writeln!(out, "{COLUMNS}")?;
    row(out, nginx)?;
    match router {
        Ok(r) => {
            row(out, r)?;
            let eff = r.req_per_cpu_s() / nginx.req_per_cpu_s();
            let thr = r.wrk.rps / nginx.wrk.rps;
            let p99 = r.wrk.p99_us / nginx.wrk.p99_us;
            writeln!(
                out,
                "router/nginx: efficiency (req per CPU-s) {eff:.2}x (higher is better), \
                 throughput {thr:.2}x (higher is better), p99 {p99:.2}x (lower is better)"
            )?;
        }
        Err(why) => writeln!(out, "router        (not measured: {why})")?,
    }
    for m in std::iter::once(nginx).chain(router.ok()) {
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

    fn m(server: &'static str, rps: f64, cpu: f64) -> Measurement {
        Measurement {
            server,
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
        scenario(
            &mut buf,
            "t",
            &m("nginx", 1000.0, 10.0),
            Ok(&m("router", 2000.0, 10.0)),
        )
        .unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("efficiency (req per CPU-s) 2.00x"), "{s}");
        assert!(s.contains("throughput 2.00x"), "{s}");
        assert!(s.contains("900us") && s.contains("2.50ms"), "{s}");

        let mut buf = Vec::new();
        scenario(&mut buf, "t", &m("nginx", 1000.0, 10.0), Err("no binary")).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("not measured: no binary") && !s.contains("router/nginx"));
    }
}
