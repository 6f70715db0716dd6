//! How `faults` classifies one streamed request, and the per-row tally of the classes.
//!
//! Classes (mutually exclusive, so `sent = ok + failed + lost`):
//! - `ok`: 2xx, no error event, and the stream ended with `data: [DONE]` or a usage chunk;
//! - `failed`, by kind: `http` (a non-2xx status), `sse-error` (a 2xx stream carrying an error
//!   event: `event: error`, or data JSON with a non-null `error`), `truncated` (a 2xx stream
//!   that ended, cleanly or not, before `[DONE]` and without a usage chunk), `no-response`
//!   (connect refused or reset, or the connection closed before a response head);
//! - `lost`: the request timed out (no complete answer within the request timeout).
//!
//! `slow` counts the `ok` requests that took longer than [`SLOW`] in total.
//!
//! Invariants: classification is a pure function of the request's I/O result and what was read
//! before it ended; a timeout is `lost` whatever arrived before it.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::time::Duration;

use crate::kv_route::stream::Streamed;

/// An `ok` request taking longer than this is also `slow`.
pub(crate) const SLOW: Duration = Duration::from_secs(5);

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FailKind {
    /// A non-2xx status.
    Http,
    /// A 2xx stream with an error event.
    SseError,
    /// A 2xx stream that ended before `[DONE]` and without usage.
    Truncated,
    /// Refused, reset or closed before the response head.
    NoResponse,
}

impl FailKind {
    /// The kind's name in the report.
    pub(crate) fn label(self) -> &'static str {
        match self {
            FailKind::Http => "http",
            FailKind::SseError => "sse-error",
            FailKind::Truncated => "truncated",
            FailKind::NoResponse => "no-response",
        }
    }
}

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered in full.
    Ok,
    /// Answered, but not with a whole answer.
    Failed {
        /// Why.
        kind: FailKind,
        /// The status (0 without a response head), and the body head, error event or I/O error.
        detail: String,
    },
    /// Not answered within the request timeout.
    Lost(String),
}

/// Classifies a request from its I/O result and what was read before it ended.
pub(crate) fn classify(io: &std::io::Result<()>, out: &Streamed) -> Outcome {
    let failed = |kind, detail: String| Outcome::Failed { kind, detail };
    if let Err(e) = io
        && matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock)
    {
        let seen = if out.status == 0 {
            "no response head".to_owned()
        } else {
            format!("status {}, {} content bytes", out.status, out.content.len())
        };
        return Outcome::Lost(format!("{e} ({seen})"));
    }
    if out.status == 0 {
        let why = io
            .as_ref()
            .err()
            .map_or("no response".to_owned(), ToString::to_string);
        return failed(FailKind::NoResponse, why);
    }
    if !(200..300).contains(&out.status) {
        return failed(
            FailKind::Http,
            format!("{} {}", out.status, one_line(&out.body_head)),
        );
    }
    if let Some(ev) = &out.error_event {
        return failed(
            FailKind::SseError,
            format!("{} error event {}", out.status, one_line(ev)),
        );
    }
    match io {
        Err(e) => failed(
            FailKind::Truncated,
            format!(
                "{} after {} content bytes: {e}",
                out.status,
                out.content.len()
            ),
        ),
        Ok(()) if out.done || out.prompt_tokens.is_some() => Outcome::Ok,
        Ok(()) => failed(
            FailKind::Truncated,
            format!(
                "{} ended without [DONE] or usage after {} content bytes",
                out.status,
                out.content.len()
            ),
        ),
    }
}

/// At most 200 characters of `s`, on one line.
fn one_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    flat.trim().to_owned()
}

/// The classes of a row's requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Requests sent.
    pub(crate) sent: usize,
    /// Answered in full.
    pub(crate) ok: usize,
    /// Failed (any kind).
    pub(crate) failed: usize,
    /// `ok` and slower than [`SLOW`].
    pub(crate) slow: usize,
    /// Timed out.
    pub(crate) lost: usize,
    /// Failures per kind.
    pub(crate) by_kind: BTreeMap<FailKind, usize>,
}

impl Tally {
    /// Counts one request that took `secs`.
    pub(crate) fn add(&mut self, outcome: &Outcome, secs: f64) {
        self.sent += 1;
        match outcome {
            Outcome::Ok => {
                self.ok += 1;
                if secs > SLOW.as_secs_f64() {
                    self.slow += 1;
                }
            }
            Outcome::Failed { kind, .. } => {
                self.failed += 1;
                *self.by_kind.entry(*kind).or_default() += 1;
            }
            Outcome::Lost(_) => self.lost += 1,
        }
    }

    /// `kind=N, ...`, or `-` without failures.
    pub(crate) fn kinds_text(&self) -> String {
        if self.by_kind.is_empty() {
            return "-".to_owned();
        }
        let parts: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, n)| format!("{}={n}", k.label()))
            .collect();
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(status: u16) -> Streamed {
        Streamed {
            status,
            ..Streamed::default()
        }
    }

    fn err(kind: ErrorKind) -> std::io::Result<()> {
        Err(std::io::Error::new(kind, "x"))
    }

    fn kind(o: &Outcome) -> Option<FailKind> {
        match o {
            Outcome::Failed { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    #[test]
    fn whole_answers_are_ok() {
        let mut s = streamed(200);
        s.done = true;
        assert_eq!(classify(&Ok(()), &s), Outcome::Ok);
        let mut s = streamed(200);
        s.prompt_tokens = Some(10);
        assert_eq!(classify(&Ok(()), &s), Outcome::Ok);
    }

    #[test]
    fn each_failure_has_its_kind() {
        let mut s = streamed(503);
        s.body_head = "{\"error\":\n\"no worker\"}".into();
        let o = classify(&Ok(()), &s);
        assert_eq!(kind(&o), Some(FailKind::Http));
        assert!(
            matches!(&o, Outcome::Failed { detail, .. } if detail == "503 {\"error\": \"no worker\"}")
        );
        let mut s = streamed(200);
        s.done = true;
        s.error_event = Some("{\"error\":{}}".into());
        assert_eq!(kind(&classify(&Ok(()), &s)), Some(FailKind::SseError));
        // An error event then a closed connection is still the clean error.
        assert_eq!(
            kind(&classify(&err(ErrorKind::InvalidData), &s)),
            Some(FailKind::SseError)
        );
        let s = streamed(200);
        assert_eq!(kind(&classify(&Ok(()), &s)), Some(FailKind::Truncated));
        assert_eq!(
            kind(&classify(&err(ErrorKind::InvalidData), &s)),
            Some(FailKind::Truncated)
        );
        assert_eq!(
            kind(&classify(&err(ErrorKind::ConnectionReset), &s)),
            Some(FailKind::Truncated)
        );
        let s = streamed(0);
        assert_eq!(
            kind(&classify(&err(ErrorKind::ConnectionRefused), &s)),
            Some(FailKind::NoResponse)
        );
    }

    #[test]
    fn timeouts_are_lost() {
        for k in [ErrorKind::TimedOut, ErrorKind::WouldBlock] {
            assert!(matches!(
                classify(&err(k), &streamed(0)),
                Outcome::Lost(d) if d.contains("no response head")
            ));
            assert!(matches!(
                classify(&err(k), &streamed(200)),
                Outcome::Lost(d) if d.contains("status 200")
            ));
        }
    }

    #[test]
    fn the_tally() {
        let mut t = Tally::default();
        t.add(&Outcome::Ok, 0.2);
        t.add(&Outcome::Ok, 6.0);
        t.add(&Outcome::Lost("t".into()), 60.0);
        for k in [FailKind::Truncated, FailKind::Http, FailKind::Truncated] {
            t.add(
                &Outcome::Failed {
                    kind: k,
                    detail: String::new(),
                },
                1.0,
            );
        }
        assert_eq!((t.sent, t.ok, t.failed, t.slow, t.lost), (6, 2, 3, 1, 1));
        assert_eq!(t.kinds_text(), "http=1 truncated=2");
        assert_eq!(Tally::default().kinds_text(), "-");
    }
}
