//! The broker transport (`dynamo.load.transport: broker`, BROKER-01..07, BROKER-09): a
//! subscription's bytes come over an event-bus stream that an in-cluster broker relays from the
//! publisher, instead of a TCP connection to the publisher's Pod IP.
//!
//! [`BrokerConnector`] asks the running listener (`continuum_bus::EventBus`, swapped into
//! [`crate::signals::broker::BrokerSignals`] by the control thread) for a stream of the
//! publisher's advertised `tcp://host:port` in its Dynamo namespace and topic, and hands the
//! session driver the stream's socket ([`continuum_bus::OpenStream::into_socket`]): the ZMTP
//! handshake, caps, decoding, identity checks, dedup and gap rules then run over the relayed
//! bytes exactly as over TCP (BROKER-04).
//!
//! Invariants:
//! - not ready (pending) while no active, non-draining broker session declared the namespace;
//!   the task then waits on the shard's broker epoch, which the control thread moves through the
//!   mailbox whenever the sessions change: no polling (BROKER-06);
//! - opening is bounded by [`OPEN_TIMEOUT`]; every failure is a sanitised reason word
//!   ([`SessionEnd::Broker`], BROKER-05);
//! - a stream whose session ended or drains, or does so within [`SESSION_LOSS_GRACE`] of the
//!   stream's end, reports `carrier_lost` (BROKER-09); the admin row names the relaying broker
//!   only while it relays (ADMIN-04).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use continuum_bus::{BusStreamError, SessionId, Topic, ZmqTarget};
use continuum_core::discovery::{Family, PublisherId};
use monoio::io::AsyncReadRentExt as _;
use monoio::net::UnixStream;

use super::driver::SessionEnd;
use super::task::Connector;
use crate::notify::LocalEpoch;
use crate::signals::Signals;
use crate::signals::subs::SubTable;

/// How long a commanded stream may take to open (BROKER-05; the listener enforces the same
/// bound and answers `open_timeout`; this one covers a listener that stops answering).
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(31);

/// How long after a relayed stream ends its session may take to be reported gone, for the
/// end to count as the carrier's (BROKER-09). A stream its publisher ended waits this long
/// before its normal backoff.
pub(crate) const SESSION_LOSS_GRACE: Duration = Duration::from_millis(500);

/// The event-bus topic of a family.
pub(crate) fn topic(family: Family) -> Topic {
    match family {
        Family::KvMetrics => Topic::KvMetrics,
        Family::KvEvents => Topic::KvEvents,
    }
}

/// One subscription's way to its publisher through a broker.
pub(crate) struct BrokerConnector {
    signals: Arc<Signals>,
    epoch: Rc<LocalEpoch>,
    target: ZmqTarget,
    family: Family,
    publisher: PublisherId,
    table: Arc<SubTable>,
    /// The session carrying the last stream opened, until [`Connector::carrier_lost`].
    carrier: Cell<Option<SessionId>>,
}

impl std::fmt::Debug for BrokerConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConnector")
            .field("namespace", &self.target.namespace)
            .field("family", &self.family)
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

/// Where a broker subscription goes: the publisher's advertised endpoint in its namespace.
#[derive(Debug)]
pub(crate) struct BrokerRoute {
    pub(crate) target: ZmqTarget,
    pub(crate) family: Family,
    pub(crate) publisher: PublisherId,
}

impl BrokerConnector {
    /// The connector of `route`, reading the bus from `signals`, woken by `epoch`, naming the
    /// relaying broker in `table`.
    pub(crate) fn new(
        route: BrokerRoute,
        signals: Arc<Signals>,
        epoch: Rc<LocalEpoch>,
        table: Arc<SubTable>,
    ) -> Self {
        Self {
            signals,
            epoch,
            target: route.target,
            family: route.family,
            publisher: route.publisher,
            table,
            carrier: Cell::new(None),
        }
    }

    fn refused(e: BusStreamError) -> SessionEnd {
        match e {
            BusStreamError::NoSession => SessionEnd::Uncovered,
            e => SessionEnd::Broker(e.reason()),
        }
    }
}

impl Connector for BrokerConnector {
    type Stream = UnixStream;

    fn ready(&self) -> bool {
        self.signals.broker.brokers_for(&self.target.namespace) > 0
    }

    async fn until_ready(&self) {
        loop {
            let seen = self.epoch.get();
            if self.ready() {
                return;
            }
            self.epoch.changed(seen).await;
        }
    }

    async fn connect(&self) -> Result<UnixStream, SessionEnd> {
        let Some(bus) = self.signals.broker.bus() else {
            return Err(SessionEnd::Uncovered);
        };
        let open = bus
            .open_stream(&self.target, topic(self.family))
            .map_err(Self::refused)?;
        self.carrier.set(Some(open.carrier()));
        let broker = open.broker().to_owned();
        let sock = open.into_socket().map_err(SessionEnd::Io)?;
        sock.set_nonblocking(true).map_err(SessionEnd::Io)?;
        let mut sock = UnixStream::from_std(sock).map_err(SessionEnd::Io)?;
        let (read, status) =
            match monoio::time::timeout(OPEN_TIMEOUT, sock.read_exact(vec![0u8; 1])).await {
                Ok(r) => r,
                Err(_) => return Err(SessionEnd::Broker("open_timeout")),
            };
        // End of file before the status byte: the listener stopped.
        read.map_err(|_| SessionEnd::Broker("session_closed"))?;
        continuum_bus::open_status(status.first().copied().unwrap_or(u8::MAX))
            .map_err(Self::refused)?;
        self.table
            .set_broker(self.family, self.publisher, Some(&broker));
        Ok(sock)
    }

    async fn carrier_lost(&self) -> bool {
        self.table.set_broker(self.family, self.publisher, None);
        let Some(carrier) = self.carrier.take() else {
            return false;
        };
        // A dead broker's data streams can end before its session does (each is its own HTTP/2
        // request): give the session up to SESSION_LOSS_GRACE to be reported gone.
        let deadline = crate::clock::instant() + SESSION_LOSS_GRACE;
        loop {
            let seen = self.epoch.get();
            let alive = self
                .signals
                .broker
                .bus()
                .is_some_and(|bus| bus.carries(carrier));
            if !alive {
                return true;
            }
            let left = deadline.saturating_duration_since(crate::clock::instant());
            if left.is_zero()
                || monoio::time::timeout(left, self.epoch.changed(seen))
                    .await
                    .is_err()
            {
                return false;
            }
        }
    }
}
