//! Differential test: segment-cached encoding == whole-prompt `encode`, on the fixture prompts
//! and on thousands of generated multi-turn prompts (random unicode, whitespace at segment
//! edges, partial special-token spellings, repeated turns through a warm cache, and a cache
//! small enough to evict), plus the fallback for tokenizers that cannot be segmented safely.

use super::fixture_tests::tiny_pipeline;
use super::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const PIECES: [&str; 24] = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\u{a0}",
    "\u{3000}",
    "hello",
    "world",
    " the",
    "é",
    "e\u{301}",
    "漢字",
    "🙂",
    "👩‍👩‍👧",
    "<|",
    "|>",
    "<|eot",
    "_id|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|begin_of_text|>",
    "123",
];

fn random_text(rng: &mut Rng, max_pieces: usize) -> String {
    let mut s = String::new();
    for _ in 0..rng.below(max_pieces) {
        if rng.below(4) == 0 {
            s.push(char::from_u32(rng.below(0x3_0000) as u32).unwrap_or('?'));
        } else {
            s.push_str(PIECES[rng.below(PIECES.len())]);
        }
    }
    s
}

fn check(p: &PromptPipeline, text: &str, cache: &mut SegmentCache) {
    let (mut whole, mut seg) = (Vec::new(), Vec::new());
    p.tokenizer().encode_whole(text, &mut whole).unwrap();
    p.tokenizer().encode(text, cache, &mut seg).unwrap();
    assert_eq!(seg, whole, "{text:?}");
}

#[test]
fn random_prompts_segment_exactly() {
    let p = tiny_pipeline();
    assert!(p.tokenizer().is_segmented());
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut big = SegmentCache::new(1 << 20, 3);
    let mut tiny = SegmentCache::new(2048, 4);
    for _ in 0..3000 {
        let text = random_text(&mut rng, 40);
        check(&p, &text, &mut big);
        check(&p, &text, &mut tiny);
        check(&p, &text, &mut big); // warm
    }
    assert!(big.stats().hits > 0);
    assert!(tiny.stats().evictions > 0);
}

#[test]
fn multi_turn_chats_through_warm_and_evicting_caches() {
    let p = tiny_pipeline();
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let mut big = SegmentCache::new(1 << 20, 5);
    let mut tiny = SegmentCache::new(4096, 6);
    let mut s = PromptScratch::default();
    for _conv in 0..60 {
        let mut messages =
            vec![serde_json::json!({"role": "system", "content": random_text(&mut rng, 30)})];
        for _turn in 0..8 {
            messages
                .push(serde_json::json!({"role": "user", "content": random_text(&mut rng, 30)}));
            let body = serde_json::to_vec(&serde_json::json!({"messages": messages})).unwrap();
            let req = ChatRequest::parse(&body).unwrap();
            let mut rendered = Vec::new();
            p.template().render(&req, 0, &mut rendered).unwrap();
            let text = String::from_utf8(rendered).unwrap();
            check(&p, &text, &mut big);
            check(&p, &text, &mut tiny);
            let prepared = p
                .prepare(&body, &[16], PrepareOptions::default(), &mut big, &mut s)
                .unwrap();
            let mut whole = Vec::new();
            p.tokenizer().encode_whole(&text, &mut whole).unwrap();
            assert_eq!(prepared.token_ids(), whole.as_slice());
            messages.push(
                serde_json::json!({"role": "assistant", "content": random_text(&mut rng, 20)}),
            );
        }
    }
    assert!(big.stats().hits > big.stats().misses);
    assert!(tiny.stats().evictions > 0);
}

#[test]
fn unsafe_tokenizers_fall_back_to_whole_encoding() {
    let path = format!(
        "{}/../../shared/fixtures/tiny-model/tokenizer.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut tok: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    tok["added_tokens"][4]["lstrip"] = serde_json::Value::Bool(true);
    tok["added_tokens"][4]["rstrip"] = serde_json::Value::Bool(true);
    let t = PromptTokenizer::new(&serde_json::to_vec(&tok).unwrap()).unwrap();
    assert!(!t.is_segmented());
    let mut cache = SegmentCache::new(1 << 16, 1);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let text = "a  <|eot_id|>  b";
    t.encode(text, &mut cache, &mut a).unwrap();
    t.encode_whole(text, &mut b).unwrap();
    assert_eq!(a, b);
    assert_eq!(cache.stats().misses, 0);
}
