//! Tests of `auth` (client API keys): conversion, defaults, every refusal, masking.

use super::tests_basic::ok;
use super::tests_cfg_a::rejects;
use super::{BackendName, KeyRate};

/// Two distinct well-formed digests (the keys behind them do not matter here).
const HA: &str = "sha256:0b1d8e5dcac2a2fc0b1c1cbe1f5b4e8d5f1a8d7f4f0a3b2d9e6c5a4b3f2e1d0c";
const HB: &str = "sha256:1c2e9f6edbd3b3fd1c2d2dcf2f6c5f9e6f2b9e8f5f1b4c3e0f7d6b5c4f3f2e1d";

fn with_auth(keys: &str) -> String {
    format!(
        "backends: [ {{ name: a, type: openai, url: \"http://127.0.0.1:9000\", models: [m] }}, \
         {{ name: b, type: openai, url: \"http://127.0.0.1:9001\", models: [m] }} ]\nauth: {{ keys: [ {keys} ] }}\n"
    )
}

#[test]
fn keys_convert_with_their_policies_and_defaults() {
    let (c, _) = ok(&with_auth(&format!(
        "{{ name: team-a, key_hash: \"{HA}\", allowed_models: [m], allowed_backends: [b], \
         requests_per_second: 2.5, max_concurrent: 4 }}, {{ name: open, key_hash: \"{HB}\" }}"
    )));
    let auth = c.auth.expect("auth on");
    let a = &auth.keys[0];
    assert_eq!(a.name.0, "team-a");
    assert_eq!(a.allowed_models.as_deref(), Some(&["m".to_owned()][..]));
    assert_eq!(a.allowed_backends, Some(vec![BackendName("b".into())]));
    // The default burst is one second's worth, rounded up.
    assert_eq!(
        a.rate,
        Some(KeyRate {
            requests_per_second: 2.5,
            burst: 3
        })
    );
    assert_eq!(a.max_concurrent, Some(4));
    let o = &auth.keys[1];
    assert_eq!(
        (
            o.allowed_models.as_ref(),
            o.allowed_backends.as_ref(),
            o.rate,
            o.max_concurrent
        ),
        (None, None, None, None)
    );
    let (c, _) = ok("");
    assert!(c.auth.is_none());
}

#[test]
fn every_bad_key_is_refused_with_its_field() {
    let k = |body: &str| with_auth(&format!("{{ name: k, key_hash: \"{HA}\", {body} }}"));
    rejects(&with_auth(""), "auth.keys");
    rejects(&with_auth("{ name: k }"), "auth.keys[0].key_hash");
    rejects(
        &with_auth("{ name: k, key_hash: sk-plaintext }"),
        "auth.keys[0].key_hash",
    );
    rejects(
        &with_auth(&format!("{{ key_hash: \"{HA}\" }}")),
        "auth.keys[0].name",
    );
    rejects(
        &with_auth(&format!("{{ name: \"a b\", key_hash: \"{HA}\" }}")),
        "auth.keys[0].name",
    );
    rejects(
        &with_auth(&format!(
            "{{ name: k, key_hash: \"{HA}\" }}, {{ name: k, key_hash: \"{HB}\" }}"
        )),
        "auth.keys[1].name",
    );
    rejects(
        &with_auth(&format!(
            "{{ name: k, key_hash: \"{HA}\" }}, {{ name: j, key_hash: \"{HA}\" }}"
        )),
        "auth.keys[1].key_hash",
    );
    rejects(
        &k("allowed_backends: [nope]"),
        "auth.keys[0].allowed_backends[0]",
    );
    rejects(
        &k("allowed_models: [\"\"]"),
        "auth.keys[0].allowed_models[0]",
    );
    rejects(
        &k("requests_per_second: 0"),
        "auth.keys[0].requests_per_second",
    );
    rejects(&k("burst: 5"), "auth.keys[0].burst");
    rejects(&k("requests_per_second: 1, burst: 0"), "auth.keys[0].burst");
    rejects(&k("max_concurrent: 0"), "auth.keys[0].max_concurrent");
}

#[test]
fn a_plaintext_key_in_key_hash_is_never_echoed() {
    let e = rejects(
        &with_auth("{ name: k, key_hash: sk-live-secret }"),
        "auth.keys[0].key_hash",
    );
    let shown = format!("{e:?}");
    assert!(!shown.contains("sk-live-secret"), "{shown}");
}

#[test]
fn shown_keys_mask_their_hashes() {
    let (c, _) = ok(&with_auth(&format!(
        "{{ name: k, key_hash: \"{HA}\", requests_per_second: 1 }}"
    )));
    let shown = c.show_masked();
    assert!(shown.contains("sha256:********"), "{shown}");
    assert!(!shown.contains(&HA[7..]), "{shown}");
    let j = c.show_json();
    assert_eq!(j["auth"]["keys"][0]["name"], "k");
    assert_eq!(j["auth"]["keys"][0]["burst"], 1);
}

#[test]
fn the_key_and_allow_list_caps_are_enforced() {
    let digest = |i: usize| format!("sha256:{i:064x}");
    let keys: Vec<String> = (0..=super::convert_auth::MAX_KEYS)
        .map(|i| format!("{{ name: k{i}, key_hash: \"{}\" }}", digest(i)))
        .collect();
    rejects(&with_auth(&keys.join(", ")), "auth.keys");
    let ok_keys = &keys[..super::convert_auth::MAX_KEYS];
    let (c, _) = ok(&with_auth(&ok_keys.join(", ")));
    assert_eq!(c.auth.unwrap().keys.len(), super::convert_auth::MAX_KEYS);
    let models: Vec<String> = (0..=1024).map(|i| format!("m{i}")).collect();
    rejects(
        &with_auth(&format!(
            "{{ name: k, key_hash: \"{}\", allowed_models: [{}] }}",
            digest(1),
            models.join(", ")
        )),
        "auth.keys[0].allowed_models",
    );
}
