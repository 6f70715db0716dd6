//! Conversion of what makes backends trustworthy: the upstream timeouts (server defaults and
//! per-backend overrides), the active health check, passive outlier ejection, the retry
//! budget and how an `https://` backend is verified (`tls`).
//!
//! Invariants: every value is range-checked with its dotted path and the conversion goes on
//! with the default; a health check's timeout must be shorter than its interval (a probe never
//! overlaps the next); a section written with `enabled: false` is off, and then none of its
//! other keys may be written (they would do nothing); a `tls` block needs an `https://` url
//! (on `http://` it would do nothing), and every `https://` backend gets one (system roots,
//! the URL's host) when none is written.

use std::time::Duration;

use super::addr::valid_server_name;
use super::scalar::Scalar;
use super::user::{
    UserBackendTimeouts, UserBackendTls, UserHealthCheck, UserOutlier, UserRetryBudget,
    UserTimeouts,
};
use super::values::{Ctx, join};
use super::{
    BackendTls, BackendUrl, HealthCheck, OutlierPolicy, RetryBudgetConfig, TlsRoots,
    UpstreamTimeouts, UrlScheme,
};

/// Longest upstream timeout or deadline accepted.
const MAX_UPSTREAM: Duration = Duration::from_secs(24 * 3600);
const MS1: Duration = Duration::from_millis(1);

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(300),
            idle: Duration::from_secs(120),
            deadline: None,
        }
    }
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_retries_per_second: 10,
        }
    }
}

impl Default for HealthCheck {
    fn default() -> Self {
        Self {
            path: "/health".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
        }
    }
}

impl Default for OutlierPolicy {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejection_percent: 50,
        }
    }
}

/// One timeout key of `base`.
fn timeout(
    ctx: &mut Ctx<'_>,
    base: &str,
    key: &str,
    v: Option<&Scalar>,
    default: Duration,
) -> Duration {
    ctx.duration(&join(base, key), v, default, MS1, MAX_UPSTREAM)
}

/// `server.timeouts`' upstream keys. `upstream_response` was split in two and is refused with
/// that advice.
pub(crate) fn server_upstream(ctx: &mut Ctx<'_>, t: Option<&UserTimeouts>) -> UpstreamTimeouts {
    let d = UpstreamTimeouts::default();
    let Some(t) = t else { return d };
    let base = "server.timeouts";
    if let Some(v) = &t.upstream_response {
        ctx.error(
            &join(base, "upstream_response"),
            v,
            "was replaced by upstream_first_byte (time to the response head) and upstream_idle \
             (time between two reads of a response body)",
        );
    }
    UpstreamTimeouts {
        connect: timeout(
            ctx,
            base,
            "upstream_connect",
            t.upstream_connect.as_ref(),
            d.connect,
        ),
        first_byte: timeout(
            ctx,
            base,
            "upstream_first_byte",
            t.upstream_first_byte.as_ref(),
            d.first_byte,
        ),
        idle: timeout(ctx, base, "upstream_idle", t.upstream_idle.as_ref(), d.idle),
        deadline: t
            .request_deadline
            .as_ref()
            .map(|v| timeout(ctx, base, "request_deadline", Some(v), MAX_UPSTREAM)),
    }
}

/// `backends[i].timeouts` over the server's.
pub(crate) fn backend_timeouts(
    ctx: &mut Ctx<'_>,
    base: &str,
    server: UpstreamTimeouts,
    u: Option<&UserBackendTimeouts>,
) -> UpstreamTimeouts {
    let Some(u) = u else { return server };
    let base = join(base, "timeouts");
    UpstreamTimeouts {
        connect: timeout(
            ctx,
            &base,
            "upstream_connect",
            u.upstream_connect.as_ref(),
            server.connect,
        ),
        first_byte: timeout(
            ctx,
            &base,
            "upstream_first_byte",
            u.upstream_first_byte.as_ref(),
            server.first_byte,
        ),
        idle: timeout(
            ctx,
            &base,
            "upstream_idle",
            u.upstream_idle.as_ref(),
            server.idle,
        ),
        deadline: match &u.request_deadline {
            None => server.deadline,
            Some(v) => Some(timeout(
                ctx,
                &base,
                "request_deadline",
                Some(v),
                MAX_UPSTREAM,
            )),
        },
    }
}

/// Whether a section is switched off by `enabled: false`; when it is, any other key written is
/// an error (it would do nothing).
fn switched_off(ctx: &mut Ctx<'_>, base: &str, enabled: Option<&Scalar>, others: usize) -> bool {
    if ctx.bool(&join(base, "enabled"), enabled, true) {
        return false;
    }
    if others > 0 {
        ctx.error(
            &join(base, "enabled"),
            "false",
            "the section is off: remove its other keys, they would do nothing",
        );
    }
    true
}

/// `backends[i].health_check`. `shim_replica`: the backend is a shim replica, which is checked
/// with the defaults (`GET /health`) when the section is not written.
pub(crate) fn health_check(
    ctx: &mut Ctx<'_>,
    base: &str,
    u: Option<&UserHealthCheck>,
    shim_replica: bool,
) -> Option<HealthCheck> {
    let d = HealthCheck::default();
    let Some(u) = u else {
        return shim_replica.then_some(d);
    };
    let base = join(base, "health_check");
    let written = [
        &u.path,
        &u.interval,
        &u.timeout,
        &u.healthy_threshold,
        &u.unhealthy_threshold,
    ]
    .iter()
    .filter(|v| v.is_some())
    .count();
    if switched_off(ctx, &base, u.enabled.as_ref(), written) {
        return None;
    }
    let path = match ctx.string(&join(&base, "path"), u.path.as_ref()) {
        None => d.path,
        Some(p) if !p.starts_with('/') || p.bytes().any(|b| b <= b' ' || b == 0x7f) => {
            ctx.error(
                &join(&base, "path"),
                &p,
                "must start with / and contain no spaces or control characters",
            );
            d.path
        }
        Some(p) => p,
    };
    let interval = ctx.duration(
        &join(&base, "interval"),
        u.interval.as_ref(),
        d.interval,
        Duration::from_millis(100),
        Duration::from_secs(3600),
    );
    let probe_timeout = ctx.duration(
        &join(&base, "timeout"),
        u.timeout.as_ref(),
        d.timeout.min(interval),
        MS1,
        Duration::from_secs(3600),
    );
    if probe_timeout > interval {
        ctx.error(
            &join(&base, "timeout"),
            super::values::fmt_duration(probe_timeout),
            format!(
                "must not exceed the interval ({})",
                super::values::fmt_duration(interval)
            ),
        );
    }
    let threshold = |ctx: &mut Ctx<'_>, key: &str, v: Option<&Scalar>, def: u32| {
        ctx.uint(&join(&base, key), v, u64::from(def), 1, 100) as u32
    };
    Some(HealthCheck {
        path,
        interval,
        timeout: probe_timeout,
        healthy_threshold: threshold(
            ctx,
            "healthy_threshold",
            u.healthy_threshold.as_ref(),
            d.healthy_threshold,
        ),
        unhealthy_threshold: threshold(
            ctx,
            "unhealthy_threshold",
            u.unhealthy_threshold.as_ref(),
            d.unhealthy_threshold,
        ),
    })
}

/// `backends[i].outlier` (on unless `enabled: false`).
pub(crate) fn outlier(
    ctx: &mut Ctx<'_>,
    base: &str,
    u: Option<&UserOutlier>,
) -> Option<OutlierPolicy> {
    let d = OutlierPolicy::default();
    let Some(u) = u else { return Some(d) };
    let base = join(base, "outlier");
    let written = [
        &u.consecutive_failures,
        &u.base_ejection,
        &u.max_ejection,
        &u.max_ejection_percent,
    ]
    .iter()
    .filter(|v| v.is_some())
    .count();
    if switched_off(ctx, &base, u.enabled.as_ref(), written) {
        return None;
    }
    let hour = Duration::from_secs(3600);
    let base_ejection = ctx.duration(
        &join(&base, "base_ejection"),
        u.base_ejection.as_ref(),
        d.base_ejection,
        MS1,
        hour,
    );
    let max_ejection = ctx.duration(
        &join(&base, "max_ejection"),
        u.max_ejection.as_ref(),
        d.max_ejection.max(base_ejection),
        MS1,
        hour,
    );
    if max_ejection < base_ejection {
        ctx.error(
            &join(&base, "max_ejection"),
            super::values::fmt_duration(max_ejection),
            format!(
                "must not be shorter than base_ejection ({})",
                super::values::fmt_duration(base_ejection)
            ),
        );
    }
    Some(OutlierPolicy {
        consecutive_failures: ctx.uint(
            &join(&base, "consecutive_failures"),
            u.consecutive_failures.as_ref(),
            u64::from(d.consecutive_failures),
            1,
            1000,
        ) as u32,
        base_ejection,
        max_ejection,
        max_ejection_percent: ctx.uint(
            &join(&base, "max_ejection_percent"),
            u.max_ejection_percent.as_ref(),
            u64::from(d.max_ejection_percent),
            1,
            100,
        ) as u8,
    })
}

/// `server.retry_budget`.
pub(crate) fn retry_budget(ctx: &mut Ctx<'_>, u: Option<&UserRetryBudget>) -> RetryBudgetConfig {
    let d = RetryBudgetConfig::default();
    let Some(u) = u else { return d };
    RetryBudgetConfig {
        ratio: ctx.float(
            "server.retry_budget.ratio",
            u.ratio.as_ref(),
            d.ratio,
            0.0,
            1.0,
        ),
        min_retries_per_second: ctx.uint(
            "server.retry_budget.min_retries_per_second",
            u.min_retries_per_second.as_ref(),
            u64::from(d.min_retries_per_second),
            0,
            100_000,
        ) as u32,
    }
}

/// `backends[i].tls`: `Some` exactly for an `https://` url.
pub(crate) fn backend_tls(
    ctx: &mut Ctx<'_>,
    base: &str,
    url: &BackendUrl,
    u: Option<&UserBackendTls>,
) -> Option<BackendTls> {
    let base = join(base, "tls");
    if url.scheme == UrlScheme::Http {
        if u.is_some() {
            ctx.error(
                &base,
                "{...}",
                "a tls block needs an https:// url (over http:// it would not be used)",
            );
        }
        return None;
    }
    let roots = match u.and_then(|t| t.ca_cert.as_ref()) {
        None => TlsRoots::System,
        Some(v) => match ctx.path(&join(&base, "ca_cert"), Some(v)) {
            Some(p) => TlsRoots::CaFile(p),
            None => TlsRoots::System,
        },
    };
    let field = join(&base, "server_name");
    let server_name = match u.and_then(|t| t.server_name.as_ref()) {
        None => url.host.clone(),
        Some(v) => match ctx.string(&field, Some(v)) {
            Some(n) if valid_server_name(&n) => n,
            Some(n) => {
                ctx.error(
                    &field,
                    &n,
                    "must be a DNS name or an IP address the certificate is issued for",
                );
                url.host.clone()
            }
            None => url.host.clone(),
        },
    };
    Some(BackendTls { roots, server_name })
}
