//! `zmtp-ingest`: how fast the router's own ZMTP SUB path ingests `kv_metrics` messages, against
//! the `zeromq` crate's `SubSocket` receiving the same stream (issue goals: at least 2x the
//! `zeromq` crate, at least 1M messages/s on one core, no allocation per message, idle memory of
//! one subscription within the 2,624-byte budget of LOAD-ZMTP-15).
//!
//! One run, on loopback. A raw ZMTP PUB peer ([`publisher`]) blasts M distinct messages of the
//! real Dynamo shape to one subscriber at a time: first the baseline ([`baseline`]: zmq.rs
//! `SubSocket`, tokio current-thread), then the router path ([`router`]: `ZmtpSub` + 2 KiB reads
//! on monoio, as the shards run it, then the same state machine under a blocking std read loop).
//! Every subscriber decodes every message with `decode_kv_metrics` and checks the sequence.
//! Figures cover messages 2..=M (from the first message's arrival to the last's): wall time,
//! CPU time of the receiving thread (`CLOCK_THREAD_CPUTIME_ID`, split by `RUSAGE_THREAD`) and
//! allocations made by that thread (the bench's counting allocator).
//!
//! Invariants: nothing is written outside memory; every thread ends by the run's deadline; the
//! receivers and the publisher are pinned to different CPUs when there are at least two.

mod baseline;
pub(crate) mod publisher;
pub(crate) mod router;

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use continuum_core::dynamo_event::{DynamoReject, decode_kv_metrics};
use continuum_core::zmtp::limits::{IDLE_BUDGET_BYTES, READ_BUFFER_BYTES};
use continuum_core::zmtp::{SubscribeError, ZmtpError, ZmtpSub};

use crate::alloc::thread_allocations;
use crate::cpu;

/// Options of `zmtp-ingest`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IngestOptions {
    /// Messages per subscriber (M).
    pub(crate) messages: u64,
    /// Messages per publisher write.
    pub(crate) batch: usize,
    /// Seconds each subscriber may take before the run is abandoned.
    pub(crate) timeout_secs: u64,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self {
            messages: 2_000_000,
            batch: 1024,
            timeout_secs: 60,
        }
    }
}

/// Most messages `--messages` accepts.
pub(crate) const MAX_MESSAGES: u64 = publisher::MAX_MESSAGES;

/// Why a part of the run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IngestError {
    /// Building the messages failed (a bug of the bench).
    #[error("setup: {0}")]
    Setup(String),
    /// A socket or runtime operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The router's state machine refused the session.
    #[error("ZmtpSub refused the session: {0}")]
    Zmtp(#[from] ZmtpError),
    /// The router's state machine refused its topics.
    #[error("ZmtpSub::new: {0}")]
    Subscribe(#[from] SubscribeError),
    /// The `zeromq` crate failed.
    #[error("zeromq: {0}")]
    Zeromq(#[from] zeromq::ZmqError),
    /// The deadline passed first.
    #[error("{side}: deadline passed after {got} of {want} messages")]
    Timeout {
        /// Who ran out of time.
        side: &'static str,
        /// Messages handled.
        got: u64,
        /// Messages expected.
        want: u64,
    },
    /// The peer closed before every message arrived.
    #[error("{side}: connection closed after {got} of {want} messages")]
    Closed {
        /// Who saw the close.
        side: &'static str,
        /// Messages received.
        got: u64,
        /// Messages expected.
        want: u64,
    },
    /// The baseline (zeromq) subscriber produced no measurement; the report says why.
    #[error("the zeromq baseline was not measured")]
    NoBaseline,
    /// A thread of the run panicked.
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
}

impl From<IngestError> for crate::error::BenchError {
    fn from(e: IngestError) -> Self {
        Self::stage(crate::error::Stage::ZmtpIngest, e)
    }
}

/// Pins the calling thread to `cpu` (best effort: a failure only makes figures noisier).
pub(crate) fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it; sched_setaffinity(0)
    // targets the calling thread and only reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain data and clock_gettime only writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// User and system time of the calling thread in microseconds (`RUSAGE_THREAD`).
fn thread_user_sys_us() -> (u64, u64) {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let us = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    (us(ru.ru_utime), us(ru.ru_stime))
}

/// A stopwatch of the calling thread's CPU time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThreadClock(u64);

impl ThreadClock {
    /// Starts now.
    pub(crate) fn now() -> Self {
        Self(thread_cpu_ns())
    }

    /// CPU nanoseconds of this thread since [`ThreadClock::now`].
    pub(crate) fn elapsed_ns(self) -> u64 {
        thread_cpu_ns().saturating_sub(self.0)
    }
}

/// The receiving thread's counters at one instant.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    wall: Instant,
    cpu_ns: u64,
    user_us: u64,
    sys_us: u64,
    allocs: u64,
}

impl Snapshot {
    fn now() -> Self {
        let allocs = thread_allocations();
        let (user_us, sys_us) = thread_user_sys_us();
        Self {
            wall: Instant::now(),
            cpu_ns: thread_cpu_ns(),
            user_us,
            sys_us,
            allocs,
        }
    }
}

/// What a subscriber received, and its counters from the first message to the last.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    total: u64,
    received: u64,
    rejected: u64,
    /// Messages the state machine dropped whole (router only).
    pub(super) dropped: u64,
    gaps: u64,
    next_seq: u64,
    checksum: u64,
    idle_after_handshake: Option<usize>,
    idle_after_run: Option<usize>,
    start: Option<Snapshot>,
    end: Option<Snapshot>,
}

impl Tally {
    pub(super) fn new(total: u64) -> Self {
        Self {
            total,
            received: 0,
            rejected: 0,
            dropped: 0,
            gaps: 0,
            next_seq: publisher::SEQ_BASE,
            checksum: 0,
            idle_after_handshake: None,
            idle_after_run: None,
            start: None,
            end: None,
        }
    }

    /// Messages rejected, dropped, or out of sequence: 0 for a clean stream.
    pub(crate) fn anomalies(&self) -> u64 {
        self.rejected + self.gaps + self.dropped
    }

    /// Whether every message arrived.
    pub(super) fn done(&self) -> bool {
        self.received >= self.total
    }

    /// Decodes one message and checks its sequence; snapshots after the first and the last.
    pub(super) fn on_message(&mut self, frames: &[&[u8]]) {
        self.received += 1;
        match decode_kv_metrics(frames) {
            Ok(s) => {
                if s.sequence.0 != self.next_seq {
                    self.gaps += 1;
                }
                self.next_seq = s.sequence.0.wrapping_add(1);
                self.checksum = self
                    .checksum
                    .wrapping_add(s.load.kv_used_blocks.unwrap_or(0) ^ s.sequence.0);
            }
            Err(e) => self.reject(&e),
        }
        if self.received == 1 {
            self.start = Some(Snapshot::now());
        }
        if self.received == self.total {
            self.end = Some(Snapshot::now());
        }
    }

    fn reject(&mut self, e: &DynamoReject) {
        if self.rejected == 0 {
            eprintln!("zmtp-ingest: first rejected message: {e}");
        }
        self.rejected += 1;
    }

    /// The handshake completed; `capacity` is the state machine's buffered capacity.
    pub(super) fn on_ready(&mut self, capacity: usize) {
        self.idle_after_handshake = Some(capacity);
    }

    /// The run ended; `capacity` is the state machine's buffered capacity.
    pub(super) fn finish(&mut self, capacity: usize) {
        self.idle_after_run = Some(capacity);
    }

    pub(super) fn timeout(&self, side: &'static str) -> IngestError {
        IngestError::Timeout {
            side,
            got: self.received,
            want: self.total,
        }
    }

    pub(super) fn eof(&self, side: &'static str) -> IngestError {
        IngestError::Closed {
            side,
            got: self.received,
            want: self.total,
        }
    }

    /// The measured interval (messages 2..=M).
    pub(crate) fn measured(&self) -> Option<Measured> {
        let (a, b) = (self.start?, self.end?);
        Some(Measured {
            messages: self.received.saturating_sub(1).max(1),
            wall: b.wall.duration_since(a.wall),
            cpu_ns: b.cpu_ns.saturating_sub(a.cpu_ns),
            user_us: b.user_us.saturating_sub(a.user_us),
            sys_us: b.sys_us.saturating_sub(a.sys_us),
            allocs: b.allocs.saturating_sub(a.allocs),
        })
    }
}

/// Figures of one subscriber over the measured interval.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) messages: u64,
    pub(crate) wall: Duration,
    pub(crate) cpu_ns: u64,
    user_us: u64,
    sys_us: u64,
    allocs: u64,
}

impl Measured {
    pub(crate) fn rate(&self) -> f64 {
        self.messages as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub(crate) fn cpu_per_msg_ns(&self) -> f64 {
        self.cpu_ns as f64 / self.messages as f64
    }

    /// Messages per second of receiver CPU: what one core would sustain.
    pub(crate) fn per_core(&self) -> f64 {
        1e9 / self.cpu_per_msg_ns().max(1e-9)
    }

    pub(crate) fn allocs_per_msg(&self) -> f64 {
        self.allocs as f64 / self.messages as f64
    }

    /// The part of [`Measured::cpu_per_msg_ns`] spent in the kernel (split as `RUSAGE_THREAD`
    /// splits it).
    pub(crate) fn sys_per_msg_ns(&self) -> f64 {
        self.cpu_per_msg_ns() * self.sys_us as f64 / (self.user_us + self.sys_us).max(1) as f64
    }

    /// The part of [`Measured::cpu_per_msg_ns`] spent in user space.
    pub(crate) fn user_per_msg_ns(&self) -> f64 {
        self.cpu_per_msg_ns() - self.sys_per_msg_ns()
    }
}

/// One subscriber's run: its tally (or why it failed), the publisher's, and the machine's load.
struct Side {
    name: String,
    tally: Result<Tally, IngestError>,
    published: Result<publisher::Published, IngestError>,
    other_cpu_s: f64,
}

/// Which subscriber to run.
#[derive(Debug, Clone, Copy)]
enum Subscriber {
    Zeromq,
    RouterMonoio,
    RouterBlocking,
    /// The blocking loop with a larger read buffer: a diagnostic, not the router's path.
    BlockingLargeReads,
}

fn run_side(
    which: Subscriber,
    opts: IngestOptions,
    template: &publisher::Template,
    cpus: Option<(usize, usize)>,
) -> Side {
    let deadline = Instant::now() + Duration::from_secs(opts.timeout_secs);
    let total = opts.messages;
    let (recv_cpu, pub_cpu) = match cpus {
        Some((r, p)) => (Some(r), Some(p)),
        None => (None, None),
    };
    let mut name = match which {
        Subscriber::Zeromq => "zeromq 0.7 SubSocket (tokio current_thread)".to_owned(),
        Subscriber::RouterMonoio => "router ZmtpSub, monoio".to_owned(),
        Subscriber::RouterBlocking => "router ZmtpSub, blocking std read".to_owned(),
        Subscriber::BlockingLargeReads => format!(
            "diagnostic: blocking, {} KiB reads",
            router::DIAGNOSTIC_READ_BYTES / 1024
        ),
    };
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(source) => {
            let e = || IngestError::Io {
                what: "binding the publisher",
                source: std::io::Error::new(source.kind(), source.to_string()),
            };
            return Side {
                name,
                tally: Err(e()),
                published: Err(e()),
                other_cpu_s: 0.0,
            };
        }
    };
    let addr: Result<SocketAddr, _> = listener.local_addr();
    let busy_before = cpu::machine_busy().ok();
    let (tally, published, threads_cpu_ns) = std::thread::scope(|s| {
        let publisher =
            s.spawn(|| publisher::run(&listener, template, total, opts.batch, deadline, pub_cpu));
        let receiver = s.spawn(|| {
            let addr = addr.map_err(|source| IngestError::Io {
                what: "publisher address",
                source,
            })?;
            let clock = ThreadClock::now();
            let received = match which {
                Subscriber::Zeromq => {
                    baseline::run(addr, total, deadline, recv_cpu).map(|t| (t, None))
                }
                Subscriber::RouterMonoio => router::run_monoio(addr, total, deadline, recv_cpu)
                    .map(|(t, driver)| (t, Some(driver))),
                Subscriber::RouterBlocking => {
                    router::run_blocking::<READ_BUFFER_BYTES>(addr, total, deadline, recv_cpu)
                        .map(|t| (t, None))
                }
                Subscriber::BlockingLargeReads => router::run_blocking::<
                    { router::DIAGNOSTIC_READ_BYTES },
                >(addr, total, deadline, recv_cpu)
                .map(|t| (t, None)),
            };
            received.map(|(t, driver)| (t, driver, clock.elapsed_ns()))
        });
        let received = receiver
            .join()
            .unwrap_or(Err(IngestError::Panicked("receiver")));
        let published = publisher
            .join()
            .unwrap_or(Err(IngestError::Panicked("publisher")));
        let mut cpu_ns = published.as_ref().map(|p| p.cpu_ns).unwrap_or(0);
        let tally = received.map(|(t, driver, ns)| {
            cpu_ns += ns;
            (t, driver)
        });
        (tally, published, cpu_ns)
    });
    let other_cpu_s = match (busy_before, cpu::machine_busy().ok()) {
        (Some(a), Some(b)) => (b.since(a).total() - threads_cpu_ns as f64 / 1e9).max(0.0),
        _ => 0.0,
    };
    let tally = tally.map(|(t, driver)| {
        if let Some(d) = driver {
            let _ = write!(name, " ({d})");
        }
        t
    });
    Side {
        name,
        tally,
        published,
        other_cpu_s,
    }
}

/// CPU nanoseconds per `decode_kv_metrics` of the template message, alone (no transport): the
/// part of every subscriber's per-message cost that is the same on both sides.
fn decode_only_ns(template: &publisher::Template, rounds: u64) -> f64 {
    let frames: Vec<&[u8]> = template.frames.iter().map(Vec::as_slice).collect();
    let clock = ThreadClock::now();
    for _ in 0..rounds {
        let _ = std::hint::black_box(decode_kv_metrics(std::hint::black_box(&frames)));
    }
    clock.elapsed_ns() as f64 / rounds.max(1) as f64
}

/// Runs the subscribers against the same stream and renders the report. Fails only if
/// the baseline could not be measured.
pub(crate) fn run(opts: IngestOptions) -> Result<String, IngestError> {
    let template = publisher::Template::new()?;
    let ncpu = std::thread::available_parallelism().map_or(1, usize::from);
    let cpus = (ncpu >= 2).then_some((0, 1));
    let sides: Vec<Side> = [
        Subscriber::Zeromq,
        Subscriber::RouterMonoio,
        Subscriber::RouterBlocking,
        Subscriber::BlockingLargeReads,
    ]
    .into_iter()
    .map(|w| {
        eprintln!("zmtp-ingest: {w:?}: {} messages ...", opts.messages);
        run_side(w, opts, &template, cpus)
    })
    .collect();
    if let Some((cpu, _)) = cpus {
        pin_to_cpu(cpu);
    }
    let decode_ns = decode_only_ns(&template, opts.messages.min(1_000_000));
    let report = render(opts, &template, cpus, &sides, decode_ns);
    match sides.first().map(|s| &s.tally) {
        Some(Ok(t)) if t.measured().is_some() => Ok(report),
        _ => {
            // The report still says what was measured and why the baseline failed.
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(report.as_bytes());
            Err(IngestError::NoBaseline)
        }
    }
}

fn render(
    opts: IngestOptions,
    template: &publisher::Template,
    cpus: Option<(usize, usize)>,
    sides: &[Side],
    decode_ns: f64,
) -> String {
    let mut r = String::new();
    let msg_len = template.wire.len();
    let _ = writeln!(
        r,
        "zmtp-ingest: {m} kv_metrics messages per subscriber over loopback, {msg_len} B each on \
         the wire (4 frames: topic, publisher id, sequence, msgpack map EventEnvelope around an \
         ActiveLoad), sequences increasing from {base}",
        m = opts.messages,
        base = publisher::SEQ_BASE,
    );
    let _ = writeln!(
        r,
        "publisher: raw ZMTP 3.1 PUB on a std thread (greeting, READY Socket-Type PUB, then \
         {b} pre-encoded messages = {kib:.0} KiB per write_all, sequences patched in place)",
        b = opts.batch,
        kib = (opts.batch * msg_len) as f64 / 1024.0,
    );
    let _ = match cpus {
        Some((rc, pc)) => writeln!(
            r,
            "pinning: subscriber thread on CPU {rc}, publisher on CPU {pc}"
        ),
        None => writeln!(r, "pinning: none (fewer than 2 CPUs)"),
    };
    let _ = writeln!(
        r,
        "figures over messages 2..=M of each subscriber; cpu = the subscriber thread's \
         CLOCK_THREAD_CPUTIME_ID; allocs = allocations by that thread\n"
    );
    let _ = writeln!(
        r,
        "{:<48} {:>10} {:>11} {:>8} {:>8} {:>11} {:>11} {:>10} {:>11}",
        "subscriber (+ decode_kv_metrics per message)",
        "msgs/s",
        "cpu ns/msg",
        "usr ns",
        "sys ns",
        "msgs/cpu-s",
        "allocs/msg",
        "pub ns/msg",
        "other cpu-s"
    );
    for side in sides {
        match side.tally.as_ref().map(|t| (t, t.measured())) {
            Ok((t, Some(m))) => {
                let pub_ns = side
                    .published
                    .as_ref()
                    .map(|p| p.cpu_ns as f64 / p.messages.max(1) as f64)
                    .unwrap_or(f64::NAN);
                let _ = writeln!(
                    r,
                    "{:<48} {:>10.0} {:>11.1} {:>8.1} {:>8.1} {:>11.0} {:>11.4} {:>10.1} {:>11.2}",
                    side.name,
                    m.rate(),
                    m.cpu_per_msg_ns(),
                    m.user_per_msg_ns(),
                    m.sys_per_msg_ns(),
                    m.per_core(),
                    m.allocs_per_msg(),
                    pub_ns,
                    side.other_cpu_s,
                );
                if t.rejected + t.gaps + t.dropped > 0 {
                    let _ = writeln!(
                        r,
                        "  WARNING: {} rejected, {} sequence gaps, {} dropped: the figures are not \
                         of a clean stream",
                        t.rejected, t.gaps, t.dropped
                    );
                }
                std::hint::black_box(t.checksum);
            }
            Ok((_, None)) => {
                let _ = writeln!(r, "{:<48} not measured (no complete interval)", side.name);
            }
            Err(e) => {
                let _ = writeln!(r, "{:<48} FAILED: {e}", side.name);
            }
        }
    }
    let measured = |i: usize| {
        sides
            .get(i)
            .and_then(|s| s.tally.as_ref().ok())
            .and_then(Tally::measured)
    };
    let base = measured(0);
    let _ = writeln!(r);
    for (i, label) in [
        (1, "router (monoio)"),
        (2, "router (blocking)"),
        (3, "diagnostic (16 KiB reads)"),
    ] {
        if let (Some(b), Some(m)) = (base, measured(i)) {
            let _ = writeln!(
                r,
                "{label}/zeromq: throughput {t:.2}x (goal >= 2x), CPU per message {c:.2}x \
                 (lower is better; {e:.2}x the messages per CPU-second; user-space CPU {u:.2}x)",
                u = m.user_per_msg_ns() / b.user_per_msg_ns().max(1e-9),
                t = m.rate() / b.rate().max(1e-9),
                c = m.cpu_per_msg_ns() / b.cpu_per_msg_ns().max(1e-9),
                e = m.per_core() / b.per_core().max(1e-9),
            );
        }
    }
    let _ = writeln!(
        r,
        "decode_kv_metrics alone (same message, hot loop): {decode_ns:.1} ns; CPU per message \
         without it, i.e. the transport's own cost:"
    );
    for (i, side) in sides.iter().enumerate() {
        if let Some(m) = measured(i) {
            let own = m.cpu_per_msg_ns() - decode_ns;
            let vs = base.map_or(String::new(), |b| {
                format!(
                    "  ({:.2}x zeromq's)",
                    own / (b.cpu_per_msg_ns() - decode_ns).max(1e-9)
                )
            });
            let _ = writeln!(r, "  {:<46} {own:8.1} ns{vs}", side.name);
        }
    }
    if let Some(m) = measured(1) {
        let _ = writeln!(
            r,
            "router (monoio) on one core: {rate:.2}M msgs/s wall, {core:.2}M msgs per CPU-second \
             (goal >= 1M)",
            rate = m.rate() / 1e6,
            core = m.per_core() / 1e6,
        );
        let _ = writeln!(
            r,
            "router (monoio) allocations per message: {a:.4} ({n} allocations over {msgs} \
             messages; goal 0)",
            a = m.allocs_per_msg(),
            n = m.allocs,
            msgs = m.messages,
        );
    }
    if let Some(t) = sides.get(1).and_then(|s| s.tally.as_ref().ok()) {
        let held = t.idle_after_handshake.unwrap_or(0);
        let after = t.idle_after_run.unwrap_or(0);
        let _ = writeln!(
            r,
            "idle memory of one subscription: ZmtpSub buffers {held} B after the handshake \
             ({after} B after {m} messages) + {READ_BUFFER_BYTES} B read buffer = {sum} B \
             (budget {IDLE_BUDGET_BYTES} B); the ZmtpSub struct itself is {inline} B inline",
            m = opts.messages,
            sum = held + READ_BUFFER_BYTES,
            inline = std::mem::size_of::<ZmtpSub>(),
        );
    }
    if let Some(load) = cpu::loadavg() {
        let _ = writeln!(
            r,
            "load average at the end: {load:.2}; 'other cpu-s' is busy CPU of everything else \
             during each subscriber's run: when it is large, trust the CPU-per-message ratios \
             more than the msgs/s ones"
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run end to end: every subscriber (the zeromq baseline, the shards' driver on the
    /// shards' runtime, the blocking loops) receives every message and the report has its rows.
    #[test]
    fn a_small_run_measures_every_subscriber() {
        let opts = IngestOptions {
            messages: 20_000,
            batch: 256,
            timeout_secs: 30,
        };
        let report = run(opts).unwrap_or_else(|e| panic!("zmtp-ingest failed: {e}"));
        for row in ["router (monoio)/zeromq", "router (blocking)/zeromq"] {
            assert!(report.contains(row), "{row} missing from:\n{report}");
        }
    }
}
