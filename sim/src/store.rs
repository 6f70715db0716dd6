//! A writer of Dynamo's file store (`DYN_DISCOVERY_BACKEND=file`): records in, files out, kept
//! alive like Dynamo's `FileStore` keeps its own.
//!
//! Role: [`FileStore::put`] publishes a key the way upstream does (a `.tmp_<hex>` file in the
//! bucket directory, then an atomic rename into place, so a reader never sees half a record);
//! [`FileStore::remove`] deletes keys; a keep-alive thread (`sim-store`) touches the mtime of every
//! owned file every `ttl / 3` (at least 1 s), as Dynamo does for the keys of its live leases.
//!
//! Invariants:
//! - every file this store wrote and did not remove is touched at least every `ttl / 3`, so the
//!   router (which treats an mtime older than the TTL as absent) keeps seeing it while the fleet
//!   runs; a removed key is never touched again (touching opens without `create`, so it cannot
//!   bring a file back);
//! - the keep-alive thread ends when the store is dropped; it holds no lock while sleeping.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use crate::error::SimError;
use crate::records::file_path;

/// Files owned by the store, shared with the keep-alive thread.
type Owned = Arc<Mutex<BTreeSet<PathBuf>>>;

/// Dynamo's file store under one root, written by the simulated workers.
#[derive(Debug)]
pub struct FileStore {
    root: PathBuf,
    owned: Owned,
    stop: Option<mpsc::Sender<()>>,
    keeper: Option<JoinHandle<()>>,
}

impl FileStore {
    /// A store under `root` (created if missing) whose files are touched every
    /// `max(ttl / 3, 1 s)`.
    pub fn open(root: &Path, ttl: Duration) -> Result<FileStore, SimError> {
        std::fs::create_dir_all(root).map_err(SimError::store(root))?;
        let owned: Owned = Arc::default();
        let (stop, stopped) = mpsc::channel::<()>();
        let period = (ttl / 3).max(Duration::from_secs(1));
        let files = owned.clone();
        let keeper = std::thread::Builder::new()
            .name("sim-store".into())
            .spawn(move || keep_alive(&files, period, &stopped))
            .map_err(SimError::io("spawning the file-store keep-alive thread"))?;
        Ok(FileStore {
            root: root.to_path_buf(),
            owned,
            stop: Some(stop),
            keeper: Some(keeper),
        })
    }

    /// The root (`DYN_FILE_KV`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, BTreeSet<PathBuf>> {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes `value` under `key` (`v1/<bucket>/...`): temp file, then rename into place.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<PathBuf, SimError> {
        let path = file_path(&self.root, key)
            .ok_or_else(|| SimError::Spec(format!("key {key:?} is not v1/<bucket>/<rest>")))?;
        let dir = path
            .parent()
            .ok_or_else(|| SimError::Spec(format!("key {key:?} has no bucket")))?;
        std::fs::create_dir_all(dir).map_err(SimError::store(dir))?;
        let tmp = dir.join(format!(".tmp_{:016x}", temp_suffix()));
        std::fs::write(&tmp, value).map_err(SimError::store(&tmp))?;
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(SimError::store(&path)(e));
        }
        self.owned().insert(path.clone());
        Ok(path)
    }

    /// Deletes `paths` (files `put` returned; a missing one is not an error) and stops touching
    /// them.
    pub fn remove(&self, paths: &[PathBuf]) -> Result<(), SimError> {
        let mut first_err = None;
        {
            let mut owned = self.owned();
            for p in paths {
                owned.remove(p);
            }
        }
        for p in paths {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert_with(|| SimError::store(p)(e));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Files currently owned (alive).
    pub fn owned_files(&self) -> usize {
        self.owned().len()
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
    }
}

/// A process-unique suffix for temporary files.
fn temp_suffix() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Touches every owned file each `period` until `stopped` says stop (or its sender is gone).
fn keep_alive(owned: &Owned, period: Duration, stopped: &mpsc::Receiver<()>) {
    loop {
        match stopped.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let files: Vec<PathBuf> = owned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        let now = SystemTime::now();
        for f in files {
            // Without `create`: a file removed meanwhile stays removed.
            if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&f) {
                let _ = file.set_modified(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_renames_into_place_and_remove_deletes() {
        let root = std::env::temp_dir().join(format!("continuum-sim-store-{}", temp_suffix()));
        let store = FileStore::open(&root, Duration::from_secs(10)).unwrap();
        let p = store
            .put("v1/instances/ns/backend/generate/1f", b"{}")
            .unwrap();
        assert_eq!(p, root.join("v1/instances/ns%2Fbackend%2Fgenerate%2F1f"));
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        assert_eq!(store.owned_files(), 1);
        store.remove(std::slice::from_ref(&p)).unwrap();
        assert!(!p.exists());
        assert_eq!(store.owned_files(), 0);
        store.remove(&[p]).unwrap();
        drop(store);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
