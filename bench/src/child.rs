//! Supervised child processes: pinned to CPUs at spawn, tied to the
//! driver's life, and torn down (with their descendants) on drop.
//!
//! Invariants: a [`Supervised`] owns exactly one child; dropping it always
//! leaves that child reaped and every descendant seen at drop time
//! signalled, whether the run succeeded or failed. If the driver itself
//! dies, the kernel sends the child SIGTERM (`PR_SET_PDEATHSIG`), which
//! nginx turns into a fast shutdown of its workers.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::cpu;
use crate::error::BenchError;

/// How long a child gets to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(3);

/// A running child process that is killed when dropped.
#[derive(Debug)]
pub(crate) struct Supervised {
    what: &'static str,
    child: Child,
    log: Option<PathBuf>,
}

impl Supervised {
    /// Spawns `cmd` pinned to `cpus`, with stdin closed. The caller sets
    /// stdout/stderr; `log` (if any) is quoted in error messages.
    pub(crate) fn spawn(
        what: &'static str,
        mut cmd: Command,
        cpus: &[usize],
        log: Option<&Path>,
    ) -> Result<Self, BenchError> {
        cmd.stdin(Stdio::null());
        Self::spawn_as_set(what, cmd, cpus, log)
    }

    /// Like [`spawn`](Self::spawn), but with stdin and stdout piped to the
    /// driver (for a child driven by commands on stdin, such as fleet.py).
    /// The caller sets stderr.
    pub(crate) fn spawn_piped(
        what: &'static str,
        mut cmd: Command,
        cpus: &[usize],
        log: Option<&Path>,
    ) -> Result<(Self, ChildStdin, ChildStdout), BenchError> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut s = Self::spawn_as_set(what, cmd, cpus, log)?;
        match (s.child.stdin.take(), s.child.stdout.take()) {
            (Some(stdin), Some(stdout)) => Ok((s, stdin, stdout)),
            _ => Err(BenchError::io(format!("piping {what}"))(
                std::io::Error::other("stdin or stdout not piped"),
            )),
        }
    }

    /// Spawns `cmd` as configured by the caller, pinned and tied to the driver.
    fn spawn_as_set(
        what: &'static str,
        mut cmd: Command,
        cpus: &[usize],
        log: Option<&Path>,
    ) -> Result<Self, BenchError> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let set = cpu_set(cpus);
        // SAFETY: getpid has no preconditions.
        let driver = unsafe { libc::getpid() };
        // SAFETY: the closure only makes async-signal-safe syscalls
        // (sched_setaffinity, prctl, getppid) on data copied before fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The driver died between fork and prctl: do not run orphaned.
                if libc::getppid() != driver {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| BenchError::Spawn {
            what,
            program,
            source,
        })?;
        Ok(Self {
            what,
            child,
            log: log.map(Path::to_path_buf),
        })
    }

    /// The child's pid.
    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// Role of the child, for messages.
    pub(crate) fn what(&self) -> &'static str {
        self.what
    }

    /// Errors if the child has exited.
    pub(crate) fn ensure_running(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(BenchError::ExitedEarly {
                what: self.what,
                status,
                log: self.log_tail(),
            }),
            Err(e) => Err(BenchError::io(format!("waiting for {}", self.what))(e)),
        }
    }

    /// Waits for the child to exit on its own, at most until `deadline`.
    /// Returns `None` on timeout (the child is still running).
    pub(crate) fn wait_until(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<ExitStatus>, BenchError> {
        loop {
            if crate::signals::interrupted() {
                return Err(BenchError::Interrupted);
            }
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(Some(status)),
                Ok(None) if Instant::now() < deadline => sleep(Duration::from_millis(20)),
                Ok(None) => return Ok(None),
                Err(e) => return Err(BenchError::io(format!("waiting for {}", self.what))(e)),
            }
        }
    }

    /// Polls for exit for up to `grace`, ignoring interrupts (used on drop).
    pub(crate) fn reaped_within(&mut self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    /// Last lines of the child's log, prefixed with a newline, or empty.
    pub(crate) fn log_tail(&self) -> String {
        let Some(path) = &self.log else {
            return String::new();
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return String::new();
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
        if tail.is_empty() {
            String::new()
        } else {
            format!("\n  last lines of {}:\n  {tail}", path.display())
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = self.pid();
        let descendants = cpu::descendants(pid);
        // SAFETY: kill has no memory-safety preconditions; `pid` is our
        // unreaped child, so it cannot have been recycled.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        if !self.reaped_within(GRACE) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for d in descendants {
            if Path::new(&format!("/proc/{d}")).exists() {
                // SAFETY: as above; `d` was our descendant a moment ago.
                unsafe { libc::kill(d, libc::SIGKILL) };
            }
        }
    }
}

/// A `cpu_set_t` holding exactly `cpus`.
fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bitmask; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let limit = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    for &cpu in cpus.iter().filter(|&&c| c < limit) {
        // SAFETY: `cpu` is below CPU_SETSIZE, so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    set
}

/// Number of CPUs this process may run on.
pub(crate) fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `explicit`, else the program `name` next to this executable (where cargo
/// puts the router next to the bench).
pub(crate) fn sibling_or(explicit: Option<&Path>, name: &str) -> Result<PathBuf, BenchError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().map_err(BenchError::io("locating continuum-bench"))?;
    Ok(exe.with_file_name(name))
}

/// Sets the driver's nice value; every child spawned afterwards inherits it.
pub(crate) fn set_nice(nice: i32) -> Result<(), BenchError> {
    // SAFETY: setpriority has no memory-safety preconditions. `who = 0` is
    // the calling thread, which is still the driver's only thread; threads
    // and children created later inherit the value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc != 0 {
        return Err(BenchError::io(format!(
            "setting nice {nice} (a negative value needs CAP_SYS_NICE)"
        ))(std::io::Error::last_os_error()));
    }
    Ok(())
}
