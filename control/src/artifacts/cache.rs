//! The on-disk artifact cache, `kv.artifact_cache_dir/blobs/<64 hex>` (KV-TOK-06).
//!
//! Remote artifacts (`http(s)://`, `hf://`) are kept here after a verified download, so a
//! restart or a reload does not fetch them again. Every read from the cache is verified
//! against the digest it is named by; a blob that fails (corrupted, truncated, replaced) is
//! removed and the artifact fetched again.
//!
//! Invariants: the cache directory and `blobs/` are created owner-only (0700) and blobs are
//! written owner-only (0600) through a temporary file and a rename, so a reader never sees a
//! partial blob; nothing is ever read from the cache without its digest checked; a blob read is
//! bounded by 64 MiB.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use continuum_core::config::dynamo::Blake3Digest;
use tokio::io::AsyncWriteExt;

use super::fetch::{FetchError, read_file, verified};

/// One cache directory.
#[derive(Debug, Clone)]
pub struct BlobCache {
    blobs: PathBuf,
}

/// What a cache lookup found.
#[derive(Debug)]
pub enum Cached {
    /// The verified bytes.
    Hit(Vec<u8>),
    /// No blob.
    Miss,
    /// A blob whose bytes do not have its digest: removed.
    Corrupt,
}

impl BlobCache {
    /// The cache under `dir` (created owner-only when missing; existing directories are set to
    /// 0700).
    pub fn open(dir: &Path) -> std::io::Result<BlobCache> {
        let blobs = dir.join("blobs");
        for d in [dir, blobs.as_path()] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(BlobCache { blobs })
    }

    /// Where the blob of `digest` lives.
    pub fn path(&self, digest: Blake3Digest) -> PathBuf {
        let name = digest.to_string();
        self.blobs
            .join(name.strip_prefix("blake3:").unwrap_or(&name))
    }

    /// The verified blob of `digest`.
    pub async fn get(&self, digest: Blake3Digest) -> Cached {
        let path = self.path(digest);
        let Some(p) = path.to_str() else {
            return Cached::Miss;
        };
        match read_file(p).await {
            Ok(bytes) => match verified(bytes, digest) {
                Ok(b) => Cached::Hit(b),
                Err(_) => {
                    let _ = tokio::fs::remove_file(&path).await;
                    Cached::Corrupt
                }
            },
            Err(FetchError::TooLarge) => {
                let _ = tokio::fs::remove_file(&path).await;
                Cached::Corrupt
            }
            Err(_) => Cached::Miss,
        }
    }

    /// Store verified `bytes` as the blob of `digest` (0600, atomically).
    pub async fn put(&self, digest: Blake3Digest, bytes: &[u8]) -> std::io::Result<()> {
        // One temp file per call (two loads may put the same blob at once; a shared name let
        // them write into one file), created fresh so a leftover is never written through.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.path(digest);
        let tmp = path.with_extension(format!("tmp{}.{n}", std::process::id()));
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .await?;
        let written = async {
            f.write_all(bytes).await?;
            f.sync_all().await?;
            tokio::fs::rename(&tmp, &path).await
        }
        .await;
        if written.is_err() {
            // A unique name is never written through again: a failed put removes its own.
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::fetch::digest;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "continuum-blobs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[tokio::test]
    async fn blobs_are_owner_only_verified_on_read_and_removed_when_corrupt() {
        let dir = tempdir();
        let cache = BlobCache::open(&dir).expect("open");
        for d in [dir.clone(), dir.join("blobs")] {
            let mode = std::fs::metadata(&d).expect("dir").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        let bytes = b"{\"model\":{}}".to_vec();
        let d = digest(&bytes);
        assert!(matches!(cache.get(d).await, Cached::Miss));
        cache.put(d, &bytes).await.expect("put");
        let mode = std::fs::metadata(cache.path(d))
            .expect("blob")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(cache.get(d).await, Cached::Hit(b) if b == bytes));
        // Someone changes the blob: the read refuses it and removes it.
        std::fs::write(cache.path(d), b"tampered").expect("write");
        assert!(matches!(cache.get(d).await, Cached::Corrupt));
        assert!(!cache.path(d).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn temp_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("blobs"))
            .expect("blobs")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .count()
    }

    /// Two loads putting one blob at once both succeed (each writes its own temp file), and a
    /// put that fails removes its temp file.
    #[tokio::test]
    async fn concurrent_puts_share_no_file_and_a_failed_put_leaves_nothing() {
        let dir = tempdir();
        let cache = BlobCache::open(&dir).expect("open");
        let bytes = vec![7u8; 1 << 20];
        let d = digest(&bytes);
        let (a, b) = tokio::join!(cache.put(d, &bytes), cache.put(d, &bytes));
        a.expect("first put");
        b.expect("second put");
        assert!(matches!(cache.get(d).await, Cached::Hit(got) if got == bytes));
        assert_eq!(temp_files(&dir), 0);
        // The blob's name is taken by a non-empty directory: the rename fails.
        let other = b"other".to_vec();
        let o = digest(&other);
        std::fs::create_dir_all(cache.path(o).join("x")).expect("mkdir");
        assert!(cache.put(o, &other).await.is_err());
        assert_eq!(temp_files(&dir), 0, "the failed put removed its temp file");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_existing_directory_is_made_owner_only() {
        let dir = tempdir();
        std::fs::create_dir_all(dir.join("blobs")).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        BlobCache::open(&dir).expect("open");
        let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
