//! The worker Dynamo's own KV router picked for each request, read from the
//! `dynamo.frontend --router-mode kv` log: one `route request completed` line per request, with
//! `request_id=<uuid>` (the `chatcmpl-<uuid>` id of the response's chunks), `worker_id=<decimal
//! instance id>` and `overlap_blocks=<n>`, all wrapped in ANSI color codes.
//!
//! Invariants: pure parsing; ANSI escape sequences are removed before matching; a line without a
//! `worker_id` is skipped, never guessed; the log is read up to [`MAX_LOG`] bytes.

use std::collections::HashMap;
use std::path::Path;

/// Largest frontend log read.
const MAX_LOG: u64 = 256 * 1024 * 1024;

/// What one `route request completed` line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// Every `request_id` of the line (the span's and the router's).
    pub(crate) request_ids: Vec<String>,
    /// The chosen worker's decimal instance id.
    pub(crate) worker_id: u64,
    /// `overlap_blocks`, if given.
    pub(crate) overlap_blocks: Option<u64>,
}

/// `line` without ANSI escape sequences (CSI `ESC [ ... final`, and two-byte `ESC x`).
pub(crate) fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // `ESC x` drops x; `ESC [` drops parameters and intermediates up to one final byte
        // in '@'..='~'.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// The route of one log line, if it is a `route request completed` line naming a worker.
pub(crate) fn parse_line(line: &str) -> Option<Route> {
    if !line.contains("route request completed") {
        return None;
    }
    let line = strip_ansi(line);
    let mut route = Route {
        request_ids: Vec::new(),
        worker_id: 0,
        overlap_blocks: None,
    };
    let mut worker = None;
    for word in line.split_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        let value = value.trim_matches('"');
        match key {
            "request_id" => route.request_ids.push(value.to_owned()),
            "worker_id" => worker = value.parse().ok(),
            "overlap_blocks" => route.overlap_blocks = value.parse().ok(),
            _ => {}
        }
    }
    route.worker_id = worker?;
    Some(route)
}

/// Every route of a log text.
pub(crate) fn parse(text: &str) -> Vec<Route> {
    text.lines().filter_map(parse_line).collect()
}

/// The routes of the log at `path` (empty if it cannot be read).
pub(crate) fn read(path: &Path) -> Vec<Route> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let Ok(f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if f.take(MAX_LOG).read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    parse(&String::from_utf8_lossy(&bytes))
}

/// Routes by request id (every id of every line).
pub(crate) fn by_request_id(routes: &[Route]) -> HashMap<&str, &Route> {
    routes
        .iter()
        .flat_map(|r| r.request_ids.iter().map(move |id| (id.as_str(), r)))
        .collect()
}

/// The request id of a response id (`chatcmpl-<uuid>` → `<uuid>`).
pub(crate) fn request_id(response_id: &str) -> &str {
    response_id.strip_prefix("chatcmpl-").unwrap_or(response_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line as the 1.6.1 frontend writes it (colors on).
    const LINE: &str = "\u{1b}[2m2026-12-03T16:45:53.701023Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \
        \u{1b}[1mhttp-request\u{1b}[0m:\u{1b}[1mkv_router.route_request\u{1b}[0m: \
        \u{1b}[2mrequest_span\u{1b}[0m\u{1b}[2m:\u{1b}[0m route request completed \
        \u{1b}[3mrequest.outcome\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"success\" \
        \u{1b}[3mrequest_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m635be1fa-432c-4a90-80a6-cdc7155c90b0 \
        \u{1b}[3mmodel\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"tiny-agg\"\u{1b}[0m \
        \u{1b}[3mrequest_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m7e2cf12f-6be8-42f7-a8cb-c58a388e8ebc \
        \u{1b}[3mdp_rank\u{1b}[0m\u{1b}[2m=\u{1b}[0m0 \
        \u{1b}[3moverlap_blocks\u{1b}[0m\u{1b}[2m=\u{1b}[0m30 \
        \u{1b}[3mphase\u{1b}[0m\u{1b}[2m=\u{1b}[0mAggregated \
        \u{1b}[3mworker_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m9052132158046760215 \
        \u{1b}[3mrequest.attempt\u{1b}[0m\u{1b}[2m=\u{1b}[0m0";

    #[test]
    fn parses_a_colored_route_line() {
        let r = parse_line(LINE).unwrap();
        assert_eq!(r.worker_id, 9_052_132_158_046_760_215);
        assert_eq!(r.overlap_blocks, Some(30));
        assert_eq!(
            r.request_ids,
            [
                "635be1fa-432c-4a90-80a6-cdc7155c90b0",
                "7e2cf12f-6be8-42f7-a8cb-c58a388e8ebc"
            ]
        );
        let plain = strip_ansi(LINE);
        assert!(!plain.contains('\u{1b}'));
        assert!(plain.contains("overlap_blocks=30 phase=Aggregated worker_id="));
    }

    #[test]
    fn maps_response_ids_and_skips_other_lines() {
        let text = format!("{LINE}\nINFO other line worker_id=1\nroute request completed x=1\n");
        let routes = parse(&text);
        assert_eq!(routes.len(), 1);
        let map = by_request_id(&routes);
        let id = request_id("chatcmpl-7e2cf12f-6be8-42f7-a8cb-c58a388e8ebc");
        assert_eq!(map[id].worker_id, 9_052_132_158_046_760_215);
        assert_eq!(request_id("abc"), "abc");
        assert_eq!(strip_ansi("a\u{1b}[1;32mb\u{1b}[0m\u{1b}"), "ab");
    }
}
