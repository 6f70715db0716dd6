//! CPU accounting from `/proc` and getrusage: per process tree (utime +
//! stime of a pid and all its live descendants), machine-wide busy time,
//! reaped children (for wrk) and the driver's own process (for an
//! in-process fleet).
//!
//! Invariant: all figures are in seconds, converted from clock ticks with
//! the kernel's `_SC_CLK_TCK`; sampling never follows a pid outside the
//! sampled tree.

use std::fs;

use crate::error::BenchError;

/// CPU consumed, split into user and kernel time, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CpuTime {
    /// Time in user mode.
    pub(crate) user: f64,
    /// Time in kernel mode.
    pub(crate) system: f64,
}

impl CpuTime {
    /// User plus kernel time.
    pub(crate) fn total(self) -> f64 {
        self.user + self.system
    }

    /// Time consumed between `before` and `self`.
    pub(crate) fn since(self, before: Self) -> Self {
        Self {
            user: (self.user - before.user).max(0.0),
            system: (self.system - before.system).max(0.0),
        }
    }
}

/// The fields of `/proc/<pid>/stat` the bench needs.
#[derive(Debug, Clone, Copy)]
struct Stat {
    ppid: i32,
    utime: u64,
    stime: u64,
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

fn read_stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses one `/proc/<pid>/stat` line. The command name may contain spaces
/// and parentheses, so fields are counted from the last `)`.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state) of proc(5).
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        utime: fields.get(11)?.parse().ok()?,
        stime: fields.get(12)?.parse().ok()?,
    })
}

fn all_stats() -> Vec<(i32, Stat)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, read_stat(pid)?)))
        .collect()
}

/// Live descendants of `root` (children, grandchildren, ...), not `root`.
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let stats = all_stats();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            stats
                .iter()
                .filter(|(_, s)| s.ppid == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// CPU time of `root` and its live descendants (e.g. nginx master + workers;
/// the router's threads are already included in its own line).
pub(crate) fn tree(root: i32) -> Result<CpuTime, BenchError> {
    let hz = ticks_per_second();
    let mut ticks = read_stat(root).ok_or(BenchError::ProcStat { pid: root })?;
    for pid in descendants(root) {
        if let Some(s) = read_stat(pid) {
            ticks.utime += s.utime;
            ticks.stime += s.stime;
        }
    }
    Ok(CpuTime {
        user: ticks.utime as f64 / hz,
        system: ticks.stime as f64 / hz,
    })
}

/// Busy CPU time of the whole machine (all CPUs) from `/proc/stat`.
pub(crate) fn machine_busy() -> Result<CpuTime, BenchError> {
    let text = fs::read_to_string("/proc/stat").map_err(BenchError::io("reading /proc/stat"))?;
    let line = text.lines().next().unwrap_or_default();
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let hz = ticks_per_second();
    Ok(CpuTime {
        user: (get(0) + get(1)) as f64 / hz,
        system: (get(2) + get(5) + get(6) + get(7)) as f64 / hz,
    })
}

/// CPU time of all reaped children of the driver (getrusage).
pub(crate) fn reaped_children() -> CpuTime {
    rusage(libc::RUSAGE_CHILDREN)
}

/// CPU time of the driver's own process, all its threads (getrusage), e.g.
/// an in-process simulated fleet; children are not included.
pub(crate) fn own_process() -> CpuTime {
    rusage(libc::RUSAGE_SELF)
}

fn rusage(who: libc::c_int) -> CpuTime {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    CpuTime {
        user: secs(ru.ru_utime),
        system: secs(ru.ru_stime),
    }
}

/// Busy CPU seconds of the machine (`machine`) not accounted for by
/// `parts`, never below 0.
pub(crate) fn rest(machine: CpuTime, parts: &[CpuTime]) -> f64 {
    parts
        .iter()
        .fold(machine.total(), |left, p| left - p.total())
        .max(0.0)
}

/// 1-minute load average, if readable.
pub(crate) fn loadavg() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_comm() {
        let line = "42 (a) b (c) S 7 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 5 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.ppid, s.utime, s.stime), (7, 250, 75));
    }

    #[test]
    fn own_tree_is_readable() {
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(tree(me).is_ok());
        assert!(machine_busy().unwrap().total() > 0.0);
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {}
        assert!(own_process().total() > 0.0);
    }
}
