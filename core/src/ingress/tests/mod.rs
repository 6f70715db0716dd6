//! Tests of the ingress conversions with docs-shaped fixtures.

mod anthropic_req;
mod anthropic_resp;
mod anthropic_stream;
mod errors_sanitize;
mod responses;
mod responses_stream;
mod sse;

/// Deterministic pseudo-random splitter (xorshift), for "split anywhere" tests.
pub(super) fn splits(len: usize, seed: u64) -> Vec<usize> {
    let mut x = seed | 1;
    let mut cuts = Vec::new();
    let mut at = 0;
    while at < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        at += 1 + (x % 23) as usize;
        cuts.push(at.min(len));
    }
    cuts
}

/// Feeds `input` cut at `cuts` through `feed`, concatenating the outputs.
pub(super) fn feed_split<F>(input: &[u8], cuts: &[usize], mut feed: F) -> Vec<u8>
where
    F: FnMut(&[u8]) -> Vec<u8>,
{
    let mut out = Vec::new();
    let mut prev = 0;
    for &c in cuts {
        out.extend(feed(&input[prev..c]));
        prev = c;
    }
    out.extend(feed(&input[prev..]));
    out
}

/// Parses SSE output into `(event, data JSON)` pairs.
pub(super) fn parse_events(bytes: &[u8]) -> Vec<(String, serde_json::Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|b| {
            let mut lines = b.lines();
            let ev = lines
                .next()
                .unwrap()
                .strip_prefix("event: ")
                .unwrap()
                .to_owned();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            (ev, serde_json::from_str(data).unwrap())
        })
        .collect()
}
