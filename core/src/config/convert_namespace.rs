//! Dynamo namespace checks shared by the `dynamo` conversions (CFG-08, CFG-09, CFG-24).
//!
//! Role: the leaf helpers that `convert_dynamo` (etcd, Kubernetes), `convert_dynamo_file` and
//! `convert_dynamo_rest` (shim, event bus) all apply to namespace values, kept apart so that those
//! modules depend on it and never on each other's internals.
//!
//! Invariants: as in every conversion, each finding goes to the [`Ctx`] with its dotted path and
//! the caller continues with what was accepted.

use super::dynamo::MAX_DYNAMO_NAMESPACES;
use super::scalar::Scalar;
use super::values::{Ctx, index};

/// CFG-08: a Dynamo namespace is non-empty, without `/`, whitespace or control characters.
pub(crate) fn check_namespace(ctx: &mut Ctx<'_>, field: &str, s: &Scalar) -> Option<String> {
    let ns = ctx.string(field, Some(s))?;
    if ns.is_empty() {
        ctx.error(field, "\"\"", "namespace must not be empty");
        return None;
    }
    if ns
        .chars()
        .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    {
        ctx.error(
            field,
            &ns,
            "namespace must not contain '/', whitespace or control characters",
        );
        return None;
    }
    Some(ns)
}

/// A list of unique namespaces, at most 16, each checked by `check` (CFG-09 / CFG-24).
pub(crate) fn namespace_list(
    ctx: &mut Ctx<'_>,
    field: &str,
    list: &[Scalar],
    check: fn(&mut Ctx<'_>, &str, &Scalar) -> Option<String>,
) -> Vec<String> {
    if list.is_empty() {
        ctx.error(field, "[]", "must hold at least 1 namespace when written");
    }
    if list.len() > MAX_DYNAMO_NAMESPACES {
        ctx.error(
            field,
            format!("{} entries", list.len()),
            format!("at most {MAX_DYNAMO_NAMESPACES} namespaces"),
        );
    }
    let mut out: Vec<String> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let f = index(field, i);
        if let Some(ns) = check(ctx, &f, s) {
            if out.contains(&ns) {
                ctx.error(&f, &ns, "duplicate namespace");
            } else {
                out.push(ns);
            }
        }
    }
    out
}
