//! Fuzz the Kubernetes list and watch parsers (`discovery::kube_wire`) and the Pod reader
//! (`discovery::pods::pod_facts`): bytes an API server (or anything posing as one) sends.
//!
//! Asserts, for every input: no panic; a parsed page's tokens and a bookmark's version are
//! within `MAX_TOKEN`; a status message is within 512 bytes; every object a page or event
//! carries goes through `pod_facts` without panicking, and a Pod it accepts has a non-empty name
//! within `MAX_NAME`.
#![no_main]

use continuum_core::discovery::kube_wire::{
    MAX_TOKEN, WatchEvent, parse_list_page, parse_watch_line,
};
use continuum_core::discovery::pods::{MAX_NAME, pod_facts};
use libfuzzer_sys::fuzz_target;

fn check_pod(v: &serde_json::Value) {
    if let Ok(p) = pod_facts(v) {
        assert!(!p.name.is_empty() && p.name.len() <= MAX_NAME);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(page) = parse_list_page(data) {
        assert!(page.resource_version.len() <= MAX_TOKEN);
        assert!(page.continue_token.as_ref().is_none_or(|t| t.len() <= MAX_TOKEN));
        page.items.iter().for_each(check_pod);
    }
    match parse_watch_line(data) {
        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => check_pod(&o),
        Ok(WatchEvent::Bookmark { resource_version }) => {
            assert!(resource_version.len() <= MAX_TOKEN);
        }
        Ok(WatchEvent::Error(s)) => assert!(s.message.len() <= 512 && s.reason.len() <= 512),
        Err(_) => {}
    }
});
