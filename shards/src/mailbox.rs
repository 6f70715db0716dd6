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
