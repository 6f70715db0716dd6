//! Tests of the file-store source: key decoding, temp-file skipping and TTL staleness (pure), and
//! sessions over a real temporary root written exactly as Dynamo's FileStore writes it (bucket
//! directories, percent-encoded names, temp file then rename), with the 1.6.1 fixture records:
//! seed, inotify-driven rewrite / delete / expiry, TTL expiry of untouched files, temp files,
//! oversized files, namespaces, and a root that appears after the session started.
#![allow(clippy::disallowed_methods)] // tests age real files

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime};

use continuum_core::discovery::{DiscoveryEventKind, Family, FleetView, InstanceId, Reducer};
use tokio::sync::mpsc;

use super::super::session::{self, SessionReport, drive_session};
use super::*;

// ---------------------------------------------------------------- pure parts

fn layout(ns: &[&str]) -> Layout {
    let ns: Vec<String> = ns.iter().map(|s| (*s).to_owned()).collect();
    Layout::new(PathBuf::from("/kv"), &ns, Duration::from_secs(10))
}

#[test]
fn percent_decoding_is_upstreams() {
    assert_eq!(
        percent_decode(b"agg%2Fbackend%2Fgenerate%2F6a6ca22d4998ac0b"),
        b"agg/backend/generate/6a6ca22d4998ac0b"
    );
    // Lower-case hex, a stray `%`, a truncated escape and a non-hex escape stay lenient.
    assert_eq!(percent_decode(b"a%2fb"), b"a/b");
    assert_eq!(percent_decode(b"100%"), b"100%");
    assert_eq!(percent_decode(b"%2"), b"%2");
    assert_eq!(percent_decode(b"%zz%41"), b"%zzA");
    // An encoded `%` decodes once: an etcd segment escape survives (`ns%2Eone`).
    assert_eq!(percent_decode(b"ns%252Eone"), b"ns%2Eone");
}

#[test]
fn relative_paths_decode_to_etcd_keys() {
    let l = layout(&["agg", "ns.one"]);
    assert_eq!(
        l.classify(Path::new(
            "/kv/v1/instances/agg%2Fbackend%2Fgenerate%2F6a6ca22d4998ac0b"
        )),
        PathClass::Key(b"v1/instances/agg/backend/generate/6a6ca22d4998ac0b".to_vec())
    );
    assert_eq!(
        l.classify(Path::new("/kv/v1/mdc/agg%2Fbackend%2Fgenerate%2F1")),
        PathClass::Key(b"v1/mdc/agg/backend/generate/1".to_vec())
    );
    assert_eq!(
        l.classify(Path::new(
            "/kv/v1/event_channels/namespace%2Fns%252Eone%2Fcomponent%2Fc"
        )),
        PathClass::Key(b"v1/event_channels/namespace/ns%2Eone/component/c".to_vec())
    );
    // Event sources (Dynamo 1.6.1) are keys too, under the channels' layout.
    assert_eq!(
        l.classify(Path::new(
            "/kv/v1/event_sources/namespace%2Fns%252Eone%2Ftopic%2Fkv-events%2F1"
        )),
        PathClass::Key(b"v1/event_sources/namespace/ns%2Eone/topic/kv-events/1".to_vec())
    );
    assert_eq!(
        l.classify(Path::new("/kv/v1/event_sources/.tmp_1")),
        PathClass::Temp
    );
    // A trailing slash on the root changes nothing.
    let slashed = Layout::new(
        PathBuf::from("/kv/"),
        &["agg".to_owned()],
        Duration::from_secs(10),
    );
    assert!(matches!(
        slashed.classify(Path::new("/kv/v1/mdc/agg%2Fb")),
        PathClass::Key(_)
    ));
}

#[test]
fn temp_foreign_and_structural_paths_are_not_keys() {
    let l = layout(&["agg"]);
    assert_eq!(
        l.classify(Path::new("/kv/v1/instances/.tmp_0123456789abcdef")),
        PathClass::Temp
    );
    assert_eq!(l.classify(Path::new("/kv/v1/mdc/.tmp_x")), PathClass::Temp);
    // Another namespace, another bucket: not followed.
    for p in [
        "/kv/v1/instances/disagg%2Fbackend%2Fgenerate%2F1",
        "/kv/v1/claims/agg%2Fx",
        "/kv/v1/event_sources/namespace%2Fdisagg%2Fx",
        "/kv/v1/event_sources/agg%2Fx",
        "/kv/v2/instances/agg%2Fx",
        // `agg` must be a whole segment: `aggregate/` is another namespace.
        "/kv/v1/instances/aggregate%2Fbackend%2Fgenerate%2F1",
    ] {
        assert_eq!(l.classify(Path::new(p)), PathClass::Ignored, "{p}");
    }
    for p in ["/kv", "/kv/v1", "/kv/v1/instances", "/kv/v1/instances/a/b"] {
        assert_eq!(l.classify(Path::new(p)), PathClass::Other, "{p}");
    }
    assert_eq!(
        l.classify(Path::new("/other/v1/mdc/agg%2Fx")),
        PathClass::Outside
    );
    assert_eq!(
        l.classify(Path::new("/kv/../kv/v1/mdc/agg%2Fx")),
        PathClass::Other
    );
}

#[test]
fn staleness_with_an_injected_now() {
    let ttl = Duration::from_secs(10);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    assert!(is_live(now, now, ttl));
    assert!(is_live(now - ttl, now, ttl), "exactly the ttl old is alive");
    assert!(!is_live(now - ttl - Duration::from_millis(1), now, ttl));
    assert!(!is_live(SystemTime::UNIX_EPOCH, now, ttl));
    assert!(
        is_live(now + Duration::from_secs(60), now, ttl),
        "future mtime"
    );
    assert_eq!(
        rescan_period(Duration::from_secs(10)),
        Duration::from_millis(3333) + Duration::from_nanos(333_333)
    );
    assert_eq!(rescan_period(Duration::from_secs(1)), MIN_RESCAN);
    assert_eq!(
        rescan_period(Duration::from_secs(60)),
        Duration::from_secs(20)
    );
}

// ---------------------------------------------------------------- a FileStore writer

/// A unique temporary root (not created).
fn temp_root(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "continuum-file-store-{tag}-{}-{n}",
        std::process::id()
    ))
}

/// The file of an etcd key, as Dynamo's `FileStore` (and the simulated fleet) writes it.
fn file_of(root: &Path, key: &str) -> PathBuf {
    continuum_sim::records::file_path(root, key).unwrap_or_else(|| panic!("{key}: no bucket"))
}

fn publish(root: &Path, key: &str, value: &[u8]) {
    let path = file_of(root, key);
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp_{:016x}", n ^ 0x5eed));
    std::fs::write(&tmp, value).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

fn fixture() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
        .collect()
}

fn write_fixture(root: &Path) {
    for (k, v) in fixture() {
        publish(root, &k, v.as_bytes());
    }
}

fn set_mtime(path: &Path, t: SystemTime) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_modified(t).unwrap();
}

struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------- sessions

const AGG_B: &str = "6a6ca22d4998ac16";
const AGG_B_INSTANCE: &str = "v1/instances/agg/backend/generate/6a6ca22d4998ac16";
const AGG_A_CARD: &str = "v1/mdc/agg/backend/generate/6a6ca22d4998ac0b";

fn plan(root: &Path, ttl: Duration, ns: &[&str]) -> FilePlan {
    FilePlan {
        root: root.to_path_buf(),
        ttl,
        namespaces: ns.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs a session over `plan` next to `script`, which gets the published views; fails if the
/// session ends first.
fn with_session<F, Fut>(plan: FilePlan, reducer: &Mutex<Reducer>, script: F)
where
    F: FnOnce(Views) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    rt().block_on(async {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut source = FileSource::new(plan);
        let session = drive_session(
            &mut source,
            reducer,
            move |v| {
                let _ = tx.send(v);
            },
            |_| {},
        );
        tokio::pin!(session);
        let script = script(Views { rx, last: None });
        tokio::select! {
            r = &mut session => panic!("session ended: {}", report_text(&r)),
            () = script => {}
        }
    });
}

fn report_text(r: &SessionReport) -> String {
    format!("{} after {:?}", r.end, r.healthy_for)
}

struct Views {
    rx: mpsc::UnboundedReceiver<Arc<FleetView>>,
    last: Option<Arc<FleetView>>,
}

impl Views {
    /// Waits until the latest view satisfies `pred` (or fails after `deadline`).
    async fn until(
        &mut self,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&FleetView) -> bool,
    ) -> Arc<FleetView> {
        let end = Instant::now() + deadline;
        loop {
            if let Some(v) = &self.last
                && pred(v)
            {
                return v.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(v)) => self.last = Some(v),
                Ok(None) => panic!("{what}: publisher gone"),
                Err(_) => panic!(
                    "{what}: not within {deadline:?}; last view has {:?} workers",
                    self.last.as_ref().map(|v| v.workers.len())
                ),
            }
        }
    }
}

fn workers(v: &FleetView) -> usize {
    v.workers.len()
}

/// Long enough that the periodic rescan (every ttl/3) cannot be what a test observes.
const LONG_TTL: Duration = Duration::from_secs(600);
const DEADLINE: Duration = Duration::from_secs(5);

#[test]
fn seeded_view_has_the_four_workers_and_temp_files_are_ignored() {
    let root = temp_root("seed");
    let _c = Cleanup(root.clone());
    write_fixture(&root);
    // A half-written record left by a writer that died: a `.tmp_` file with a fifth worker.
    let (k, v) = fixture()
        .into_iter()
        .find(|(k, _)| k == AGG_B_INSTANCE)
        .unwrap();
    let tmp = file_of(&root, &k).with_file_name(".tmp_00000000deadbeef");
    std::fs::write(&tmp, v.replace(AGG_B, "6a6ca22d4998acff")).unwrap();
    let reducer = Mutex::new(Reducer::new());
    with_session(
        plan(&root, LONG_TTL, &["agg", "disagg"]),
        &reducer,
        |mut views| async move {
            let v = views.until("seed", DEADLINE, |v| workers(v) == 4).await;
            assert!(
                v.worker("agg", InstanceId::new(0x6a6ca22d4998ac16))
                    .is_some()
            );
            // A temp file written while watching is ignored too.
            let tmp2 = tmp.with_file_name(".tmp_feedfacefeedface");
            std::fs::write(&tmp2, v_of(&tmp)).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            while let Ok(v) = views.rx.try_recv() {
                assert_eq!(workers(&v), 4, "a temp file became a worker");
            }
        },
    );
    assert_eq!(
        session::lock(&reducer)
            .counts()
            .get(DiscoveryEventKind::Malformed),
        0
    );
}

fn v_of(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

#[test]
fn atomic_rewrite_delete_and_stale_mtime_are_seen_through_inotify() {
    let root = temp_root("inotify");
    let _c = Cleanup(root.clone());
    write_fixture(&root);
    let card = fixture()
        .into_iter()
        .find(|(k, _)| k == AGG_A_CARD)
        .map(|(_, v)| v)
        .unwrap();
    let reducer = Mutex::new(Reducer::new());
    let agg_a = InstanceId::new(0x6a6ca22d4998ac0b);
    let agg_b = InstanceId::new(0x6a6ca22d4998ac16);
    let root2 = root.clone();
    with_session(
        plan(&root, LONG_TTL, &["agg", "disagg"]),
        &reducer,
        |mut views| async move {
            let root = root2;
            views.until("seed", DEADLINE, |v| workers(v) == 4).await;
            // Atomic rewrite (temp file + rename) of a card: the model name changes.
            let renamed = card.replace(
                "\"display_name\":\"tiny-agg\"",
                "\"display_name\":\"tiny-agg-v2\"",
            );
            assert_ne!(renamed, card);
            publish(&root, AGG_A_CARD, renamed.as_bytes());
            views
                .until("rewrite", DEADLINE, |v| {
                    v.worker("agg", agg_a).and_then(|w| w.model.as_deref()) == Some("tiny-agg-v2")
                })
                .await;
            // Delete: the worker goes.
            std::fs::remove_file(file_of(&root, AGG_B_INSTANCE)).unwrap();
            views
                .until("delete", DEADLINE, |v| {
                    v.worker("agg", agg_b).is_none() && workers(v) == 3
                })
                .await;
            // Back again, then its owner dies without cleaning up: an mtime older than the ttl.
            let (_, v) = fixture()
                .into_iter()
                .find(|(k, _)| k == AGG_B_INSTANCE)
                .unwrap();
            publish(&root, AGG_B_INSTANCE, v.as_bytes());
            views.until("re-put", DEADLINE, |v| workers(v) == 4).await;
            let path = file_of(&root, AGG_B_INSTANCE);
            set_mtime(
                &path,
                SystemTime::now() - LONG_TTL - Duration::from_secs(60),
            );
            views
                .until("stale mtime", DEADLINE, |v| {
                    v.worker("agg", agg_b).is_none()
                })
                .await;
            assert!(
                path.exists(),
                "the router must never delete an expired file"
            );
            // A keep-alive touch revives it.
            set_mtime(&path, SystemTime::now());
            views.until("touched", DEADLINE, |v| workers(v) == 4).await;
        },
    );
}

#[test]
fn untouched_files_expire_after_the_ttl_while_kept_alive_ones_stay() {
    let root = temp_root("ttl");
    let _c = Cleanup(root.clone());
    write_fixture(&root);
    let ttl = Duration::from_secs(1);
    let reducer = Mutex::new(Reducer::new());
    let agg_b = InstanceId::new(0x6a6ca22d4998ac16);
    let dying = file_of(&root, AGG_B_INSTANCE);
    let root2 = root.clone();
    with_session(
        plan(&root, ttl, &["agg", "disagg"]),
        &reducer,
        |mut views| async move {
            views.until("seed", DEADLINE, |v| workers(v) == 4).await;
            // Keep every file alive (as each owner does every ttl/3) except one worker's instance.
            let keep = async {
                loop {
                    for (k, _) in fixture() {
                        let p = file_of(&root2, &k);
                        if p != dying {
                            set_mtime(&p, SystemTime::now());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            let expired = views.until("expiry", Duration::from_secs(8), |v| {
                v.worker("agg", agg_b).is_none()
            });
            tokio::select! {
                v = expired => assert_eq!(workers(&v), 3),
                () = keep => {}
            }
            assert!(
                dying.exists(),
                "expired files are left for Dynamo's stores to delete"
            );
        },
    );
}

#[test]
fn oversized_file_is_counted_malformed_and_nothing_crashes() {
    let root = temp_root("big");
    let _c = Cleanup(root.clone());
    write_fixture(&root);
    let big = file_of(&root, "v1/instances/agg/backend/generate/00000000000000aa");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(u64::try_from(MAX_RECORD_BYTES).unwrap() + 1)
        .unwrap();
    drop(f);
    let reducer = Mutex::new(Reducer::new());
    with_session(
        plan(&root, LONG_TTL, &["agg", "disagg"]),
        &reducer,
        |mut views| async move {
            views.until("seed", DEADLINE, |v| workers(v) == 4).await;
        },
    );
    assert_eq!(
        session::lock(&reducer)
            .counts()
            .get(DiscoveryEventKind::Malformed),
        1,
        "{:?}",
        session::lock(&reducer).drain_diagnostics()
    );
}

/// The kv-events publishers of a view with their registered `(worker hex, dp_rank)`.
fn kv_sources(v: &FleetView) -> Vec<(String, Option<(String, u32)>)> {
    v.publishers_of(Family::KvEvents)
        .map(|p| {
            let s = p.source.map(|s| (s.worker_id.hex(), s.dp_rank));
            (p.publisher_id.hex(), s)
        })
        .collect()
}

#[test]
fn event_source_files_reach_the_reducer_as_etcd_records_do() {
    const SOURCE: &str = "v1/event_sources/namespace/agg/component/backend/endpoint/generate/topic/kv-events/1103cdbce2962";
    let root = temp_root("sources");
    let _c = Cleanup(root.clone());
    write_fixture(&root);
    // The same records fed straight into a reducer, as the etcd source feeds them.
    let mut direct = Reducer::new();
    for (k, v) in fixture() {
        let ev = continuum_core::discovery::KvEvent::Put {
            key: k.as_bytes(),
            value: v.as_bytes(),
        };
        direct.apply(ev, continuum_core::discovery::UnixMillis(1));
    }
    let expected = direct.materialize();
    assert_eq!(
        kv_sources(&expected)
            .iter()
            .filter(|(_, s)| s.is_some())
            .count(),
        3,
        "the dump's three event sources"
    );
    let record = fixture()
        .into_iter()
        .find(|(k, _)| k == SOURCE)
        .map(|(_, v)| v)
        .unwrap();
    let has_source = |v: &FleetView| {
        kv_sources(v)
            .into_iter()
            .find(|(p, _)| p == "1103cdbce2962")
            .and_then(|(_, s)| s)
    };
    let reducer = Mutex::new(Reducer::new());
    with_session(
        plan(&root, LONG_TTL, &["agg", "disagg"]),
        &reducer,
        |mut views| async move {
            let v = views
                .until("seed", DEADLINE, |v| v.publishers == expected.publishers)
                .await;
            assert_eq!(
                has_source(&v),
                Some(("6a6ca22d4998ac16".to_owned(), 0)),
                "agg worker b's publisher"
            );
            // Deleting the file resets the publisher's source; the publisher stays.
            std::fs::remove_file(file_of(&root, SOURCE)).unwrap();
            let v = views
                .until("source deleted", DEADLINE, |v| has_source(v).is_none())
                .await;
            assert_eq!(v.publishers.len(), expected.publishers.len());
            // A rewrite is read again.
            let rank2 = record.replace("\"dp_rank\":0", "\"dp_rank\":2");
            publish(&root, SOURCE, rank2.as_bytes());
            views
                .until("source rewritten", DEADLINE, |v| {
                    has_source(v) == Some(("6a6ca22d4998ac16".to_owned(), 2))
                })
                .await;
        },
    );
    assert_eq!(
        session::lock(&reducer)
            .counts()
            .get(DiscoveryEventKind::Malformed),
        0
    );
}

#[test]
fn only_the_configured_namespaces_are_read() {
    let root = temp_root("ns");
    let _c = Cleanup(root.clone());
    write_fixture(&root);
    let reducer = Mutex::new(Reducer::new());
    with_session(
        plan(&root, LONG_TTL, &["disagg"]),
        &reducer,
        |mut views| async move {
            let v = views.until("seed", DEADLINE, |v| workers(v) == 2).await;
            assert!(v.workers.iter().all(|w| w.namespace == "disagg"));
        },
    );
}

#[test]
fn missing_root_is_empty_never_created_and_picked_up_when_it_appears() {
    let base = temp_root("late");
    let _c = Cleanup(base.clone());
    std::fs::create_dir_all(&base).unwrap();
    // Two missing levels: the watch has to walk down as they appear.
    let root = base.join("store").join("kv");
    let reducer = Mutex::new(Reducer::new());
    let root2 = root.clone();
    with_session(
        plan(&root, LONG_TTL, &["agg", "disagg"]),
        &reducer,
        |mut views| async move {
            views
                .until("empty seed", DEADLINE, |v| workers(v) == 0)
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(!root2.exists(), "the router must not create the root");
            assert!(!base_of(&root2).join("store").exists());
            write_fixture(&root2);
            views
                .until("root appeared", DEADLINE, |v| workers(v) == 4)
                .await;
            // Removing the whole root empties the view.
            std::fs::remove_dir_all(&root2).unwrap();
            views
                .until("root removed", DEADLINE, |v| workers(v) == 0)
                .await;
            write_fixture(&root2);
            views
                .until("root re-created", DEADLINE, |v| workers(v) == 4)
                .await;
        },
    );
}

fn base_of(root: &Path) -> PathBuf {
    root.parent().and_then(Path::parent).unwrap().to_path_buf()
}
