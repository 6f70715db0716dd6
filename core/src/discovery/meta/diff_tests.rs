//! Differential test of the join against a naive reference: after every operation the diffs
//! the join sent, applied to a plain map, equal both the join's own state and the state the
//! reference recomputes from scratch (which resources are held, which Pods are ready, first
//! supplier by name); and every diff changes something (DISC-K8S-META-13..18, Q-33).
//!
//! The deterministic generator of `test_support` drives the cases; each is reproducible from
//! its seed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::*;
use crate::discovery::test_support::Rng;

const PODS: [&str; 4] = ["a", "b", "c", "d"];
const SLICES: [&str; 3] = ["s1", "s2", "s3"];
const UIDS: [&str; 2] = ["u1", "u2"];

/// A resource: valid with records drawn from a small pool (some keys shared by every Pod, as
/// event channels are), or bad of some kind.
fn resource(rng: &mut Rng, name: &str) -> Resource {
    let uid = (*rng.pick(&UIDS)).to_owned();
    let version = rng.below(1000).to_string();
    let body = match rng.below(6) {
        0 => Body::Bad {
            kind: DiscoveryEventKind::Malformed,
            reason: "x".into(),
        },
        1 => Body::Bad {
            kind: DiscoveryEventKind::Mismatch,
            reason: "x".into(),
        },
        2 if rng.below(3) == 0 => Body::Bad {
            kind: DiscoveryEventKind::Refused,
            reason: "x".into(),
        },
        _ => {
            let mut recs: BTreeMap<Box<[u8]>, Arc<[u8]>> = BTreeMap::new();
            for _ in 0..rng.below(5) {
                let key = if rng.below(2) == 0 {
                    format!("v1/event_channels/shared/{}", rng.below(3))
                } else {
                    format!("v1/instances/{name}/{}", rng.below(3))
                };
                let value = format!("{{\"v\":{}}}", rng.below(3));
                recs.insert(key.into_bytes().into(), Arc::from(value.as_bytes()));
            }
            Body::Valid(
                recs.into_iter()
                    .map(|(key, value)| Record { key, value })
                    .collect::<Vec<_>>()
                    .into(),
            )
        }
    };
    Resource {
        name: name.to_owned(),
        uid,
        version,
        body,
    }
}

fn slice(rng: &mut Rng, name: &str) -> SliceFacts {
    SliceFacts {
        name: name.to_owned(),
        ready: PODS
            .iter()
            .filter(|_| rng.below(2) == 0)
            .map(|p| (*p).to_owned())
            .collect(),
    }
}

#[derive(Default)]
struct Reference {
    held: BTreeMap<String, (String, Arc<[Record]>)>,
    slices: BTreeMap<String, BTreeSet<String>>,
}

impl Reference {
    fn upsert(&mut self, r: &Resource) {
        match &r.body {
            Body::Valid(recs) => {
                self.held
                    .insert(r.name.clone(), (r.uid.clone(), recs.clone()));
            }
            Body::Bad {
                kind: DiscoveryEventKind::Refused,
                ..
            } => {
                self.held.remove(&r.name);
            }
            Body::Bad { .. } => {
                if self.held.get(&r.name).is_some_and(|(uid, _)| *uid != r.uid) {
                    self.held.remove(&r.name);
                }
            }
        }
    }

    fn state(&self) -> BTreeMap<Box<[u8]>, Arc<[u8]>> {
        let ready: BTreeSet<&String> = self.slices.values().flatten().collect();
        let mut out: BTreeMap<Box<[u8]>, Arc<[u8]>> = BTreeMap::new();
        // Names in order: the first supplier's value is kept.
        for (name, (_, recs)) in &self.held {
            if !ready.contains(name) {
                continue;
            }
            for r in recs.iter() {
                out.entry(r.key.clone()).or_insert_with(|| r.value.clone());
            }
        }
        out
    }
}

fn apply(map: &mut BTreeMap<Box<[u8]>, Arc<[u8]>>, changes: &[RecordChange], seed: u64) {
    for c in changes {
        match c {
            RecordChange::Put(k, v) => {
                let old = map.insert(k.clone(), v.clone());
                assert_ne!(
                    old.as_deref(),
                    Some(&**v),
                    "seed {seed}: a put that changes nothing"
                );
            }
            RecordChange::Delete(k) => {
                assert!(
                    map.remove(k).is_some(),
                    "seed {seed}: a delete of an absent key"
                );
            }
        }
    }
}

#[test]
fn the_joins_diffs_match_a_reference_recomputed_from_scratch() {
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut j = MetaJoin::new();
        let mut reference = Reference::default();
        let mut fed: BTreeMap<Box<[u8]>, Arc<[u8]>> = BTreeMap::new();
        // What the API server holds now (for re-lists).
        let mut server: BTreeMap<String, Resource> = BTreeMap::new();
        let mut server_slices: BTreeMap<String, SliceFacts> = BTreeMap::new();
        for step in 0..60 {
            match rng.below(10) {
                0..=3 => {
                    let name = rng_pick(&mut rng, &PODS);
                    let r = resource(&mut rng, name);
                    reference.upsert(&r);
                    server.insert(r.name.clone(), r.clone());
                    apply(&mut fed, &j.upsert(r), seed);
                }
                4 => {
                    let name = rng_pick(&mut rng, &PODS);
                    reference.held.remove(name);
                    server.remove(name);
                    apply(&mut fed, &j.remove_resource(name), seed);
                }
                5..=7 => {
                    let name = rng_pick(&mut rng, &SLICES);
                    let s = slice(&mut rng, name);
                    reference.slices.insert(s.name.clone(), s.ready.clone());
                    server_slices.insert(s.name.clone(), s.clone());
                    apply(&mut fed, &j.upsert_slice(s), seed);
                }
                8 => {
                    let name = rng_pick(&mut rng, &SLICES);
                    reference.slices.remove(name);
                    server_slices.remove(name);
                    apply(&mut fed, &j.remove_slice(name), seed);
                }
                _ => {
                    // A re-list: what the server holds replaces everything.
                    let mut next = Reference {
                        held: BTreeMap::new(),
                        slices: reference.slices.clone(),
                    };
                    for r in server.values() {
                        if let Some(h) = reference.held.get(&r.name) {
                            next.held.insert(r.name.clone(), h.clone());
                        }
                        next.upsert(r);
                    }
                    reference = next;
                    let state = j.replace_all(
                        server.values().cloned().collect(),
                        server_slices.values().cloned().collect(),
                    );
                    fed = state.into_iter().collect();
                }
            }
            let want = reference.state();
            assert_eq!(fed, want, "seed {seed} step {step}: fed vs reference");
            let own: BTreeMap<_, _> = j.state().into_iter().collect();
            assert_eq!(
                own, want,
                "seed {seed} step {step}: join state vs reference"
            );
            assert_eq!(
                j.resources(),
                reference.held.len(),
                "seed {seed} step {step}"
            );
        }
    }
}

fn rng_pick<'a>(rng: &mut Rng, v: &[&'a str]) -> &'a str {
    v[rng.below(v.len() as u64) as usize]
}
