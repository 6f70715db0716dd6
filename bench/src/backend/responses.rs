//! The backend's canned responses, rendered once at startup.
//!
//! Invariant: every response is a complete HTTP/1.1 message framed by
//! `Content-Length`, so keep-alive clients (nginx, the router, wrk) can
//! reuse the connection.

use super::parse::Route;

/// The chat completion body, ~300 bytes, as an OpenAI server would send it.
const CHAT_BODY: &str = concat!(
    r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"#,
    r#""model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","#,
    r#""content":"Hello from the continuum bench backend."},"logprobs":null,"#,
    r#""finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":8,"#,
    r#""total_tokens":17}}"#
);

const MODELS_BODY: &str = concat!(
    r#"{"object":"list","data":[{"id":"bench-model","object":"model","#,
    r#""created":1700000000,"owned_by":"continuum-bench"}]}"#
);

const HEALTH_BODY: &str = r#"{"status":"ok"}"#;

/// All canned responses, leaked so they can be written without copying.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Responses {
    chat: &'static [u8],
    models: &'static [u8],
    health: &'static [u8],
    not_found: &'static [u8],
}

impl Responses {
    /// Renders every response once; the memory lives for the process.
    pub(crate) fn leak() -> Self {
        Self {
            chat: leak(json("200 OK", CHAT_BODY)),
            models: leak(json("200 OK", MODELS_BODY)),
            health: leak(json("200 OK", HEALTH_BODY)),
            not_found: leak(json("404 Not Found", r#"{"error":"not found"}"#)),
        }
    }

    /// The bytes to send for `route`.
    pub(crate) fn for_route(&self, route: Route) -> &'static [u8] {
        match route {
            Route::Chat => self.chat,
            Route::Models => self.models,
            Route::Health => self.health,
            Route::NotFound => self.not_found,
        }
    }
}

fn json(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn leak(s: String) -> &'static [u8] {
    Box::leak(s.into_bytes().into_boxed_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_body_is_small_and_framed() {
        let r = Responses::leak();
        let chat = std::str::from_utf8(r.for_route(Route::Chat)).unwrap();
        assert!((250..400).contains(&CHAT_BODY.len()), "{}", CHAT_BODY.len());
        assert!(chat.contains(&format!("Content-Length: {}\r\n", CHAT_BODY.len())));
        assert!(chat.ends_with(CHAT_BODY));
    }
}
