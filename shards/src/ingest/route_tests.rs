//! Which connector a subscription gets (`Ingest::route`), in this build: direct to the address
//! the control thread resolved; through a broker to the advertised endpoint; and, in a build
//! without the event bus, nothing at all for `transport: broker` (BROKER-12: pending, never a
//! direct fallback). CI runs this file in both builds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use continuum_core::config::{Config, NoEnv};
use continuum_core::discovery::{Family, FleetView, Publisher, PublisherId, TcpTarget};
use continuum_core::snapshot::RouterSnapshot;

use super::{Ingest, Route};
use crate::signals::subs::Transport;

fn publisher() -> Publisher {
    Publisher {
        family: Family::KvMetrics,
        publisher_id: PublisherId::new(0x11),
        namespace: "dyn".into(),
        component: Some("backend".into()),
        endpoint: Some("generate".into()),
        tcp: TcpTarget {
            host: "worker-0.dyn.svc".into(),
            port: 5557,
        },
        source: None,
    }
}

fn snapshot(resolved: SocketAddr) -> RouterSnapshot {
    let (config, _) = Config::from_yaml("backends: []\n", &NoEnv).unwrap();
    let addrs = HashMap::from([(PublisherId::new(0x11), Ok(resolved))]);
    RouterSnapshot::build(
        1,
        Arc::new(config),
        Vec::new(),
        Arc::default(),
        Arc::new(FleetView::default()),
        Arc::new(addrs),
        None,
    )
}

#[test]
fn the_transport_picks_the_route_and_no_bus_means_no_route() {
    let resolved = SocketAddr::from(([10, 0, 0, 7], 5557));
    let snap = snapshot(resolved);
    let p = publisher();
    assert_eq!(
        Ingest::route(&snap, &p, Transport::Direct),
        Some(Route::Direct(resolved))
    );
    let broker = Ingest::route(&snap, &p, Transport::Broker);
    #[cfg(feature = "dynamo-event-bus")]
    assert_eq!(
        broker,
        Some(Route::Broker("dyn".into(), "worker-0.dyn.svc".into(), 5557)),
        "the advertised endpoint, not the resolved address"
    );
    #[cfg(not(feature = "dynamo-event-bus"))]
    assert_eq!(broker, None, "BROKER-12: no bus, and no direct fallback");
}
