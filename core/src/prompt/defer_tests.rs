//! The inline budget (KV-TOK-12): what `prepare` defers, and that ids encoded elsewhere and put
//! back with `insert_encoded` give exactly the whole-prompt encoding; and KV-TOK-14's token cap
//! exactly at and one over, on the whole and the segmented encode.

use super::fixture_tests::tiny_pipeline;
use super::*;

fn body(system_words: usize, turns: usize) -> Vec<u8> {
    let system: String = (0..system_words).map(|i| format!("rule{i} ")).collect();
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for t in 0..turns {
        messages.push(serde_json::json!({"role": "user", "content": format!("question {t}")}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("answer {t}")}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "last"}));
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap()
}

fn budget(b: usize) -> PrepareOptions<'static> {
    PrepareOptions {
        inline_budget: Some(b),
        ..Default::default()
    }
}

#[test]
fn a_prompt_over_the_budget_is_deferred_with_its_uncached_segments_only() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let long = body(2000, 2);
    // Over budget, cold: deferred, labelled prompt_too_large, with the big system segment.
    let err = p
        .prepare(&long, &[64], budget(4096), &mut cache, &mut s)
        .expect_err("deferred");
    assert_eq!(err.fallback(), KvSelection::PromptTooLarge);
    let PromptError::Deferred { bytes, pieces } = err else {
        panic!("{err:?}")
    };
    assert!(bytes > 4096, "{bytes}");
    assert!(pieces.iter().any(|x| x.contains("rule1999")), "{pieces:?}");
    assert_eq!(pieces.iter().map(String::len).sum::<usize>(), bytes);
    // Nothing was encoded or cached by the deferral.
    assert!(cache.is_empty());
    // Encoded elsewhere (as the background encoder does) and put back: the next prepare is
    // inline and gives exactly the whole-prompt ids.
    for piece in &pieces {
        let ids = p.tokenizer().encode_segment(piece).unwrap();
        cache.insert_encoded(piece, ids);
    }
    let via_cache = p
        .prepare(&long, &[64], budget(4096), &mut cache, &mut s)
        .expect("inline now")
        .token_ids()
        .to_vec();
    let rendered = p
        .prepare(
            &long,
            &[64],
            PrepareOptions::default(),
            &mut SegmentCache::new(0, 1),
            &mut s,
        )
        .unwrap()
        .rendered()
        .to_owned();
    let mut whole = Vec::new();
    p.tokenizer().encode_whole(&rendered, &mut whole).unwrap();
    assert_eq!(via_cache, whole);
    // A small prompt is always inline; so is a long one whose new part fits the budget.
    assert!(
        p.prepare(&body(10, 1), &[64], budget(4096), &mut cache, &mut s)
            .is_ok()
    );
    assert!(
        p.prepare(&body(2000, 3), &[64], budget(4096), &mut cache, &mut s)
            .is_ok()
    );
}

#[test]
fn only_segments_the_cache_lacks_count_against_the_budget() {
    let p = tiny_pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let long = body(2000, 0);
    // Warm it without a budget, then the same prompt costs nothing new.
    p.prepare(&long, &[64], PrepareOptions::default(), &mut cache, &mut s)
        .unwrap();
    let mut pieces = Vec::new();
    let rendered = s.rendered.clone();
    let text = std::str::from_utf8(&rendered).unwrap();
    assert_eq!(
        p.tokenizer().uncached(text, &cache, 0, 16, &mut pieces),
        None
    );
    assert!(pieces.is_empty());
    // With the cache empty every segment counts; at most `max_pieces` are copied.
    let empty = SegmentCache::new(1 << 20, 1);
    let all = p.tokenizer().uncached(text, &empty, 0, 1, &mut pieces);
    assert!(all.is_some_and(|b| b > 2000));
    assert_eq!(pieces.len(), 1);
}

#[test]
fn the_token_cap_holds_exactly_at_and_one_over_on_both_encode_paths() {
    let json = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures/tiny-model/tokenizer.json"
    ))
    .unwrap();
    let text = "<|begin_of_text|>system: keep it short<|eot_id|>user: hello there<|eot_id|>";
    let mut ids = Vec::new();
    PromptTokenizer::new(&json)
        .unwrap()
        .encode_whole(text, &mut ids)
        .unwrap();
    let n = ids.len();
    assert!(n > 4, "{n}");
    for (cap, fits) in [(n, true), (n - 1, false)] {
        let t = PromptTokenizer::new(&json).unwrap().with_max_tokens(cap);
        assert!(t.is_segmented(), "the tiny tokenizer segments");
        let mut out = Vec::new();
        let whole = t.encode_whole(text, &mut out);
        let mut cache = SegmentCache::new(1 << 20, 1);
        let segmented = t.encode(text, &mut cache, &mut out);
        if fits {
            assert!(whole.is_ok() && segmented.is_ok(), "cap {cap}");
            assert_eq!(out, ids);
        } else {
            assert!(
                matches!(whole, Err(TokenizeError::TooManyTokens)),
                "cap {cap}"
            );
            assert!(
                matches!(segmented, Err(TokenizeError::TooManyTokens)),
                "cap {cap}"
            );
        }
    }
}
