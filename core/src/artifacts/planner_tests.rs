//! The planner's rules, one test each (KV-TOK-03/04, -07..10, -18).

use std::time::Duration;

use super::*;
use crate::artifacts::card::{FileFormat, MAX_ARTIFACT_BYTES, Slot};
use crate::config::dynamo::Blake3Digest;

fn digest(b: u8) -> Blake3Digest {
    Blake3Digest([b; 32])
}

fn artifact(slot: Slot, format: FileFormat, uri: &str, sum: u8, size: u64) -> ArtifactRef {
    ArtifactRef {
        slot,
        format,
        uri: uri.to_owned(),
        kind: crate::artifacts::card::uri_kind(uri).expect("kind"),
        checksum: digest(sum),
        size: Some(size),
    }
}

fn set(tok: u8, cfg: u8, uri: &str) -> ArtifactSet {
    ArtifactSet {
        tokenizer: artifact(Slot::Tokenizer, FileFormat::TokenizerJson, uri, tok, 1000),
        formatter: Some(artifact(
            Slot::PromptFormatter,
            FileFormat::TokenizerConfigJson,
            "/m/tokenizer_config.json",
            cfg,
            100,
        )),
        template: None,
    }
}

fn model(name: &str, s: ArtifactSet) -> ModelArtifacts {
    ModelArtifacts {
        model: name.to_owned(),
        agreement: Agreement::Agreed(s),
        block_sizes: vec![64],
        block_size_issues: Vec::new(),
    }
}

fn pinned(sums: &[u8]) -> KvConfig {
    KvConfig {
        enabled: true,
        pinned_artifacts: sums.iter().map(|b| digest(*b)).collect(),
        ..KvConfig::default()
    }
}

fn at(s: u64) -> Instant {
    Instant::from_origin(Duration::from_secs(s))
}

fn skip_of(t: &PromptTable<&'static str>, m: &str) -> Option<KvSkip> {
    match &t.get(m).expect("model").state {
        PromptState::Skip(s) => Some(*s),
        PromptState::Ready(_) => None,
    }
}

#[test]
fn an_unpinned_artifact_is_skipped_counted_once_and_never_loaded() {
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let models = [model("m", set(1, 2, "/m/tokenizer.json"))];
    let plan = p.plan(&models, &pinned(&[1]), at(0));
    assert_eq!(skip_of(&plan.table, "m"), Some(KvSkip::ArtifactUnpinned));
    assert!(plan.start.is_empty());
    assert_eq!(plan.events.len(), 1);
    let ArtifactEvent::Unpinned { model, artifact } = &plan.events[0] else {
        panic!("{:?}", plan.events)
    };
    assert_eq!(
        (model.as_str(), artifact.slot),
        ("m", Slot::PromptFormatter)
    );
    // Planned again: still skipped, not reported again.
    let plan = p.plan(&models, &pinned(&[1]), at(1));
    assert_eq!(skip_of(&plan.table, "m"), Some(KvSkip::ArtifactUnpinned));
    assert!(plan.events.is_empty());
    // Pinned by a reload: loaded.
    let plan = p.plan(&models, &pinned(&[1, 2]), at(2));
    assert_eq!(plan.start.len(), 1);
    assert_eq!(
        skip_of(&plan.table, "m"),
        Some(KvSkip::TokenizerUnavailable)
    );
}

#[test]
fn a_set_loads_once_for_every_model_that_names_it_and_becomes_ready() {
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let s = set(1, 2, "/m/tokenizer.json");
    let mut other = s.clone();
    other.tokenizer.uri = "/elsewhere/tokenizer.json".into();
    let models = [model("a", s.clone()), model("b", other)];
    let plan = p.plan(&models, &pinned(&[1, 2]), at(0));
    assert_eq!(plan.start.len(), 1, "shared per ArtifactKey");
    assert_eq!(p.loading(), 1);
    // Planning while it loads starts nothing more.
    assert!(p.plan(&models, &pinned(&[1, 2]), at(1)).start.is_empty());
    p.finished(s.key(), Ok(("pipeline", 1100)), at(2));
    let plan = p.plan(&models, &pinned(&[1, 2]), at(2));
    for m in ["a", "b"] {
        match &plan.table.get(m).expect("m").state {
            PromptState::Ready(x) => assert_eq!(**x, "pipeline"),
            other => panic!("{m}: {other:?}"),
        }
        assert_eq!(plan.table.get(m).expect("m").block_sizes, vec![64]);
    }
    assert_eq!(p.loaded(), 1);
}

#[test]
fn a_failed_load_is_retried_only_after_five_minutes() {
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let s = set(1, 2, "/m/tokenizer.json");
    let models = [model("m", s.clone())];
    assert_eq!(p.plan(&models, &pinned(&[1, 2]), at(0)).start.len(), 1);
    p.finished(s.key(), Err(()), at(10));
    assert_eq!(p.retry_at(at(10)), Some(at(310)));
    let plan = p.plan(&models, &pinned(&[1, 2]), at(309));
    assert!(plan.start.is_empty());
    assert_eq!(
        skip_of(&plan.table, "m"),
        Some(KvSkip::TokenizerUnavailable)
    );
    assert_eq!(p.plan(&models, &pinned(&[1, 2]), at(310)).start.len(), 1);
}

#[test]
fn locations_the_config_does_not_allow_are_refused() {
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let http = [model("m", set(1, 2, "http://127.0.0.1:9/tokenizer.json"))];
    let hf = [model("m", set(1, 2, "hf://org/repo/tokenizer.json"))];
    let mut cfg = pinned(&[1, 2]);
    // Defaults: http allowed, hf refused.
    assert_eq!(p.plan(&http, &cfg, at(0)).start.len(), 1);
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let plan = p.plan(&hf, &cfg, at(0));
    assert!(plan.start.is_empty());
    assert!(matches!(plan.events[..], [ArtifactEvent::Refused { .. }]));
    assert_eq!(
        skip_of(&plan.table, "m"),
        Some(KvSkip::TokenizerUnavailable)
    );
    cfg.allow_hf_artifacts = true;
    assert_eq!(p.plan(&hf, &cfg, at(1)).start.len(), 1);
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    cfg.allow_http_artifacts = false;
    assert!(p.plan(&http, &cfg, at(0)).start.is_empty());
}

#[test]
fn disagreement_and_unusable_cards_are_tokenizer_unavailable() {
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let models = [
        ModelArtifacts {
            model: "d".into(),
            agreement: Agreement::Disagree,
            block_sizes: vec![64],
            block_size_issues: Vec::new(),
        },
        ModelArtifacts {
            model: "n".into(),
            agreement: Agreement::NoCard,
            block_sizes: vec![],
            block_size_issues: vec![BlockSizeIssue::OutOfRange(8)],
        },
    ];
    let plan = p.plan(&models, &pinned(&[]), at(0));
    assert_eq!(
        skip_of(&plan.table, "d"),
        Some(KvSkip::TokenizerUnavailable)
    );
    assert_eq!(
        skip_of(&plan.table, "n"),
        Some(KvSkip::TokenizerUnavailable)
    );
    assert!(plan.start.is_empty());
    assert_eq!(
        plan.events,
        vec![ArtifactEvent::UnsupportedBlockSize {
            model: "n".into(),
            issue: BlockSizeIssue::OutOfRange(8)
        }]
    );
    assert!(p.plan(&models, &pinned(&[]), at(1)).events.is_empty());
}

#[test]
fn the_limits_hold_exactly() {
    let limits = LoaderLimits {
        max_loaded: 3,
        max_concurrent: 2,
        max_total_bytes: 3 * 1100,
        retry_after: Duration::from_secs(300),
    };
    let mut p: Planner<&'static str> = Planner::new(limits);
    let sets: Vec<ArtifactSet> = (1..=5).map(|i| set(i, 100, "/m/t.json")).collect();
    let models: Vec<ModelArtifacts> = sets
        .iter()
        .enumerate()
        .map(|(i, s)| model(&format!("m{i}"), s.clone()))
        .collect();
    let cfg = pinned(&[1, 2, 3, 4, 5, 100]);
    // Two at once.
    let first = p.plan(&models, &cfg, at(0)).start;
    assert_eq!(first.len(), 2);
    for j in &first {
        p.finished(j.key, Ok(("p", 1100)), at(1));
    }
    // A third fits (3 loaded, 3300 bytes); a fourth does not.
    let third = p.plan(&models, &cfg, at(1)).start;
    assert_eq!(third.len(), 1);
    p.finished(third[0].key, Ok(("p", 1100)), at(2));
    let plan = p.plan(&models, &cfg, at(2));
    assert!(plan.start.is_empty());
    assert_eq!(p.loaded(), 3);
    let ready = plan
        .table
        .iter()
        .filter(|(_, m)| matches!(m.state, PromptState::Ready(_)))
        .count();
    assert_eq!(ready, 3);
    // A model leaves: its pipeline is dropped and the next set loads.
    let plan = p.plan(&models[1..], &cfg, at(3));
    assert_eq!(plan.start.len(), 1);
    assert_eq!(p.loaded(), 2);
}

#[test]
fn a_late_result_for_a_dropped_set_is_ignored() {
    let mut p: Planner<&'static str> = Planner::new(LoaderLimits::SPEC);
    let s = set(1, 2, "/m/t.json");
    p.plan(&[model("m", s.clone())], &pinned(&[1, 2]), at(0));
    p.plan(&[], &pinned(&[1, 2]), at(1));
    p.finished(s.key(), Ok(("late", 1)), at(2));
    assert_eq!(p.loaded(), 0);
}

#[test]
fn a_set_that_leaves_and_returns_while_loading_is_not_loaded_twice() {
    let limits = LoaderLimits {
        max_concurrent: 1,
        ..LoaderLimits::SPEC
    };
    let mut p: Planner<&'static str> = Planner::new(limits);
    let (a, b) = (set(1, 2, "/m/a.json"), set(3, 4, "/m/b.json"));
    let cfg = pinned(&[1, 2, 3, 4]);
    assert_eq!(p.plan(&[model("a", a.clone())], &cfg, at(0)).start.len(), 1);
    // `a` leaves while its load runs: the load still holds the one concurrency slot.
    assert!(
        p.plan(&[model("b", b.clone())], &cfg, at(1))
            .start
            .is_empty()
    );
    assert_eq!(p.loading(), 1);
    // `a` comes back: its running load is taken back, not started again.
    assert!(
        p.plan(&[model("a", a.clone())], &cfg, at(2))
            .start
            .is_empty()
    );
    p.finished(a.key(), Ok(("a", 1)), at(3));
    assert_eq!((p.loading(), p.loaded()), (0, 1));
    // `a` is dropped and `b` loads; `b` leaves mid-load: its result is dropped when it ends,
    // and only then does the slot free.
    assert_eq!(p.plan(&[model("b", b.clone())], &cfg, at(4)).start.len(), 1);
    assert!(
        p.plan(&[model("a", a.clone())], &cfg, at(5))
            .start
            .is_empty()
    );
    p.finished(b.key(), Ok(("b", 1)), at(6));
    assert_eq!((p.loading(), p.loaded()), (0, 0));
    assert_eq!(p.plan(&[model("a", a)], &cfg, at(7)).start.len(), 1);
}

#[test]
fn a_due_retry_the_limits_hold_back_asks_for_no_timer() {
    let limits = LoaderLimits {
        max_concurrent: 1,
        ..LoaderLimits::SPEC
    };
    let mut p: Planner<&'static str> = Planner::new(limits);
    let (a, b) = (set(1, 2, "/m/a.json"), set(3, 4, "/m/b.json"));
    let models = [model("a", a.clone()), model("b", b.clone())];
    let cfg = pinned(&[1, 2, 3, 4]);
    let first = p.plan(&models, &cfg, at(0)).start;
    assert_eq!(first.len(), 1, "one load at a time");
    p.finished(first[0].key, Err(()), at(0));
    // The other set starts; the failed one's retry comes due while it still runs.
    assert_eq!(p.plan(&models, &cfg, at(1)).start.len(), 1);
    assert_eq!(p.retry_at(at(1)), Some(at(300)));
    assert!(p.plan(&models, &cfg, at(301)).start.is_empty(), "held back");
    // Due and held back: no timer (a timer in the past would make the control loop spin).
    assert_eq!(p.retry_at(at(301)), None);
}

#[test]
fn a_set_without_declared_sizes_is_charged_the_largest_artifact_size() {
    let limits = LoaderLimits {
        max_total_bytes: 3 * MAX_ARTIFACT_BYTES,
        ..LoaderLimits::SPEC
    };
    let mut p: Planner<&'static str> = Planner::new(limits);
    let no_size = |tok: u8| {
        let mut s = set(tok, 100, "/m/t.json");
        s.tokenizer.size = None;
        s
    };
    // Each set: 64 MiB (no size) + 100 bytes: only two fit in three artifacts' worth.
    let models = [
        model("a", no_size(1)),
        model("b", no_size(2)),
        model("c", no_size(3)),
    ];
    let plan = p.plan(&models, &pinned(&[1, 2, 3, 100]), at(0));
    assert_eq!(plan.start.len(), 2);
}

#[test]
fn the_spec_limits_are_kv_tok_09s() {
    let l = LoaderLimits::SPEC;
    assert_eq!(
        (
            l.max_loaded,
            l.max_concurrent,
            l.max_total_bytes,
            l.retry_after
        ),
        (16, 2, 256 * 1024 * 1024, Duration::from_secs(300))
    );
}
