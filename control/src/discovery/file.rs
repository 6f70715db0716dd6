//! The Dynamo file-store watch source (feature `dynamo`, DISC-SRC-05, Q-29): the same records
//! as etcd, read from the directory tree Dynamo's `FileStore` writes.
//!
//! Layout (upstream `lib/runtime/src/storage/kv/file.rs`): a bucket is the directory
//! `root/<bucket>` (`v1/instances`, `v1/mdc`, `v1/event_channels`, and since Dynamo 1.6.1
//! `v1/event_sources`); each key is one regular file
//! in it, named by the key percent-encoded with every non-alphanumeric byte escaped; the
//! etcd-equivalent key is the percent-decoded path relative to the root; the file's bytes are the
//! etcd value. Writers publish through a `.tmp_*` file renamed (or hard-linked) into place, and
//! keep their files alive by touching the mtime every TTL/3; a file not touched for a TTL is dead.
//!
//! Invariants:
//! - read-only: this module never creates, writes, touches, renames or deletes anything under
//!   the root, not even expired files (Dynamo's own stores delete those; we only stop seeing
//!   them); a missing root or bucket is simply empty, and is picked up when it appears;
//! - `.tmp_*` files, other buckets and keys outside the configured namespaces' prefixes
//!   ([`namespace_prefixes`], one per reducer keyspace, DISC-REC-01) are never read;
//! - a file is stat-ed before it is read: one above `MAX_RECORD_BYTES` is handed to the reducer
//!   as an oversized put (counted malformed) without reading it, and no read takes more than
//!   `MAX_RECORD_BYTES + 1` bytes;
//! - a file whose mtime is older than the TTL is absent: its key is deleted from the view;
//! - file-system work runs on tokio's blocking pool, never on the control thread; inotify events
//!   come through a bounded queue whose overflow turns into a full rescan, and a periodic rescan
//!   every max(TTL/3, 1 s) expires dead files and reconciles anything the events missed;
//! - no timeout besides the driver's seed timeout.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use continuum_core::discovery::MAX_RECORD_BYTES;
use continuum_core::discovery::keys::namespace_prefixes;
use notify::event::ModifyKind;
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::plan::FilePlan;
use super::session::{Change, SessionEnd, WatchSource};

/// The bucket directories under `root/v1` that hold discovery records (DISC-REC-01), one per
/// reducer keyspace.
pub const BUCKETS: [&str; 4] = ["instances", "mdc", "event_channels", "event_sources"];
/// Upstream's prefix for files being written; never a key.
pub const TEMP_PREFIX: &[u8] = b".tmp_";
/// Shortest rescan period (upstream's shortest keep-alive period).
pub const MIN_RESCAN: Duration = Duration::from_secs(1);
/// Watch events queued before the overflow flag asks for a full rescan instead.
const EVENT_QUEUE: usize = 4096;
/// Events folded into one batch at most.
const MAX_BATCH_EVENTS: usize = 4096;

/// The rescan period for a TTL: max(TTL/3, 1 s), the owners' keep-alive period.
pub fn rescan_period(ttl: Duration) -> Duration {
    (ttl / 3).max(MIN_RESCAN)
}

/// Whether a file last modified at `mtime` is alive at `now` (upstream deletes it once
/// `mtime < now - ttl`). An mtime in the future is alive.
pub fn is_live(mtime: SystemTime, now: SystemTime, ttl: Duration) -> bool {
    match now.duration_since(mtime) {
        Ok(age) => age <= ttl,
        Err(_) => true,
    }
}

/// Percent-decodes `raw` leniently, as upstream's `percent_decode_str`: `%` followed by two hex
/// digits is that byte; any other `%` stays as it is.
pub fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'%'
            && let (Some(hi), Some(lo)) = (
                raw.get(i + 1).and_then(|c| hex(*c)),
                raw.get(i + 2).and_then(|c| hex(*c)),
            )
        {
            out.push(hi << 4 | lo);
            i += 3;
            continue;
        }
        out.push(b);
        i += 1;
    }
    out
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// What a path under (or outside) the root is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathClass {
    /// A record file of a followed namespace, with its etcd-equivalent key.
    Key(Vec<u8>),
    /// A writer's temporary file.
    Temp,
    /// A record file the router does not follow (other namespace or bucket).
    Ignored,
    /// Something else inside the root (the root, `v1`, a bucket directory, a nested entry).
    Other,
    /// Not under the root.
    Outside,
}

/// Where the store is and what of it is read: pure path logic plus blocking reads.
#[derive(Debug)]
pub struct Layout {
    root: PathBuf,
    prefixes: Vec<Vec<u8>>,
    ttl: Duration,
}

/// What identifies one published version of a file (every upstream write is a new inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
        }
    }
}

/// Keys currently put, with the version that was read.
type Known = BTreeMap<Vec<u8>, Stamp>;

impl Layout {
    /// The layout for `root`, following `namespaces` (their [`namespace_prefixes`]), with `ttl`.
    pub fn new(root: PathBuf, namespaces: &[String], ttl: Duration) -> Self {
        let prefixes = namespaces
            .iter()
            .flat_map(|ns| namespace_prefixes(ns))
            .map(String::into_bytes)
            .collect();
        Layout {
            root,
            prefixes,
            ttl,
        }
    }

    /// Classifies `path`; record files are `root/v1/<bucket>/<percent-encoded key>`.
    pub fn classify(&self, path: &Path) -> PathClass {
        let Ok(rel) = path.strip_prefix(&self.root) else {
            return PathClass::Outside;
        };
        let parts: Vec<&OsStr> = rel
            .components()
            .map(|c| match c {
                Component::Normal(s) => Some(s),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        let [v1, bucket, name] = parts.as_slice() else {
            return PathClass::Other;
        };
        if name.as_bytes().starts_with(TEMP_PREFIX) {
            return PathClass::Temp;
        }
        let bucket = bucket.as_bytes();
        if v1.as_bytes() != b"v1" || !BUCKETS.iter().any(|b| b.as_bytes() == bucket) {
            return PathClass::Ignored;
        }
        let mut key = Vec::with_capacity(4 + bucket.len() + name.len());
        key.extend_from_slice(b"v1/");
        key.extend_from_slice(bucket);
        key.push(b'/');
        key.extend_from_slice(&percent_decode(name.as_bytes()));
        if self.prefixes.iter().any(|p| key.starts_with(p)) {
            PathClass::Key(key)
        } else {
            PathClass::Ignored
        }
    }

    /// Re-reads one key's file (blocking): a put when it is alive and new, changed or `force`d,
    /// a delete when it is gone or dead and was put before.
    fn probe(
        &self,
        path: &Path,
        key: &[u8],
        now: SystemTime,
        force: bool,
        known: &mut Known,
        out: &mut Vec<Change>,
    ) {
        let meta = match std::fs::metadata(path) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return forget(key, known, out, "not a regular file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return forget(key, known, out, "removed");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "file store: cannot stat");
                return;
            }
        };
        let mtime = meta.modified().unwrap_or(now);
        if !is_live(mtime, now, self.ttl) {
            return forget(key, known, out, "expired (mtime older than the ttl)");
        }
        if !force && known.get(key) == Some(&Stamp::of(&meta)) {
            return;
        }
        match read_capped(path) {
            Ok((value, stamp)) => {
                known.insert(key.to_vec(), stamp);
                out.push(Change::Put(key.to_vec(), value));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                forget(key, known, out, "removed")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "file store: cannot read");
            }
        }
    }

    /// Walks every bucket (blocking): puts for new, changed or `force`d live files, deletes for
    /// keys put before whose files are gone or dead. A bucket that cannot be listed for another
    /// reason than absence keeps its keys.
    fn scan(
        &self,
        now: SystemTime,
        force: &HashSet<Vec<u8>>,
        known: &mut Known,
        out: &mut Vec<Change>,
    ) {
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut unlisted: Vec<Vec<u8>> = Vec::new();
        for bucket in BUCKETS {
            let dir = self.root.join("v1").join(bucket);
            let entries = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "file store: cannot list");
                    unlisted.push(format!("v1/{bucket}/").into_bytes());
                    continue;
                }
            };
            let mut names: Vec<_> = entries
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect();
            names.sort();
            for name in names {
                let path = dir.join(&name);
                if let PathClass::Key(key) = self.classify(&path) {
                    let forced = force.contains(&key);
                    self.probe(&path, &key, now, forced, known, out);
                    seen.insert(key);
                }
            }
        }
        let gone: Vec<Vec<u8>> = known
            .keys()
            .filter(|k| !seen.contains(*k) && !unlisted.iter().any(|p| k.starts_with(p)))
            .cloned()
            .collect();
        for key in gone {
            forget(&key, known, out, "removed");
        }
    }
}

/// Deletes `key` from the view when it was put.
fn forget(key: &[u8], known: &mut Known, out: &mut Vec<Change>, why: &str) {
    if known.remove(key).is_some() {
        tracing::info!(key = %String::from_utf8_lossy(key), why, "file store: record gone");
        out.push(Change::Delete(key.to_vec()));
    }
}

/// Reads a file of at most `MAX_RECORD_BYTES` (blocking); a larger one is not read and yields a
/// placeholder of `MAX_RECORD_BYTES + 1` zero bytes that the reducer counts as oversized.
fn read_capped(path: &Path) -> std::io::Result<(Vec<u8>, Stamp)> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let stamp = Stamp::of(&meta);
    let cap = u64::try_from(MAX_RECORD_BYTES).unwrap_or(u64::MAX);
    if meta.len() > cap {
        return Ok((vec![0; MAX_RECORD_BYTES + 1], stamp));
    }
    let mut value = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap + 1).read_to_end(&mut value)?;
    Ok((value, stamp))
}

/// The directory being watched: the root (recursively) or, while it is missing, its nearest
/// existing ancestor (that directory only).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Watched {
    path: PathBuf,
    dev: u64,
    ino: u64,
    is_root: bool,
}

fn nearest_dir(root: &Path) -> Option<Watched> {
    root.ancestors().find_map(|p| {
        let m = std::fs::metadata(p)
            .ok()
            .filter(std::fs::Metadata::is_dir)?;
        Some(Watched {
            path: p.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            is_root: p == root,
        })
    })
}

/// What one batch of events asks for.
#[derive(Debug, Default)]
struct Pending {
    /// Walk every bucket.
    full: bool,
    /// Paths to re-read, with their keys and whether to read even an unchanged version.
    probes: BTreeMap<PathBuf, (Vec<u8>, bool)>,
}

type EventResult = notify::Result<Event>;

/// A read-only file-store session.
pub struct FileSource {
    layout: Arc<Layout>,
    known: Known,
    watcher: Option<RecommendedWatcher>,
    watched: Option<Watched>,
    tx: mpsc::Sender<EventResult>,
    rx: mpsc::Receiver<EventResult>,
    overflow: Arc<AtomicBool>,
    tick: Option<tokio::time::Interval>,
}

impl std::fmt::Debug for FileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("layout", &self.layout)
            .field("keys", &self.known.len())
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SessionEnd> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SessionEnd::Disconnected(format!("file store task: {e}")))
}

impl FileSource {
    /// A source for the plan (nothing is read or watched yet).
    pub fn new(plan: FilePlan) -> Self {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        FileSource {
            layout: Arc::new(Layout::new(plan.root, &plan.namespaces, plan.ttl)),
            known: Known::new(),
            watcher: None,
            watched: None,
            tx,
            rx,
            overflow: Arc::new(AtomicBool::new(false)),
            tick: None,
        }
    }

    /// Runs the probes, or a full scan that covers them, off the runtime thread.
    async fn read(&mut self, pending: Pending) -> Result<Vec<Change>, SessionEnd> {
        let layout = self.layout.clone();
        let mut known = std::mem::take(&mut self.known);
        let (known, out) = blocking(move || {
            let now = crate::clock::wall();
            let mut out = Vec::new();
            if pending.full {
                let force: HashSet<Vec<u8>> = pending
                    .probes
                    .into_values()
                    .filter_map(|(k, force)| force.then_some(k))
                    .collect();
                layout.scan(now, &force, &mut known, &mut out);
            } else {
                for (path, (key, force)) in pending.probes {
                    layout.probe(&path, &key, now, force, &mut known, &mut out);
                }
            }
            (known, out)
        })
        .await?;
        self.known = known;
        Ok(out)
    }

    /// Watches the root, or its nearest existing ancestor while it is missing; re-arms when that
    /// changed (root created, removed or replaced). Returns whether it re-armed.
    async fn arm(&mut self) -> Result<bool, SessionEnd> {
        let root = self.layout.root.clone();
        let current = self.watched.clone();
        let watcher = self.watcher.take();
        let tx = self.tx.clone();
        let overflow = self.overflow.clone();
        let (watcher, watched, rearmed) = blocking(move || {
            let target = nearest_dir(&root)
                .ok_or_else(|| format!("no existing directory above {}", root.display()))?;
            if let Some(w) = watcher
                && current.as_ref() == Some(&target)
            {
                return Ok((w, target, false));
            }
            let handler = move |ev: EventResult| {
                if tx.try_send(ev).is_err() {
                    overflow.store(true, Ordering::Relaxed);
                }
            };
            let mut w = notify::recommended_watcher(handler)
                .map_err(|e| format!("cannot start the file watcher: {e}"))?;
            let mode = if target.is_root {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            w.watch(&target.path, mode)
                .map_err(|e| format!("cannot watch {}: {e}", target.path.display()))?;
            Ok::<_, String>((w, target, true))
        })
        .await?
        .map_err(SessionEnd::Disconnected)?;
        if rearmed {
            if watched.is_root {
                tracing::info!(root = %watched.path.display(), "file store: watching the root");
            } else {
                tracing::info!(
                    root = %self.layout.root.display(),
                    watching = %watched.path.display(),
                    "file store: root missing, watching its nearest existing parent"
                );
            }
        }
        self.watcher = Some(watcher);
        self.watched = Some(watched);
        Ok(rearmed)
    }
}

/// Folds one watch event into `pending`.
fn take(layout: &Layout, ev: EventResult, pending: &mut Pending) {
    let ev = match ev {
        Ok(ev) => ev,
        Err(e) => {
            tracing::debug!(error = %e, "file store: watch error, rescanning");
            pending.full = true;
            return;
        }
    };
    if ev.need_rescan() {
        pending.full = true;
    }
    if matches!(ev.kind, EventKind::Access(_)) {
        return;
    }
    // A touch only needs a stat (alive or expired); anything else re-reads the bytes.
    let force = !matches!(ev.kind, EventKind::Modify(ModifyKind::Metadata(_)));
    for path in ev.paths {
        match layout.classify(&path) {
            PathClass::Key(key) => {
                let e = pending.probes.entry(path).or_insert((key, false));
                e.1 |= force;
            }
            PathClass::Other => pending.full = true,
            PathClass::Temp | PathClass::Ignored | PathClass::Outside => {}
        }
    }
}

impl WatchSource for FileSource {
    async fn seed(&mut self) -> Result<Vec<Change>, SessionEnd> {
        let root = self.layout.root.clone();
        if !blocking(move || root.is_dir()).await? {
            tracing::info!(
                root = %self.layout.root.display(),
                "file store root does not exist yet: no workers until it appears"
            );
        }
        self.known.clear();
        self.read(Pending {
            full: true,
            probes: BTreeMap::new(),
        })
        .await
    }

    async fn open_watches(&mut self) -> Result<(), SessionEnd> {
        self.arm().await.map_err(|e| match e {
            SessionEnd::Disconnected(m) => SessionEnd::SeedFailed(m),
            other => other,
        })?;
        let mut tick = tokio::time::interval(rescan_period(self.layout.ttl));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: it reconciles what changed between seed and watch.
        self.tick = Some(tick);
        Ok(())
    }

    async fn next(&mut self) -> Result<Vec<Change>, SessionEnd> {
        loop {
            let Some(tick) = self.tick.as_mut() else {
                return Err(SessionEnd::Disconnected("file store not watched".into()));
            };
            let mut pending = Pending::default();
            tokio::select! {
                ev = self.rx.recv() => {
                    let Some(ev) = ev else {
                        return Err(SessionEnd::Disconnected("file watcher stopped".into()));
                    };
                    take(&self.layout, ev, &mut pending);
                    let mut n = 1;
                    while n < MAX_BATCH_EVENTS {
                        let Ok(ev) = self.rx.try_recv() else { break };
                        take(&self.layout, ev, &mut pending);
                        n += 1;
                    }
                }
                _ = tick.tick() => pending.full = true,
            }
            if self.overflow.swap(false, Ordering::Relaxed) {
                pending.full = true;
            }
            if self.arm().await? {
                pending.full = true;
            }
            if !pending.full && pending.probes.is_empty() {
                continue;
            }
            let changes = self.read(pending).await?;
            if !changes.is_empty() {
                return Ok(changes);
            }
        }
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
