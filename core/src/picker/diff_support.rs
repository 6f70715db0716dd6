//! What both pickers' differential tests (`diff_tests`, `kv_diff_tests`) share: the clock and
//! namespaces of their generated fleets, a pick in comparable form, and a worker's declared
//! ranks as the spec reads them. Each test keeps its own reference picker and generators.

use crate::discovery::Worker;

use super::{Chosen, Pick};

/// The pick time of every generated case, in milliseconds.
pub(crate) const NOW_MS: u64 = 100_000;
/// The namespaces of the generated fleets.
pub(crate) const NAMESPACES: [&str; 3] = ["a", "b", "c"];

/// What a picker (or a reference) chose, in comparable form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) namespace: String,
    pub(crate) decode: (u64, u32, &'static str),
    pub(crate) prefill: Option<(u64, u32, &'static str)>,
    pub(crate) prefill_event: &'static str,
    pub(crate) headers: (Option<u32>, Option<u32>),
    /// The KV outcome `(overlap_blocks, block_size)`; `None` for a load-only pick.
    pub(crate) kv: Option<(u32, u32)>,
}

/// `p` in comparable form.
pub(crate) fn outcome_of(p: &Pick<'_>) -> Outcome {
    let c = |c: Chosen| (c.instance_id.get(), c.dp_rank, c.reason.label());
    Outcome {
        namespace: p.namespace.to_owned(),
        decode: c(p.decode),
        prefill: p.prefill.map(c),
        prefill_event: p.events()[1].reason.label(),
        headers: (
            p.dp_rank_headers.decode_rank,
            p.dp_rank_headers.prefill_rank,
        ),
        kv: p.kv.map(|k| (k.overlap_blocks, k.block_size)),
    }
}

/// The ranks `w` declares (PICK-04), those that fit a `u32`.
pub(crate) fn ranks(w: &Worker) -> Vec<u32> {
    let start = u64::from(w.dp_start_rank.unwrap_or(0));
    let size = u64::from(w.dp_size.unwrap_or(1).max(1));
    (start..start + size)
        .filter_map(|r| u32::try_from(r).ok())
        .collect()
}
