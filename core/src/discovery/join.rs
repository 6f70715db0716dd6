//! Materialisation: from the held records to a [`FleetView`].
//!
//! Role: the join and rejection rules of DISC-REC and DISC-DUP, applied to the whole held state
//! at once, so the result depends only on what is held, never on the order it arrived in.
//!
//! Rules:
//! - workers come from `generate` Endpoint records; a generate instance id claimed by more than one
//!   key, in one namespace or across namespaces, creates no worker (DISC-DUP-04);
//! - a worker's card is the base card with its namespace, component, endpoint and instance id,
//!   else a legacy card (empty component and endpoint) with its namespace and instance id
//!   (DISC-REC-04/06); a card identity claimed by several keys is rejected and the worker
//!   materialises without a card, with no fallback (DISC-DUP-05);
//! - roles follow [`resolve_role`]; a conflict excludes the worker (DISC-REC-09);
//! - a publisher id claimed by several subscribable channels creates no publisher (LOAD-CHAN-09);
//! - a kv-events publisher's `source` is the used event-source record held under its channel
//!   key's suffix (`v1/event_channels/X` -> `v1/event_sources/X`), else `None`; sources never
//!   create publishers and never annotate `kv_metrics` ones;
//! - each distinct colliding key set, and each role conflict, is reported once while it lasts
//!   (DISC-DUP-08, Q-11); it recovers at the first materialisation after the delete (DISC-DUP-09).

use std::collections::{BTreeMap, BTreeSet};

use super::diag::{Diagnostic, DuplicateKind, MAX_LISTED_KEYS, Sink};
use super::fleet::{EventSource, Family, FleetView, Publisher, Role, Worker};
use super::held::{ChannelRec, Held, HeldMap, Memo, Slot};
use super::ids::InstanceId;
use super::keys::source_key_of;
use super::records::{CardFields, CardRecord, InstanceRecord, WorkerTypeClaim, clip};

/// What has already been reported, so it is reported once.
#[derive(Debug, Default)]
pub(crate) struct JoinMemory {
    duplicates: BTreeSet<(DuplicateKind, Vec<Vec<u8>>)>,
    conflicts: BTreeSet<(String, InstanceId, Role, Role)>,
}

/// The role a component name determines: exactly `prefill` or `decode`, ignoring ASCII case.
pub fn component_role(component: &str) -> Option<Role> {
    if component.eq_ignore_ascii_case("prefill") {
        Some(Role::Prefill)
    } else if component.eq_ignore_ascii_case("decode") {
        Some(Role::Decode)
    } else {
        None
    }
}

/// Resolves a worker's role from its component name and its card's typed fields (`None`: no card).
///
/// - the component names a role: that role, unless the card explicitly names another one
///   (`Err((component_role, card_role))`, DISC-REC-09); an absent or unrecognised `worker_type`
///   makes no claim (DISC-REC-15);
/// - otherwise the card decides: its explicit role, or `aggregated` when it has no `worker_type`
///   (upstream's default); an unrecognised `worker_type` gives `unknown` (DISC-REC-15);
/// - no component role and no card: `unknown` until the card arrives.
pub fn resolve_role(component: &str, card: Option<&CardFields>) -> Result<Role, (Role, Role)> {
    let explicit = card.and_then(|f| match f.claim() {
        WorkerTypeClaim::Prefill => Some(Role::Prefill),
        WorkerTypeClaim::Decode => Some(Role::Decode),
        WorkerTypeClaim::Aggregated => Some(Role::Aggregated),
        WorkerTypeClaim::Absent | WorkerTypeClaim::Unrecognised => None,
    });
    match (component_role(component), explicit) {
        (Some(c), Some(k)) if c != k => Err((c, k)),
        (Some(c), _) => Ok(c),
        (None, Some(k)) => Ok(k),
        (None, None) => Ok(match card.map(CardFields::claim) {
            Some(WorkerTypeClaim::Absent) => Role::Aggregated,
            _ => Role::Unknown,
        }),
    }
}

type CardId<'a> = (&'a str, &'a str, &'a str, InstanceId);

struct Claim<'a, T> {
    key: &'a [u8],
    namespace: &'a str,
    held: &'a Held<T>,
    rec: &'a T,
}

fn used<T>(map: &HeldMap<T>) -> impl Iterator<Item = Claim<'_, T>> {
    map.iter().filter_map(|(key, held)| match &held.slot {
        Slot::Used { namespace, rec } => Some(Claim {
            key,
            namespace,
            held,
            rec,
        }),
        Slot::Skipped { .. } => None,
    })
}

/// Builds the view from everything the reducer holds, reporting new duplicates and conflicts to
/// `sink` (once each, by `memory`) and dropping the memo of every worker no longer claimed.
pub(crate) fn build_view(
    held_instances: &HeldMap<InstanceRecord>,
    held_cards: &HeldMap<CardRecord>,
    held_channels: &HeldMap<ChannelRec>,
    held_sources: &HeldMap<EventSource>,
    memos: &mut BTreeMap<InstanceId, Memo>,
    memory: &mut JoinMemory,
    sink: &mut Sink,
) -> FleetView {
    let mut found: Vec<(DuplicateKind, String, Vec<Vec<u8>>)> = Vec::new();
    let mut conflicts = BTreeSet::new();

    // Generate instance ids: one claimant across the whole view (DISC-DUP-04, Q-45).
    let mut by_id: BTreeMap<InstanceId, Vec<Claim<'_, InstanceRecord>>> = BTreeMap::new();
    for c in used(held_instances) {
        by_id.entry(c.rec.instance_id).or_default().push(c);
    }
    let mut instances = Vec::with_capacity(by_id.len());
    for (id, mut claims) in by_id {
        if claims.len() == 1 {
            instances.extend(claims.pop());
            continue;
        }
        let first_ns = claims.first().map(|c| c.namespace);
        let kind = if claims.iter().all(|c| Some(c.namespace) == first_ns) {
            DuplicateKind::Instance
        } else {
            DuplicateKind::InstanceAcrossNamespaces
        };
        found.push((
            kind,
            id.to_string(),
            claims.iter().map(|c| c.key.to_vec()).collect(),
        ));
    }

    // Base cards, by (namespace, component, endpoint, instance id); `None` marks a rejected id.
    let mut cards: BTreeMap<CardId<'_>, Vec<Claim<'_, CardRecord>>> = BTreeMap::new();
    for c in used(held_cards) {
        let id = (
            c.namespace,
            c.rec.component.as_str(),
            c.rec.endpoint.as_str(),
            c.rec.instance_id,
        );
        cards.entry(id).or_default().push(c);
    }
    let mut card_of: BTreeMap<CardId<'_>, Option<Claim<'_, CardRecord>>> = BTreeMap::new();
    for (id, mut claims) in cards {
        if claims.len() == 1 {
            card_of.insert(id, claims.pop());
        } else {
            let (ns, comp, ep, iid) = id;
            found.push((
                DuplicateKind::BaseCard,
                clip(&format!("{ns}/{comp}/{ep}/{iid}")),
                claims.iter().map(|c| c.key.to_vec()).collect(),
            ));
            card_of.insert(id, None);
        }
    }

    let mut workers = Vec::with_capacity(instances.len());
    for inst in instances {
        let ns = inst.namespace;
        let rec = inst.rec;
        let scoped = (
            ns,
            rec.component.as_str(),
            rec.endpoint.as_str(),
            rec.instance_id,
        );
        let card = match card_of.get(&scoped) {
            Some(found) => found.as_ref(),
            None => card_of
                .get(&(ns, "", "", rec.instance_id))
                .and_then(Option::as_ref),
        };
        let fields = card.filter(|c| c.rec.has_card_json).map(|c| &c.rec.fields);
        let role = match resolve_role(&rec.component, fields) {
            Ok(role) => role,
            Err((component_role, card_role)) => {
                conflicts.insert((ns.to_owned(), rec.instance_id, component_role, card_role));
                if !memory.conflicts.contains(&(
                    ns.to_owned(),
                    rec.instance_id,
                    component_role,
                    card_role,
                )) {
                    sink.push(Diagnostic::RoleConflict {
                        namespace: ns.to_owned(),
                        instance_id: rec.instance_id,
                        component: clip(&rec.component),
                        component_role,
                        card_role,
                    });
                }
                continue;
            }
        };
        let memo = Memo::for_worker(memos, ns, rec.instance_id, inst.held.changed_at);
        if let Some(f) = fields
            && !f.versions.is_empty()
            && !memo.version_logged
        {
            memo.version_logged = true;
            sink.push(Diagnostic::VersionSeen {
                namespace: ns.to_owned(),
                instance_id: rec.instance_id,
                versions: f.versions.clone(),
            });
        }
        let defaults = CardFields::default();
        let f = fields.unwrap_or(&defaults);
        let last_updated = card.map_or(inst.held.changed_at, |c| {
            c.held.changed_at.max(inst.held.changed_at)
        });
        workers.push(Worker {
            namespace: ns.to_owned(),
            instance_id: rec.instance_id,
            component: rec.component.clone(),
            endpoint: rec.endpoint.clone(),
            role,
            model: f.display_name.clone(),
            block_size: f.block_size,
            capacity: f.capacity,
            dp_start_rank: f.dp_start_rank,
            dp_size: f.dp_size,
            disaggregated_endpoint: f.disaggregated_endpoint.clone(),
            card: card.and_then(|c| c.rec.card.clone()),
            first_seen: memo.first_seen,
            last_updated,
            transport: rec.transport.clone(),
        });
    }
    workers.sort_by(|a, b| (&a.namespace, a.instance_id).cmp(&(&b.namespace, b.instance_id)));

    // Publishers: one claimant per publisher id across the view (LOAD-CHAN-09).
    let mut by_pub: BTreeMap<_, Vec<Claim<'_, _>>> = BTreeMap::new();
    for c in used(held_channels) {
        by_pub.entry(c.rec.publisher_id).or_default().push(c);
    }
    let mut publishers = Vec::with_capacity(by_pub.len());
    let mut source_key = Vec::new();
    for (id, claims) in by_pub {
        match claims.as_slice() {
            [c] => publishers.push(Publisher {
                family: c.rec.family,
                publisher_id: id,
                namespace: c.namespace.to_owned(),
                component: c.rec.scope.component().map(str::to_owned),
                endpoint: c.rec.scope.endpoint().map(str::to_owned),
                tcp: c.rec.tcp.clone(),
                source: source_of(c, held_sources, &mut source_key),
            }),
            _ => found.push((
                DuplicateKind::Publisher,
                id.to_string(),
                claims.iter().map(|c| c.key.to_vec()).collect(),
            )),
        }
    }
    publishers.sort_by(|a, b| {
        (&a.namespace, a.family, a.publisher_id).cmp(&(&b.namespace, b.family, b.publisher_id))
    });

    report_duplicates(memory, sink, found);
    memory.conflicts = conflicts;
    let claimed = claimed_workers(held_instances);
    memos.retain(|k, _| claimed.contains(k));
    FleetView {
        workers,
        publishers,
    }
}

/// The registered source of a kv-events channel: the used record under the same key suffix.
fn source_of(
    channel: &Claim<'_, ChannelRec>,
    held_sources: &HeldMap<EventSource>,
    buf: &mut Vec<u8>,
) -> Option<EventSource> {
    if channel.rec.family != Family::KvEvents {
        return None;
    }
    let key = source_key_of(channel.key, buf)?;
    match &held_sources.get(key)?.slot {
        Slot::Used { rec, .. } => Some(*rec),
        Slot::Skipped { .. } => None,
    }
}

/// Every `(namespace, instance_id)` that a held `generate` record claims.
fn claimed_workers(instances: &HeldMap<InstanceRecord>) -> BTreeSet<InstanceId> {
    instances
        .values()
        .filter_map(|h| match &h.slot {
            Slot::Used { rec, .. } => Some(rec.instance_id),
            Slot::Skipped { .. } => None,
        })
        .collect()
}

/// Reports each distinct colliding key set once while it lasts (DISC-DUP-07/08, Q-11).
fn report_duplicates(
    memory: &mut JoinMemory,
    sink: &mut Sink,
    found: Vec<(DuplicateKind, String, Vec<Vec<u8>>)>,
) {
    let mut now = BTreeSet::new();
    for (kind, id, mut keys) in found {
        keys.sort();
        let set = (kind, keys);
        if !memory.duplicates.contains(&set) {
            let (kind, keys) = &set;
            sink.push(Diagnostic::Duplicate {
                kind: *kind,
                id,
                count: keys.len(),
                keys: keys
                    .iter()
                    .take(MAX_LISTED_KEYS)
                    .map(|k| clip(&String::from_utf8_lossy(k)))
                    .collect(),
            });
        }
        now.insert(set);
    }
    memory.duplicates = now;
}
