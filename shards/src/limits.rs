//! Process limits the data plane depends on.
//!
//! Every `kv_metrics` subscription, client connection, upstream connection and watched file holds
//! a descriptor; with 1,000 workers the router needs over 1,000 for subscriptions alone, more
//! than the common soft limit of 1,024 (measured with `continuum-bench sim-hop --router-nofile`:
//! at 1,024 the router starts but fails nearly every request). At startup the soft
//! `RLIMIT_NOFILE` is raised to the hard limit, which needs no privilege.

/// The open-files limit before and after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit found at startup.
    pub before: u64,
    /// The soft limit now.
    pub after: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise_open_files_limit() -> std::io::Result<OpenFiles> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; raising the soft limit up to the hard one needs no
        // privilege and changes nothing else.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(OpenFiles {
        before,
        after: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}
