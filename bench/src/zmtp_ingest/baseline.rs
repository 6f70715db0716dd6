//! The baseline of `zmtp-ingest`: the `zeromq` crate's (zmq.rs) `SubSocket` on a tokio
//! current-thread runtime, subscribed to `kv_metrics`, decoding every message with the same
//! `decode_kv_metrics` as the router path, so the work compared is equal.
//!
//! Invariants: the runtime is current-thread, so every task zmq.rs spawns (its reconnect task,
//! the framed reader it polls) runs on the measured thread; the receive loop is bounded by the
//! message count and by one deadline timer registered once, outside the loop. The `zeromq`
//! crate is a bench dependency only, never a production one.

use std::net::SocketAddr;
use std::time::Instant;

use zeromq::{Socket, SocketRecv, SubSocket};

use super::{IngestError, Tally, pin_to_cpu};

/// Receives `total` messages from `addr` (pinned to `cpu` if given).
pub(super) fn run(
    addr: SocketAddr,
    total: u64,
    deadline: Instant,
    cpu: Option<usize>,
) -> Result<Tally, IngestError> {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| IngestError::Io {
            what: "building the tokio runtime",
            source,
        })?;
    rt.block_on(async move {
        let mut sock = SubSocket::new();
        sock.connect(&format!("tcp://{addr}")).await?;
        sock.subscribe("kv_metrics").await?;
        let mut tally = Tally::new(total);
        let stop = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
        tokio::pin!(stop);
        while !tally.done() {
            let msg = tokio::select! {
                biased;
                m = sock.recv() => m?,
                () = &mut stop => return Err(tally.timeout("zeromq SubSocket")),
            };
            let mut frames: [&[u8]; 4] = [&[]; 4];
            let mut n = 0usize;
            for f in msg.iter() {
                if let Some(slot) = frames.get_mut(n) {
                    *slot = f;
                }
                n += 1;
            }
            if n > frames.len() {
                // More frames than the Dynamo layout: counted as a rejected message.
                tally.on_message(&[]);
            } else {
                tally.on_message(frames.get(..n).unwrap_or(&[]));
            }
        }
        Ok(tally)
    })
}
