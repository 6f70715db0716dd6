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
    /// `POST /v1/messages`, `POST /anthropic/v1/messages` (Anthropic Messages)
    Messages,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/responses/compact` (never pinned, INGRESS-08)
    ResponsesCompact,
    /// `GET /v1/models`
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

impl Route {
    /// Every route, in discriminant order.
    pub const ALL: [Route; 11] = [
        Route::ChatCompletions,
        Route::Messages,
        Route::Responses,
        Route::ResponsesCompact,
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
        let path = target.split(|b| *b == b'?').next().unwrap_or(target);
        match path {
            b"/v1/chat/completions" => Route::ChatCompletions,
            b"/v1/messages" | b"/anthropic/v1/messages" => Route::Messages,
            b"/v1/responses" => Route::Responses,
            b"/v1/responses/compact" => Route::ResponsesCompact,
            b"/v1/models" => Route::Models,
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
            Route::ChatCompletions | Route::Messages | Route::Responses | Route::ResponsesCompact
        )
    }

    /// The `route` label.
    pub fn label(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Messages => "messages",
            Route::Responses => "responses",
            Route::ResponsesCompact => "responses_compact",
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
