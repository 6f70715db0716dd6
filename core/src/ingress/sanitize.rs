//! Removal of client-sent pinning and token fields from request bodies.
//!
//! Role: KV-PICK-11 and INGRESS-04 require that a client-sent `nvext.token_data` never reaches a
//! shim; Q-38 adds the body fields upstream Dynamo frontends honour for worker pinning. Both are
//! removed here, from any chat or Responses body, before the router writes its own pin.
//!
//! Invariants: only the listed keys are touched; an `nvext` object left empty is removed too
//! (so a body that only carried pins becomes identical to one that never did); the functions
//! report whether anything was removed.

use serde_json::{Map, Value};

use super::{IngressError, parse_object, to_bytes};

/// Keys removed from the `nvext` object.
pub const NVEXT_STRIPPED: &[&str] = &[
    "token_data",
    "backend_instance_id",
    "decode_worker_id",
    "prefill_worker_id",
    "dp_rank",
    "prefill_dp_rank",
];

/// Pin-like keys also removed at the top level of the body (Q-38 names them without a prefix;
/// none is an OpenAI or Anthropic field, so removing them there is harmless).
pub const TOP_LEVEL_STRIPPED: &[&str] = &[
    "backend_instance_id",
    "decode_worker_id",
    "prefill_worker_id",
    "dp_rank",
    "prefill_dp_rank",
];

/// Removes client `nvext.token_data` and pin fields from a body object. Returns whether
/// anything was removed.
pub fn strip_client_pins(body: &mut Map<String, Value>) -> bool {
    let mut removed = false;
    for k in TOP_LEVEL_STRIPPED {
        removed |= body.remove(*k).is_some();
    }
    let mut drop_nvext = false;
    if let Some(Value::Object(nv)) = body.get_mut("nvext") {
        for k in NVEXT_STRIPPED {
            removed |= nv.remove(*k).is_some();
        }
        drop_nvext = removed && nv.is_empty();
    }
    if drop_nvext {
        body.remove("nvext");
    }
    removed
}

/// [`strip_client_pins`] over a `Value`; a non-object is left alone.
pub fn strip_client_pins_value(body: &mut Value) -> bool {
    match body {
        Value::Object(m) => strip_client_pins(m),
        _ => false,
    }
}

/// A `/v1/responses` body ready for native passthrough (INGRESS-05).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passthrough {
    /// The body to send: the client's bytes unchanged when nothing was removed.
    pub body: Vec<u8>,
    /// The `model` to pick workers from.
    pub model: String,
    /// Whether any client field was removed.
    pub removed: bool,
}

/// Prepares a native `/v1/responses` passthrough: removes `nvext.token_data` (and the pin
/// fields) and returns the model name for pinning. The bytes are untouched if nothing was
/// removed.
pub fn responses_passthrough(body: &[u8]) -> Result<Passthrough, IngressError> {
    let mut obj = parse_object(body)?;
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(IngressError::InvalidRequest(
                "`model` must be a non-empty string".into(),
            ));
        }
    };
    let removed = strip_client_pins(&mut obj);
    let body = if removed {
        to_bytes(&Value::Object(obj))
    } else {
        body.to_vec()
    };
    Ok(Passthrough {
        body,
        model,
        removed,
    })
}
