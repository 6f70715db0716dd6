//! Scripted-source tests of `drive_session` (TEST-02): puts and deletes applied, compaction ends
//! the session, a resync converges on the new state and keeps `first_seen`, an identical resync
//! publishes nothing new.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use continuum_core::discovery::{FleetView, InstanceId, Reducer};

use super::*;

fn dump() -> Vec<Change> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|kv| Change::Put(kv[0].as_bytes().to_vec(), kv[1].as_bytes().to_vec()))
        .collect()
}

struct Scripted {
    seed: Vec<Change>,
    batches: VecDeque<Result<Vec<Change>, SessionEnd>>,
}

impl WatchSource for Scripted {
    async fn seed(&mut self) -> Result<Vec<Change>, SessionEnd> {
        Ok(std::mem::take(&mut self.seed))
    }
    async fn open_watches(&mut self) -> Result<(), SessionEnd> {
        Ok(())
    }
    async fn next(&mut self) -> Result<Vec<Change>, SessionEnd> {
        self.batches.pop_front().unwrap_or(Err(SessionEnd::Stopped))
    }
}

fn run(
    src: &mut Scripted,
    reducer: &Mutex<Reducer>,
) -> (SessionReport, Vec<Arc<FleetView>>, Vec<bool>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut views = Vec::new();
    let mut conn = Vec::new();
    // Like the real publisher, which drains the reducer's diagnostics: the reducer must not be
    // locked while `publish` runs (a std mutex is not reentrant: that would deadlock the thread).
    let report = rt.block_on(drive_session(
        src,
        reducer,
        |v| {
            assert!(
                reducer.try_lock().is_ok(),
                "publish called with the reducer locked"
            );
            views.push(v)
        },
        |c| conn.push(c),
    ));
    (report, views, conn)
}

const AGG_B: &str = "v1/instances/agg/backend/generate/6a6ca22d4998ac16";

#[test]
fn applies_seed_then_events_until_compaction() {
    let reducer = Mutex::new(Reducer::new());
    let mut src = Scripted {
        seed: dump(),
        batches: VecDeque::from([
            Ok(vec![Change::Delete(AGG_B.into())]),
            Err(SessionEnd::Compacted),
        ]),
    };
    let (report, views, conn) = run(&mut src, &reducer);
    assert_eq!(report.end, SessionEnd::Compacted);
    assert_eq!(conn, [true, false]);
    assert_eq!(views.len(), 2);
    assert_eq!(views[0].workers.len(), 4, "{:#?}", views[0].workers);
    assert_eq!(views[1].workers.len(), 3);
    let gone = InstanceId::new(0x6a6ca22d4998ac16);
    assert!(views[0].worker("agg", gone).is_some());
    assert!(views[1].worker("agg", gone).is_none());
}

#[test]
fn resync_converges_keeps_first_seen_and_identical_resync_is_the_same_view() {
    let reducer = Mutex::new(Reducer::new());
    let mut first = Scripted {
        seed: dump(),
        batches: VecDeque::from([Err(SessionEnd::Compacted)]),
    };
    let (_, v1, _) = run(&mut first, &reducer);
    std::thread::sleep(std::time::Duration::from_millis(5));
    // The same data again: the reducer must hand back the very same view.
    let mut same = Scripted {
        seed: dump(),
        batches: VecDeque::new(),
    };
    let (_, v2, _) = run(&mut same, &reducer);
    assert!(
        Arc::ptr_eq(&v1[0], &v2[0]),
        "an idempotent resync must not produce a new view"
    );
    // A resync that lost a worker (its delete was compacted away) drops it and keeps the rest.
    let seed: Vec<Change> = dump()
        .into_iter()
        .filter(|c| !matches!(c, Change::Put(k, _) if k.as_slice() == AGG_B.as_bytes()))
        .collect();
    let mut lost = Scripted {
        seed,
        batches: VecDeque::new(),
    };
    let (_, v3, _) = run(&mut lost, &reducer);
    assert_eq!(v3[0].workers.len(), 3);
    for w in &v3[0].workers {
        let before = v1[0].worker(&w.namespace, w.instance_id).unwrap();
        assert_eq!(
            w.first_seen, before.first_seen,
            "first_seen must survive a resync"
        );
    }
}

#[test]
fn failed_seed_reports_without_connecting() {
    struct Failing;
    impl WatchSource for Failing {
        async fn seed(&mut self) -> Result<Vec<Change>, SessionEnd> {
            Err(SessionEnd::SeedFailed("refused".into()))
        }
        async fn open_watches(&mut self) -> Result<(), SessionEnd> {
            Ok(())
        }
        async fn next(&mut self) -> Result<Vec<Change>, SessionEnd> {
            Err(SessionEnd::Stopped)
        }
    }
    let reducer = Mutex::new(Reducer::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut conn = Vec::new();
    let report = rt.block_on(drive_session(
        &mut Failing,
        &reducer,
        |_| {},
        |c| conn.push(c),
    ));
    assert_eq!(report.end, SessionEnd::SeedFailed("refused".into()));
    assert_eq!(report.healthy_for, std::time::Duration::ZERO);
    assert!(conn.is_empty());
}

#[test]
fn a_burst_of_batches_publishes_one_view() {
    let reducer = Mutex::new(Reducer::new());
    let all = dump();
    let (instances, rest): (Vec<Change>, Vec<Change>) = all
        .into_iter()
        .partition(|c| matches!(c, Change::Put(k, _) if k.starts_with(b"v1/instances/")));
    let mut src = Scripted {
        seed: rest,
        batches: instances
            .into_iter()
            .map(|c| Ok(vec![c]))
            .chain([Err(SessionEnd::Compacted)])
            .collect(),
    };
    let (report, views, _) = run(&mut src, &reducer);
    assert_eq!(report.end, SessionEnd::Compacted);
    // The seed view (no instance records, so no workers) and one view for the whole burst.
    assert_eq!(views.len(), 2, "a burst must be coalesced into one view");
    assert!(views[0].workers.is_empty());
    assert_eq!(views[1].workers.len(), 4);
}
