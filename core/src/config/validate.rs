//! The conversion pipeline and the cross-section rules: user model → [`Config`].
//!
//! Role: run every section conversion (each records its own field errors), then the rules that
//! need several sections at once: shim references to `backends[]` (CFG-10, CFG-16, CFG-18,
//! CFG-23), the event-bus port overlap (BUS-07), direct-mode placement advice (CFG-21, CFG-22)
//! and event-bus coverage advice (BUS-45).
//!
//! Invariant: the returned [`Config`] is meaningful only when the context holds no error; the
//! caller ([`super::parse`]) enforces that.

use std::collections::{HashMap, HashSet};

use super::addr::{listen_overlaps, looks_internal};
use super::dynamo::{BrokerRole, DiscoverySource, LoadTransport};
use super::user::UserConfig;
use super::values::{Ctx, index, join};
use super::{BackendConfig, BackendName, Config, convert, convert_dynamo};

/// Convert and validate the whole document, recording every finding in `ctx`.
pub(crate) fn convert(ctx: &mut Ctx<'_>, u: &UserConfig) -> Config {
    let server = convert::server(ctx, u.server.as_ref());
    let admin = convert::admin(ctx, u.admin.as_ref());
    let disaggregated_serving = convert::disaggregated(ctx, u.disaggregated_serving.as_ref());
    let dynamo = convert_dynamo::dynamo(ctx, u.dynamo.as_ref());
    let shim_replicas: HashSet<&str> = dynamo
        .shim
        .backends
        .iter()
        .chain(dynamo.shim.pools.iter().flat_map(|p| p.backends.iter()))
        .map(|n| n.0.as_str())
        .collect();
    let backends = convert::backends(ctx, u.backends.as_ref(), server.upstream, &shim_replicas);
    let auth = super::convert_auth::auth(ctx, u.auth.as_ref(), &backends);
    let config = Config {
        server,
        admin,
        backends,
        disaggregated_serving,
        dynamo,
        auth,
    };
    cross_section(ctx, &config);
    config
}

fn cross_section(ctx: &mut Ctx<'_>, c: &Config) {
    shim_rules(ctx, c);
    placement_advice(ctx, c);
    event_bus_rules(ctx, c);
}

/// CFG-16, CFG-18 (backend flags), CFG-23: a shim backend must be a configured one.
fn check_backend_ref(
    ctx: &mut Ctx<'_>,
    by_name: &HashMap<&str, &BackendConfig>,
    field: &str,
    name: &BackendName,
) {
    match by_name.get(name.0.as_str()) {
        None => ctx.error(field, &name.0, "is not a configured backends[].name"),
        Some(b) => {
            if b.internal {
                ctx.warn(field, format!("shim backend {} is internal: true", name.0));
            }
            if !b.enabled {
                ctx.warn(
                    field,
                    format!(
                        "shim backend {} is enabled: false and never receives traffic",
                        name.0
                    ),
                );
            }
        }
    }
}

/// CFG-10, CFG-16, CFG-18, CFG-23.
fn shim_rules(ctx: &mut Ctx<'_>, c: &Config) {
    let shim = &c.dynamo.shim;
    let by_name: HashMap<&str, &BackendConfig> =
        c.backends.iter().map(|b| (b.name.0.as_str(), b)).collect();
    for (i, name) in shim.backends.iter().enumerate() {
        check_backend_ref(ctx, &by_name, &index("dynamo.shim.backends", i), name);
    }
    let namespaces = c.dynamo.namespaces();
    // CFG-10.
    if namespaces.len() >= 2 && !shim.backends.is_empty() {
        ctx.error(
            "dynamo.shim.backends",
            format!("{} backends", shim.backends.len()),
            format!(
                "{} Dynamo namespaces are configured: use shim.pools (one pool per namespace) \
                 instead of shim.backends",
                namespaces.len()
            ),
        );
    } else if !shim.backends.is_empty() && !shim.pools.is_empty() {
        ctx.error(
            "dynamo.shim.backends",
            format!("{} backends", shim.backends.len()),
            "use either shim.backends or shim.pools, not both",
        );
    }
    if namespaces.len() >= 2 && shim.pools.is_empty() && c.dynamo.enabled {
        ctx.error(
            "dynamo.shim.pools",
            "[]",
            "several Dynamo namespaces are configured: every namespace needs a shim pool",
        );
    }
    // CFG-23.
    if !shim.pools.is_empty() {
        let mut pool_of: HashMap<&str, usize> = HashMap::new();
        let mut owner: HashMap<&str, usize> = HashMap::new();
        for (i, p) in shim.pools.iter().enumerate() {
            let base = index("dynamo.shim.pools", i);
            let nf = join(&base, "namespace");
            if !namespaces.contains(&p.namespace) {
                ctx.error(
                    &nf,
                    &p.namespace,
                    format!(
                        "is not a configured Dynamo namespace ({})",
                        namespaces.join(", ")
                    ),
                );
            }
            if let Some(prev) = pool_of.insert(p.namespace.as_str(), i) {
                ctx.error(
                    &nf,
                    &p.namespace,
                    format!("namespace already has a pool (dynamo.shim.pools[{prev}])"),
                );
            }
            for (j, b) in p.backends.iter().enumerate() {
                let bf = index(&join(&base, "backends"), j);
                check_backend_ref(ctx, &by_name, &bf, b);
                if let Some(prev) = owner.insert(b.0.as_str(), i)
                    && prev != i
                {
                    ctx.error(
                        &bf,
                        &b.0,
                        format!("backend already belongs to dynamo.shim.pools[{prev}]"),
                    );
                }
            }
        }
        for ns in namespaces {
            if !pool_of.contains_key(ns.as_str()) {
                ctx.error(
                    "dynamo.shim.pools",
                    ns,
                    "configured Dynamo namespace has no shim pool",
                );
            }
        }
    }
    // CFG-18: a shim does nothing unless both switches are on.
    let used = if !shim.pools.is_empty() {
        Some("dynamo.shim.pools")
    } else if !shim.backends.is_empty() {
        Some("dynamo.shim.backends")
    } else {
        None
    };
    if let Some(field) = used {
        if !c.dynamo.enabled {
            ctx.warn(
                field,
                "shim configured while dynamo.enabled is false: it is not used",
            );
        }
        if !c.disaggregated_serving.enabled {
            ctx.warn(
                field,
                "shim configured while disaggregated_serving.enabled is false: it is not used",
            );
        }
    }
}

/// CFG-21, CFG-22 and the broker-transport prerequisite.
fn placement_advice(ctx: &mut Ctx<'_>, c: &Config) {
    let d = &c.dynamo;
    if d.load.transport == LoadTransport::Direct {
        if d.enabled && d.load.direct_allow_cidrs.is_none() {
            ctx.warn(
                "dynamo.load.direct_allow_cidrs",
                "omitted: direct load/KV subscriptions may connect to any address a worker \
                 record names; add the worker Pod CIDR (e.g. 10.0.0.0/8)",
            );
        }
        if d.discovery.source == DiscoverySource::Etcd {
            for (i, ep) in d.discovery.etcd.endpoints.iter().enumerate() {
                if !looks_internal(&ep.host) {
                    ctx.warn(
                        &index("dynamo.discovery.etcd.endpoints", i),
                        format!(
                            "{ep} looks external to the cluster while load.transport is direct \
                             (which assumes the router runs inside it); use load.transport: \
                             broker with the event bus for a router outside the cluster"
                        ),
                    );
                }
            }
        }
    } else if !d.event_bus.enabled {
        ctx.warn(
            "dynamo.load.transport",
            "broker transport needs dynamo.event_bus.enabled: subscriptions stay pending",
        );
    }
}

/// BUS-07 and BUS-45.
fn event_bus_rules(ctx: &mut Ctx<'_>, c: &Config) {
    let bus = &c.dynamo.event_bus;
    if let Some(listen) = bus.listen
        && listen_overlaps(listen, c.server.bind_address)
    {
        ctx.error(
            "dynamo.event_bus.listen",
            listen,
            format!(
                "port overlaps server.bind_address {}; the event bus needs a dedicated port",
                c.server.bind_address
            ),
        );
    }
    // BUS-45 (reading): a kv_listener allowance for a backend this config does not have is
    // never used.
    for (i, b) in bus.brokers.iter().enumerate() {
        if b.role != BrokerRole::KvListener {
            continue;
        }
        for (j, name) in b.backends.iter().enumerate() {
            if !c.backends.iter().any(|cb| &cb.name.0 == name) {
                ctx.warn(
                    &index(&join(&index("dynamo.event_bus.brokers", i), "backends"), j),
                    format!("{name} is not a configured backend: this allowance is never used"),
                );
            }
        }
    }
}
