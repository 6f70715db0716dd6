//! Commands from the control thread to one shard.
//!
//! A typed crossbeam channel carries the command; a byte written to the shard's end of a Unix
//! socket pair (the doorbell) wakes the shard's runtime, whose mailbox task then drains the
//! channel. The doorbell is what lets a shard sleeping in io_uring or epoll notice the command
//! without polling a timer.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

/// What the control thread can ask of a shard.
#[derive(Debug, Clone)]
pub enum ShardCommand {
    /// A new snapshot was published: load it.
    Reload,
    /// Replace the active worker picker with one built by this factory (API-06).
    SetPicker(crate::dispatch::PickerFactory),
    /// The event bus or its broker sessions changed: wake the pending broker subscriptions.
    BrokerSessionsChanged,
    /// Stop accepting, let in-flight requests finish until `deadline`, then exit.
    Drain {
        /// When to give up on in-flight requests.
        deadline: Instant,
    },
}

/// The control thread's handle to one shard's mailbox.
#[derive(Debug)]
pub struct MailboxSender {
    tx: Sender<ShardCommand>,
    doorbell: UnixStream,
}

/// The shard's end of its mailbox.
#[derive(Debug)]
pub(crate) struct MailboxReceiver {
    pub(crate) rx: Receiver<ShardCommand>,
    pub(crate) doorbell: UnixStream,
}

/// A connected sender/receiver pair.
pub(crate) fn mailbox() -> std::io::Result<(MailboxSender, MailboxReceiver)> {
    let (a, b) = UnixStream::pair()?;
    a.set_nonblocking(true)?;
    let (tx, rx) = crossbeam_channel::unbounded();
    Ok((
        MailboxSender { tx, doorbell: a },
        MailboxReceiver { rx, doorbell: b },
    ))
}

impl MailboxSender {
    /// Queue `cmd` and ring the doorbell. Fails only when the shard has exited.
    pub fn send(&self, cmd: ShardCommand) -> Result<(), ShardGone> {
        self.tx.send(cmd).map_err(|_| ShardGone)?;
        // A full socket buffer means the shard already has unread rings pending; it will drain
        // the channel when it reads them, so WouldBlock is not an error.
        match (&self.doorbell).write(&[1]) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
            Err(_) => Err(ShardGone),
        }
    }
}

/// The shard behind a mailbox has exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shard has exited")]
pub struct ShardGone;

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// The real pair under load, with the doorbell's socket buffer full for most of the run: a
    /// sender thread queues `N` commands (its rings hit `WouldBlock` and are dropped) while a
    /// receiver thread runs `mailbox_loop`'s protocol (blocking doorbell read, then drain the
    /// channel until empty; return at end-of-file without draining). Every command must have
    /// been received by end-of-file, and nothing may be left queued behind it.
    ///
    /// This exercises the real sockets and channel; it cannot force the rare interleavings (a
    /// `send` that rang before enqueueing passes it too). Those are checked exhaustively by the
    /// loom model of this protocol, `core/src/mailbox_loom.rs`.
    #[test]
    fn a_full_doorbell_loses_no_command() {
        const N: usize = 10_000;
        let (sender, receiver) = mailbox().unwrap();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let shard = std::thread::spawn(move || {
            let MailboxReceiver { rx, mut doorbell } = receiver;
            let _ = go_rx.recv();
            let (mut received, mut wakes, mut buf) = (0, 0, [0u8; 64]);
            loop {
                match doorbell.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => wakes += 1,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => panic!("doorbell read: {e}"),
                }
                while let Ok(cmd) = rx.try_recv() {
                    assert!(matches!(cmd, ShardCommand::Reload), "{cmd:?}");
                    received += 1;
                }
            }
            let stranded = rx.try_iter().count();
            let _ = done_tx.send((received, wakes, stranded));
        });
        let control = std::thread::spawn(move || {
            // Fill the doorbell before the receiver runs, then keep sending while it drains.
            let mut sent = 0;
            let mut full_after = None;
            while sent < N {
                sender.send(ShardCommand::Reload).unwrap();
                sent += 1;
                if full_after.is_none() {
                    match (&sender.doorbell).write(&[1]) {
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            full_after = Some(sent);
                            let _ = go_tx.send(());
                        }
                        Ok(_) => {}
                        Err(e) => panic!("doorbell write: {e}"),
                    }
                }
            }
            drop(go_tx);
            full_after
            // Dropping `sender` closes the doorbell: the receiver reads end-of-file.
        });
        let Ok((received, wakes, stranded)) = done_rx.recv_timeout(Duration::from_secs(10)) else {
            panic!("the receiver did not reach end-of-file within 10 s (a lost wake-up?)");
        };
        let full_after = control.join().unwrap();
        shard.join().unwrap();
        eprintln!(
            "doorbell full after {full_after:?} sends; {wakes} wake-ups for {received} commands"
        );
        assert!(
            full_after.is_some_and(|k| k < N),
            "the doorbell never filled: {full_after:?}"
        );
        assert_eq!((received, stranded), (N, 0), "after {wakes} wake-ups");
        assert!(wakes < N, "rings should have coalesced: {wakes} wake-ups");
    }
}
