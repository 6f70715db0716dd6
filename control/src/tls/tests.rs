//! Loading `backends[].tls` anchors: what loads, what is shared, and every refusal with its
//! field, value and reason.

use std::path::PathBuf;
use std::sync::Arc;

use continuum_core::config::{Config, NoEnv};

use super::{MAX_CA_FILE, load};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "continuum-tls-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A self-signed CA certificate in PEM.
fn ca_pem(name: &str) -> String {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, name.to_owned());
    let key = rcgen::KeyPair::generate().unwrap();
    p.self_signed(&key).unwrap().pem()
}

fn write(name: &str, text: &str) -> String {
    let p = dir().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// A config with one https backend per `(url, tls block)`.
fn config(backends: &[(&str, &str)]) -> Config {
    let mut y = String::from("backends:\n");
    for (i, (url, tls)) in backends.iter().enumerate() {
        y.push_str(&format!(
            "  - {{ name: b{i}, type: openai, url: \"{url}\", models: [m]{} }}\n",
            if tls.is_empty() {
                String::new()
            } else {
                format!(", tls: {tls}")
            }
        ));
    }
    Config::from_yaml(&y, &NoEnv).unwrap().0
}

#[test]
fn backends_with_the_same_anchors_and_name_share_one_client_config() {
    let ca = write("shared.pem", &ca_pem("shared"));
    let c = config(&[
        (
            "https://10.0.0.1:8443",
            &format!("{{ ca_cert: {ca}, server_name: api.test }}"),
        ),
        (
            "https://10.0.0.2:8443",
            &format!("{{ ca_cert: {ca}, server_name: api.test }}"),
        ),
        (
            "https://10.0.0.3:8443",
            &format!("{{ ca_cert: {ca}, server_name: other.test }}"),
        ),
        ("http://10.0.0.4:8000", ""),
    ]);
    let t = load(&c).unwrap();
    assert_eq!(t.len(), 4);
    let (a, b, o) = (
        t[0].as_ref().unwrap(),
        t[1].as_ref().unwrap(),
        t[2].as_ref().unwrap(),
    );
    assert!(t[3].is_none(), "http backends have no context");
    assert!(Arc::ptr_eq(&a.config, &b.config));
    assert_eq!(a.id, b.id);
    assert_ne!(a.id, o.id, "another server name is another trust");
    assert_eq!(a.server_name.to_str(), "api.test");
    assert_eq!(a.config.alpn_protocols, vec![b"http/1.1".to_vec()]);
}

#[test]
fn the_server_name_defaults_to_the_url_host_and_ids_survive_a_reload_of_the_same_file() {
    let ca = write("stable.pem", &ca_pem("stable"));
    let c = config(&[("https://127.0.0.1:9443", &format!("{{ ca_cert: {ca} }}"))]);
    let first = load(&c).unwrap();
    let again = load(&c).unwrap();
    let (f, g) = (first[0].as_ref().unwrap(), again[0].as_ref().unwrap());
    assert_eq!(f.server_name.to_str(), "127.0.0.1");
    assert_eq!(f.id, g.id, "same anchors and name, same id");
    // A rotated CA file behind the same path is another trust.
    std::fs::write(&ca, ca_pem("rotated")).unwrap();
    let rotated = load(&c).unwrap();
    assert_ne!(rotated[0].as_ref().unwrap().id, f.id);
}

#[test]
fn unusable_anchors_are_refused_with_field_value_and_reason() {
    let missing = dir().join("nope.pem").to_string_lossy().into_owned();
    let empty = write("empty.pem", "# no certificates here\n");
    let garbage = write(
        "garbage.pem",
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    );
    let huge = dir().join("huge.pem");
    std::fs::write(&huge, vec![b'#'; usize::try_from(MAX_CA_FILE).unwrap() + 1]).unwrap();
    let huge = huge.to_string_lossy().into_owned();
    let good = write("good.pem", &ca_pem("good"));
    let c = config(&[
        ("https://10.0.0.1", &format!("{{ ca_cert: {missing} }}")),
        ("https://10.0.0.2", &format!("{{ ca_cert: {empty} }}")),
        ("https://10.0.0.3", &format!("{{ ca_cert: {garbage} }}")),
        ("https://10.0.0.4", &format!("{{ ca_cert: {huge} }}")),
        ("https://10.0.0.5", &format!("{{ ca_cert: {good} }}")),
    ]);
    let errors = load(&c).unwrap_err();
    let got: Vec<(&str, &str)> = errors
        .iter()
        .map(|e| (e.field.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("backends[0].tls.ca_cert", missing.as_str()),
            ("backends[1].tls.ca_cert", empty.as_str()),
            ("backends[2].tls.ca_cert", garbage.as_str()),
            ("backends[3].tls.ca_cert", huge.as_str()),
        ],
        "{errors:?}"
    );
    assert!(
        errors[0].reason.starts_with("cannot open"),
        "{}",
        errors[0].reason
    );
    assert!(
        errors[1].reason.contains("no PEM certificate"),
        "{}",
        errors[1].reason
    );
    assert!(
        errors[2].reason.contains("trust anchor"),
        "a PEM block that is not a certificate: {}",
        errors[2].reason
    );
    assert!(errors[3].reason.contains("at most"), "{}", errors[3].reason);
}
