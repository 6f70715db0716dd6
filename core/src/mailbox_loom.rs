//! Loom model of a shard's wake-up after a publication (compiled only under
//! `cfg(all(test, loom))`).
//!
//! Role: the control → shard mailbox lives in `shards` and is made of OS sockets and a crossbeam
//! channel, which loom cannot run, so this module re-states its protocol with loom primitives
//! and checks it with the real [`super::PublishCell`]. What it mirrors:
//! - `shards/src/mailbox.rs`, `MailboxSender::send`: `self.tx.send(cmd)` (here
//!   [`Queue::send`]) THEN `(&self.doorbell).write(&[1])` on the nonblocking end of the socket
//!   pair, where `WouldBlock` (buffer full) is ignored (here [`Doorbell::ring`], with a buffer of
//!   one byte so that every ring while a byte is unread coalesces, the worst case);
//! - dropping the `MailboxSender` when the control thread ends closes its end: the shard's read
//!   then returns 0 once the buffer is empty (here [`Doorbell::close`]);
//! - `shards/src/shard/mod.rs`, `mailbox_loop`: `doorbell.read(buf)` of up to 64 bytes,
//!   returning on `Ok(0)` or an error (here [`Doorbell::read`]), THEN
//!   `while let Ok(cmd) = rx.try_recv() { shard.obey(cmd) }`, `Reload` being `reload()`, which
//!   starts with `self.cell.load()` (here [`shard`]).
//!
//! The crossbeam channel is modelled as a mutex-guarded queue: it is linearisable, and a send
//! happens before the `try_recv` that takes it, which is all the protocol relies on. The socket
//! is a mutex-guarded byte count with a condition variable: a write happens before the read that
//! returns its byte.
//!
//! Invariant checked (no lost wake-up): the control thread publishes generation 2, sends
//! `Reload`, publishes 3, sends `Reload`, and exits; the shard runs until the doorbell reads
//! end-of-file; it must by then have received both commands (a full doorbell never loses one)
//! and loaded generation 3. Negative controls loom must catch: the sender rings before enqueueing
//! (the shard can wake, find the queue empty and sleep through the command), and the shard takes
//! one command per wake-up (`if let` for `while let`: coalesced rings strand commands).
//!
//! As in `seqcell_loom.rs` (loom 0.7 misses races from the main thread, tokio-rs/loom#392): the
//! main thread only spawns and joins, control is spawned before the shard, and the positive
//! model asserts that loom explored runs both with and without a coalesced ring.
//!
//! Run: `CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" cargo test -p continuum-core --release --lib loom_models`

use std::collections::{BTreeSet, VecDeque};

use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
use loom::thread;

use super::loom_models::Snap;
use super::{Generation, PublishCell};
use crate::loom_support::Outcomes;

/// Bytes the doorbell holds before a write would block.
const DOORBELL_CAPACITY: usize = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The doorbell socket pair: unread bytes, and whether the control end is closed.
#[derive(Debug, Default)]
struct Doorbell {
    state: Mutex<(usize, bool)>,
    readable: Condvar,
}

impl Doorbell {
    /// A nonblocking one-byte write; `false` for `WouldBlock` (the caller ignores it).
    fn ring(&self) -> bool {
        let mut s = lock(&self.state);
        if s.0 == DOORBELL_CAPACITY {
            return false;
        }
        s.0 += 1;
        self.readable.notify_one();
        true
    }

    /// The control end goes away.
    fn close(&self) {
        lock(&self.state).1 = true;
        self.readable.notify_one();
    }

    /// A blocking read of up to 64 bytes: how many it took, 0 at end-of-file.
    fn read(&self) -> usize {
        let mut s = lock(&self.state);
        loop {
            if s.0 > 0 {
                let n = s.0.min(64);
                s.0 -= n;
                return n;
            }
            if s.1 {
                return 0;
            }
            s = self
                .readable
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// A shard command (only `Reload` matters here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Reload,
}

/// The command channel.
#[derive(Debug, Default)]
struct Queue(Mutex<VecDeque<Command>>);

impl Queue {
    fn send(&self, cmd: Command) {
        lock(&self.0).push_back(cmd);
    }

    fn try_recv(&self) -> Option<Command> {
        lock(&self.0).pop_front()
    }
}

/// The control thread's side.
#[derive(Debug, Clone, Copy)]
enum Sender {
    /// `MailboxSender::send`: enqueue, then ring.
    Real,
    /// BROKEN: ring, then enqueue.
    RingFirst,
}

/// The shard's side.
#[derive(Debug, Clone, Copy)]
enum Receiver {
    /// `mailbox_loop`: read the doorbell, then drain the channel until empty.
    Real,
    /// BROKEN: read the doorbell, then take at most one command.
    OnePerWake,
}

struct Mailbox {
    cell: PublishCell<Snap>,
    queue: Queue,
    doorbell: Doorbell,
}

/// `MailboxSender::send(Reload)`; returns whether the ring coalesced (`WouldBlock`).
fn send(m: &Mailbox, how: Sender) -> bool {
    match how {
        Sender::Real => {
            m.queue.send(Command::Reload);
            !m.doorbell.ring()
        }
        Sender::RingFirst => {
            let rang = m.doorbell.ring();
            m.queue.send(Command::Reload);
            !rang
        }
    }
}

/// The shard's mailbox task until end-of-file: `(commands received, generation loaded last)`.
fn shard(m: &Mailbox, how: Receiver) -> (usize, u64) {
    let (mut received, mut loaded) = (0, m.cell.load().generation());
    while m.doorbell.read() > 0 {
        let mut apply = |cmd| {
            assert_eq!(cmd, Command::Reload);
            received += 1;
            loaded = m.cell.load().generation();
        };
        match how {
            Receiver::Real => {
                while let Some(cmd) = m.queue.try_recv() {
                    apply(cmd);
                }
            }
            Receiver::OnePerWake => {
                if let Some(cmd) = m.queue.try_recv() {
                    apply(cmd);
                }
            }
        }
    }
    (received, loaded)
}

/// What one execution ended with: `(commands received, last generation loaded, whether a ring
/// coalesced)`.
type Outcome = (usize, u64, bool);

/// Runs the protocol under loom; panics on a lost wake-up.
fn model(sender: Sender, receiver: Receiver) -> (usize, BTreeSet<Outcome>) {
    let seen = Outcomes::new();
    let sink = seen.handle();
    let mut builder = loom::model::Builder::new();
    // Larger than the preemptions of any execution here, so nothing is pruned; unlike `None`, a
    // bound also makes loom add bounded DPOR's conservative backtracking points, which explore
    // more executions and make up for part of what loom#392 misses.
    builder.preemption_bound = Some(100);
    builder.check(move || {
        let m = Arc::new(Mailbox {
            cell: PublishCell::new(Snap(1)),
            queue: Queue::default(),
            doorbell: Doorbell::default(),
        });
        let control = {
            let m = m.clone();
            thread::spawn(move || {
                m.cell.publish(Snap(2));
                let first = send(&m, sender);
                m.cell.publish(Snap(3));
                let second = send(&m, sender);
                m.doorbell.close();
                first || second
            })
        };
        let shard = {
            let m = m.clone();
            thread::spawn(move || shard(&m, receiver))
        };
        let coalesced = control
            .join()
            .unwrap_or_else(|_| panic!("control panicked"));
        let (received, loaded) = shard.join().unwrap_or_else(|_| panic!("shard panicked"));
        assert!(
            received == 2 && loaded == 3,
            "lost wake-up: the shard exited having received {received} of 2 commands, \
             at generation {loaded} of 3"
        );
        sink.record((received, loaded, coalesced));
    });
    seen.take()
}

/// Runs a model that must fail; returns its panic message.
fn must_fail(sender: Sender, receiver: Receiver) -> String {
    crate::loom_support::must_fail("mailbox", || {
        model(sender, receiver);
    })
}

#[test]
fn loom_models_mailbox_no_lost_wake_up() {
    let (runs, seen) = model(Sender::Real, Receiver::Real);
    eprintln!("{runs} executions, outcomes {seen:?}");
    assert!(runs > 100, "loom explored only {runs} executions");
    assert!(
        seen.iter().any(|o| o.2) && seen.iter().any(|o| !o.2),
        "loom never explored both a coalesced and an uncoalesced ring: {seen:?}"
    );
}

#[test]
fn loom_models_negative_mailbox_ring_before_enqueue() {
    let msg = must_fail(Sender::RingFirst, Receiver::Real);
    assert!(
        msg.contains("lost wake-up"),
        "failed for another reason: {msg}"
    );
}

#[test]
fn loom_models_negative_mailbox_one_command_per_wake() {
    let msg = must_fail(Sender::Real, Receiver::OnePerWake);
    assert!(
        msg.contains("lost wake-up"),
        "failed for another reason: {msg}"
    );
}
