//! API-06 end to end, in process: the active picker of running shards is replaced at run time
//! (`ShardSet::set_picker`), every shard builds its own instance from the factory, and the next
//! picks follow it — with a scripted direct-mode shim that records the pins it receives.
//!
//! No Dynamo fleet is needed: the snapshot is built from the simulator's 1.6.1 records through
//! the router's own reducer, and the shim is a plain loopback HTTP/1.1 server.
#![allow(clippy::disallowed_methods)] // real sockets and threads, bounded by wall-clock deadlines
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use continuum_core::config::{Config, NoEnv};
use continuum_core::load::LoadStore;
use continuum_core::picker::{NoWorker, PickInput, Picks, WorkerPicker};
use continuum_core::publish::SnapshotCell;
use continuum_core::snapshot::RouterSnapshot;
use continuum_shards::metrics::ControlStats;
use continuum_shards::runtime::DriverChoice;
use continuum_shards::{PickerFactory, ShardSpec, load_based_picker, spawn_shards};
use continuum_sim::records::{WorkerRecord, fleet_of};

const MODEL: &str = "tiny-agg";
const IDS: [u64; 3] = [0x100, 0x200, 0x300];

/// A shim that answers every request 200 and records its `x-dynamo-worker-instance-id`.
fn start_shim() -> (SocketAddr, Arc<Mutex<Vec<u64>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let pins = Arc::new(Mutex::new(Vec::new()));
    let seen = pins.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let seen = seen.clone();
            std::thread::spawn(move || serve_shim(conn, &seen));
        }
    });
    (addr, pins)
}

fn serve_shim(mut conn: TcpStream, seen: &Mutex<Vec<u64>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // One request: head, then its content-length body.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
        };
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        if let Some(pin) = header("x-dynamo-worker-instance-id").and_then(|v| v.parse().ok()) {
            seen.lock().unwrap().push(pin);
        }
        buf.drain(..head_end + len);
        let body = br#"{"id":"c","object":"chat.completion","choices":[]}"#;
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if conn
            .write_all(reply.as_bytes())
            .and_then(|()| conn.write_all(body))
            .is_err()
        {
            return;
        }
    }
}

/// The snapshot: three aggregated workers of `MODEL` in namespace `agg`, one shim pool.
fn snapshot(shim: SocketAddr) -> RouterSnapshot {
    let yaml = format!(
        "server:\n  bind_address: \"127.0.0.1:0\"\n  shards: 2\n\
         backends:\n  - {{ name: shim, type: openai, url: \"http://{shim}\", models: [] }}\n\
         disaggregated_serving: {{ enabled: true, fallback_to_unified: false }}\n\
         dynamo:\n  enabled: true\n  discovery:\n    source: file\n    file:\n      \
         root: /nonexistent\n      namespaces: [agg]\n  shim:\n    pools:\n      \
         - {{ namespace: agg, backends: [shim] }}\n"
    );
    let (config, _) = Config::from_yaml(&yaml, &NoEnv).unwrap();
    let records: Vec<WorkerRecord<'_>> = IDS
        .iter()
        .map(|&id| {
            WorkerRecord::aggregated("agg", MODEL, id, 16, "127.0.0.1:1", "tcp://127.0.0.1:1")
        })
        .collect();
    let fleet = fleet_of(&records);
    assert_eq!(
        fleet.workers.len(),
        IDS.len(),
        "the records make three workers"
    );
    RouterSnapshot::build(
        1,
        Arc::new(config),
        vec![Some(shim)],
        Arc::default(),
        fleet,
        Arc::default(),
        None,
    )
}

/// Always the last candidate worker of the fleet, counting how many instances were built.
#[derive(Debug)]
struct Last;

static BUILT: AtomicU64 = AtomicU64::new(0);

impl WorkerPicker for Last {
    fn name(&self) -> &'static str {
        "last"
    }

    fn pick<'f>(&mut self, input: &PickInput<'f>, out: &mut Picks<'f>) -> Result<(), NoWorker> {
        out.clear();
        let w = input.fleet.workers.last().ok_or(NoWorker)?;
        out.push(continuum_core::picker::Pick {
            namespace: &w.namespace,
            decode: continuum_core::picker::Chosen {
                instance_id: w.instance_id,
                dp_rank: 0,
                reason: continuum_core::picker::SelectionReason::Load,
            },
            prefill: None,
            dp_rank_headers: Default::default(),
            kv: None,
        });
        Ok(())
    }
}

/// One chat request on a new connection (so SO_REUSEPORT spreads them over the shards).
fn chat(router: SocketAddr) -> u16 {
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let mut s = TcpStream::connect(router).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn set_picker_replaces_the_picker_of_every_running_shard() {
    let (shim, pins) = start_shim();
    let cell = Arc::new(SnapshotCell::new(snapshot(shim)));
    let spec = ShardSpec {
        bind: "127.0.0.1:0".parse().unwrap(),
        cpus: vec![None, None],
        driver: DriverChoice::Best,
        picker: load_based_picker(),
        peers: Default::default(),
    };
    let store = Arc::new(LoadStore::new());
    let mut set = spawn_shards(&spec, cell, Arc::new(ControlStats::default()), store).unwrap();
    let router = set.local_addr;
    assert_eq!(set.picker().name(), "load_based");

    // Without load samples the load-based picker rotates over the workers (PICK-07).
    for _ in 0..12 {
        assert_eq!(chat(router), 200);
    }
    let before: Vec<u64> = pins.lock().unwrap().drain(..).collect();
    assert_eq!(before.len(), 12, "every request was pinned");
    let distinct = IDS.iter().filter(|id| before.contains(id)).count();
    assert!(distinct >= 2, "the load-based picker rotates: {before:?}");

    set.set_picker(PickerFactory::new("last", |_env| {
        BUILT.fetch_add(1, Ordering::Relaxed);
        Box::new(Last)
    }));
    assert_eq!(set.picker().name(), "last");
    // The shards apply it when their mailbox delivers it; from then on every pick is the last
    // worker, on every shard.
    let deadline = Instant::now() + Duration::from_secs(10);
    while BUILT.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < deadline, "both shards build their picker");
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..24 {
        assert_eq!(chat(router), 200);
    }
    let after: Vec<u64> = pins.lock().unwrap().drain(..).collect();
    assert_eq!(after.len(), 24);
    assert!(
        after.iter().all(|id| *id == IDS[2]),
        "every shard picks with the new picker: {after:?}"
    );
    assert_eq!(BUILT.load(Ordering::Relaxed), 2, "one instance per shard");
    assert!(set.drain(Instant::now() + Duration::from_secs(2)));
}
