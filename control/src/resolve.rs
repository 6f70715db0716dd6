//! Resolving backend and publisher host names to socket addresses, off the data plane.
//!
//! Shards never resolve: a host name is looked up here and the first address is placed in the
//! snapshot. A backend that does not resolve is logged and left out of routing until a later
//! reload resolves it. Publishers ([`Publishers`]) are looked up in the background: the control
//! loop never waits for DNS, and a publisher's host is looked up again only when its record's
//! endpoint changes or its last lookup failed (LOAD-STORE-16).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use continuum_core::config::Config;
use continuum_core::discovery::{Family, FleetView, Publisher, PublisherId};
use continuum_core::snapshot::PublisherAddrs;
use continuum_core::subscriptions::{ConnectPolicy, Refusal, admitted};

/// Resolve every backend of `config` (blocking; call from the control thread's blocking pool or
/// at startup).
pub fn resolve_blocking(config: &Config) -> Vec<Option<SocketAddr>> {
    config
        .backends
        .iter()
        .map(|b| {
            if let Ok(ip) = b.url.host.parse::<IpAddr>() {
                return Some(SocketAddr::new(ip, b.url.port));
            }
            match (b.url.host.as_str(), b.url.port).to_socket_addrs() {
                Ok(mut addrs) => {
                    let first = addrs.next();
                    if first.is_none() {
                        tracing::warn!(backend = %b.name, host = %b.url.host, "backend host resolved to no address");
                    }
                    first
                }
                Err(e) => {
                    tracing::warn!(backend = %b.name, host = %b.url.host, error = %e, "backend host does not resolve");
                    None
                }
            }
        })
        .collect()
}

/// How long resolving one publisher host may take (LOAD-ZMTP-18: `CONNECT_TIMEOUT`).
pub(crate) const PUBLISHER_RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first and the longest delay before failed publisher lookups are retried.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A publisher's `(host, port)` as its record gives it.
type Endpoint = (String, u16);

/// One finished round of lookups: per publisher, the endpoint looked up and what it gave
/// (empty: the lookup failed or timed out).
#[derive(Debug)]
pub(crate) struct Looked {
    round: u64,
    results: Vec<(PublisherId, Endpoint, Vec<SocketAddr>)>,
}

/// The fleet's publishers' addresses and the host-name lookups still running for them.
///
/// [`Self::refresh`] answers at once from what is known: IP literals, earlier successful
/// lookups of the same endpoint (checked against the connect policy again, so a policy change
/// needs no lookup), and earlier failures (`Unresolved`). Host names never looked up at their
/// endpoint are left out of the answer (not resolved yet) and looked up by one background task,
/// all at once and bounded by [`PUBLISHER_RESOLVE_TIMEOUT`]; its results come back as a
/// [`Looked`] on the control loop's channel, and [`Self::absorb`] takes them. Failed lookups are
/// retried from [`Self::retry_at`] with a doubling delay (1 s .. 30 s). The control loop never
/// waits for DNS.
#[derive(Debug)]
pub(crate) struct Publishers {
    found: HashMap<PublisherId, (Endpoint, Vec<SocketAddr>)>,
    failed: HashMap<PublisherId, Endpoint>,
    /// The lookups of the current round: its number, the endpoints and the task.
    running: Option<(
        u64,
        HashMap<PublisherId, Endpoint>,
        tokio::task::JoinHandle<()>,
    )>,
    round: u64,
    results: tokio::sync::mpsc::UnboundedSender<Looked>,
    retry_at: Option<tokio::time::Instant>,
    retry_delay: Duration,
}

impl Drop for Publishers {
    fn drop(&mut self) {
        if let Some((_, _, task)) = self.running.take() {
            task.abort();
        }
    }
}

impl Publishers {
    /// Lookup results will be sent on `results`.
    pub(crate) fn new(results: tokio::sync::mpsc::UnboundedSender<Looked>) -> Self {
        Self {
            found: HashMap::new(),
            failed: HashMap::new(),
            running: None,
            round: 0,
            results,
            retry_at: None,
            retry_delay: RETRY_MIN,
        }
    }

    /// The decisions for `fleet`'s admitted publishers under `policy` (CFG-20) from what is
    /// known now; starts the lookups of host names not looked up yet (replacing a running
    /// round that no longer covers them).
    pub(crate) fn refresh(&mut self, fleet: &FleetView, policy: &ConnectPolicy) -> PublisherAddrs {
        let mut addrs = PublisherAddrs::new();
        let mut wanted: HashMap<PublisherId, Endpoint> = HashMap::new();
        let mut live = std::collections::HashSet::new();
        for family in [Family::KvMetrics, Family::KvEvents] {
            for p in admitted(fleet, family) {
                let id = p.publisher_id;
                live.insert(id);
                let endpoint = (p.tcp.host.clone(), p.tcp.port);
                let decision = if let Ok(ip) = p.tcp.host.parse::<IpAddr>() {
                    Some(policy.choose(&[SocketAddr::new(ip, p.tcp.port)]))
                } else if let Some((_, a)) = self.found.get(&id).filter(|(e, _)| *e == endpoint) {
                    Some(policy.choose(a))
                } else if self.failed.get(&id) == Some(&endpoint) {
                    Some(Err(Refusal::Unresolved))
                } else {
                    wanted.insert(id, endpoint);
                    None
                };
                if let Some(d) = decision {
                    note_refusal(p, &d);
                    addrs.insert(id, d);
                }
            }
        }
        self.found.retain(|id, _| live.contains(id));
        self.failed.retain(|id, _| live.contains(id));
        let covered = self
            .running
            .as_ref()
            .is_some_and(|(_, running, _)| wanted.iter().all(|(id, e)| running.get(id) == Some(e)));
        if wanted.is_empty() {
            if let Some((_, _, task)) = self.running.take() {
                task.abort();
            }
        } else if !covered {
            if let Some((_, _, task)) = self.running.take() {
                task.abort();
            }
            self.round += 1;
            let task = tokio::spawn(look_up(self.round, wanted.clone(), self.results.clone()));
            self.running = Some((self.round, wanted, task));
        }
        addrs
    }

    /// Take a finished round of lookups (a stale round is ignored). Returns whether anything
    /// was learned; call [`Self::refresh`] then.
    pub(crate) fn absorb(&mut self, looked: Looked) -> bool {
        if self.running.as_ref().map(|(r, _, _)| *r) != Some(looked.round) {
            return false;
        }
        self.running = None;
        for (id, endpoint, resolved) in looked.results {
            if resolved.is_empty() {
                self.found.remove(&id);
                self.failed.insert(id, endpoint);
            } else {
                self.failed.remove(&id);
                self.found.insert(id, (endpoint, resolved));
            }
        }
        self.schedule_retry();
        true
    }

    /// When failed lookups are due again; `None` when nothing failed.
    pub(crate) fn retry_at(&self) -> Option<tokio::time::Instant> {
        self.retry_at
    }

    /// Forget the failures, so the next [`Self::refresh`] looks those hosts up again.
    pub(crate) fn retry_failed(&mut self) {
        self.failed.clear();
        self.retry_at = None;
    }

    /// How many publishers' lookups failed (and wait for their retry).
    pub(crate) fn unresolved(&self) -> usize {
        self.failed.len()
    }

    /// Whether a round of lookups is running.
    #[cfg(test)]
    pub(crate) fn looking_up(&self) -> bool {
        self.running.is_some()
    }

    fn schedule_retry(&mut self) {
        if self.failed.is_empty() {
            self.retry_delay = RETRY_MIN;
            self.retry_at = None;
        } else if self.retry_at.is_none() {
            self.retry_at = Some(tokio::time::Instant::now() + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
        }
    }
}

/// Look every endpoint up on the blocking pool at once, bounded by
/// [`PUBLISHER_RESOLVE_TIMEOUT`] for the whole round, and send the results.
async fn look_up(
    round: u64,
    wanted: HashMap<PublisherId, Endpoint>,
    results: tokio::sync::mpsc::UnboundedSender<Looked>,
) {
    let lookups: Vec<_> = wanted
        .into_iter()
        .map(|(id, endpoint)| {
            let target = endpoint.clone();
            let task = tokio::task::spawn_blocking(move || {
                target.to_socket_addrs().map(Iterator::collect::<Vec<_>>)
            });
            (id, endpoint, task)
        })
        .collect();
    let deadline = tokio::time::Instant::now() + PUBLISHER_RESOLVE_TIMEOUT;
    let mut out = Vec::with_capacity(lookups.len());
    for (id, endpoint, task) in lookups {
        let resolved = match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Ok(addrs))) => addrs,
            _ => Vec::new(),
        };
        out.push((id, endpoint, resolved));
    }
    let _ = results.send(Looked {
        round,
        results: out,
    });
}

fn note_refusal(p: &Publisher, decision: &Result<SocketAddr, Refusal>) {
    if let Err(why) = decision {
        tracing::warn!(publisher = %p.publisher_id, namespace = %p.namespace, reason = %why, "publisher not subscribed");
    }
}

#[cfg(test)]
mod tests {
    use continuum_core::discovery::{Family, FleetView, Publisher, PublisherId, TcpTarget};
    use continuum_core::subscriptions::{ConnectPolicy, Refusal};
    use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

    use super::*;

    fn publisher(id: u64, host: &str) -> Publisher {
        Publisher {
            family: Family::KvMetrics,
            publisher_id: PublisherId::new(id),
            namespace: "ns".into(),
            component: None,
            endpoint: None,
            tcp: TcpTarget {
                host: host.into(),
                port: 5557,
            },
            source: None,
        }
    }

    fn fleet(publishers: Vec<Publisher>) -> FleetView {
        FleetView {
            workers: Vec::new(),
            publishers,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Wait for the running round and take it.
    async fn settle(p: &mut Publishers, rx: &mut UnboundedReceiver<Looked>) {
        let looked = rx.recv().await.unwrap();
        assert!(p.absorb(looked), "the running round's results are taken");
    }

    #[test]
    fn the_loop_gets_an_answer_at_once_and_host_names_follow_from_the_background() {
        rt().block_on(async {
            let (tx, mut rx) = unbounded_channel();
            let mut p = Publishers::new(tx);
            let f = fleet(vec![
                publisher(1, "10.1.2.3"),
                publisher(2, "203.0.113.9"),
                publisher(3, "localhost"),
                publisher(4, "no-such-host.invalid"),
            ]);
            let policy = ConnectPolicy::new(Some(vec![
                "10.0.0.0/8".parse().unwrap(),
                "127.0.0.0/8".parse().unwrap(),
            ]));
            // At once: IP literals decided, host names not resolved yet (absent).
            let now = p.refresh(&f, &policy);
            assert_eq!(
                now[&PublisherId::new(1)],
                Ok("10.1.2.3:5557".parse().unwrap())
            );
            assert_eq!(now[&PublisherId::new(2)], Err(Refusal::NotAllowed));
            assert!(!now.contains_key(&PublisherId::new(3)));
            assert!(!now.contains_key(&PublisherId::new(4)));
            assert!(p.looking_up());
            settle(&mut p, &mut rx).await;
            let after = p.refresh(&f, &policy);
            assert!(
                after[&PublisherId::new(3)]
                    .as_ref()
                    .is_ok_and(|a| a.ip().is_loopback())
            );
            assert_eq!(after[&PublisherId::new(4)], Err(Refusal::Unresolved));
            assert_eq!(p.unresolved(), 1);
            assert!(!p.looking_up(), "a failed host waits for its retry");
            assert!(p.retry_at().is_some());
            // The retry looks the failed host up again, and only it.
            p.retry_failed();
            let retrying = p.refresh(&f, &policy);
            assert!(!retrying.contains_key(&PublisherId::new(4)));
            assert!(retrying.contains_key(&PublisherId::new(3)));
            assert!(p.looking_up());
            settle(&mut p, &mut rx).await;
            assert_eq!(
                p.refresh(&f, &policy)[&PublisherId::new(4)],
                Err(Refusal::Unresolved)
            );
        });
    }

    #[test]
    fn a_policy_change_needs_no_lookup_and_a_moved_record_is_looked_up_again() {
        rt().block_on(async {
            let (tx, mut rx) = unbounded_channel();
            let mut p = Publishers::new(tx);
            let f = fleet(vec![publisher(3, "localhost"), publisher(5, "localhost")]);
            let open = ConnectPolicy::new(None);
            p.refresh(&f, &open);
            settle(&mut p, &mut rx).await;
            assert!(p.refresh(&f, &open)[&PublisherId::new(3)].is_ok());
            // Loopback no longer allowed: decided again from the addresses already found.
            let closed = ConnectPolicy::new(Some(vec!["10.0.0.0/8".parse().unwrap()]));
            let d = p.refresh(&f, &closed);
            assert_eq!(d[&PublisherId::new(3)], Err(Refusal::NotAllowed));
            assert!(!p.looking_up());
            // Publisher 3's record moves to another host: looked up again; 5 left the fleet.
            let moved = fleet(vec![publisher(3, "no-such-host.invalid")]);
            let d = p.refresh(&moved, &open);
            assert!(!d.contains_key(&PublisherId::new(3)), "not resolved yet");
            assert!(!d.contains_key(&PublisherId::new(5)));
            settle(&mut p, &mut rx).await;
            assert_eq!(
                p.refresh(&moved, &open)[&PublisherId::new(3)],
                Err(Refusal::Unresolved)
            );
        });
    }

    #[test]
    fn a_round_replaced_before_it_ends_is_ignored() {
        rt().block_on(async {
            let (tx, mut rx) = unbounded_channel();
            let mut p = Publishers::new(tx);
            let open = ConnectPolicy::new(None);
            p.refresh(&fleet(vec![publisher(1, "no-such-host.invalid")]), &open);
            // The record changes before the first round ends: a second round replaces it.
            let f = fleet(vec![publisher(1, "localhost")]);
            p.refresh(&f, &open);
            let mut taken = 0;
            while p.looking_up() {
                if p.absorb(rx.recv().await.unwrap()) {
                    taken += 1;
                }
            }
            assert_eq!(taken, 1);
            assert!(p.refresh(&f, &open)[&PublisherId::new(1)].is_ok());
            assert_eq!(p.unresolved(), 0);
            assert!(p.retry_at().is_none());
        });
    }
}
