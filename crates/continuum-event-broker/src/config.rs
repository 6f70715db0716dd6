//! The broker's `--config` file: a serde user layer converted into a validated [`BrokerConfig`],
//! every problem reported as field, value and reason (as the router's `config validate` does).
//!
//! ```yaml
//! id: broker-a.dynamo                 # its `brokers[]` entry at the router
//! router:
//!   address: router.example:7443      # the router's event bus listener
//!   server_name: router.example       # default: the address's host
//!   ca_file: /etc/continuum/router-ca.pem
//!   token_file: /var/run/secrets/continuum/token   # or $CONTINUUM_BROKER_TOKEN, or:
//!   client_cert_file: /etc/continuum/broker.pem
//!   client_key_file: /etc/continuum/broker-key.pem
//! discovery:                          # the router's `dynamo.discovery`, same schema and rules
//!   source: kubernetes
//!   kubernetes: { namespace: dynamo-system, dynamo_namespaces: [dynamo] }
//! metrics_listen: 0.0.0.0:9464        # /metrics and /healthz (optional)
//! ```
//!
//! Invariants: the discovery section goes through the router's own parser and rules (so what
//! validates there validates here); the declared namespaces are the discovery's effective list;
//! TLS to the router is mandatory (there is no plaintext mode to fall into); the token never
//! comes from the command line and is never printed.

use std::net::SocketAddr;
use std::path::PathBuf;

use continuum_core::config::dynamo::DiscoveryConfig;
use continuum_core::config::{EnvLookup, FieldError, Warning};
use serde::Deserialize;

/// The environment variable a token may come from instead of `router.token_file`.
pub const TOKEN_ENV: &str = "CONTINUUM_BROKER_TOKEN";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserConfig {
    id: Option<String>,
    router: Option<UserRouter>,
    discovery: Option<serde_yaml_ng::Value>,
    metrics_listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserRouter {
    address: Option<String>,
    server_name: Option<String>,
    ca_file: Option<String>,
    token_file: Option<String>,
    client_cert_file: Option<String>,
    client_key_file: Option<String>,
}

/// How the broker proves who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bearer token (read from `router.token_file` or [`TOKEN_ENV`]).
    Token(String),
    /// A client certificate whose DNS SAN is the broker's id.
    Certificate {
        /// PEM chain.
        cert_file: PathBuf,
        /// PEM key.
        key_file: PathBuf,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Token(_) => f.write_str("Token(***)"),
            Credential::Certificate { cert_file, .. } => {
                write!(f, "Certificate({})", cert_file.display())
            }
        }
    }
}

/// A validated broker config.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The broker's id.
    pub id: String,
    /// The router's listener, as written (`host:port`).
    pub address: String,
    /// The name the router's certificate must carry.
    pub server_name: String,
    /// The CA that signed the router's certificate.
    pub ca_file: PathBuf,
    /// The credential.
    pub credential: Credential,
    /// The discovery to run (the router's section, validated by the router's rules).
    pub discovery: DiscoveryConfig,
    /// The declared namespaces: the discovery's effective list.
    pub namespaces: Vec<String>,
    /// Where `/metrics` and `/healthz` are served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
}

fn err(field: &str, value: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_owned(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// Parses and validates `text`; `read_token` reads a token file (injected: tests need no files).
/// Every error found, never only the first.
pub fn parse(
    text: &str,
    env: &dyn EnvLookup,
    read_token: &dyn Fn(&str) -> std::io::Result<String>,
) -> Result<(BrokerConfig, Vec<Warning>), Vec<FieldError>> {
    let user: UserConfig = match serde_yaml_ng::from_str::<Option<UserConfig>>(text) {
        Ok(u) => u.unwrap_or_default(),
        Err(e) => return Err(vec![err("(document)", "", e.to_string())]),
    };
    let mut errors = Vec::new();
    let id = match user.id {
        Some(id) if continuum_event_bus::message::is_dns_name(&id) => id,
        Some(id) => {
            errors.push(err(
                "id",
                id,
                "must be a DNS name (the router's brokers[].id)",
            ));
            String::new()
        }
        None => {
            errors.push(err("id", "", "required"));
            String::new()
        }
    };
    let router = user.router.unwrap_or_default();
    let address = match router.address.clone() {
        Some(a) => match a.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => a,
            _ => {
                errors.push(err("router.address", a, "must be host:port"));
                String::new()
            }
        },
        None => {
            errors.push(err("router.address", "", "required"));
            String::new()
        }
    };
    let server_name = router.server_name.clone().unwrap_or_else(|| {
        address
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_owned())
            .unwrap_or_default()
    });
    let ca_file = match router.ca_file.clone() {
        Some(f) if f.starts_with('/') => PathBuf::from(f),
        Some(f) => {
            errors.push(err("router.ca_file", f, "must be an absolute path"));
            PathBuf::new()
        }
        None => {
            errors.push(err(
                "router.ca_file",
                "",
                "required: the broker speaks only TLS to the router",
            ));
            PathBuf::new()
        }
    };
    let credential = credential(&router, env, read_token, &mut errors);
    let metrics_listen = match user.metrics_listen {
        Some(m) => match m.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errors.push(err("metrics_listen", m, "must be ip:port"));
                None
            }
        },
        None => None,
    };
    let discovery = discovery(user.discovery, env, &mut errors);
    match (discovery, credential) {
        (Some((discovery, warnings)), Some(credential)) if errors.is_empty() => {
            let namespaces = discovery.namespaces().to_vec();
            Ok((
                BrokerConfig {
                    id,
                    address,
                    server_name,
                    ca_file,
                    credential,
                    discovery,
                    namespaces,
                    metrics_listen,
                },
                warnings,
            ))
        }
        _ => Err(errors),
    }
}

fn credential(
    router: &UserRouter,
    env: &dyn EnvLookup,
    read_token: &dyn Fn(&str) -> std::io::Result<String>,
    errors: &mut Vec<FieldError>,
) -> Option<Credential> {
    let env_token = env.var(TOKEN_ENV).filter(|t| !t.trim().is_empty());
    let cert = (&router.client_cert_file, &router.client_key_file);
    match (&router.token_file, env_token, cert) {
        (Some(_), Some(_), _) => {
            errors.push(err(
                "router.token_file",
                "(set)",
                format!("give the token once: the file or ${TOKEN_ENV}, not both"),
            ));
            None
        }
        (Some(file), None, _) => match read_token(file) {
            Ok(t) if !t.trim().is_empty() => Some(Credential::Token(t.trim().to_owned())),
            Ok(_) => {
                errors.push(err("router.token_file", file.clone(), "the file is empty"));
                None
            }
            Err(e) => {
                errors.push(err("router.token_file", file.clone(), e.to_string()));
                None
            }
        },
        (None, Some(t), _) => Some(Credential::Token(t.trim().to_owned())),
        (None, None, (Some(c), Some(k))) => Some(Credential::Certificate {
            cert_file: PathBuf::from(c),
            key_file: PathBuf::from(k),
        }),
        (None, None, (Some(_), None)) => {
            errors.push(err(
                "router.client_key_file",
                "",
                "required with client_cert_file",
            ));
            None
        }
        (None, None, (None, Some(_))) => {
            errors.push(err(
                "router.client_cert_file",
                "",
                "required with client_key_file",
            ));
            None
        }
        (None, None, (None, None)) => {
            errors.push(err(
                "router.token_file",
                "",
                format!(
                    "no credential: a token file, ${TOKEN_ENV}, or client_cert_file and \
                     client_key_file"
                ),
            ));
            None
        }
    }
}

/// The discovery section through the router's parser and rules
/// (`DiscoveryConfig::from_yaml`); its field paths come back under `discovery.`.
fn discovery(
    section: Option<serde_yaml_ng::Value>,
    env: &dyn EnvLookup,
    errors: &mut Vec<FieldError>,
) -> Option<(DiscoveryConfig, Vec<Warning>)> {
    let Some(section) = section else {
        errors.push(err("discovery", "", "required"));
        return None;
    };
    let text = match serde_yaml_ng::to_string(&section) {
        Ok(t) => t,
        Err(e) => {
            errors.push(err("discovery", "", e.to_string()));
            return None;
        }
    };
    let under = |f: &str| format!("discovery.{f}");
    match DiscoveryConfig::from_yaml(&text, env) {
        Ok((d, warnings)) => Some((
            d,
            warnings
                .into_iter()
                .map(|mut w| {
                    w.field = under(&w.field);
                    w
                })
                .collect(),
        )),
        Err(e) => {
            errors.extend(e.errors.into_iter().map(|mut f| {
                f.field = under(&f.field);
                f
            }));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Env(Vec<(&'static str, &'static str)>);

    impl EnvLookup for Env {
        fn var(&self, name: &str) -> Option<String> {
            self.0
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn tokens(path: &str) -> std::io::Result<String> {
        match path {
            "/run/token" => Ok("s3cret\n".into()),
            "/run/empty" => Ok("  \n".into()),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file",
            )),
        }
    }

    const GOOD: &str = "
id: broker-a.dynamo
router:
  address: router.example:7443
  ca_file: /etc/ca.pem
  token_file: /run/token
discovery:
  source: file
  file: { root: /var/dynamo, namespaces: [dynamo, other] }
metrics_listen: 127.0.0.1:9464
";

    fn fields(r: Result<(BrokerConfig, Vec<Warning>), Vec<FieldError>>) -> Vec<String> {
        r.err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn a_good_config_declares_the_discovery_namespaces_and_reads_the_token() {
        let (c, warnings) = parse(GOOD, &Env(vec![]), &tokens).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(c.id, "broker-a.dynamo");
        assert_eq!(
            c.server_name, "router.example",
            "the address's host by default"
        );
        assert_eq!(c.namespaces, ["dynamo", "other"]);
        assert_eq!(c.credential, Credential::Token("s3cret".into()));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.discovery.file.root.as_deref(), Some("/var/dynamo"));
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the token is never printed"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_field() {
        let bad = "
id: not a name
router:
  address: no-port
  ca_file: relative.pem
discovery:
  source: bogus
metrics_listen: nowhere
";
        let got = fields(parse(bad, &Env(vec![]), &tokens));
        for f in [
            "id",
            "router.address",
            "router.ca_file",
            "router.token_file",
            "metrics_listen",
            "discovery.source",
        ] {
            assert!(got.iter().any(|g| g == f), "{f} missing from {got:?}");
        }
        assert!(
            got.iter()
                .all(|g| !g.starts_with("dynamo.") && !g.contains("discovery.discovery")),
            "discovery paths are the broker's: {got:?}"
        );
    }

    #[test]
    fn tls_to_the_router_and_a_credential_are_required() {
        let bare = "
id: b.dynamo
router: { address: r:1 }
discovery: { source: file, file: { root: /d } }
";
        let got = fields(parse(bare, &Env(vec![]), &tokens));
        assert!(got.contains(&"router.ca_file".to_owned()), "{got:?}");
        assert!(got.contains(&"router.token_file".to_owned()), "{got:?}");
    }

    #[test]
    fn the_token_comes_from_one_place() {
        let env_only = GOOD.replace("  token_file: /run/token\n", "");
        let env = Env(vec![(TOKEN_ENV, "from-env")]);
        let (c, _) = parse(&env_only, &env, &tokens).unwrap();
        assert_eq!(c.credential, Credential::Token("from-env".into()));
        // Both: refused rather than guessed.
        assert_eq!(fields(parse(GOOD, &env, &tokens)), ["router.token_file"]);
        // An empty or unreadable file.
        for file in ["/run/empty", "/run/missing"] {
            let t = GOOD.replace("/run/token", file);
            assert_eq!(
                fields(parse(&t, &Env(vec![]), &tokens)),
                ["router.token_file"]
            );
        }
        // A client certificate instead needs its key.
        let cert = env_only.replace(
            "  ca_file: /etc/ca.pem\n",
            "  ca_file: /etc/ca.pem\n  client_cert_file: /etc/b.pem\n",
        );
        assert_eq!(
            fields(parse(&cert, &Env(vec![]), &tokens)),
            ["router.client_key_file"]
        );
        let both = cert.replace(
            "client_cert_file: /etc/b.pem\n",
            "client_cert_file: /etc/b.pem\n  client_key_file: /etc/b-key.pem\n",
        );
        let (c, _) = parse(&both, &Env(vec![]), &tokens).unwrap();
        assert!(matches!(c.credential, Credential::Certificate { .. }));
    }

    #[test]
    fn unknown_fields_are_errors() {
        let typo = GOOD.replace("metrics_listen", "metrics_lisen");
        assert_eq!(fields(parse(&typo, &Env(vec![]), &tokens)), ["(document)"]);
    }
}
