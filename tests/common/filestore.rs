//! A Dynamo file store written the way Dynamo's `FileStore` writes it (bucket directories,
//! percent-encoded file names, a `.tmp_*` file renamed into place), for the tests that use
//! `dynamo.discovery.source: file`.

use std::path::{Path, PathBuf};

/// The recorded Dynamo 1.6.1 fleet (`key` / `value` line pairs).
pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
);

/// `v1/<bucket>/<rest>` lives in `root/v1/<bucket>/url_safe(rest)` (the simulated fleet's
/// writer, `continuum_sim::records::file_path`).
pub fn file_of(root: &Path, key: &str) -> PathBuf {
    continuum_sim::records::file_path(root, key).unwrap_or_else(|| panic!("{key}: no bucket"))
}

/// Write one record atomically (temp file, then rename).
pub fn publish(root: &Path, key: &str, value: &str) {
    let path = file_of(root, key);
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(".tmp_0123456789abcdef");
    std::fs::write(&tmp, value).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// Remove one record.
pub fn remove(root: &Path, key: &str) {
    std::fs::remove_file(file_of(root, key)).unwrap();
}

/// Write every record of the recorded fleet.
pub fn write_fixture(root: &Path) {
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for kv in lines.chunks(2) {
        publish(root, kv[0], kv[1]);
    }
}
