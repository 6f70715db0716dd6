//! Sans-IO pieces of HTTP/1.1 framing shared by the data plane: the chunked transfer-coding
//! decoder. Bytes in, events out; no buffers of its own, so hostile peers cannot make it grow.

pub mod chunked;
