//! Each worker's `kv_metrics` PUB socket: a listener, its subscriber connections, and the loop
//! that publishes the worker's load.
//!
//! Role: [`run`] is one tokio task per worker on the simulator's runtime. It accepts subscribers
//! (each served by its own task speaking [`crate::zmtp_pub::PubSession`]) and publishes one
//! message per data-parallel rank whenever the worker's load changes (as Dynamo does: a sample
//! at request start, one at the end), whenever a subscriber subscribes, and every
//! `publish_interval` besides, so the router's samples stay fresh while load is steady.
//!
//! Invariants:
//! - the sequence increases by one per message, whether or not anyone is subscribed (a PUB
//!   drops what nobody takes); one publisher incarnation is one `publisher_id` for its life;
//! - a subscriber too slow to keep up loses messages (the broadcast lags, like ZMQ's high-water
//!   mark) rather than slowing the publisher or growing memory: each connection holds at most
//!   [`QUEUE`] messages;
//! - aborting the task (a killed worker, a stopped fleet) drops the listener and every
//!   connection task with it, closing their sockets.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use continuum_core::discovery::UnixMillis;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use crate::records::KV_METRICS_TOPIC;
use crate::spec::LoadFields;
use crate::worker::Worker;
use crate::zmtp_pub::{GREETING, PubEvent, PubSession, kv_metrics_message, pong, ready};

/// Messages queued per subscriber before it starts losing them.
pub(crate) const QUEUE: usize = 256;

/// How a worker publishes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PublishCfg {
    /// Periodic publication besides the ones on change.
    pub(crate) interval: Option<Duration>,
    /// Which fields are filled.
    pub(crate) fields: LoadFields,
    /// The fleet's start (stats are relative to it).
    pub(crate) epoch: Instant,
}

/// Serves `worker`'s PUB socket on `listener` until aborted.
pub(crate) async fn run(worker: Arc<Worker>, listener: std::net::TcpListener, cfg: PublishCfg) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(_) => return,
    };
    let (tx, _) = broadcast::channel::<Arc<[u8]>>(QUEUE);
    let mut conns = JoinSet::new();
    let mut sequence = 0u64;
    // Far enough to never fire when there is no interval.
    let period = cfg.interval.unwrap_or(Duration::from_secs(86_400 * 365));
    let mut next = tokio::time::Instant::now() + period;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    conns.spawn(serve_subscriber(stream, tx.subscribe(), worker.clone()));
                }
                continue;
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            () = worker.changed.notified() => {}
            () = tokio::time::sleep_until(next) => {}
        }
        let samples: Vec<_> = (0..worker.info.dp_size.max(1))
            .map(|rank| worker.sample(rank, cfg.fields))
            .collect();
        let now = UnixMillis(wall_millis());
        for s in &samples {
            sequence += 1;
            if let Ok(msg) = kv_metrics_message(worker.info.publisher_id, sequence, now, s) {
                // Err: nobody subscribed; the message is dropped, as a PUB drops it.
                let _ = tx.send(Arc::from(msg));
            }
        }
        worker.record_publish(cfg.epoch.elapsed(), &samples);
        next = tokio::time::Instant::now() + period;
    }
}

fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One subscriber: handshake, subscriptions, then every matching message.
async fn serve_subscriber(
    stream: TcpStream,
    mut rx: broadcast::Receiver<Arc<[u8]>>,
    worker: Arc<Worker>,
) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    if wr.write_all(&GREETING).await.is_err() {
        return;
    }
    let mut session = PubSession::new();
    let mut events = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            n = rd.read(&mut buf) => {
                let n = match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                events.clear();
                if session.feed(buf.get(..n).unwrap_or(&[]), &mut events).is_err() {
                    return;
                }
                for ev in events.drain(..) {
                    let reply = match ev {
                        PubEvent::Greeted => ready(),
                        PubEvent::Ping(ctx) => pong(&ctx),
                        PubEvent::Subscribed(_) => {
                            // Skip what queued up during the handshake and publish a fresh
                            // sample now, so a new subscriber is not left waiting.
                            rx = rx.resubscribe();
                            worker.changed.notify_one();
                            continue;
                        }
                        PubEvent::Ready | PubEvent::Unsubscribed(_) => continue,
                    };
                    if wr.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            }
            msg = rx.recv(), if session.is_open() => match msg {
                Ok(msg) => {
                    if session.matches(KV_METRICS_TOPIC.as_bytes())
                        && wr.write_all(&msg).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
