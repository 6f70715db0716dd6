//! Sans-IO pieces of HTTP/1.1 shared by the data plane: the request-head parser and the chunked
//! transfer-coding decoder. Bytes in, facts out; no buffers of their own beyond a reused span
//! vector, so hostile peers cannot make them grow. Both are fuzzed (`fuzz/`).

pub mod chunked;
pub mod request;
