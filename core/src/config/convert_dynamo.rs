//! Conversion of `dynamo.enabled` and `dynamo.discovery` (etcd and Kubernetes sources; the file
//! source is in `convert_dynamo_file.rs`):
//! CFG-02, CFG-03, CFG-05..CFG-09, CFG-11, CFG-13, CFG-14, CFG-24..CFG-28, Q-16..Q-18, Q-41.
//!
//! Invariants: every finding goes to the [`Ctx`] with its dotted path; secrets (the etcd
//! password) are never echoed; "required" checks that only matter for a running watcher apply
//! when `dynamo.enabled` is true and the source is the one they belong to, while shape rules
//! apply to whatever is written.

use std::collections::HashSet;
use std::time::Duration;

use super::addr::{RawEndpoint, parse_etcd_endpoint};
use super::convert_namespace::{check_namespace, namespace_list};
use super::dynamo::{
    Backoff, DEFAULT_NAMESPACE, DiscoveryConfig, DiscoverySource, DynamoConfig, EtcdAuth,
    EtcdConfig, EtcdScheme, EtcdTls, KUBE_WATCH_IDLE_TIMEOUT, KUBE_WATCH_TIMEOUT, KubeModel,
    KubernetesConfig, Secret,
};
use super::scalar::Scalar;
use super::user_dynamo::{
    UserBackoff, UserDiscovery, UserDynamo, UserEtcd, UserEtcdAuth, UserKubernetes,
};
use super::values::{Ctx, MISSING, fmt_duration, index, interpolate, join};

/// Most etcd endpoints (CFG-05).
const MAX_ENDPOINTS: usize = 16;
/// Most `kubernetes.models` entries (CFG-26).
const MAX_KUBE_MODELS: usize = 256;

/// `dynamo`.
pub(crate) fn dynamo(ctx: &mut Ctx<'_>, u: Option<&UserDynamo>) -> DynamoConfig {
    let Some(u) = u else {
        return DynamoConfig::default();
    };
    let enabled = ctx.bool("dynamo.enabled", u.enabled.as_ref(), false);
    let discovery = discovery(ctx, u.discovery.as_ref(), enabled);
    let load = super::convert_dynamo_rest::load(ctx, u.load.as_ref());
    let shim = super::convert_dynamo_rest::shim(ctx, u.shim.as_ref());
    let kv = super::convert_dynamo_rest::kv(ctx, u.kv.as_ref());
    let event_bus = super::convert_dynamo_rest::event_bus(ctx, u.event_bus.as_ref());
    let peers = super::convert_dynamo_rest::peers(ctx, u.peers.as_ref());
    DynamoConfig {
        enabled,
        discovery,
        load,
        shim,
        kv,
        event_bus,
        peers,
    }
}

/// `dynamo.discovery`.
pub(crate) fn discovery(
    ctx: &mut Ctx<'_>,
    u: Option<&UserDiscovery>,
    enabled: bool,
) -> DiscoveryConfig {
    let Some(u) = u else {
        let d = DiscoveryConfig::default();
        if enabled {
            etcd_endpoints_required(ctx, &d.etcd);
        }
        return d;
    };
    let source = match &u.source {
        None => DiscoverySource::Etcd,
        Some(Scalar::Str(s)) if s == "etcd" => DiscoverySource::Etcd,
        Some(Scalar::Str(s)) if s == "kubernetes" => DiscoverySource::Kubernetes,
        Some(Scalar::Str(s)) if s == "kubernetes_pods" => DiscoverySource::KubernetesPods,
        Some(Scalar::Str(s)) if s == "file" => DiscoverySource::File,
        Some(s) => {
            ctx.error(
                "dynamo.discovery.source",
                s,
                "must be one of etcd, kubernetes, kubernetes_pods, file",
            );
            DiscoverySource::Etcd
        }
    };
    let etcd = etcd(ctx, u.etcd.as_ref());
    if enabled && source == DiscoverySource::Etcd {
        etcd_endpoints_required(ctx, &etcd);
    }
    let kubernetes = kubernetes(ctx, u.kubernetes.as_ref(), source, enabled);
    let file = super::convert_dynamo_file::file(ctx, u.file.as_ref(), source, enabled);
    if source == DiscoverySource::KubernetesPods {
        ctx.warn(
            "dynamo.discovery.source",
            "kubernetes_pods provides no capacity or load signals: the picker will round-robin \
             between workers (prefer source: kubernetes when RBAC allows dynamoworkermetadatas)",
        );
    }
    DiscoveryConfig {
        source,
        etcd,
        kubernetes,
        file,
    }
}

/// CFG-05: discovery through etcd needs at least one endpoint.
fn etcd_endpoints_required(ctx: &mut Ctx<'_>, etcd: &EtcdConfig) {
    if etcd.endpoints.is_empty() {
        ctx.error(
            "dynamo.discovery.etcd.endpoints",
            "[]",
            "at least 1 endpoint is required when dynamo.enabled is true with source etcd",
        );
    }
}

/// `watch_reconnect_backoff` (CFG-02 defaults, CFG-14 `max >= initial`).
fn backoff(ctx: &mut Ctx<'_>, base: &str, u: Option<&UserBackoff>) -> Backoff {
    let d = Backoff::default();
    let Some(u) = u else { return d };
    let base = join(base, "watch_reconnect_backoff");
    let (lo, hi) = (Duration::from_millis(1), Duration::from_secs(3600));
    let initial = ctx.duration(
        &join(&base, "initial"),
        u.initial.as_ref(),
        d.initial,
        lo,
        hi,
    );
    let max = ctx.duration(&join(&base, "max"), u.max.as_ref(), d.max, lo, hi);
    if max < initial {
        let shown = u
            .max
            .as_ref()
            .map_or_else(|| "30s".to_owned(), ToString::to_string);
        ctx.error(
            &join(&base, "max"),
            shown,
            "must be >= watch_reconnect_backoff.initial",
        );
    }
    Backoff { initial, max }
}

/// `dynamo.discovery.etcd`.
fn etcd(ctx: &mut Ctx<'_>, u: Option<&UserEtcd>) -> EtcdConfig {
    const BASE: &str = "dynamo.discovery.etcd";
    let d = EtcdConfig::default();
    let Some(u) = u else { return d };

    let tls = u.tls.as_ref().map(|t| {
        let f = |k: &str| join(&join(BASE, "tls"), k);
        let tls = EtcdTls {
            ca_cert: ctx.path(&f("ca_cert"), t.ca_cert.as_ref()),
            client_cert: ctx.path(&f("client_cert"), t.client_cert.as_ref()),
            client_key: match t.client_key.as_ref() {
                Some(Scalar::Str(s)) if !s.trim().is_empty() => Some(Secret::new(s.clone())),
                Some(_) => {
                    ctx.error_masked(&f("client_key"), "must be a non-empty path");
                    None
                }
                None => None,
            },
            server_name: ctx.string(&f("server_name"), t.server_name.as_ref()),
        };
        // CFG-11: client certificate and key come together.
        match (&t.client_cert, &t.client_key) {
            (Some(_), None) => ctx.error(
                &f("client_key"),
                MISSING,
                "tls.client_cert requires tls.client_key",
            ),
            (None, Some(_)) => ctx.error(
                &f("client_cert"),
                MISSING,
                "tls.client_key requires tls.client_cert",
            ),
            _ => {}
        }
        tls
    });

    // Endpoints (CFG-05, CFG-06, CFG-07, Q-16, Q-17).
    let list = u.endpoints.as_deref().unwrap_or_default();
    let ep_field = join(BASE, "endpoints");
    if list.len() > MAX_ENDPOINTS {
        ctx.error(
            &ep_field,
            format!("{} entries", list.len()),
            format!("at most {MAX_ENDPOINTS} endpoints"),
        );
    }
    let mut raw: Vec<(usize, String, RawEndpoint)> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let f = index(&ep_field, i);
        if let Some(text) = ctx.string(&f, Some(s)) {
            match parse_etcd_endpoint(&text) {
                Ok(ep) => raw.push((i, text, ep)),
                Err(reason) => ctx.error(&f, &text, reason),
            }
        }
    }
    let has_tls = tls.is_some();
    let mut first_scheme: Option<EtcdScheme> = None;
    let mut endpoints = Vec::new();
    for (i, text, ep) in raw {
        let f = index(&ep_field, i);
        if has_tls && ep.scheme == Some(EtcdScheme::Http) {
            ctx.error(
                &f,
                &text,
                "plaintext http:// endpoint combined with a tls block; use https:// (or no scheme)",
            );
        }
        let ep = ep.resolve(has_tls);
        match first_scheme {
            None => first_scheme = Some(ep.scheme),
            Some(s) if s != ep.scheme => ctx.error(
                &f,
                &text,
                "mixes http and https endpoints (a scheme-less entry is https with a tls block, \
                 http without)",
            ),
            Some(_) => {}
        }
        endpoints.push(ep);
    }

    // Namespaces (CFG-08, CFG-09, Q-18).
    let ns_field = join(BASE, "namespace");
    let namespace = match &u.namespace {
        None => DEFAULT_NAMESPACE.to_owned(),
        Some(s) => check_namespace(ctx, &ns_field, s).unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
    };
    let namespaces = match &u.namespaces {
        None => vec![namespace.clone()],
        Some(list) => {
            let nss_field = join(BASE, "namespaces");
            if namespace != DEFAULT_NAMESPACE {
                ctx.error(
                    &nss_field,
                    format!("namespace: {namespace}"),
                    "namespaces cannot be combined with a non-default namespace; list every \
                     namespace in namespaces",
                );
            }
            namespace_list(ctx, &nss_field, list, check_namespace)
        }
    };

    let auth = u.auth.as_ref().and_then(|a| auth(ctx, a));
    // CFG-13: credentials over plaintext.
    if auth.is_some() && !has_tls && endpoints.iter().any(|e| e.scheme == EtcdScheme::Http) {
        ctx.warn(
            &join(BASE, "auth"),
            "auth on a plaintext connection (no tls, http://): the password and session token \
             travel in clear; add a tls block",
        );
    }
    let watch_reconnect_backoff = backoff(ctx, BASE, u.watch_reconnect_backoff.as_ref());
    EtcdConfig {
        endpoints,
        namespace,
        namespaces,
        tls,
        auth,
        watch_reconnect_backoff,
    }
}

/// `dynamo.discovery.etcd.auth` with `${NAME}` password interpolation (CFG-03).
fn auth(ctx: &mut Ctx<'_>, a: &UserEtcdAuth) -> Option<EtcdAuth> {
    const BASE: &str = "dynamo.discovery.etcd.auth";
    let user_field = join(BASE, "username");
    let username = match ctx.required_string(&user_field, a.username.as_ref()) {
        Some(u) if u.is_empty() => {
            ctx.error(&user_field, "\"\"", "must not be empty");
            None
        }
        other => other,
    };
    let pw_field = join(BASE, "password");
    let password = match &a.password {
        None => {
            ctx.error(&pw_field, MISSING, "is required with auth");
            None
        }
        Some(Scalar::Str(s)) => interpolate(ctx, &pw_field, s),
        Some(_) => {
            ctx.error_masked(&pw_field, "must be a string");
            None
        }
    };
    Some(EtcdAuth {
        username: username?,
        password: Secret::new(password?),
    })
}

/// CFG-26: a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63).
fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// CFG-26: a non-empty Kubernetes label value (at most 63, alphanumeric at both ends,
/// `-`, `_`, `.` inside).
fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn check_label_value(ctx: &mut Ctx<'_>, field: &str, s: &Scalar) -> Option<String> {
    let v = ctx.string(field, Some(s))?;
    if !is_label_value(&v) {
        ctx.error(
            field,
            &v,
            "must be a non-empty Kubernetes label value (at most 63 of [A-Za-z0-9-_.], \
             alphanumeric at both ends)",
        );
        return None;
    }
    Some(v)
}

/// `dynamo.discovery.kubernetes` (CFG-24..CFG-27, Q-41).
fn kubernetes(
    ctx: &mut Ctx<'_>,
    u: Option<&UserKubernetes>,
    source: DiscoverySource,
    enabled: bool,
) -> KubernetesConfig {
    const BASE: &str = "dynamo.discovery.kubernetes";
    let active = matches!(
        source,
        DiscoverySource::Kubernetes | DiscoverySource::KubernetesPods
    );
    let pods = source == DiscoverySource::KubernetesPods;
    let empty = UserKubernetes::default();
    let u = u.unwrap_or(&empty);

    let ns_field = join(BASE, "namespace");
    let namespace = match ctx.string(&ns_field, u.namespace.as_ref()) {
        Some(ns) if !is_dns1123_label(&ns) => {
            ctx.error(
                &ns_field,
                &ns,
                "must be a DNS-1123 label ([a-z0-9-], at most 63)",
            );
            None
        }
        other => other,
    };
    if active && enabled && u.namespace.is_none() {
        ctx.error(
            &ns_field,
            MISSING,
            "is required by the Kubernetes discovery sources",
        );
    }

    let dn_field = join(BASE, "dynamo_namespace");
    let dns_field = join(BASE, "dynamo_namespaces");
    let single = u
        .dynamo_namespace
        .as_ref()
        .and_then(|s| check_label_value(ctx, &dn_field, s));
    let dynamo_namespaces = match &u.dynamo_namespaces {
        Some(list) => {
            if u.dynamo_namespace.is_some() {
                ctx.error(
                    &dns_field,
                    format!("{} entries", list.len()),
                    "dynamo_namespaces and dynamo_namespace are mutually exclusive",
                );
            }
            namespace_list(ctx, &dns_field, list, check_label_value)
        }
        None => single.into_iter().collect(),
    };
    if active && enabled && u.dynamo_namespace.is_none() && u.dynamo_namespaces.is_none() {
        ctx.error(
            &dn_field,
            MISSING,
            "dynamo_namespace or dynamo_namespaces is required",
        );
    }

    let model_field = join(BASE, "model");
    let model = match ctx.string(&model_field, u.model.as_ref()) {
        Some(m) if m.trim().is_empty() => {
            ctx.error(&model_field, "\"\"", "must not be empty");
            None
        }
        other => other,
    };
    let models = kube_models(ctx, u, &dynamo_namespaces, pods);

    if pods {
        // CFG-26: exactly one of model / models.
        match (&u.model, &u.models) {
            (Some(_), Some(_)) => ctx.error(
                &model_field,
                "model and models",
                "set exactly one of model and models",
            ),
            (None, None) if enabled => ctx.error(
                &model_field,
                MISSING,
                "source kubernetes_pods needs exactly one of model and models",
            ),
            _ => {}
        }
    }
    if source == DiscoverySource::Kubernetes {
        // CFG-27: ignored keys.
        for (key, present) in [("model", u.model.is_some()), ("models", u.models.is_some())] {
            if present {
                ctx.warn(
                    &join(BASE, key),
                    "ignored with source: kubernetes (models come from the worker cards)",
                );
            }
        }
    }
    let watch_reconnect_backoff = backoff(ctx, BASE, u.watch_reconnect_backoff.as_ref());
    let (watch_timeout, watch_idle_timeout) = kube_watch_timeouts(ctx, u);
    KubernetesConfig {
        namespace,
        dynamo_namespaces,
        model,
        models,
        watch_reconnect_backoff,
        watch_timeout,
        watch_idle_timeout,
    }
}

/// `kubernetes.watch_timeout` (whole seconds, 1 s ..= 1 h) and `watch_idle_timeout` (longer
/// than it, at most 2 h): DISC-K8S-POD-17.
fn kube_watch_timeouts(ctx: &mut Ctx<'_>, u: &UserKubernetes) -> (Duration, Duration) {
    const BASE: &str = "dynamo.discovery.kubernetes";
    let tf = join(BASE, "watch_timeout");
    let mut timeout = ctx.duration(
        &tf,
        u.watch_timeout.as_ref(),
        KUBE_WATCH_TIMEOUT,
        Duration::from_secs(1),
        Duration::from_secs(3600),
    );
    if timeout.subsec_nanos() != 0 {
        ctx.error(
            &tf,
            fmt_duration(timeout),
            "must be whole seconds (it is sent as timeoutSeconds)",
        );
        timeout = KUBE_WATCH_TIMEOUT;
    }
    let idf = join(BASE, "watch_idle_timeout");
    let idle = ctx.duration(
        &idf,
        u.watch_idle_timeout.as_ref(),
        KUBE_WATCH_IDLE_TIMEOUT.max(timeout + Duration::from_secs(30)),
        Duration::from_secs(2),
        Duration::from_secs(7200),
    );
    if idle <= timeout {
        ctx.error(
            &idf,
            fmt_duration(idle),
            format!(
                "must be longer than watch_timeout ({}): a watch that ends on time must never \
                 count as stalled",
                fmt_duration(timeout)
            ),
        );
    }
    (timeout, idle)
}

/// `kubernetes.models[]` (CFG-25, CFG-26, Q-41).
fn kube_models(
    ctx: &mut Ctx<'_>,
    u: &UserKubernetes,
    namespaces: &[String],
    pods: bool,
) -> Vec<KubeModel> {
    const BASE: &str = "dynamo.discovery.kubernetes.models";
    let Some(list) = &u.models else {
        return Vec::new();
    };
    if list.is_empty() {
        ctx.error(BASE, "[]", "must hold at least 1 entry when written");
    }
    if list.len() > MAX_KUBE_MODELS {
        ctx.error(
            BASE,
            format!("{} entries", list.len()),
            format!("at most {MAX_KUBE_MODELS} entries"),
        );
    }
    let mut seen: HashSet<(Option<String>, String)> = HashSet::new();
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let base = index(BASE, i);
        let cf = join(&base, "component");
        let component = match ctx.required_string(&cf, m.component.as_ref()) {
            Some(c) if c.is_empty() => {
                ctx.error(&cf, "\"\"", "must not be empty");
                None
            }
            other => other,
        };
        let mf = join(&base, "model");
        let model = match ctx.required_string(&mf, m.model.as_ref()) {
            Some(c) if c.trim().is_empty() => {
                ctx.error(&mf, "\"\"", "must not be empty");
                None
            }
            other => other,
        };
        let nf = join(&base, "dynamo_namespace");
        let dynamo_namespace = m
            .dynamo_namespace
            .as_ref()
            .and_then(|s| check_label_value(ctx, &nf, s));
        if let Some(ns) = &dynamo_namespace {
            if !namespaces.is_empty() && !namespaces.contains(ns) {
                ctx.error(&nf, ns, "is not one of the configured Dynamo namespaces");
            }
        } else if pods && namespaces.len() >= 2 && m.dynamo_namespace.is_none() {
            ctx.error(
                &nf,
                MISSING,
                "required on every models entry when several Dynamo namespaces are configured",
            );
        }
        let (Some(component), Some(model)) = (component, model) else {
            continue;
        };
        // unique by (dynamo_namespace, component); an entry without a namespace belongs
        // to the only configured one.
        let key_ns = dynamo_namespace
            .clone()
            .or_else(|| (namespaces.len() == 1).then(|| namespaces[0].clone()));
        if !seen.insert((key_ns, component.clone())) {
            ctx.error(
                &cf,
                &component,
                "duplicate component for this Dynamo namespace",
            );
        }
        out.push(KubeModel {
            component,
            model,
            dynamo_namespace,
        });
    }
    out
}
