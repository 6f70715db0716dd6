//! Fuzz the Kubernetes list and watch parsers (`discovery::kube_wire`, parsed and raw), the Pod
//! reader (`discovery::pods::pod_facts`) and the metadata source's readers and join
//! (`discovery::meta`): bytes an API server (or anything posing as one) sends.
//!
//! Asserts, for every input: no panic; a parsed page's tokens and a bookmark's version are
//! within `MAX_TOKEN`; a status message is within 512 bytes; every object a page or event
//! carries goes through `pod_facts`, `slice_facts` and `read_resource` without panicking; a Pod
//! or resource they accept has a non-empty name within `MAX_NAME`; an accepted resource holds at
//! most `MAX_ENTRIES_PER_RESOURCE` records with bounded keys, in key order; and the join, fed
//! every object, supplies no key twice and only keys some held resource gave it.
#![no_main]

use continuum_core::discovery::kube_wire::{
    MAX_TOKEN, WatchEvent, parse_list_page, parse_list_page_raw, parse_watch_line,
    parse_watch_line_raw,
};
use continuum_core::discovery::meta::{
    Body, MAX_ENTRIES_PER_RESOURCE, MAX_KEY_BYTES, MetaJoin, NamespaceFilter, read_resource,
    slice_facts,
};
use continuum_core::discovery::pods::{MAX_NAME, pod_facts};
use libfuzzer_sys::fuzz_target;

fn check_pod(v: &serde_json::Value, join: &mut MetaJoin) {
    if let Ok(p) = pod_facts(v) {
        assert!(!p.name.is_empty() && p.name.len() <= MAX_NAME);
    }
    if let Ok(s) = slice_facts(v) {
        assert!(!s.name.is_empty() && s.name.len() <= MAX_NAME);
        let _ = join.upsert_slice(s);
    }
}

fn check_resource(text: &str, filter: &NamespaceFilter, join: &mut MetaJoin) {
    let Ok(r) = read_resource(text, filter) else {
        return;
    };
    assert!(!r.name.is_empty() && r.name.len() <= MAX_NAME);
    if let Body::Valid(recs) = &r.body {
        assert!(recs.len() <= MAX_ENTRIES_PER_RESOURCE);
        assert!(recs.iter().all(|x| x.key.len() <= MAX_KEY_BYTES + 20));
        assert!(recs.windows(2).all(|w| w[0].key < w[1].key));
    }
    let _ = join.upsert(r);
}

fuzz_target!(|data: &[u8]| {
    let filter = NamespaceFilter::new(&["dyn".to_owned()]);
    let mut join = MetaJoin::new();
    if let Ok(page) = parse_list_page(data) {
        assert!(page.resource_version.len() <= MAX_TOKEN);
        assert!(page.continue_token.as_ref().is_none_or(|t| t.len() <= MAX_TOKEN));
        page.items.iter().for_each(|v| check_pod(v, &mut join));
    }
    if let Ok(page) = parse_list_page_raw(data) {
        assert!(page.resource_version.len() <= MAX_TOKEN);
        for item in &page.items {
            assert!(item.get().starts_with('{'));
            check_resource(item.get(), &filter, &mut join);
        }
    }
    match parse_watch_line(data) {
        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
            check_pod(&o, &mut join);
        }
        Ok(WatchEvent::Bookmark { resource_version }) => {
            assert!(resource_version.len() <= MAX_TOKEN);
        }
        Ok(WatchEvent::Error(s)) => assert!(s.message.len() <= 512 && s.reason.len() <= 512),
        Err(_) => {}
    }
    if let Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) = parse_watch_line_raw(data) {
        check_resource(o.get(), &filter, &mut join);
    }
    let state = join.state();
    assert!(state.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(state.len(), join.keys());
});
