//! Parity with real Dynamo 1.6.1 captures (`../shared/fixtures/dynamo-1.6.1/kv-events/`, the
//! `tiny-model` artifacts): every scripted request renders and tokenizes to exactly the
//! frontend's recorded prompt and token ids, and the sequence/tokens hashes of its complete
//! 64-token blocks equal the `block_hash`/`tokens_hash` the engine stored (86 blocks; the 2
//! stored blocks made of generated tokens are beyond the prompt and not predictable).

use super::*;

fn fixture(rel: &str) -> Vec<u8> {
    let path = format!("{}/../../shared/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path} is missing ({e})"))
}

pub(super) fn tiny_pipeline() -> PromptPipeline {
    PromptPipeline::new(
        &fixture("tiny-model/tokenizer.json"),
        &fixture("tiny-model/tokenizer_config.json"),
        None,
    )
    .unwrap()
}

fn jsonl(rel: &str) -> Vec<serde_json::Value> {
    String::from_utf8(fixture(rel))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn requests_render_tokenize_and_hash_like_dynamo_1_6_1() {
    let p = tiny_pipeline();
    assert!(p.tokenizer().is_segmented());
    let requests = jsonl("dynamo-1.6.1/kv-events/requests.jsonl");
    let events = jsonl("dynamo-1.6.1/kv-events/decoded.jsonl");
    let mut cache = SegmentCache::new(1 << 20, 0x5eed);
    let mut scratch = PromptScratch::default();
    let (mut exact, mut checked, mut beyond) = (0, 0, 0);
    for r in &requests {
        let step = r["step"].as_str().unwrap();
        let body = serde_json::to_vec(&serde_json::json!({
            "model": r["model"], "messages": r["messages"], "max_tokens": r["max_tokens"],
        }))
        .unwrap();
        let prepared = p
            .prepare(
                &body,
                &[64, 16],
                PrepareOptions::default(),
                &mut cache,
                &mut scratch,
            )
            .unwrap();
        assert_eq!(
            prepared.rendered(),
            r["formatted_prompt"].as_str().unwrap(),
            "{step}"
        );
        let want: Vec<u32> = serde_json::from_value(r["token_ids"].clone()).unwrap();
        assert_eq!(prepared.token_ids(), want.as_slice(), "{step}");
        assert_eq!(
            prepared.token_count(),
            r["usage"]["prompt_tokens"].as_u64().unwrap() as usize
        );
        exact += 1;

        let bh: Vec<_> = prepared.block_hashes().collect();
        assert_eq!(bh.len(), 2);
        let b64 = bh[0];
        assert_eq!(b64.block_size, 64);
        assert_eq!(b64.sequence.len(), want.len() / 64);
        assert_eq!(bh[1].sequence.len(), want.len() / 16);
        for e in events.iter().filter(|e| e["step"] == r["step"]) {
            let Some(stored) = e["router_event"]["event"]["data"].get("stored") else {
                continue;
            };
            let first = match stored["parent_hash"].as_u64() {
                None => Some(0),
                Some(parent) => b64
                    .sequence
                    .iter()
                    .position(|h| h.0 == parent)
                    .map(|i| i + 1),
            };
            for (j, block) in stored["blocks"].as_array().unwrap().iter().enumerate() {
                let idx = first.map(|f| f + j).filter(|&i| i < b64.sequence.len());
                let Some(idx) = idx else {
                    beyond += 1;
                    continue;
                };
                assert_eq!(
                    b64.sequence[idx].0,
                    block["block_hash"].as_u64().unwrap(),
                    "{step} block {idx}"
                );
                assert_eq!(
                    b64.tokens[idx],
                    block["tokens_hash"].as_u64().unwrap(),
                    "{step} block {idx}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!((exact, requests.len()), (16, 16));
    assert_eq!((checked, beyond), (86, 2));
    // The multi-turn fixtures share system prompts: the segment cache must have been hit.
    assert!(cache.stats().hits > 0);
}

#[test]
fn salts_change_every_block_hash() {
    let p = tiny_pipeline();
    let requests = jsonl("dynamo-1.6.1/kv-events/requests.jsonl");
    let body =
        serde_json::to_vec(&serde_json::json!({"messages": requests[1]["messages"]})).unwrap();
    let salted = serde_json::to_vec(&serde_json::json!({"messages": requests[1]["messages"],
        "nvext": {"cache_salt": "tenant"}}))
    .unwrap();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let plain: Vec<_> = p
        .prepare(&body, &[64], PrepareOptions::default(), &mut cache, &mut s)
        .unwrap()
        .sequence_hashes(64)
        .unwrap()
        .to_vec();
    let tenant: Vec<_> = p
        .prepare(
            &salted,
            &[64],
            PrepareOptions::default(),
            &mut cache,
            &mut s,
        )
        .unwrap()
        .sequence_hashes(64)
        .unwrap()
        .to_vec();
    let header = PrepareOptions {
        tenant_salt: Some("tenant"),
        ..Default::default()
    };
    let via_header: Vec<_> = p
        .prepare(&body, &[64], header, &mut cache, &mut s)
        .unwrap()
        .sequence_hashes(64)
        .unwrap()
        .to_vec();
    let lora = PrepareOptions {
        lora_name: Some("adapter"),
        ..Default::default()
    };
    let with_lora: Vec<_> = p
        .prepare(&body, &[64], lora, &mut cache, &mut s)
        .unwrap()
        .sequence_hashes(64)
        .unwrap()
        .to_vec();
    assert_eq!(plain.len(), 6);
    assert_eq!(tenant, via_header);
    assert!(plain.iter().zip(&tenant).all(|(a, b)| a != b));
    assert!(plain.iter().zip(&with_lora).all(|(a, b)| a != b));
    // And they are dynamo-kv-hashing's own values.
    let req = dynamo_kv_hashing::Request::builder()
        .tokens(s.tokens.clone())
        .lora_name(Some("adapter".to_string()))
        .build()
        .unwrap();
    let want: Vec<_> = req
        .sequence_hashes(64)
        .unwrap()
        .into_iter()
        .map(crate::picker::BlockHash)
        .collect();
    assert_eq!(with_lora, want);
}

#[test]
fn prepare_errors_map_to_fallback_labels() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 16, 1);
    let mut s = PromptScratch::default();
    let mut fb = |body: &[u8], sizes: &[u32]| {
        p.prepare(body, sizes, PrepareOptions::default(), &mut cache, &mut s)
            .unwrap_err()
            .fallback()
    };
    assert_eq!(fb(b"not json", &[64]), KvSelection::RenderUnavailable);
    assert_eq!(
        fb(br#"{"messages":[]}"#, &[8]),
        KvSelection::TokenizerUnavailable
    );
    assert_eq!(
        fb(br#"{"messages":[]}"#, &[16, 32, 64]),
        KvSelection::TokenizerUnavailable
    );
    let huge = serde_json::to_vec(
        &serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(1 << 20)}]}),
    )
    .unwrap();
    assert_eq!(fb(&huge, &[64]), KvSelection::PromptTooLarge);
}
