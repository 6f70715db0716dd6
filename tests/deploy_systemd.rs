//! The router node's systemd unit (`deploy/systemd/continuum-router.service`): `systemd-analyze
//! verify` accepts it with the binary under test in place of `/usr/local/bin`, warning about
//! nothing; `systemd-analyze security` rates its exposure low; and its `CPUAffinity` is exactly
//! the CPUs of the router config its comment pairs it with, a config that validates.
#![allow(clippy::disallowed_methods)] // end-to-end tests run real processes
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::router::router_bin;
use common::{CliOutput, TempDir, run_bounded, run_cli};

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/systemd/continuum-router.service"
);

/// The unit with the binary under test where it installs the release binary.
fn unit_here(dir: &TempDir) -> std::path::PathBuf {
    let text = std::fs::read_to_string(UNIT).unwrap();
    assert!(text.contains("/usr/local/bin/continuum-router"));
    dir.write(
        "continuum-router.service",
        &text.replace("/usr/local/bin/continuum-router", router_bin()),
    )
}

fn analyze(args: &[&str]) -> CliOutput {
    let mut cmd = Command::new("systemd-analyze");
    cmd.args(args);
    run_bounded(cmd, Duration::from_secs(60))
}

#[test]
fn systemd_analyze_verifies_the_unit_without_a_warning() {
    let dir = TempDir::new("systemd");
    let unit = unit_here(&dir);
    let out = analyze(&["verify", unit.to_str().unwrap()]);
    assert!(out.ok(), "{}", out.stderr);
    assert!(out.stderr.trim().is_empty(), "warnings: {}", out.stderr);

    // The check itself catches what it is here for: an unknown key.
    let typo = dir.write(
        "typo.service",
        &std::fs::read_to_string(&unit)
            .unwrap()
            .replace("ProtectSystem=", "ProtectSystm="),
    );
    let out = analyze(&["verify", typo.to_str().unwrap()]);
    assert!(out.stderr.contains("Unknown key"), "{out:?}");
}

#[test]
fn the_units_exposure_is_low() {
    let dir = TempDir::new("systemd");
    let unit = unit_here(&dir);
    let out = analyze(&["security", "--offline=true", unit.to_str().unwrap()]);
    let text = &out.stdout;
    let level: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for continuum-router.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    assert!(
        level <= 2.0,
        "exposure {level} (systemd rates <= 2 OK):\n{text}"
    );
}

/// CPUs of a systemd/taskset list such as `1-5` or `1,3,8-9`.
fn cpu_list(text: &str) -> BTreeSet<u32> {
    let mut cpus = BTreeSet::new();
    for part in text.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => {
                cpus.insert(part.parse::<u32>().unwrap());
            }
        }
    }
    cpus
}

#[test]
fn the_cpu_affinity_is_the_configs_shard_and_control_cpus() {
    let text = std::fs::read_to_string(UNIT).unwrap();
    let affinity = text
        .lines()
        .find_map(|l| l.strip_prefix("CPUAffinity="))
        .expect("CPUAffinity=");
    // The config the comment pairs with the unit.
    let server = text
        .lines()
        .find_map(|l| l.trim_start_matches('#').trim().strip_prefix("server: "))
        .expect("the comment's server section");
    let dir = TempDir::new("systemd");
    let path = dir.write("router.yaml", &format!("server: {server}\nbackends: []\n"));
    let out = run_cli(&["config", "validate", "--config", path.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let shown = run_cli(&["config", "show", "--config", path.to_str().unwrap()]);
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&shown.stdout).unwrap();
    let mut want: BTreeSet<u32> = yaml["server"]["cpu_affinity"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| u32::try_from(c.as_u64().unwrap()).unwrap())
        .collect();
    want.insert(u32::try_from(yaml["server"]["control_cpu"].as_u64().unwrap()).unwrap());
    assert_eq!(
        cpu_list(affinity),
        want,
        "CPUAffinity={affinity} vs {server}"
    );
}
