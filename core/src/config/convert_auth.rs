//! Conversion of `auth`: the client API keys.
//!
//! Invariants: a converted `auth` has at least one key (an empty list would refuse every
//! request; without keys the section is left out); names and key hashes are unique (one key,
//! one policy); `allowed_backends` name configured backends; `burst` needs `requests_per_second`;
//! at most [`MAX_KEYS`] keys, so the constant-time scan over them stays short. Key hashes are
//! echoed masked in errors.

use std::collections::HashSet;

use super::convert::unique_name;
use super::user::UserAuth;
use super::values::{Ctx, MISSING, index, join};
use super::{ApiKeyConfig, AuthConfig, BackendConfig, BackendName, KeyName, KeyRate};

/// Most keys accepted.
pub(crate) const MAX_KEYS: usize = 1024;
/// Most models or backends one key may list.
const MAX_ALLOWED: usize = 1024;

/// `auth`.
pub(crate) fn auth(
    ctx: &mut Ctx<'_>,
    u: Option<&UserAuth>,
    backends: &[BackendConfig],
) -> Option<AuthConfig> {
    let u = u?;
    let keys_in = u.keys.as_deref().unwrap_or_default();
    if keys_in.is_empty() {
        ctx.error(
            "auth.keys",
            "[]",
            "must list at least one key; leave auth out to serve without keys",
        );
        return None;
    }
    if keys_in.len() > MAX_KEYS {
        ctx.error(
            "auth.keys",
            format!("{} keys", keys_in.len()),
            format!("at most {MAX_KEYS} keys"),
        );
    }
    let mut names = HashSet::new();
    let mut hashes = HashSet::new();
    let mut keys = Vec::with_capacity(keys_in.len());
    for (i, k) in keys_in.iter().enumerate() {
        let base = index("auth.keys", i);
        let name = unique_name(
            ctx,
            &join(&base, "name"),
            k.name.as_ref(),
            &mut names,
            "key",
        );
        let hash_field = join(&base, "key_hash");
        if k.key_hash.is_none() {
            ctx.error(
                &hash_field,
                MISSING,
                "is required (sha256:<64 lowercase hex>)",
            );
        }
        let key_hash = ctx.token_hash(&hash_field, k.key_hash.as_ref());
        if let Some(h) = key_hash
            && !hashes.insert(h.0)
        {
            ctx.error_masked(&hash_field, "the same key is listed twice");
        }
        let allowed_models = k.allowed_models.as_ref().map(|list| {
            let f = join(&base, "allowed_models");
            let mut out: Vec<String> = Vec::with_capacity(list.len());
            if list.len() > MAX_ALLOWED {
                ctx.error(
                    &f,
                    format!("{} models", list.len()),
                    format!("at most {MAX_ALLOWED}"),
                );
            }
            for (j, m) in list.iter().enumerate() {
                let fj = index(&f, j);
                match ctx.string(&fj, Some(m)) {
                    Some(m) if m.trim().is_empty() => ctx.error(&fj, &m, "must not be empty"),
                    Some(m) if out.contains(&m) => ctx.error(&fj, &m, "duplicate model id"),
                    Some(m) => out.push(m),
                    None => {}
                }
            }
            out
        });
        let allowed_backends = k.allowed_backends.as_ref().map(|list| {
            let f = join(&base, "allowed_backends");
            let mut out: Vec<BackendName> = Vec::with_capacity(list.len());
            for (j, b) in list.iter().enumerate() {
                let fj = index(&f, j);
                let Some(b) = ctx.string(&fj, Some(b)) else {
                    continue;
                };
                if !backends.iter().any(|cb| cb.name.0 == b) {
                    ctx.error(&fj, &b, "is not a configured backends[].name");
                } else if out.iter().any(|o| o.0 == b) {
                    ctx.error(&fj, &b, "duplicate backend");
                } else {
                    out.push(BackendName(b));
                }
            }
            out
        });
        let rps = ctx.opt_float(
            &join(&base, "requests_per_second"),
            k.requests_per_second.as_ref(),
            0.001,
            1_000_000.0,
        );
        let burst = ctx.opt_uint(&join(&base, "burst"), k.burst.as_ref(), 1, 1_000_000);
        if burst.is_some() && k.requests_per_second.is_none() {
            ctx.error(
                &join(&base, "burst"),
                burst.unwrap_or_default(),
                "needs requests_per_second (the rate the bucket refills at)",
            );
        }
        let rate = rps.map(|r| KeyRate {
            requests_per_second: r,
            burst: burst.map_or_else(|| (r.ceil() as u32).max(1), |b| b as u32),
        });
        let max_concurrent = ctx
            .opt_uint(
                &join(&base, "max_concurrent"),
                k.max_concurrent.as_ref(),
                1,
                1_000_000,
            )
            .map(|n| n as u32);
        if let Some(key_hash) = key_hash {
            keys.push(ApiKeyConfig {
                name: KeyName(name),
                key_hash,
                allowed_models,
                allowed_backends,
                rate,
                max_concurrent,
            });
        }
    }
    Some(AuthConfig { keys })
}
