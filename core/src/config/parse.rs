//! YAML text → user model → validated [`Config`]: the orchestration behind
//! [`Config::from_yaml`].
//!
//! Policy:
//! - a YAML syntax or shape error (e.g. a list where a map belongs) aborts with exactly one
//!   [`FieldError`], whose field is serde's path when it gives one, else `<document>`;
//! - every unknown key anywhere is an error with its full dotted path (`backends[1].wieght`);
//!   all of them are reported, alongside every conversion and validation error;
//! - the config is returned only when no error was found; warnings travel either way.

use serde::Deserialize;

use super::user::UserConfig;
use super::values::Ctx;
use super::{Config, ConfigErrors, EnvLookup, FieldError, Warning};

/// Field name used for errors that serde could not attach to a path.
const DOCUMENT: &str = "<document>";

pub(super) fn from_yaml(
    text: &str,
    env: &dyn EnvLookup,
) -> Result<(Config, Vec<Warning>), ConfigErrors> {
    let mut unknown = Vec::new();
    let user = match parse_user(text, &mut unknown) {
        Ok(u) => u,
        Err(e) => {
            return Err(ConfigErrors {
                errors: vec![e],
                warnings: Vec::new(),
            });
        }
    };
    let mut ctx = Ctx::new(env);
    for path in unknown {
        let key = path.rsplit(['.', '[']).next().unwrap_or(&path).to_owned();
        ctx.error(&path, key, "unknown key");
    }
    let config = super::validate::convert(&mut ctx, &user);
    if ctx.errors.is_empty() {
        Ok((config, ctx.warnings))
    } else {
        Err(ConfigErrors {
            errors: ctx.errors,
            warnings: ctx.warnings,
        })
    }
}

/// `dynamo.discovery` on its own, for a program that embeds the router's discovery (the event
/// broker): the router's parser and rules for that section as if `dynamo.enabled` were true.
/// Paths are relative to the section (`source`, `file.root`, ...).
pub(super) fn discovery_from_yaml(
    text: &str,
    env: &dyn EnvLookup,
) -> Result<(super::dynamo::DiscoveryConfig, Vec<Warning>), ConfigErrors> {
    const PREFIX: &str = "dynamo.discovery.";
    let mut unknown = Vec::new();
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let mut cb = |path: serde_ignored::Path<'_>| unknown.push(dotted(&path));
    let user = match super::user_dynamo::UserDiscovery::deserialize(
        serde_ignored::Deserializer::new(de, &mut cb),
    ) {
        Ok(u) => u,
        Err(e) => {
            return Err(ConfigErrors {
                errors: vec![yaml_error(&e)],
                warnings: Vec::new(),
            });
        }
    };
    let mut ctx = Ctx::new(env);
    for path in unknown {
        let key = path.rsplit(['.', '[']).next().unwrap_or(&path).to_owned();
        ctx.error(&format!("{PREFIX}{path}"), key, "unknown key");
    }
    let discovery = super::convert_dynamo::discovery(&mut ctx, Some(&user), true);
    let strip = |f: &mut String| {
        if let Some(rest) = f.strip_prefix(PREFIX) {
            *f = rest.to_owned();
        }
    };
    let mut warnings = ctx.warnings;
    warnings.iter_mut().for_each(|w| strip(&mut w.field));
    if ctx.errors.is_empty() {
        Ok((discovery, warnings))
    } else {
        let mut errors = ctx.errors;
        errors.iter_mut().for_each(|e| strip(&mut e.field));
        Err(ConfigErrors { errors, warnings })
    }
}

/// Deserialize the user model, collecting unknown-key paths.
fn parse_user(text: &str, unknown: &mut Vec<String>) -> Result<UserConfig, FieldError> {
    // An empty document (or only comments) is the all-defaults config.
    match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
        Ok(serde_yaml_ng::Value::Null) => return Ok(UserConfig::default()),
        Ok(_) => {}
        Err(e) => return Err(yaml_error(&e)),
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let mut cb = |path: serde_ignored::Path<'_>| unknown.push(dotted(&path));
    UserConfig::deserialize(serde_ignored::Deserializer::new(de, &mut cb))
        .map_err(|e| yaml_error(&e))
}

/// One [`FieldError`] from a serde_yaml_ng error: `path: message at line L column C`.
fn yaml_error(e: &serde_yaml_ng::Error) -> FieldError {
    let full = e.to_string();
    let location = e
        .location()
        .map(|l| format!("line {} column {}", l.line(), l.column()))
        .unwrap_or_default();
    // serde_yaml_ng prefixes path-carrying messages with `path: `; a path has no spaces.
    let (field, rest) = match full.split_once(": ") {
        Some((p, rest)) if !p.contains(' ') && !p.is_empty() => (p.to_owned(), rest.to_owned()),
        _ => (DOCUMENT.to_owned(), full.clone()),
    };
    let reason = match rest.find(" at line ") {
        Some(i) => rest[..i].to_owned(),
        None => rest,
    };
    FieldError {
        field,
        value: location,
        reason: format!("invalid YAML: {reason}"),
    }
}

/// Render a serde_ignored path as `a.b[2].c`.
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        Path::Map { parent, key } => {
            let p = dotted(parent);
            if p.is_empty() {
                key.clone()
            } else {
                format!("{p}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => dotted(parent),
    }
}

pub(super) fn show_yaml(c: &Config) -> String {
    super::show::to_yaml(c)
}

pub(super) fn show_json(c: &Config) -> serde_json::Value {
    super::show::to_json(c)
}
