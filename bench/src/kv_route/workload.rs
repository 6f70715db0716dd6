//! The workload of `kv-route`: seeded, deterministic multi-turn conversations. Each one opens
//! with its own ~1,000-token system prompt (tiny-model tokenizer, about 4 tokens per generated
//! English word) and grows by one user message (~50-150 tokens) per turn, plus the assistant's
//! reply once the fleet has answered.
//!
//! Invariants: every text is a pure function of (seed, conversation, turn), so two rows of one
//! run send the same system prompts and user messages in the same order; every system prompt
//! starts with a different first word, so no two conversations share a prefix beyond the chat
//! template's; the only part a row does not choose is the assistant content (what the fleet
//! answered), which the client sends back, as a chat client does.

use serde_json::{Value, json};

/// The aggregated model fleet.py serves.
pub(crate) const MODEL: &str = "tiny-agg";
/// Generated words of a system prompt (about 1,000 tokens).
const SYSTEM_WORDS: usize = 215;
/// Fewest and most generated words of a user message (about 50 and 150 tokens).
const USER_WORDS: (u64, u64) = (12, 37);

/// Words the text is drawn from (about 4 tokens each with the tiny model's vocabulary).
const VOCAB: [&str; 64] = [
    "the", "router", "worker", "cache", "prefix", "block", "token", "request", "answer", "model",
    "fleet", "shard", "latency", "budget", "policy", "system", "prompt", "turn", "index", "event",
    "decode", "prefill", "memory", "queue", "engine", "batch", "stream", "client", "server",
    "session", "history", "context", "window", "summary", "detail", "reason", "example", "careful",
    "simple", "quick", "river", "mountain", "garden", "kitchen", "library", "market", "harbor",
    "castle", "forest", "meadow", "winter", "summer", "autumn", "spring", "morning", "evening",
    "yellow", "purple", "silver", "golden", "quiet", "bright", "ancient", "gentle",
];

/// Distinct first words of the system prompts (one per conversation, then numbered).
const OPENERS: [&str; 16] = [
    "Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliet",
    "Kilo", "Lima", "Mike", "November", "Oscar", "Papa",
];

/// SplitMix64: a small, seedable, deterministic generator.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed` and a stream label `stream`.
    pub(crate) fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let _ = r.next_u64();
        r
    }

    /// The next value.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// `words` words of sentences drawn from [`VOCAB`] by `rng`.
fn sentences(rng: &mut Rng, words: usize, out: &mut String) {
    let mut in_sentence = 0;
    for _ in 0..words {
        let w = VOCAB[(rng.next_u64() % VOCAB.len() as u64) as usize];
        if in_sentence == 0 {
            let mut cs = w.chars();
            if let Some(c) = cs.next() {
                out.extend(c.to_uppercase());
                out.push_str(cs.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(w);
        }
        in_sentence += 1;
        if in_sentence >= 6 + (rng.next_u64() % 9) as usize {
            out.push_str(". ");
            in_sentence = 0;
        }
    }
    if in_sentence > 0 {
        out.push('.');
    }
}

/// The system prompt of `conversation`: its own opener, then ~1,000 tokens of text.
pub(crate) fn system_prompt(seed: u64, conversation: usize) -> String {
    let mut rng = Rng::new(seed, 1 + conversation as u64);
    let opener = OPENERS[conversation % OPENERS.len()];
    let mut s = format!(
        "{opener} {conversation} instructions for seed {seed}. You are the assistant of \
         conversation {conversation}. "
    );
    sentences(&mut rng, SYSTEM_WORDS, &mut s);
    s
}

/// The user message of `turn` (0-based) of `conversation`: ~50-150 tokens.
pub(crate) fn user_message(seed: u64, conversation: usize, turn: usize) -> String {
    let stream = 0x1_0000 + (conversation as u64) * 1024 + turn as u64;
    let mut rng = Rng::new(seed, stream);
    let words = rng.range(USER_WORDS.0, USER_WORDS.1) as usize;
    let mut s = format!("Question {turn}: ");
    sentences(&mut rng, words, &mut s);
    s
}

/// One conversation's history, grown turn by turn.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    messages: Vec<Value>,
}

impl Conversation {
    /// The conversation with only its system prompt.
    pub(crate) fn new(seed: u64, conversation: usize) -> Conversation {
        Conversation {
            messages: vec![json!({"role": "system", "content": system_prompt(seed, conversation)})],
        }
    }

    /// Appends turn `turn`'s user message; returns the request body of the turn (streamed,
    /// with usage in the last chunk).
    pub(crate) fn ask(
        &mut self,
        seed: u64,
        conversation: usize,
        turn: usize,
        max_tokens: u32,
    ) -> String {
        self.messages.push(json!({
            "role": "user",
            "content": user_message(seed, conversation, turn),
        }));
        json!({
            "model": MODEL,
            "messages": self.messages,
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string()
    }

    /// Appends the assistant's reply to the last question.
    pub(crate) fn answer(&mut self, content: &str) {
        self.messages
            .push(json!({"role": "assistant", "content": content}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_deterministic_and_distinct() {
        assert_eq!(system_prompt(1, 3), system_prompt(1, 3));
        assert_eq!(user_message(1, 3, 2), user_message(1, 3, 2));
        assert_ne!(system_prompt(1, 3), system_prompt(2, 3));
        assert_ne!(user_message(1, 3, 2), user_message(1, 3, 1));
        let firsts: Vec<String> = (0..8)
            .map(|c| {
                system_prompt(1, c)
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        for (i, a) in firsts.iter().enumerate() {
            for b in &firsts[i + 1..] {
                assert_ne!(a, b, "two conversations open with the same word");
            }
        }
        let words = system_prompt(1, 0).split_whitespace().count();
        assert!((215..245).contains(&words), "{words}");
        for t in 0..16 {
            let n = user_message(7, 1, t).split_whitespace().count();
            assert!((14..=40).contains(&n), "{n}");
        }
    }

    #[test]
    fn a_conversation_grows_by_question_and_answer() {
        let mut c = Conversation::new(1, 0);
        let first: Value = serde_json::from_str(&c.ask(1, 0, 0, 16)).unwrap();
        assert_eq!(first["messages"].as_array().unwrap().len(), 2);
        assert_eq!(first["stream"], true);
        assert_eq!(first["stream_options"]["include_usage"], true);
        assert_eq!(first["max_tokens"], 16);
        c.answer("fine");
        let second: Value = serde_json::from_str(&c.ask(1, 0, 1, 16)).unwrap();
        let msgs = second["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 4);
        assert_eq!(msgs[2]["content"], "fine");
        assert_eq!(msgs[..2], first["messages"].as_array().unwrap()[..]);
        let mut again = Conversation::new(1, 0);
        assert_eq!(again.ask(1, 0, 0, 16), first.to_string());
    }
}
