//! Conversion of the `server`, `admin`, `backends` and `disaggregated_serving` sections from the
//! user model into their validated types.
//!
//! Invariants: every problem is recorded in the [`Ctx`] with its dotted path and the conversion
//! continues with the default, so one pass reports everything; the returned values are only
//! used when the context holds no error.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use super::addr::{parse_backend_url, parse_socket_addr};
use super::scalar::Scalar;
use super::user::{UserAdmin, UserBackend, UserDisaggregated, UserServer};
use super::values::{Ctx, MISSING, index, join};
use super::{
    AdminConfig, BackendConfig, BackendKind, BackendName, BackendRole, BackendUrl,
    DisaggregatedServing, ResponsesApi, RetryBudgetConfig, ServerConfig, ShardCount,
    UpstreamTimeouts, UrlScheme, convert_upstream,
};

/// Highest CPU index accepted in `cpu_affinity` / `control_cpu` (exclusive).
const MAX_CPU: u64 = 1024;
/// Longest duration accepted for a server timeout.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

const DEFAULT_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind_address: DEFAULT_BIND,
            shards: ShardCount::Auto,
            cpu_affinity: Vec::new(),
            control_cpu: None,
            max_body_bytes: 8 << 20,
            max_header_bytes: 16 << 10,
            max_headers: 100,
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            upstream: UpstreamTimeouts::default(),
            drain_timeout: Duration::from_secs(30),
            connect_retries: 2,
            retry_budget: RetryBudgetConfig::default(),
        }
    }
}

impl Default for DisaggregatedServing {
    fn default() -> Self {
        DisaggregatedServing {
            enabled: false,
            fallback_to_unified: true,
        }
    }
}

/// `server`.
pub(crate) fn server(ctx: &mut Ctx<'_>, u: Option<&UserServer>) -> ServerConfig {
    let d = ServerConfig::default();
    let Some(u) = u else { return d };
    let bind_address = match &u.bind_address {
        None => d.bind_address,
        Some(s) => match s.as_str().map(parse_socket_addr) {
            Some(Ok(a)) => a,
            Some(Err(reason)) => {
                ctx.error("server.bind_address", s, reason);
                d.bind_address
            }
            None => {
                ctx.error("server.bind_address", s, "must be a string ip:port");
                d.bind_address
            }
        },
    };
    let shards = match &u.shards {
        None => ShardCount::Auto,
        Some(Scalar::Str(s)) if s == "auto" => ShardCount::Auto,
        Some(s) => match super::values::parse_uint(s, 1, 256) {
            Ok(n) => NonZeroUsize::new(n as usize).map_or(ShardCount::Auto, ShardCount::Fixed),
            Err(_) => {
                ctx.error(
                    "server.shards",
                    s,
                    "must be \"auto\" or an integer in 1..=256",
                );
                ShardCount::Auto
            }
        },
    };
    let mut cpu_affinity = Vec::new();
    let mut seen = HashSet::new();
    for (i, s) in u.cpu_affinity.iter().flatten().enumerate() {
        let field = index("server.cpu_affinity", i);
        if let Some(cpu) = ctx.opt_uint(&field, Some(s), 0, MAX_CPU - 1) {
            if !seen.insert(cpu) {
                ctx.error(&field, s, "duplicate CPU");
            }
            cpu_affinity.push(cpu as usize);
        }
    }
    let control_cpu = ctx
        .opt_uint("server.control_cpu", u.control_cpu.as_ref(), 0, MAX_CPU - 1)
        .map(|c| c as usize);

    let lim = u.limits.as_ref();
    let max_body_bytes = ctx.size(
        "server.limits.max_body_bytes",
        lim.and_then(|l| l.max_body_bytes.as_ref()),
        d.max_body_bytes as u64,
        1 << 10,
        1 << 30,
    ) as usize;
    let max_header_bytes = ctx.size(
        "server.limits.max_header_bytes",
        lim.and_then(|l| l.max_header_bytes.as_ref()),
        d.max_header_bytes as u64,
        1 << 10,
        1 << 20,
    ) as usize;
    let max_headers = ctx.uint(
        "server.limits.max_headers",
        lim.and_then(|l| l.max_headers.as_ref()),
        d.max_headers as u64,
        8,
        1024,
    ) as usize;

    let t = u.timeouts.as_ref();
    let ms1 = Duration::from_millis(1);
    let timeout = |ctx: &mut Ctx<'_>, key: &str, v: Option<&Scalar>, def: Duration| {
        ctx.duration(&join("server.timeouts", key), v, def, ms1, MAX_TIMEOUT)
    };
    let header_read_timeout = timeout(
        ctx,
        "header_read",
        t.and_then(|t| t.header_read.as_ref()),
        d.header_read_timeout,
    );
    let keepalive_timeout = timeout(
        ctx,
        "keepalive",
        t.and_then(|t| t.keepalive.as_ref()),
        d.keepalive_timeout,
    );
    let upstream = convert_upstream::server_upstream(ctx, t);
    let drain_timeout = timeout(
        ctx,
        "drain",
        t.and_then(|t| t.drain.as_ref()),
        d.drain_timeout,
    );
    let connect_retries = ctx.uint(
        "server.connect_retries",
        u.connect_retries.as_ref(),
        u64::from(d.connect_retries),
        0,
        8,
    ) as u32;

    ServerConfig {
        bind_address,
        shards,
        cpu_affinity,
        control_cpu,
        max_body_bytes,
        max_header_bytes,
        max_headers,
        header_read_timeout,
        keepalive_timeout,
        upstream,
        drain_timeout,
        connect_retries,
        retry_budget: convert_upstream::retry_budget(ctx, u.retry_budget.as_ref()),
    }
}

/// `admin`.
pub(crate) fn admin(ctx: &mut Ctx<'_>, u: Option<&UserAdmin>) -> AdminConfig {
    let token_hash = u.and_then(|u| ctx.token_hash("admin.token_hash", u.token_hash.as_ref()));
    AdminConfig { token_hash }
}

/// `disaggregated_serving`.
pub(crate) fn disaggregated(
    ctx: &mut Ctx<'_>,
    u: Option<&UserDisaggregated>,
) -> DisaggregatedServing {
    let d = DisaggregatedServing::default();
    let Some(u) = u else { return d };
    DisaggregatedServing {
        enabled: ctx.bool(
            "disaggregated_serving.enabled",
            u.enabled.as_ref(),
            d.enabled,
        ),
        fallback_to_unified: ctx.bool(
            "disaggregated_serving.fallback_to_unified",
            u.fallback_to_unified.as_ref(),
            d.fallback_to_unified,
        ),
    }
}

/// Whether `name` matches `[A-Za-z0-9._-]{1,64}`.
pub(crate) fn valid_backend_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A required name matching `[A-Za-z0-9._-]{1,64}`, unique among `seen` (a `what` name); the
/// name as written (empty when missing) whatever the errors.
pub(crate) fn unique_name(
    ctx: &mut Ctx<'_>,
    field: &str,
    v: Option<&Scalar>,
    seen: &mut HashSet<String>,
    what: &str,
) -> String {
    match ctx.required_string(field, v) {
        Some(n) if !valid_backend_name(&n) => {
            ctx.error(field, &n, "must match [A-Za-z0-9._-]{1,64}");
            n
        }
        Some(n) => {
            if !seen.insert(n.clone()) {
                ctx.error(field, &n, format!("duplicate {what} name"));
            }
            n
        }
        None => String::new(),
    }
}

/// `backends`. `server` holds the default upstream timeouts; `shim_replicas` names the backends
/// the shim config uses (checked with `GET /health` unless their health check is turned off).
pub(crate) fn backends(
    ctx: &mut Ctx<'_>,
    u: Option<&Vec<UserBackend>>,
    server: UpstreamTimeouts,
    shim_replicas: &HashSet<&str>,
) -> Vec<BackendConfig> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    for (i, b) in u.into_iter().flatten().enumerate() {
        let base = index("backends", i);
        let name = unique_name(
            ctx,
            &join(&base, "name"),
            b.name.as_ref(),
            &mut names,
            "backend",
        );
        let kind_field = join(&base, "type");
        let kind = match &b.kind {
            None => {
                ctx.error(&kind_field, MISSING, "is required (openai)");
                BackendKind::OpenAi
            }
            Some(Scalar::Str(s)) if s == "openai" => BackendKind::OpenAi,
            Some(s) => {
                ctx.error(
                    &kind_field,
                    s,
                    "unsupported backend type; supported: openai",
                );
                BackendKind::OpenAi
            }
        };
        let url_field = join(&base, "url");
        let url = match ctx.required_string(&url_field, b.url.as_ref()) {
            Some(text) => match parse_backend_url(&text) {
                Ok(u) => u,
                Err(reason) => {
                    ctx.error(&url_field, &text, reason);
                    placeholder_url()
                }
            },
            None => placeholder_url(),
        };
        let role = match &b.role {
            None => BackendRole::Unified,
            Some(Scalar::Str(s)) if s == "unified" => BackendRole::Unified,
            Some(Scalar::Str(s)) if s == "prefill" => BackendRole::Prefill,
            Some(Scalar::Str(s)) if s == "decode" => BackendRole::Decode,
            Some(s) => {
                ctx.error(
                    &join(&base, "role"),
                    s,
                    "must be one of unified, prefill, decode",
                );
                BackendRole::Unified
            }
        };
        let mut models = Vec::new();
        for (j, m) in b.models.iter().flatten().enumerate() {
            let f = index(&join(&base, "models"), j);
            if let Some(m) = ctx.string(&f, Some(m)) {
                if m.trim().is_empty() {
                    ctx.error(&f, &m, "must not be empty");
                } else if models.contains(&m) {
                    ctx.error(&f, &m, "duplicate model id");
                } else {
                    models.push(m);
                }
            }
        }
        let weight = ctx.uint(&join(&base, "weight"), b.weight.as_ref(), 1, 1, 1000) as u32;
        let enabled = ctx.bool(&join(&base, "enabled"), b.enabled.as_ref(), true);
        let internal = ctx.bool(&join(&base, "internal"), b.internal.as_ref(), false);
        let responses_api = match &b.responses_api {
            None => ResponsesApi::Native,
            Some(Scalar::Str(s)) if s == "native" => ResponsesApi::Native,
            Some(Scalar::Str(s)) if s == "chat" => ResponsesApi::Chat,
            Some(s) => {
                ctx.error(
                    &join(&base, "responses_api"),
                    s,
                    "must be one of native, chat",
                );
                ResponsesApi::Native
            }
        };
        let timeouts = convert_upstream::backend_timeouts(ctx, &base, server, b.timeouts.as_ref());
        let health_check = convert_upstream::health_check(
            ctx,
            &base,
            b.health_check.as_ref(),
            shim_replicas.contains(name.as_str()),
        );
        let outlier = convert_upstream::outlier(ctx, &base, b.outlier.as_ref());
        let tls = convert_upstream::backend_tls(ctx, &base, &url, b.tls.as_ref());
        out.push(BackendConfig {
            name: BackendName(name),
            kind,
            url,
            role,
            models,
            weight,
            enabled,
            internal,
            responses_api,
            timeouts,
            health_check,
            outlier,
            tls,
        });
    }
    out
}

fn placeholder_url() -> BackendUrl {
    BackendUrl {
        scheme: UrlScheme::Http,
        host: String::new(),
        port: 80,
        base_path: String::new(),
    }
}
