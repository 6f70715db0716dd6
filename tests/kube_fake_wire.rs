//! The fake Kubernetes API server (`tests/k8s/fake_apiserver.py`) on the wire, with `curl`:
//! what kubectl never shows (`tests/kube_fake.rs` drives it with kubectl). HTTP 410 with an
//! `Expired` status, an early EOF without the last chunk, a stall after the headers, clean ends
//! after `timeoutSeconds`, ERROR events, bookmarks, the bounded history and list encoding.

#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::STEP;
use common::kube::{FakeApiServer, NAMESPACE, PODS, curl, is_status, parse, put_worker, rv};
use serde_json::{Value, json};

/// The JSON lines of a watch body.
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse)
        .collect()
}

const WATCH: &str = "/api/v1/namespaces/dynamo/pods?watch=1";

fn two_pods(api: &FakeApiServer) {
    put_worker(api, "w-0", "solar", None, true);
    put_worker(api, "w-1", "solar", None, true);
}

#[test]
fn a_gone_fault_answers_the_watch_with_http_410_and_an_expired_status() {
    let api = FakeApiServer::start();
    two_pods(&api);
    api.fault(PODS, "gone", 0, 1);
    let (code, out, err) = curl(&api, &format!("{WATCH}&resourceVersion=2"), &["-i"], 10);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("HTTP/1.1 410"), "{out}");
    let st = parse(out.split("\r\n\r\n").nth(1).unwrap());
    assert!(is_status(&st, "Expired", 410), "{st}");
    // One watch only: the next one streams (the initial ADDED events, then until --max-time).
    let (code, out, _) = curl(&api, WATCH, &[], 1);
    assert_eq!(code, Some(28), "still streaming when curl gave up");
    let evs = events(&out);
    assert_eq!(evs.len(), 2, "{out}");
    assert!(
        evs.iter()
            .all(|e| e["type"] == "ADDED" && e["object"]["kind"] == "Pod"),
        "{out}"
    );
}

#[test]
fn an_eof_fault_sends_the_initial_events_then_closes_without_the_last_chunk() {
    let api = FakeApiServer::start();
    two_pods(&api);
    api.fault(PODS, "eof", 0, 1);
    let (code, out, err) = curl(&api, WATCH, &[], 10);
    assert!(
        matches!(code, Some(18 | 56)),
        "a transfer error, got {code:?}: {err}"
    );
    let evs = events(&out);
    assert_eq!(evs.len(), 2, "{out}");
    assert_eq!(evs[1]["object"]["metadata"]["name"], "w-1");
    api.wait_open_watches(PODS, 0, STEP);
}

#[test]
fn close_after_and_timeout_seconds_end_the_watch_cleanly() {
    let api = FakeApiServer::start();
    two_pods(&api);
    api.fault(PODS, "close_after", 2, 1);
    let t0 = Instant::now();
    let (code, out, err) = curl(&api, WATCH, &[], 10);
    let took = t0.elapsed();
    assert_eq!(code, Some(0), "a clean end: {err}");
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(events(&out).len(), 2, "{out}");
    // timeoutSeconds ends a watch the same way, with the events that came meanwhile.
    let t0 = Instant::now();
    let path = format!("{WATCH}&timeoutSeconds=2&resourceVersion=3");
    let (code, out, err) = std::thread::scope(|scope| {
        let watching = scope.spawn(|| curl(&api, &path, &[], 10));
        api.wait_open_watches(PODS, 1, STEP);
        api.delete(PODS, NAMESPACE, "w-0");
        watching.join().unwrap() // bounded by curl's --max-time
    });
    assert_eq!(code, Some(0), "{err}");
    assert!(
        t0.elapsed() >= Duration::from_millis(1800),
        "{:?}",
        t0.elapsed()
    );
    let evs = events(&out);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "DELETED");
    assert_eq!(api.stats()[PODS]["last_watch"]["timeoutSeconds"], "2");
}

#[test]
fn a_stall_fault_sends_nothing_after_the_headers() {
    let api = FakeApiServer::start();
    two_pods(&api);
    api.fault(PODS, "stall", 0, 1);
    let (code, text, _) = std::thread::scope(|scope| {
        let stalled = scope.spawn(|| curl(&api, WATCH, &["-i"], 2));
        api.wait_open_watches(PODS, 1, STEP);
        put_worker(&api, "w-2", "solar", None, true);
        stalled.join().unwrap()
    });
    assert_eq!(code, Some(28), "curl timed out");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    assert!(body.is_empty(), "nothing after the headers: {body:?}");
    api.wait_open_watches(PODS, 0, STEP); // the fake notices the client left
}

#[test]
fn an_error_event_fault_sends_one_expired_error_event_then_ends() {
    let api = FakeApiServer::start();
    two_pods(&api);
    api.fault(PODS, "error_event", 0, 1);
    let (code, out, err) = curl(&api, &format!("{WATCH}&resourceVersion=3"), &[], 10);
    assert_eq!(code, Some(0), "{err}");
    let evs = events(&out);
    assert_eq!(evs.len(), 1, "{out}");
    assert_eq!(evs[0]["type"], "ERROR");
    let st = &evs[0]["object"];
    assert!(is_status(st, "Expired", 410), "{st}");
}

#[test]
fn a_watch_from_a_version_older_than_the_history_gets_an_expired_error_event() {
    let api = FakeApiServer::start_with_history(4);
    let rvs: Vec<u64> = (0..8)
        .map(|i| {
            rv(&put_worker(
                &api,
                &format!("w-{}", i % 3),
                "solar",
                None,
                true,
            ))
        })
        .collect();
    let from = |v: u64| format!("{WATCH}&resourceVersion={v}");
    // The last 4 events are kept: from the 4th-to-last's version, the 3 after it are replayed.
    let (code, out, _) = curl(&api, &from(rvs[4]), &[], 1);
    assert_eq!(code, Some(28));
    let evs = events(&out);
    assert_eq!(
        evs.iter().map(|e| rv(&e["object"])).collect::<Vec<_>>(),
        rvs[5..]
    );
    assert!(evs.iter().all(|e| e["type"] == "MODIFIED"), "{out}");
    // Older: one ERROR event, 410 Expired, and a clean end.
    let (code, out, _) = curl(&api, &from(rvs[1]), &[], 10);
    assert_eq!(code, Some(0));
    let evs = events(&out);
    assert_eq!(evs.len(), 1, "{out}");
    assert_eq!(evs[0]["type"], "ERROR");
    assert!(is_status(&evs[0]["object"], "Expired", 410), "{out}");
    // A compaction expires every older version, and the continue tokens of earlier lists.
    let page = parse(&curl(&api, "/api/v1/namespaces/dynamo/pods?limit=1", &[], 10).1);
    let token = page["metadata"]["continue"].as_str().unwrap().to_owned();
    assert_eq!(page["metadata"]["remainingItemCount"], 2);
    let now: u64 = api.compact(Some(PODS)).parse().unwrap();
    let (_, out, _) = curl(&api, &from(rvs[6]), &[], 10);
    assert_eq!(events(&out)[0]["object"]["reason"], "Expired", "{out}");
    let (code, out, _) = curl(&api, &from(now), &[], 1);
    assert_eq!(
        (code, out.as_str()),
        (Some(28), ""),
        "from now: nothing yet"
    );
    let next = format!("/api/v1/namespaces/dynamo/pods?limit=1&continue={token}");
    let (_, out, _) = curl(&api, &next, &["-w", "\n%{http_code}"], 10);
    assert!(
        out.ends_with("\n410") && out.contains(r#""reason":"Expired""#),
        "{out}"
    );
}

#[test]
fn bookmarks_come_when_allowed_periodically_and_on_command() {
    let api = FakeApiServer::start();
    two_pods(&api);
    api.bookmark_period(1.0);
    let path = format!("{WATCH}&allowWatchBookmarks=true&timeoutSeconds=3&resourceVersion=3");
    let (code, out, err) = curl(&api, &path, &[], 10);
    assert_eq!(code, Some(0), "timeoutSeconds ends it cleanly: {err}");
    let evs = events(&out);
    assert!(evs.len() >= 2, "a bookmark per quiet second: {out}");
    let bookmark = json!({"type": "BOOKMARK",
        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "3"}}});
    assert!(evs.iter().all(|e| *e == bookmark), "{out}");
    // Never to a watch that did not allow them; on command to those that did.
    api.bookmark_period(0.0);
    let (_, out, _) = curl(
        &api,
        &format!("{WATCH}&timeoutSeconds=2&resourceVersion=3"),
        &[],
        10,
    );
    assert_eq!(out, "");
    // curl may return before the server has counted that watch closed: wait for it, so the
    // open watch waited for below is the new one.
    api.wait_open_watches(PODS, 0, STEP);
    let (_, out, _) = std::thread::scope(|scope| {
        let watching = scope.spawn(|| curl(&api, &path, &[], 10));
        api.wait_open_watches(PODS, 1, STEP);
        assert_eq!(api.bookmark(PODS), 1);
        watching.join().unwrap()
    });
    assert_eq!(events(&out), [bookmark]);
    assert_eq!(
        api.stats()[PODS]["last_watch"]["allowWatchBookmarks"],
        "true"
    );
}
