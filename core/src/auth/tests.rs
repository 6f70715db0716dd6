use std::sync::Arc;

use super::*;
use crate::config::{NoEnv, TokenHash};

fn digest(key: &str) -> String {
    use sha2::Digest;
    let d: [u8; 32] = sha2::Sha256::digest(key.as_bytes()).into();
    format!(
        "sha256:{}",
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

fn config(keys: &str) -> Config {
    let yaml = format!(
        "backends: [ {{ name: a, type: openai, url: \"http://127.0.0.1:9000\", models: [m] }}, \
         {{ name: b, type: openai, url: \"http://127.0.0.1:9001\", models: [m, n] }} ]\n\
         auth: {{ keys: [ {keys} ] }}\n"
    );
    Config::from_yaml(&yaml, &NoEnv).unwrap().0
}

fn table(c: &Config, previous: Option<&AuthTable>) -> AuthTable {
    AuthTable::build(c, c.auth.as_ref().unwrap(), previous)
}

#[test]
fn identify_finds_exactly_the_key_whose_digest_matches() {
    let c = config(&format!(
        "{{ name: one, key_hash: \"{}\" }}, {{ name: two, key_hash: \"{}\", allowed_models: [n], \
         allowed_backends: [b] }}",
        digest("sk-one"),
        digest("sk-two")
    ));
    let t = table(&c, None);
    assert_eq!(t.identify(b"sk-one").unwrap().config.name.0, "one");
    let two = t.identify(b"sk-two").unwrap();
    assert_eq!(two.config.name.0, "two");
    assert!(t.identify(b"sk-three").is_none());
    assert!(t.identify(b"").is_none());
    assert!(t.identify(b"sk-one ").is_none());
    assert!(two.allows_model("n") && !two.allows_model("m"));
    assert!(two.allows_backend(BackendIdx(1)) && !two.allows_backend(BackendIdx(0)));
    let one = t.identify(b"sk-one").unwrap();
    assert!(one.allows_model("anything") && one.allows_backend(BackendIdx(0)));
    assert!(
        TokenHash(two.config.key_hash.0).matches(b"sk-two"),
        "the digest is the key's"
    );
}

#[test]
fn the_bucket_admits_burst_then_the_rate_and_says_when_to_retry() {
    let s = KeyState::default();
    let rate = KeyRate {
        requests_per_second: 10.0,
        burst: 3,
    };
    let t0 = 1_000_000_000;
    for _ in 0..3 {
        assert_eq!(s.try_rate(t0, &rate), Ok(()));
    }
    let wait = s.try_rate(t0, &rate).unwrap_err();
    assert_eq!(
        wait, 100_000_000,
        "one interval (100 ms) until the next fits"
    );
    assert!(s.try_rate(t0 + 99_999_999, &rate).is_err());
    assert_eq!(s.try_rate(t0 + 100_000_000, &rate), Ok(()));
    // After a long quiet period only the burst is available again, not more.
    let later = t0 + 60_000_000_000;
    let admitted = (0..10).filter(|_| s.try_rate(later, &rate).is_ok()).count();
    assert_eq!(admitted, 3);
}

/// Shards spending one key's budget at once: never more than burst + rate × elapsed in total.
#[test]
fn the_rate_holds_across_threads() {
    for round in 0..20u64 {
        let s = Arc::new(KeyState::default());
        let rate = KeyRate {
            requests_per_second: 1000.0,
            burst: 5,
        };
        // 4 threads, each trying 200 times over a simulated 50 ms (shared timeline).
        let start = 1_000_000_000 + round;
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    (0..200u64)
                        .filter(|k| {
                            let now = start + (k * 250_000) + t; // 0..50 ms
                            s.try_rate(now, &rate).is_ok()
                        })
                        .count()
                })
            })
            .collect();
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        // 50 ms at 1000/s = 50, plus the burst of 5 (and one interval of edge).
        assert!(total <= 56, "round {round}: {total} admitted");
        assert!(total >= 45, "round {round}: only {total} admitted");
    }
}

#[test]
fn concurrency_is_capped_and_released_on_drop() {
    let s = KeyState::default();
    let a = s.enter(Some(2)).unwrap();
    let b = s.enter(Some(2)).unwrap();
    assert!(s.enter(Some(2)).is_none());
    assert_eq!(s.inflight(), 2);
    drop(a);
    let c = s.enter(Some(2)).unwrap();
    drop((b, c));
    assert_eq!(s.inflight(), 0);
    let unlimited: Vec<_> = (0..100).map(|_| s.enter(None).unwrap()).collect();
    assert_eq!(s.inflight(), 100);
    drop(unlimited);
    assert_eq!(s.inflight(), 0);
}

#[test]
fn concurrency_holds_across_threads() {
    let s = Arc::new(KeyState::default());
    let peak = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (s, peak) = (s.clone(), peak.clone());
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    if let Some(g) = s.enter(Some(3)) {
                        peak.fetch_max(s.inflight(), Ordering::Relaxed);
                        drop(g);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(peak.load(Ordering::Relaxed) <= 3);
    assert_eq!(s.inflight(), 0);
}

#[test]
fn a_reload_keeps_kept_keys_budgets_and_drops_removed_keys() {
    let c1 = config(&format!(
        "{{ name: one, key_hash: \"{}\", requests_per_second: 1, burst: 1 }}, {{ name: two, key_hash: \"{}\" }}",
        digest("sk-one"),
        digest("sk-two")
    ));
    let t1 = table(&c1, None);
    let one = t1.identify(b"sk-one").unwrap();
    let rate = one.config.rate.unwrap();
    assert!(one.state.try_rate(5, &rate).is_ok());
    assert!(one.state.try_rate(5, &rate).is_err());
    let c2 = config(&format!(
        "{{ name: one, key_hash: \"{}\", requests_per_second: 1, burst: 1 }}",
        digest("sk-one")
    ));
    let t2 = table(&c2, Some(&t1));
    let one = t2.identify(b"sk-one").unwrap();
    assert!(
        one.state.try_rate(6, &rate).is_err(),
        "the spent budget survived the reload"
    );
    assert!(t2.identify(b"sk-two").is_none(), "a removed key is refused");
}
