//! Fuzz `config::Config::from_yaml` (operator input) and the `config show` renderers.
//!
//! Asserts, beyond "does not panic":
//! - an `Err` carries at least one error (never an empty error list);
//! - an `Ok` config renders with `show_masked`, `show_json` and `Debug`, and the rendered YAML and
//!   JSON parse back to the same config (secrets aside, which are masked by design); when a token
//!   hash is set the masked `sha256:********` cannot parse back, so only rendering is checked.
#![no_main]

use continuum_core::config::{Config, NoEnv};
use libfuzzer_sys::fuzz_target;

/// Longer inputs are skipped: config files are small and YAML parsing is the slow part.
const MAX_LEN: usize = 16 * 1024;

/// Put `orig`'s secrets (masked when shown) back into `back`.
fn restore_secrets(back: &mut Config, orig: &Config) {
    let (b, o) = (&mut back.dynamo.discovery.etcd, &orig.dynamo.discovery.etcd);
    if let (Some(b), Some(o)) = (&mut b.tls, &o.tls) {
        b.client_key = o.client_key.clone();
    }
    if let (Some(b), Some(o)) = (&mut b.auth, &o.auth) {
        b.password = o.password.clone();
    }
    if let (Some(b), Some(o)) = (&mut back.dynamo.event_bus.tls, &orig.dynamo.event_bus.tls) {
        b.key = o.key.clone();
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_LEN {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let c = match Config::from_yaml(text, &NoEnv) {
        Ok((c, _warnings)) => c,
        Err(e) => {
            assert!(!e.errors.is_empty(), "Err with no errors");
            return;
        }
    };
    let shown = c.show_masked();
    let json = c.show_json().to_string();
    let _ = format!("{c:?}");
    let has_hash = c.admin.token_hash.is_some()
        || c.dynamo
            .event_bus
            .brokers
            .iter()
            .any(|b| b.token_hash.is_some());
    // A shown peers key is masked into something no config accepts (config::show's docs).
    if has_hash || c.dynamo.peers.key.is_some() {
        return;
    }
    for (what, text) in [("yaml", &shown), ("json", &json)] {
        let mut back = match Config::from_yaml(text, &NoEnv) {
            Ok((b, _)) => b,
            Err(e) => panic!("shown {what} does not parse back:\n{text}\n{:#?}", e.errors),
        };
        restore_secrets(&mut back, &c);
        assert_eq!(back, c, "shown {what} parses to another config:\n{text}");
    }
});
