//! What the benches that run rows on fresh real fleets with the KV router share (`kv-route`,
//! `aiperf`): where the fleet and the router come from ([`KvFleet`], its options parsed by
//! [`KvFleet::flag`]), their resolution before any row runs ([`KvFleet::resolve`]) and the
//! rounds loop ([`run_rounds`]) that keeps a failed row from stopping the others.
//!
//! Invariants: a missing python or fleet script stops the bench before any row; a missing router
//! binary only removes the router rows (the reason is printed and reported); an interrupt stops
//! the rounds at once.

use std::path::{Path, PathBuf};

use crate::child;
use crate::error::BenchError;
use crate::fleet_hop::FleetError;
use crate::fleet_hop::default_python;
use crate::usage::UsageError;

/// The artifacts the router must load before it picks by KV.
const PINNED_FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];

/// `blake3:<hex>` of each pinned artifact of the model in `model_dir`.
pub(crate) fn digests(model_dir: &Path) -> Result<Vec<String>, BenchError> {
    PINNED_FILES
        .iter()
        .map(|f| {
            let p = model_dir.join(f);
            let bytes =
                std::fs::read(&p).map_err(BenchError::io(format!("reading {}", p.display())))?;
            Ok(format!("blake3:{}", blake3::hash(&bytes).to_hex()))
        })
        .collect()
}

/// Where a fleet bench's fleet and KV router come from.
#[derive(Debug, Clone)]
pub(crate) struct KvFleet {
    /// Router binary; `None` means next to the current executable.
    pub(crate) router_bin: Option<PathBuf>,
    /// The fleet venv's python; `None` as `fleet-hop`.
    pub(crate) python: Option<PathBuf>,
    /// `tests/fleet/fleet.py`.
    pub(crate) fleet_script: PathBuf,
    /// The model directory whose tokenizer artifacts the router pins.
    pub(crate) model_dir: PathBuf,
    /// Seconds the fleet, then the router, may take to be ready.
    pub(crate) ready_timeout_secs: u64,
}

impl Default for KvFleet {
    fn default() -> Self {
        Self {
            router_bin: None,
            python: None,
            fleet_script: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/fleet/fleet.py"
            )),
            model_dir: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/fixtures/tiny-model"
            )),
            ready_timeout_secs: 60,
        }
    }
}

/// A [`KvFleet`] checked before the rows run.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The fleet venv's python.
    pub(crate) python: PathBuf,
    /// The router binary and the pinned artifacts' digests, or why the router rows cannot run.
    pub(crate) router: Result<(PathBuf, Vec<String>), String>,
}

impl KvFleet {
    /// Applies one of the shared flags (`--router-bin`, `--python`, `--fleet-script`,
    /// `--model-dir`, `--ready-timeout`); `Ok(false)` when `flag` is not one of them.
    pub(crate) fn flag(
        &mut self,
        flag: &str,
        value: impl FnOnce() -> Result<String, UsageError>,
        seconds: impl FnOnce(&str, String) -> Result<u64, UsageError>,
    ) -> Result<bool, UsageError> {
        match flag {
            "--router-bin" => self.router_bin = Some(PathBuf::from(value()?)),
            "--python" => self.python = Some(PathBuf::from(value()?)),
            "--fleet-script" => self.fleet_script = PathBuf::from(value()?),
            "--model-dir" => self.model_dir = PathBuf::from(value()?),
            "--ready-timeout" => self.ready_timeout_secs = seconds(flag, value()?)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the python and the fleet script, and finds the router and its digests (a missing
    /// router is printed and kept as the reason, not an error).
    pub(crate) fn resolve(&self) -> Result<Resolved, BenchError> {
        let python = self.python.clone().unwrap_or_else(default_python);
        if !python.is_file() {
            return Err(FleetError::NoPython(python).into());
        }
        if !self.fleet_script.is_file() {
            return Err(FleetError::NoScript(self.fleet_script.clone()).into());
        }
        let bin = child::sibling_or(self.router_bin.as_deref(), "continuum-router")?;
        let router = if bin.is_file() {
            digests(&self.model_dir)
                .map(|d| (bin, d))
                .map_err(|e| e.to_string())
        } else {
            Err(format!(
                "{} not found; run `cargo build --release -p continuum-router --features dynamo-kv`",
                bin.display()
            ))
        };
        if let Err(why) = &router {
            eprintln!("router: {why}. Reporting the other rows only.");
        }
        Ok(Resolved { python, router })
    }
}

/// What [`run_rounds`] ran, and per failed kind the first line of why.
pub(crate) type Rounds<K, R> = (Vec<R>, Vec<(K, String)>);

/// Runs `row(kind, round)` for every round and every kind of `order(round)`, skipping a kind
/// once it failed; returns what ran and, per failed kind, the first line of why.
pub(crate) fn run_rounds<K: Copy + PartialEq, R>(
    bench: &str,
    rounds: u32,
    order: impl Fn(u32) -> Vec<K>,
    label: impl Fn(K) -> &'static str,
    mut row: impl FnMut(K, u32) -> Result<R, BenchError>,
) -> Result<Rounds<K, R>, BenchError> {
    let mut done = Vec::new();
    let mut missing: Vec<(K, String)> = Vec::new();
    for round in 1..=rounds {
        for kind in order(round) {
            if missing.iter().any(|(k, _)| *k == kind) {
                continue;
            }
            eprintln!("{bench}: round {round}: {} ...", label(kind));
            match row(kind, round) {
                Ok(r) => done.push(r),
                Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                Err(e) => {
                    eprintln!("{bench}: {} failed: {e}", label(kind));
                    let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                    missing.push((kind, first));
                }
            }
        }
    }
    Ok((done, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_kind_is_skipped_in_later_rounds_and_reported_once() {
        let mut calls = Vec::new();
        let (done, missing) = run_rounds(
            "t",
            3,
            |round| {
                if round % 2 == 0 {
                    vec![2, 1]
                } else {
                    vec![1, 2]
                }
            },
            |k| if k == 1 { "one" } else { "two" },
            |k, round| {
                calls.push((k, round));
                if k == 2 && round == 2 {
                    Err(BenchError::Setup("boom\nmore".into()))
                } else {
                    Ok(k * 10 + round)
                }
            },
        )
        .unwrap();
        assert_eq!(calls, [(1, 1), (2, 1), (2, 2), (1, 2), (1, 3)]);
        assert_eq!(done, [11, 21, 12, 13]);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].0, 2);
        assert!(missing[0].1.contains("boom") && !missing[0].1.contains("more"));
    }

    #[test]
    fn the_shared_flags() {
        let mut f = KvFleet::default();
        let secs = |_: &str, v: String| v.parse::<u64>().map_err(|_| UsageError::MissingCommand);
        assert!(f.flag("--python", || Ok("/p".into()), secs).unwrap());
        assert!(f.flag("--ready-timeout", || Ok("7".into()), secs).unwrap());
        assert!(!f.flag("--workers", || Ok("2".into()), secs).unwrap());
        assert_eq!(f.python, Some(PathBuf::from("/p")));
        assert_eq!(f.ready_timeout_secs, 7);
        assert!(f.fleet_script.ends_with("tests/fleet/fleet.py"));
    }
}
