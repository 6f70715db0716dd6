//! A completions body through the pipeline: a text prompt is tokenized as it is (no chat
//! template, special-token text becomes its id), a token-id prompt is hashed as given, a batch by
//! its first prompt; the hashes are `dynamo-kv-hashing`'s own over those ids, salted as a chat
//! body's; the token cap and the inline budget hold for text and ids alike.

use super::fixture_tests::tiny_pipeline;
use super::*;
use serde_json::json;

fn completion() -> PrepareOptions<'static> {
    PrepareOptions {
        format: BodyFormat::Completion,
        ..Default::default()
    }
}

/// A prompt of several complete 64-token blocks, with special-token text in it.
fn long_text() -> String {
    let words: String = (0..300).map(|i| format!("w{i} ")).collect();
    format!("{words}<|eot_id|> tail")
}

fn body(prompt: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "prompt": prompt})).unwrap()
}

/// `dynamo-kv-hashing`'s sequence hashes of `ids` at block size 64.
fn reference(ids: &[u32], salt: Option<&str>) -> Vec<crate::picker::BlockHash> {
    dynamo_kv_hashing::Request::builder()
        .tokens(ids.to_vec())
        .salt(salt.map(str::to_string))
        .build()
        .unwrap()
        .sequence_hashes(64)
        .unwrap()
        .into_iter()
        .map(crate::picker::BlockHash)
        .collect()
}

#[test]
fn a_text_prompt_is_tokenized_as_it_is_and_hashed_like_dynamo() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let text = long_text();
    let whole = p
        .tokenizer()
        .tokenizer()
        .encode_fast(text.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert!(whole.contains(&4), "the special-token text is its id");
    let prepared = p
        .prepare(&body(json!(text)), &[64], completion(), &mut cache, &mut s)
        .unwrap();
    assert_eq!(prepared.source(), PromptSource::Text);
    assert_eq!(prepared.token_ids(), &whole[..]);
    assert_eq!(prepared.token_data(), Some(&whole[..]));
    assert_eq!(prepared.rendered(), text);
    let hashes = prepared.sequence_hashes(64).unwrap().to_vec();
    assert_eq!(hashes.len(), whole.len() / 64);
    assert!(hashes.len() >= 4, "{}", hashes.len());
    assert_eq!(hashes, reference(&whole, None));
    // The same text as a chat message is rendered through the template: other ids.
    let chat =
        serde_json::to_vec(&json!({"messages": [{"role": "user", "content": text}]})).unwrap();
    let rendered = p
        .prepare(&chat, &[64], PrepareOptions::default(), &mut cache, &mut s)
        .unwrap();
    assert_eq!(rendered.source(), PromptSource::Rendered);
    assert!(rendered.token_count() > whole.len());
}

#[test]
fn token_ids_are_hashed_as_given_and_a_batch_by_its_first_prompt() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let text = long_text();
    let ids = p
        .prepare(&body(json!(text)), &[64], completion(), &mut cache, &mut s)
        .unwrap()
        .token_ids()
        .to_vec();
    let by_text = reference(&ids, None);
    let cases = [
        (json!(ids), PromptSource::TokenIds),
        (json!([ids]), PromptSource::TokenIds),
        (json!([ids, [1, 2, 3]]), PromptSource::FirstOfBatch),
        (json!([text, "another prompt"]), PromptSource::FirstOfBatch),
        (json!([text]), PromptSource::Text),
    ];
    for (prompt, source) in cases {
        let prepared = p
            .prepare(
                &body(prompt.clone()),
                &[64, 16],
                completion(),
                &mut cache,
                &mut s,
            )
            .unwrap();
        assert_eq!(prepared.source(), source, "{prompt}");
        assert_eq!(prepared.token_ids(), &ids[..], "{prompt}");
        assert_eq!(prepared.sequence_hashes(64).unwrap(), &by_text[..]);
        assert_eq!(
            prepared.token_data().is_some(),
            source == PromptSource::Text,
            "token_data only for one text prompt: {prompt}"
        );
    }
    // Ids the tokenizer would never produce are still hashed as given.
    let odd = vec![u32::MAX; 130];
    let prepared = p
        .prepare(&body(json!(odd)), &[64], completion(), &mut cache, &mut s)
        .unwrap();
    assert_eq!(
        prepared.sequence_hashes(64).unwrap(),
        &reference(&odd, None)[..]
    );
}

#[test]
fn a_completion_is_salted_as_a_chat_body_is() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let text = long_text();
    let salted = serde_json::to_vec(
        &json!({"prompt": text, "cache_salt": "legacy", "nvext": {"cache_salt": "tenant"}}),
    )
    .unwrap();
    let ids = p
        .prepare(&salted, &[64], completion(), &mut cache, &mut s)
        .unwrap()
        .token_ids()
        .to_vec();
    let got = |opts: PrepareOptions<'_>, b: &[u8], s: &mut PromptScratch, c: &mut SegmentCache| {
        p.prepare(b, &[64], opts, c, s)
            .unwrap()
            .sequence_hashes(64)
            .unwrap()
            .to_vec()
    };
    assert_eq!(
        got(completion(), &salted, &mut s, &mut cache),
        reference(&ids, Some("tenant"))
    );
    let header = PrepareOptions {
        tenant_salt: Some("header"),
        ..completion()
    };
    assert_eq!(
        got(header, &salted, &mut s, &mut cache),
        reference(&ids, Some("header"))
    );
    assert_ne!(reference(&ids, Some("tenant")), reference(&ids, None));
}

#[test]
fn the_token_cap_and_the_inline_budget_hold_for_completions() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let at_cap = body(json!(vec![7u32; tokenize::MAX_TOKENS]));
    let prepared = p
        .prepare(&at_cap, &[64], completion(), &mut cache, &mut s)
        .unwrap();
    assert_eq!(prepared.token_count(), tokenize::MAX_TOKENS);
    let over = body(json!(vec![7u32; tokenize::MAX_TOKENS + 1]));
    let err = p
        .prepare(&over, &[64], completion(), &mut cache, &mut s)
        .unwrap_err();
    assert!(
        matches!(err, PromptError::Tokenize(TokenizeError::TooManyTokens)),
        "{err:?}"
    );
    assert_eq!(err.fallback(), KvSelection::PromptTooLarge);
    // A long text prompt over the inline budget is deferred with its uncached segments.
    let budget = PrepareOptions {
        inline_budget: Some(64),
        ..completion()
    };
    let err = p
        .prepare(&body(json!(long_text())), &[64], budget, &mut cache, &mut s)
        .unwrap_err();
    let PromptError::Deferred { bytes, pieces } = err else {
        panic!("{err:?}")
    };
    assert!(bytes > 64 && !pieces.is_empty(), "{bytes}");
    // Malformed and promptless bodies fall back as render_unavailable.
    for b in [&br#"{"prompt":[]}"#[..], br#"{"model":"m"}"#, b"[1]"] {
        let err = p
            .prepare(b, &[64], completion(), &mut cache, &mut s)
            .unwrap_err();
        assert_eq!(err.fallback(), KvSelection::RenderUnavailable, "{err:?}");
    }
}
