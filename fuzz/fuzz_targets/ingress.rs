//! Fuzz the ingress converters (`continuum_core::ingress`) on hostile bytes: client bodies
//! (Anthropic Messages, Responses, native Responses passthrough) and upstream chat answers
//! (buffered JSON, and SSE streams split at arbitrary points).
//!
//! Input layout: 1 byte selecting the converter and the split point, then the bytes.
//!
//! Asserts, beyond "does not panic":
//! - a converted client body is a JSON object whose `model` is the client's, and carries no
//!   `nvext` (so no `token_data`) and no top-level pin field;
//! - the passthrough body, when nothing was removed, is the client's bytes unchanged; otherwise
//!   it parses and carries no pin field or `nvext.token_data`;
//! - a streaming converter produces the same bytes whatever the split of its input, and after
//!   `fail` it is done.
#![no_main]

use continuum_core::ingress::anthropic_req::{AnthropicContext, anthropic_to_chat};
use continuum_core::ingress::anthropic_resp::chat_to_anthropic;
use continuum_core::ingress::anthropic_stream::AnthropicStream;
use continuum_core::ingress::errors::{ClassifiedError, ErrorClass};
use continuum_core::ingress::responses::{ResponsesContext, chat_to_responses, responses_to_chat};
use continuum_core::ingress::responses_stream::ResponsesStream;
use continuum_core::ingress::sanitize::{TOP_LEVEL_STRIPPED, responses_passthrough};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn no_pins(chat: &Value) {
    assert!(chat.is_object(), "converted body is not an object");
    for k in TOP_LEVEL_STRIPPED {
        assert!(chat.get(*k).is_none(), "pin field {k} survived");
    }
    assert!(
        chat.pointer("/nvext/token_data").is_none(),
        "token_data survived"
    );
}

fn client_model(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get("model")?
        .as_str()
        .map(str::to_owned)
}

/// Feed `bytes` whole and split at `cut`; both must give the same output.
fn stream_both<S>(mut make: impl FnMut() -> S, bytes: &[u8], cut: usize)
where
    S: StreamLike,
{
    let mut whole = make();
    let a = whole.feed_all(&[bytes]);
    let cut = cut.min(bytes.len());
    let mut split = make();
    let b = split.feed_all(&[&bytes[..cut], &bytes[cut..]]);
    assert_eq!(a, b, "output depends on the split");
    let err = ClassifiedError::new(ErrorClass::UpstreamProtocol, "fuzz");
    let _ = whole.fail_now(&err);
    assert!(whole.done(), "not done after fail");
}

trait StreamLike {
    fn feed_all(&mut self, parts: &[&[u8]]) -> Vec<u8>;
    fn fail_now(&mut self, err: &ClassifiedError) -> Vec<u8>;
    fn done(&self) -> bool;
}

macro_rules! stream_like {
    ($t:ty) => {
        impl StreamLike for $t {
            fn feed_all(&mut self, parts: &[&[u8]]) -> Vec<u8> {
                let mut out = Vec::new();
                for p in parts {
                    match self.feed(p) {
                        Ok(b) => out.extend(b),
                        Err(e) => {
                            out.extend(self.fail(&ClassifiedError::from(&e)));
                            return out;
                        }
                    }
                }
                match self.finish() {
                    Ok(b) => out.extend(b),
                    Err(e) => out.extend(self.fail(&ClassifiedError::from(&e))),
                }
                out
            }
            fn fail_now(&mut self, err: &ClassifiedError) -> Vec<u8> {
                self.fail(err)
            }
            fn done(&self) -> bool {
                self.is_done()
            }
        }
    };
}

stream_like!(AnthropicStream);
stream_like!(ResponsesStream);

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let cut = usize::from(sel >> 3) * 16;
    match sel % 7 {
        0 => {
            if let Ok(conv) = anthropic_to_chat(bytes) {
                no_pins(&conv.chat);
                assert_eq!(
                    conv.chat.get("model").and_then(Value::as_str).map(str::to_owned),
                    client_model(bytes),
                    "model changed"
                );
            }
        }
        1 => {
            if let Ok(conv) = responses_to_chat(bytes) {
                no_pins(&conv.chat);
                assert_eq!(
                    conv.chat.get("model").and_then(Value::as_str).map(str::to_owned),
                    client_model(bytes),
                    "model changed"
                );
            }
        }
        2 => {
            if let Ok(p) = responses_passthrough(bytes) {
                if p.removed {
                    let v: Value = serde_json::from_slice(&p.body).expect("re-serialised body");
                    no_pins(&v);
                } else {
                    assert_eq!(p.body, bytes, "unchanged body was rewritten");
                }
            }
        }
        3 => {
            let _ = chat_to_anthropic(bytes, &AnthropicContext::default());
        }
        4 => {
            let _ = chat_to_responses(bytes, &ResponsesContext::default());
        }
        5 => stream_both(
            || AnthropicStream::with_cap(AnthropicContext::default(), 4096),
            bytes,
            cut,
        ),
        _ => stream_both(
            || ResponsesStream::with_cap(ResponsesContext::default(), 4096),
            bytes,
            cut,
        ),
    }
});
