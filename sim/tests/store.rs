//! The file store a simulated fleet writes, read back the way the router reads it and fed
//! through the router's own discovery reducer (`continuum_core::discovery`).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use continuum_core::discovery::{Family, Level, Role, TcpTarget};
use continuum_sim::{SimFleet, SimSpec};

fn spec() -> SimSpec {
    SimSpec::builder()
        .namespace("demo")
        .aggregated("demo-agg", 3)
        .disaggregated("demo-disagg", 1, 2)
        .namespace("dp")
        .aggregated("dp-model", 2)
        .dp_size(2)
        .ttl(Duration::from_secs(3))
        .build()
}

#[test]
fn the_written_store_materialises_the_intended_fleet() {
    let fleet = SimFleet::start(spec()).unwrap();
    let (mut reducer, view) = common::view_of(fleet.root());

    let mut want: Vec<_> = fleet
        .workers()
        .iter()
        .map(|w| {
            (
                w.namespace.clone(),
                w.instance_id,
                w.component.clone(),
                w.role,
                Some(w.model.clone()),
                Some(w.dp_size),
            )
        })
        .collect();
    want.sort_by_key(|w| (w.0.clone(), w.1));
    let got: Vec<_> = view
        .workers
        .iter()
        .map(|w| {
            (
                w.namespace.clone(),
                w.instance_id,
                w.component.clone(),
                w.role,
                w.model.clone(),
                w.dp_size,
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(view.workers.len(), 8);

    // Roles as 1.6.1 expresses them: decode workers are component `backend`, card `decode`.
    let roles = |model: &str, role: Role| {
        view.workers
            .iter()
            .filter(|w| w.model.as_deref() == Some(model) && w.role == role)
            .map(|w| w.component.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(roles("demo-agg", Role::Aggregated), ["backend"; 3]);
    assert_eq!(roles("demo-disagg", Role::Prefill), ["prefill"]);
    assert_eq!(roles("demo-disagg", Role::Decode), ["backend"; 2]);
    for w in &view.workers {
        assert_eq!(w.endpoint, "generate");
        assert_eq!(w.block_size, Some(64));
        assert_eq!(w.capacity.total_kv_blocks, Some(16_384));
        assert_eq!(w.dp_start_rank, Some(0));
        assert!(w.card.is_some() && w.request_transport().is_some());
    }

    // One kv_metrics publisher per worker, at the address it listens on.
    assert_eq!(view.publishers_of(Family::KvMetrics).count(), 8);
    assert_eq!(view.publishers_of(Family::KvEvents).count(), 0);
    for w in fleet.workers() {
        let p = view
            .publishers
            .iter()
            .find(|p| p.publisher_id == w.publisher_id)
            .unwrap_or_else(|| panic!("no publisher for {w:?}"));
        assert_eq!(p.family, Family::KvMetrics);
        assert_eq!(p.namespace, w.namespace);
        assert_eq!(p.component.as_deref(), Some(w.component.as_str()));
        assert_eq!(
            p.tcp,
            TcpTarget {
                host: "127.0.0.1".into(),
                port: w.publisher_addr.port()
            }
        );
    }
    // Nothing worth a warning, and no mixed namespace.
    let d = reducer.drain_diagnostics();
    assert!(d.iter().all(|d| d.level() == Level::Debug), "{d:?}");
}

#[test]
fn kill_removes_the_workers_files_and_the_view_drops_it() {
    let fleet = SimFleet::start(spec()).unwrap();
    let victim = fleet.workers_of("demo-agg", Role::Aggregated)[1].clone();
    let files_before = common::read_store(fleet.root()).len();
    assert_eq!(files_before, 3 * 8);
    fleet.kill(victim.instance_id).unwrap();
    assert!(fleet.kill(victim.instance_id).is_err(), "killed twice");
    let records = common::read_store(fleet.root());
    assert_eq!(records.len(), files_before - 3);
    let hex = victim.instance_id.hex();
    let pub_hex = victim.publisher_id.hex();
    assert!(
        records
            .iter()
            .all(|(k, _)| !k.ends_with(&hex) && !k.ends_with(&pub_hex)),
        "{records:?}"
    );
    let (_, view) = common::view_of(fleet.root());
    assert_eq!(view.workers.len(), 7);
    assert!(view.worker("demo", victim.instance_id).is_none());
    assert_eq!(fleet.workers_of("demo-agg", Role::Aggregated).len(), 2);
    assert!(
        !fleet
            .stats()
            .iter()
            .find(|s| s.info.instance_id == victim.instance_id)
            .unwrap()
            .alive
    );
}

#[test]
fn files_are_kept_alive_and_removed_with_the_fleet() {
    let fleet = SimFleet::start(spec()).unwrap();
    let root = fleet.root().to_path_buf();
    let file = std::fs::read_dir(root.join("v1/mdc"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Back-date the file; the keep-alive (every ttl/3 = 1 s) touches it forward again.
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&file).unwrap().modified().unwrap() <= old {
        assert!(Instant::now() < deadline, "never touched");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(fleet);
    assert!(!root.exists(), "the temporary root is removed");
}

#[test]
fn a_given_root_is_kept_but_emptied() {
    let root = std::env::temp_dir().join(format!("continuum-sim-given-{}", std::process::id()));
    let fleet = SimFleet::start(SimSpec::builder().aggregated("m", 2).root(&root).build()).unwrap();
    assert_eq!(fleet.root(), root);
    let (_, view) = common::view_of(&root);
    assert_eq!(view.workers.len(), 2);
    assert_eq!(view.workers[0].namespace, "dynamo");
    drop(fleet);
    assert!(root.exists());
    assert!(common::read_store(&root).is_empty());
    std::fs::remove_dir_all(&root).unwrap();
}
