//! Conversion of `dynamo.discovery.file`, the Dynamo file-store source (DISC-SRC-05, Q-29).
//!
//! Invariants: every finding goes to the [`Ctx`] with its dotted path; shape rules (absolute
//! root without NUL, TTL range, namespace list CFG-08/09) apply to whatever is written, while the
//! `root` requirement applies only when `dynamo.enabled` is true with `source: file`.

use std::time::Duration;

use super::convert_namespace::{check_namespace, namespace_list};
use super::dynamo::{DEFAULT_FILE_TTL, DiscoverySource, FileConfig};
use super::user_dynamo::UserFile;
use super::values::{Ctx, MISSING, join};

const BASE: &str = "dynamo.discovery.file";
/// Shortest accepted TTL (Dynamo's FileStore never keeps files alive more often than 1 s).
const MIN_TTL: Duration = Duration::from_secs(1);
/// Longest accepted TTL.
const MAX_TTL: Duration = Duration::from_secs(600);

/// `dynamo.discovery.file`.
pub(crate) fn file(
    ctx: &mut Ctx<'_>,
    u: Option<&UserFile>,
    source: DiscoverySource,
    enabled: bool,
) -> FileConfig {
    let d = FileConfig::default();
    let empty = UserFile::default();
    let u = u.unwrap_or(&empty);

    let root_field = join(BASE, "root");
    let root = match ctx.string(&root_field, u.root.as_ref()) {
        Some(r) if r.contains('\0') => {
            ctx.error(&root_field, r.escape_debug(), "must not contain NUL");
            None
        }
        Some(r) if !r.starts_with('/') => {
            ctx.error(&root_field, &r, "must be an absolute path");
            None
        }
        other => other,
    };
    if enabled && source == DiscoverySource::File && u.root.is_none() {
        ctx.error(
            &root_field,
            MISSING,
            "is required when dynamo.enabled is true with source file",
        );
    }

    let ttl = ctx.duration(
        &join(BASE, "ttl"),
        u.ttl.as_ref(),
        DEFAULT_FILE_TTL,
        MIN_TTL,
        MAX_TTL,
    );

    let namespaces = match &u.namespaces {
        None => d.namespaces,
        Some(list) => {
            let got = namespace_list(ctx, &join(BASE, "namespaces"), list, check_namespace);
            if got.is_empty() {
                FileConfig::default().namespaces
            } else {
                got
            }
        }
    };
    FileConfig {
        root,
        ttl,
        namespaces,
    }
}
