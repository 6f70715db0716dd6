//! The `kubernetes_pods` discovery source, the pure part: which Pods are workers, with which
//! role, model and id (DISC-K8S-POD-03..12, -20, Q-43).
//!
//! The watcher (in `control/`) lists and watches the Pods the [`label_selector`] names and
//! feeds each object through [`pod_facts`] into a [`PodTable`]; [`PodTable::workers`] is the
//! fleet the source publishes. Pods carry no model card and no event channel, so their workers
//! have no capacity, no data-parallel rank and no publishers (DISC-K8S-POD-07).
//!
//! Invariants:
//! - a worker is a Pod that is `Running`, `Ready` and not being deleted (DISC-K8S-POD-05), of a
//!   worker component type (DISC-K8S-POD-04), of a configured Dynamo namespace, not in
//!   container discovery mode (DISC-K8S-POD-12), whose model is known (DISC-K8S-POD-09/10);
//! - its id is Dynamo's `hash_pod_name` of its name ([`super::pod_hash`]); two Pods whose names
//!   hash to one id are both left out as duplicates (DISC-K8S-POD-20);
//! - the table holds at most [`MAX_PODS`] Pods, the first ones by name; the rest are refused and
//!   counted, and the table keeps serving;
//! - every string read from a Pod is length-checked before it is kept.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::fleet::{Capacity, Role, Worker};
use super::ids::{InstanceId, UnixMillis};
use super::pod_hash::hash_pod_name;
use crate::config::dynamo::KubernetesConfig;

/// Most Pods held (DISC-K8S-POD-15, -20).
pub const MAX_PODS: usize = 16_384;
/// Pods asked for per list page (DISC-K8S-POD-15).
pub const LIST_PAGE: u32 = 500;
/// Longest Pod name kept (a DNS subdomain).
pub const MAX_NAME: usize = 253;
/// Longest label or annotation value kept.
pub const MAX_LABEL_VALUE: usize = 63;

/// The labels and the annotation the rules read.
pub mod keys {
    /// Set to `kubernetes` on Pods of a Kubernetes-discovery fleet.
    pub const DISCOVERY_BACKEND: &str = "nvidia.com/dynamo-discovery-backend";
    /// `true` on Pods that take part in discovery.
    pub const DISCOVERY_ENABLED: &str = "nvidia.com/dynamo-discovery-enabled";
    /// The workers' `DYN_NAMESPACE`.
    pub const DYNAMO_NAMESPACE: &str = "nvidia.com/dynamo-namespace";
    /// `prefill`, `decode`, `worker`, `frontend`, `planner`, ...
    pub const COMPONENT_TYPE: &str = "nvidia.com/dynamo-component-type";
    /// With component type `worker`: `prefill`, `decode` or anything else (aggregated).
    pub const SUB_COMPONENT_TYPE: &str = "nvidia.com/dynamo-sub-component-type";
    /// The pool's component name (`VllmWorker-decodeheavy`), mapped to a model by `models`.
    pub const COMPONENT: &str = "nvidia.com/dynamo-component";
    /// Annotation: `container` when each container registers itself (refused).
    pub const DISCOVERY_MODE: &str = "nvidia.com/dynamo-kube-discovery-mode";
}

/// The label selector of the Pod list and watch for these Dynamo namespaces (DISC-K8S-POD-03).
pub fn label_selector(dynamo_namespaces: &[String]) -> String {
    let base = format!(
        "{}=kubernetes,{}=true",
        keys::DISCOVERY_BACKEND,
        keys::DISCOVERY_ENABLED
    );
    match dynamo_namespaces {
        [] => base,
        [one] => format!("{base},{}={one}", keys::DYNAMO_NAMESPACE),
        many => format!("{base},{} in ({})", keys::DYNAMO_NAMESPACE, many.join(",")),
    }
}

/// What the rules read of one Pod object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.name`.
    pub name: String,
    /// The [`keys::DYNAMO_NAMESPACE`] label.
    pub dynamo_namespace: Option<String>,
    /// The [`keys::COMPONENT_TYPE`] label.
    pub component_type: Option<String>,
    /// The [`keys::SUB_COMPONENT_TYPE`] label.
    pub sub_component_type: Option<String>,
    /// The [`keys::COMPONENT`] label.
    pub component: Option<String>,
    /// The [`keys::DISCOVERY_MODE`] annotation is `container`.
    pub container_mode: bool,
    /// `status.phase == "Running"`, the `Ready` condition `"True"` and no
    /// `metadata.deletionTimestamp` (DISC-K8S-POD-05).
    pub ready: bool,
}

/// Why a Pod object was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// Not a JSON object with a `metadata` object.
    #[error("not a Pod object")]
    NotAPod,
    /// `metadata.name` is missing, empty or not a string.
    #[error("the Pod has no name")]
    NoName,
    /// The name is longer than [`MAX_NAME`].
    #[error("the Pod name is longer than {MAX_NAME} bytes")]
    NameTooLong,
    /// A label or annotation the rules read is longer than [`MAX_LABEL_VALUE`] or not a string.
    #[error("label or annotation {0} is not a string of at most {MAX_LABEL_VALUE} bytes")]
    BadLabel(&'static str),
}

/// Read the facts the rules need from a Pod object of the Kubernetes API.
pub fn pod_facts(pod: &Value) -> Result<PodFacts, PodError> {
    let meta = pod
        .get("metadata")
        .filter(|m| m.is_object())
        .ok_or(PodError::NotAPod)?;
    let name = match meta.get("name").and_then(Value::as_str) {
        None | Some("") => return Err(PodError::NoName),
        Some(n) if n.len() > MAX_NAME => return Err(PodError::NameTooLong),
        Some(n) => n.to_owned(),
    };
    let labels = meta.get("labels");
    let label = |key: &'static str| -> Result<Option<String>, PodError> {
        match labels.and_then(|l| l.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() <= MAX_LABEL_VALUE => Ok(Some(s.clone())),
            Some(_) => Err(PodError::BadLabel(key)),
        }
    };
    let mode = match meta
        .get("annotations")
        .and_then(|a| a.get(keys::DISCOVERY_MODE))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(PodError::BadLabel(keys::DISCOVERY_MODE)),
    };
    let status = pod.get("status");
    let running = status.and_then(|s| s.get("phase")).and_then(Value::as_str) == Some("Running");
    let ready_condition = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    let deleting = meta.get("deletionTimestamp").is_some_and(|d| !d.is_null());
    Ok(PodFacts {
        name,
        dynamo_namespace: label(keys::DYNAMO_NAMESPACE)?,
        component_type: label(keys::COMPONENT_TYPE)?,
        sub_component_type: label(keys::SUB_COMPONENT_TYPE)?,
        component: label(keys::COMPONENT)?,
        container_mode: mode == Some("container"),
        ready: running && ready_condition && !deleting,
    })
}

/// What a Pod is to the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodVerdict {
    /// A worker to publish.
    Worker {
        /// Its Dynamo namespace.
        namespace: String,
        /// Its role.
        role: Role,
        /// The served model.
        model: String,
        /// Its component label (empty without one).
        component: String,
    },
    /// A worker Pod that is not ready (or being deleted): held, not published.
    NotReady,
    /// Not a worker (`frontend`, `planner`, `epp`, no type, ...): skipped.
    NotAWorker,
    /// A worker whose component maps to no configured model: held in memory only
    /// (DISC-K8S-POD-10).
    Unmapped,
    /// Container discovery mode: refused (DISC-K8S-POD-12).
    ContainerMode,
    /// Its Dynamo namespace label is missing or not configured.
    ForeignNamespace,
}

/// The role of a Pod by its component type labels (DISC-K8S-POD-04); `None`: not a worker.
pub fn pod_role(component_type: Option<&str>, sub_component_type: Option<&str>) -> Option<Role> {
    match component_type? {
        "prefill" => Some(Role::Prefill),
        "decode" => Some(Role::Decode),
        "worker" => Some(match sub_component_type {
            Some("prefill") => Role::Prefill,
            Some("decode") => Role::Decode,
            _ => Role::Aggregated,
        }),
        _ => None,
    }
}

/// The model a worker Pod of `component` in `dynamo_namespace` serves: the `models` entry whose
/// component matches exactly (and whose namespace, when given, is the Pod's), else `model`.
pub fn pod_model<'c>(
    cfg: &'c KubernetesConfig,
    dynamo_namespace: &str,
    component: Option<&str>,
) -> Option<&'c str> {
    if cfg.models.is_empty() {
        return cfg.model.as_deref();
    }
    let component = component?;
    cfg.models
        .iter()
        .find(|m| {
            m.component == component
                && m.dynamo_namespace
                    .as_deref()
                    .is_none_or(|ns| ns == dynamo_namespace)
        })
        .map(|m| m.model.as_str())
}

/// The verdict on one Pod under `cfg`.
pub fn classify(p: &PodFacts, cfg: &KubernetesConfig) -> PodVerdict {
    if p.container_mode {
        return PodVerdict::ContainerMode;
    }
    let Some(role) = pod_role(p.component_type.as_deref(), p.sub_component_type.as_deref()) else {
        return PodVerdict::NotAWorker;
    };
    let Some(ns) = p
        .dynamo_namespace
        .as_deref()
        .filter(|ns| cfg.dynamo_namespaces.iter().any(|c| c == ns))
    else {
        return PodVerdict::ForeignNamespace;
    };
    if !p.ready {
        return PodVerdict::NotReady;
    }
    match pod_model(cfg, ns, p.component.as_deref()) {
        None => PodVerdict::Unmapped,
        Some(model) => PodVerdict::Worker {
            namespace: ns.to_owned(),
            role,
            model: model.to_owned(),
            component: p.component.clone().unwrap_or_default(),
        },
    }
}

/// One held Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    facts: PodFacts,
    first_seen: UnixMillis,
    last_updated: UnixMillis,
}

/// What a change did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodChange {
    /// Held now (new or changed).
    Held,
    /// Nothing changed.
    Unchanged,
    /// Removed.
    Removed,
    /// Not held: the table is full.
    OverCap,
}

/// The Pods of the source, by name, bounded by [`MAX_PODS`].
#[derive(Debug, Clone, Default)]
pub struct PodTable {
    pods: BTreeMap<String, Held>,
    /// Pods refused because the table was full, since the last full list.
    over_cap: u64,
}

/// The fleet a table publishes, with what was left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodWorkers {
    /// The workers, by (namespace, id).
    pub workers: Vec<Worker>,
    /// Pods left out because another Pod's name hashes to the same id (DISC-K8S-POD-20).
    pub duplicates: Vec<String>,
    /// Worker Pods refused for container discovery mode.
    pub container_mode: Vec<String>,
    /// Ready worker Pods whose component maps to no model.
    pub unmapped: Vec<String>,
}

impl PodTable {
    /// Hold `facts` (new or changed) at `now`.
    pub fn upsert(&mut self, facts: PodFacts, now: UnixMillis) -> PodChange {
        if let Some(h) = self.pods.get_mut(&facts.name) {
            if h.facts == facts {
                return PodChange::Unchanged;
            }
            h.facts = facts;
            h.last_updated = now;
            return PodChange::Held;
        }
        if self.pods.len() >= MAX_PODS {
            self.over_cap += 1;
            return PodChange::OverCap;
        }
        self.pods.insert(
            facts.name.clone(),
            Held {
                facts,
                first_seen: now,
                last_updated: now,
            },
        );
        PodChange::Held
    }

    /// Forget the Pod named `name`.
    pub fn remove(&mut self, name: &str) -> PodChange {
        match self.pods.remove(name) {
            Some(_) => PodChange::Removed,
            None => PodChange::Unchanged,
        }
    }

    /// Replace everything with a full list (a re-list after a watch ended): Pods that vanished
    /// are removed, the others keep when they were first seen. The first [`MAX_PODS`] by
    /// name are held; the rest are counted as over the cap.
    pub fn replace_all(&mut self, mut listed: Vec<PodFacts>, now: UnixMillis) {
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        listed.dedup_by(|a, b| a.name == b.name);
        let mut next = BTreeMap::new();
        self.over_cap = 0;
        for facts in listed {
            if next.len() >= MAX_PODS {
                self.over_cap += 1;
                continue;
            }
            let held = match self.pods.remove(&facts.name) {
                Some(old) if old.facts == facts => old,
                Some(old) => Held {
                    facts,
                    first_seen: old.first_seen,
                    last_updated: now,
                },
                None => Held {
                    facts,
                    first_seen: now,
                    last_updated: now,
                },
            };
            next.insert(held.facts.name.clone(), held);
        }
        self.pods = next;
    }

    /// How many Pods are held.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Pods refused for the cap since the last full list.
    pub fn over_cap(&self) -> u64 {
        self.over_cap
    }

    /// The workers under `cfg`, each with Dynamo's id of its Pod name.
    pub fn workers(&self, cfg: &KubernetesConfig) -> PodWorkers {
        self.workers_by(cfg, hash_pod_name)
    }

    /// The workers under `cfg`, with ids from `id_of` (tests force collisions through it).
    fn workers_by(&self, cfg: &KubernetesConfig, id_of: impl Fn(&str) -> InstanceId) -> PodWorkers {
        let mut out = PodWorkers::default();
        // Ids come from a hash of the name: two names with one id leave both out, whatever
        // their Dynamo namespaces (the load store keys on the id alone, Q-45).
        let mut by_id: HashMap<InstanceId, Vec<(&str, Worker)>> = HashMap::new();
        for (name, held) in &self.pods {
            match classify(&held.facts, cfg) {
                PodVerdict::Worker {
                    namespace,
                    role,
                    model,
                    component,
                } => {
                    let instance_id = id_of(name);
                    let w = Worker {
                        namespace,
                        instance_id,
                        component,
                        endpoint: "generate".to_owned(),
                        role,
                        model: Some(model),
                        block_size: None,
                        capacity: Capacity::default(),
                        dp_start_rank: None,
                        dp_size: None,
                        disaggregated_endpoint: None,
                        card: None,
                        first_seen: held.first_seen,
                        last_updated: held.last_updated,
                        transport: None,
                    };
                    by_id.entry(instance_id).or_default().push((name, w));
                }
                PodVerdict::ContainerMode => out.container_mode.push(name.clone()),
                PodVerdict::Unmapped => out.unmapped.push(name.clone()),
                PodVerdict::NotReady | PodVerdict::NotAWorker | PodVerdict::ForeignNamespace => {}
            }
        }
        for (_, mut group) in by_id {
            if group.len() == 1 {
                if let Some((_, w)) = group.pop() {
                    out.workers.push(w);
                }
            } else {
                out.duplicates
                    .extend(group.into_iter().map(|(n, _)| n.to_owned()));
            }
        }
        out.duplicates.sort();
        out.workers
            .sort_by(|a, b| (&a.namespace, a.instance_id).cmp(&(&b.namespace, b.instance_id)));
        out
    }
}

#[cfg(test)]
mod tests;
