//! The client-facing routes the router serves, and their `route` metric label.
//!
//! Role: classify a request path (query string ignored) into a closed [`Route`] set. The data
//! plane dispatches on it and counts `continuum_http_requests_total{route,status}` with its
//! label, so the label set never depends on client input.
//!
//! Invariant: [`Route::ALL`] lists every variant once, in discriminant order (metric cells are
//! indexed by `route as usize`).

/// Client-facing routes, the `route` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/messages`, `POST /anthropic/v1/messages` (Anthropic Messages)
    Messages,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/responses/compact` (never pinned, INGRESS-08)
    ResponsesCompact,
    /// `POST /v1/embeddings` (plain model routing, never pinned)
    Embeddings,
    /// `GET /v1/models`, `GET /v1/models/{id}`
    Models,
    /// `GET /health`
    Health,
    /// `GET /metrics`
    Metrics,
    /// `GET /admin/config`
    AdminConfig,
    /// `GET /admin/dynamo/workers` (served only by builds with Dynamo discovery)
    AdminDynamoWorkers,
    /// `POST /admin/dynamo/explain` (served only by builds with Dynamo discovery)
    AdminDynamoExplain,
    /// Anything else (404/405, and requests rejected before routing).
    Other,
}

/// The path of a request target: the target without its query string.
pub fn path_of(target: &[u8]) -> &[u8] {
    target.split(|b| *b == b'?').next().unwrap_or(target)
}

/// The path prefix of `GET /v1/models/{id}`.
const MODEL_PREFIX: &[u8] = b"/v1/models/";

/// The model id a `GET /v1/models/{id}` target names: the rest of the path (query string
/// ignored), percent-decoded, since SDKs differ on escaping the `/` of ids such as
/// `Qwen/Qwen3-32B`. `None` for another path, an empty id, a malformed escape or an id that is
/// not UTF-8.
pub fn model_id(target: &[u8]) -> Option<String> {
    let raw = path_of(target).strip_prefix(MODEL_PREFIX)?;
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = |c: Option<&u8>| c.and_then(|c| char::from(*c).to_digit(16));
        let (hi, lo) = (hex(bytes.next())?, hex(bytes.next())?);
        out.push(u8::try_from(hi * 16 + lo).ok()?);
    }
    if out.is_empty() {
        return None;
    }
    String::from_utf8(out).ok()
}

impl Route {
    /// Every route, in discriminant order.
    pub const ALL: [Route; 13] = [
        Route::ChatCompletions,
        Route::Completions,
        Route::Messages,
        Route::Responses,
        Route::ResponsesCompact,
        Route::Embeddings,
        Route::Models,
        Route::Health,
        Route::Metrics,
        Route::AdminConfig,
        Route::AdminDynamoWorkers,
        Route::AdminDynamoExplain,
        Route::Other,
    ];

    /// The route of a request target (`path`, with or without a query string).
    pub fn classify(target: &[u8]) -> Route {
        match path_of(target) {
            b"/v1/chat/completions" => Route::ChatCompletions,
            b"/v1/completions" => Route::Completions,
            b"/v1/messages" | b"/anthropic/v1/messages" => Route::Messages,
            b"/v1/responses" => Route::Responses,
            b"/v1/responses/compact" => Route::ResponsesCompact,
            b"/v1/embeddings" => Route::Embeddings,
            b"/v1/models" => Route::Models,
            p if p.starts_with(MODEL_PREFIX) => Route::Models,
            b"/health" => Route::Health,
            b"/metrics" => Route::Metrics,
            b"/admin/config" => Route::AdminConfig,
            b"/admin/dynamo/workers" => Route::AdminDynamoWorkers,
            b"/admin/dynamo/explain" => Route::AdminDynamoExplain,
            _ => Route::Other,
        }
    }

    /// Whether requests on this route are proxied to a backend (and cancelled when the client
    /// leaves).
    pub fn is_proxied(self) -> bool {
        matches!(
            self,
            Route::ChatCompletions
                | Route::Completions
                | Route::Messages
                | Route::Responses
                | Route::ResponsesCompact
                | Route::Embeddings
        )
    }

    /// The `route` label.
    pub fn label(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
            Route::Messages => "messages",
            Route::Responses => "responses",
            Route::ResponsesCompact => "responses_compact",
            Route::Embeddings => "embeddings",
            Route::Models => "models",
            Route::Health => "health",
            Route::Metrics => "metrics",
            Route::AdminConfig => "admin_config",
            Route::AdminDynamoWorkers => "admin_dynamo_workers",
            Route::AdminDynamoExplain => "admin_dynamo_explain",
            Route::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_path_names_its_id_percent_decoded() {
        assert_eq!(Route::classify(b"/v1/models/x"), Route::Models);
        assert_eq!(Route::classify(b"/v1/modelsx"), Route::Other);
        assert_eq!(
            model_id(b"/v1/models/tiny-agg").as_deref(),
            Some("tiny-agg")
        );
        assert_eq!(
            model_id(b"/v1/models/Qwen/Qwen3-32B?x=1").as_deref(),
            Some("Qwen/Qwen3-32B")
        );
        assert_eq!(
            model_id(b"/v1/models/Qwen%2fQwen3-32B").as_deref(),
            Some("Qwen/Qwen3-32B")
        );
        assert_eq!(
            model_id(b"/v1/models/caf%C3%A9").as_deref(),
            Some("caf\u{e9}")
        );
        for bad in [
            &b"/v1/models/"[..],
            b"/v1/models",
            b"/v1/models/%",
            b"/v1/models/%4",
            b"/v1/models/%zz",
            b"/v1/models/%ff",
            b"/other/x",
        ] {
            assert_eq!(model_id(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn all_is_in_discriminant_order() {
        for (i, r) in Route::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }

    #[test]
    fn classify_ignores_the_query_and_knows_both_messages_paths() {
        assert_eq!(
            Route::classify(b"/v1/chat/completions?x=1"),
            Route::ChatCompletions
        );
        assert_eq!(Route::classify(b"/anthropic/v1/messages"), Route::Messages);
        assert_eq!(Route::classify(b"/v1/messages"), Route::Messages);
        assert_eq!(
            Route::classify(b"/v1/completions?stream=1"),
            Route::Completions
        );
        assert!(Route::Completions.is_proxied());
        assert_eq!(
            Route::classify(b"/v1/responses/compact"),
            Route::ResponsesCompact
        );
        assert_eq!(Route::classify(b"/v1/chat/completions/"), Route::Other);
        assert_eq!(
            Route::classify(b"/admin/dynamo/explain?format=messages"),
            Route::AdminDynamoExplain
        );
        assert_eq!(Route::classify(b""), Route::Other);
        assert!(Route::Responses.is_proxied() && !Route::Health.is_proxied());
    }
}
