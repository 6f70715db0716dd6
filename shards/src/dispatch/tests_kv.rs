//! Shard-level tests of what KV-aware picking changes on the wire: the shim attempt of a
//! conditional bypass (KV-PICK-14: only the decode pin, path `unified`) and where
//! `nvext.token_data` goes (KV-PICK-10/11: the shim attempts only, a client's never).

use continuum_core::config::{BackendUrl, ResponsesApi, UrlScheme};
use continuum_core::headers::PinHeaders;

use super::Ingress;
use super::attempt::{attempt_body, build_upstream_head};
use super::exchange::{Body, body_and_shim};
use super::plan::Pinned;
use super::prepare;
use super::shim::{FALLBACK_ATTEMPT, pinned_attempt};
use super::tests::{Parts, backend};
use super::token_data::write_shim_body;

const CHAT: &str = "/v1/chat/completions";

fn url() -> BackendUrl {
    BackendUrl {
        scheme: UrlScheme::Http,
        host: "127.0.0.1".to_owned(),
        port: 8000,
        base_path: String::new(),
    }
}

fn pinned(pins: PinHeaders, body: Option<Body>) -> Pinned<'static> {
    Pinned {
        pins,
        namespace: "disagg",
        replicas: &[],
        dispatched: [None, None],
        body,
    }
}

/// The upstream request `attempt` writes for `p`'s request (head and coalesced body).
fn upstream_request(p: &mut Parts, attempt: &super::exchange::Attempt<'_>) -> String {
    let mut ex = p.exchange(Ingress::Chat);
    prepare::prepare(&mut ex).unwrap();
    let body = attempt_body(&mut ex, &backend(ResponsesApi::Chat), attempt).unwrap();
    build_upstream_head(&mut ex, &url(), body, attempt);
    String::from_utf8_lossy(&ex.bufs.out).into_owned()
}

fn header_lines(raw: &str) -> Vec<String> {
    let head = raw.split_once("\r\n\r\n").map_or(raw, |(h, _)| h);
    head.lines().skip(1).map(str::to_ascii_lowercase).collect()
}

#[test]
fn kv_pick_14_a_bypass_pins_only_the_decode_worker_and_is_unified() {
    // What KvAwarePicker's bypass pick gives (core tests): decode worker and rank, no prefill.
    let bypass = PinHeaders {
        worker: 7_465_265_302_745_285,
        worker_rank: Some(1),
        prefill: None,
        prefill_rank: None,
    };
    let p = pinned(bypass, None);
    let (attempt, path) = pinned_attempt(&p);
    assert_eq!(path.label(), "unified");
    assert_eq!(attempt.routing.map(|r| r.path), Some("unified"));
    // A client's own prefill pin is dropped; only the picker's decode pin and rank go out.
    let body = r#"{"model":"m","messages":[]}"#;
    let mut parts = Parts::new(CHAT, body);
    parts.req = crate::http::Request::parsed(
        format!(
            "POST {CHAT} HTTP/1.1\r\nhost: r\r\nx-dynamo-prefill-instance-id: 5\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let raw = upstream_request(&mut parts, &attempt);
    let lines = header_lines(&raw);
    assert!(lines.contains(&"x-dynamo-worker-instance-id: 7465265302745285".to_owned()));
    assert!(lines.contains(&"x-dynamo-dp-rank: 1".to_owned()));
    assert!(
        !lines.iter().any(|l| l.starts_with("x-dynamo-prefill")),
        "no prefill pin on a bypass: {lines:?}"
    );
    // A disaggregated pick of the same request pins both and says so.
    let pair = pinned(
        PinHeaders {
            prefill: Some(9),
            ..bypass
        },
        None,
    );
    let (attempt, path) = pinned_attempt(&pair);
    assert_eq!(path.label(), "disaggregated");
    let lines = header_lines(&upstream_request(&mut parts, &attempt));
    assert!(lines.contains(&"x-dynamo-prefill-instance-id: 9".to_owned()));
}

#[test]
fn kv_pick_10_11_token_data_rides_the_shim_attempts_only() {
    // The client sends its own token_data: prepare strips it (KV-PICK-11).
    let client = r#"{"model":"m","nvext":{"token_data":[666],"cache_salt":"s"},"messages":[]}"#;
    let mut parts = Parts::new(CHAT, client);
    let mut ex = parts.exchange(Ingress::Chat);
    prepare::prepare(&mut ex).unwrap();
    let kind = ex.body;
    let (body, shim) = body_and_shim(ex.req, ex.bufs, kind);
    assert!(write_shim_body(body, &[1, 2, 3], shim));
    let with_ids = pinned(
        PinHeaders {
            worker: 2,
            worker_rank: None,
            prefill: Some(1),
            prefill_rank: None,
        },
        Some(Body::Shim),
    );
    let (attempt, _) = pinned_attempt(&with_ids);
    let be = backend(ResponsesApi::Chat);
    // The shim attempt sends the router's ids, the client's other nvext fields kept.
    let b = attempt_body(&mut ex, &be, &attempt).unwrap();
    assert_eq!(b, Body::Shim);
    let v: serde_json::Value = serde_json::from_slice(ex.bytes(b)).unwrap();
    assert_eq!(v["nvext"]["token_data"], serde_json::json!([1, 2, 3]));
    assert_eq!(v["nvext"]["cache_salt"], "s");
    // The unified fallback sends the prepared body: no token_data at all.
    let b = attempt_body(&mut ex, &be, &FALLBACK_ATTEMPT).unwrap();
    assert_eq!(b, Body::Prepared);
    let v: serde_json::Value = serde_json::from_slice(ex.bytes(b)).unwrap();
    assert!(v.pointer("/nvext/token_data").is_none(), "{v}");
    assert_eq!(v["nvext"]["cache_salt"], "s");
    // Without token_data (send_token_data off, or no prepared prompt) shim attempts send the
    // prepared body, stripped of the client's ids just the same.
    let without = pinned(with_ids.pins, None);
    let (attempt, _) = pinned_attempt(&without);
    let b = attempt_body(&mut ex, &be, &attempt).unwrap();
    assert_eq!(b, Body::Prepared);
    // The upstream head counts the shim body's length.
    build_upstream_head(&mut ex, &url(), Body::Shim, &pinned_attempt(&with_ids).0);
    let raw = String::from_utf8_lossy(&ex.bufs.out).into_owned();
    let shim_len = ex.bytes(Body::Shim).len();
    assert!(
        raw.contains(&format!("content-length: {shim_len}\r\n")),
        "{raw}"
    );
    assert!(raw.ends_with(std::str::from_utf8(ex.bytes(Body::Shim)).unwrap()));
}

mod prediction {
    //! What the hash-parity watchdog predicts after a pick: the prefilling rank and the deepest
    //! block of its block size, only when that rank lacked part of the prompt.

    use continuum_core::discovery::InstanceId;
    use continuum_core::load::LoadKey;
    use continuum_core::picker::{
        BlockHash, Chosen, DpRankHeaders, KvOutcome, Pick, PromptBlocks, SelectionReason,
    };

    use super::super::plan::prediction;

    fn chosen(id: u64, dp_rank: u32) -> Chosen {
        Chosen {
            instance_id: InstanceId::new(id),
            dp_rank,
            reason: SelectionReason::KvAware,
        }
    }

    fn pick(prefill: Option<Chosen>, kv: Option<KvOutcome>) -> Pick<'static> {
        Pick {
            namespace: "ns",
            decode: chosen(1, 2),
            prefill,
            dp_rank_headers: DpRankHeaders::default(),
            kv,
        }
    }

    const SMALL: [BlockHash; 3] = [BlockHash(10), BlockHash(11), BlockHash(12)];
    const LARGE: [BlockHash; 1] = [BlockHash(20)];

    fn blocks() -> [PromptBlocks<'static>; 2] {
        [
            PromptBlocks {
                block_size: 16,
                hashes: &SMALL,
            },
            PromptBlocks {
                block_size: 64,
                hashes: &LARGE,
            },
        ]
    }

    fn kv(overlap_blocks: u32, block_size: u32) -> Option<KvOutcome> {
        Some(KvOutcome {
            overlap_blocks,
            block_size,
        })
    }

    #[test]
    fn the_prefilling_rank_and_the_deepest_block_of_its_size() {
        let key = |id, dp_rank| LoadKey {
            worker_id: InstanceId::new(id),
            dp_rank,
        };
        // Aggregated: the decode worker prefills.
        assert_eq!(
            prediction(&pick(None, kv(1, 16)), &blocks()),
            Some((key(1, 2), BlockHash(12)))
        );
        // A pair: the prefill worker, with its own block size.
        assert_eq!(
            prediction(&pick(Some(chosen(7, 0)), kv(0, 64)), &blocks()),
            Some((key(7, 0), BlockHash(20)))
        );
    }

    #[test]
    fn nothing_without_kv_new_blocks_or_a_matching_size() {
        assert_eq!(prediction(&pick(None, None), &blocks()), None, "load-only");
        assert_eq!(
            prediction(&pick(None, kv(3, 16)), &blocks()),
            None,
            "every block held already"
        );
        assert_eq!(prediction(&pick(None, kv(0, 32)), &blocks()), None);
        assert_eq!(prediction(&pick(None, kv(0, 16)), &[]), None, "no blocks");
        let empty = [PromptBlocks {
            block_size: 16,
            hashes: &[],
        }];
        assert_eq!(prediction(&pick(None, kv(0, 16)), &empty), None);
    }
}
