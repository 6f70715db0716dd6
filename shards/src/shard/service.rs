//! The shard's [`Handler`]: which module answers a request. Proxied routes (POST) go to the
//! shard's [`crate::dispatch::Dispatcher`] (503 `draining` once the shard drains); everything
//! else to the local routes ([`crate::admin`]), `POST /admin/dynamo/explain` with the
//! dispatcher's dry run.

use continuum_core::http1::request::Method;
use continuum_core::route::Route;

use super::Service;
use crate::admin;
use crate::dispatch::{ExchangeBufs, Ingress};
use crate::http::respond::{ErrorShape, LocalError};
use crate::http::{Handler, Outcome, ReadLimits, Request, ResponseSink};
use crate::metrics::ShardMetrics;

impl Handler for Service {
    type ConnState = ExchangeBufs;

    fn limits(&self) -> ReadLimits {
        let snap = self.snapshot.borrow();
        let cfg = &snap.config.server;
        ReadLimits {
            max_header_bytes: cfg.max_header_bytes,
            max_headers: cfg.max_headers,
            max_body_bytes: cfg.max_body_bytes,
            header_read_timeout: cfg.header_read_timeout,
            keepalive_timeout: cfg.keepalive_timeout,
            timer_floor: snap.timer_floor(),
        }
    }

    fn draining(&self) -> bool {
        self.drain.is_fired()
    }

    fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    async fn serve(
        &self,
        bufs: &mut ExchangeBufs,
        req: &mut Request,
        sink: &mut ResponseSink,
    ) -> Outcome {
        let snap = self.snapshot();
        let ingress = match req.route {
            Route::ChatCompletions => Some(Ingress::Chat),
            Route::Completions => Some(Ingress::Completions),
            Route::Messages => Some(Ingress::Messages),
            Route::Responses => Some(Ingress::Responses),
            Route::ResponsesCompact => Some(Ingress::ResponsesCompact),
            Route::Embeddings => Some(Ingress::Embeddings),
            _ => None,
        };
        match ingress {
            Some(ingress) if req.head.method == Method::Post => {
                if self.draining() {
                    req.head.keep_alive = false;
                    return sink.local_error(
                        &req.head,
                        ErrorShape::of(req.route),
                        LocalError::Draining,
                    );
                }
                self.dispatch.serve(&snap, req, sink, bufs, ingress).await
            }
            Some(_) => sink.local_error(
                &req.head,
                ErrorShape::of(req.route),
                LocalError::MethodNotAllowed,
            ),
            #[cfg(feature = "dynamo")]
            None if req.route == Route::AdminDynamoExplain => {
                admin::explain(&snap, &self.dispatch, req, sink, bufs)
            }
            None => admin::serve(
                admin::Views {
                    snap: &snap,
                    metrics: &self.all_metrics,
                    control: &self.control,
                    signals: &self.signals,
                },
                req,
                sink,
            ),
        }
    }
}
