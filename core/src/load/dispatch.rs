//! Unanswered-dispatch accounting (LOAD-STORE-10) and the stall judgement's input
//! (LOAD-STORE-11/12, Q-28).
//!
//! Role: each shard owns one [`DispatchLedger`] (`&mut`, shard-local, exact) recording the
//! requests it dispatched; the ledger publishes one summary per key into its own
//! [`InflightTable`] (seqlock cells, single writer: that shard). Pickers on every shard read all
//! shards' tables through an [`InflightReader`] and sum them, so a quiet worker is filled only up
//! to the others' load whichever shards dispatch to it.
//!
//! A dispatch at `t` counts for its key until a sample of that key is received strictly after `t`
//! or until `t + 30 s`. Per key, dispatch times are ordered (one shard clock), so both ends
//! remove a *prefix* of the key's records; the ledger keeps per-key sums and prunes prefixes.
//!
//! Finished requests (beyond the spec; docs/decisions.md): a dispatch that a sample has answered
//! is kept, uncounted, until it finishes; when it finishes it becomes a **credit** of its key: the
//! worker's last sample was taken while the request was in flight, so until the worker's next
//! sample the router subtracts the finished request's tokens and blocks from that sample
//! ([`Finished`], applied by [`super::rules::KeyLoad`]). Measured on real 1.6.1 mockers: a worker
//! publishes its idle sample ~2 ms after the client has the last byte, so a conversation's next
//! turn, sent at once, found its own finished turn still counted against the worker holding its
//! prefix and moved away. A credit counts while no sample of the key was received after the
//! (latest) finish (one at the very instant of the finish counts as after it); an answered record
//! that never finishes leaves at the 30 s expiry.
//!
//! Running requests (beyond the spec; docs/decisions.md): the blocks of answered, unfinished
//! dispatches are a **floor** under the worker's block figures. Real 1.6.1 mockers publish a
//! sample as a request arrives, before it is scheduled: that sample answers the dispatch while
//! showing none of its blocks, so eight simultaneous first turns were spread 3/2/2/1 instead of
//! 2/2/2/2. The floor is what the router itself still has running there; a sample showing more
//! (another router's requests) wins. Prompt tokens get no floor (the router does not see a
//! request's prefill end).
//!
//! Summary words: `[epoch, sums, newest_t, earliest_eligible_t, latest_eligible_t, credits,
//! credit_t, running]` (times in ns, `u64::MAX` = none; `sums`, `credits` and `running` pack
//! prefill tokens in the high and blocks in the low 32 bits, each saturating at `u32::MAX`). A
//! reader applies the corrections the writer has not yet made: every record answered (a receipt
//! after `newest_t`) counts as running instead of unanswered, every record expired (`newest_t +
//! 30 s <= now`) counts zero, and credits count zero once a receipt is at or after `credit_t`.
//!
//! Invariants:
//! - right after [`DispatchLedger::refresh`] the published summary is exact for that `now` (sums
//!   and stall); between refreshes a reader may over-count partially answered or expired records
//!   and may miss a stall whose record is neither the earliest nor the latest eligible one, and
//!   counts records answered since (those finished unanswered included) as running — the shard
//!   refreshes before each pick and on its housekeeping tick, which bounds that window;
//! - `dispatch` and `finish` allocate only when a key gets its first record on this shard or the
//!   shard holds more records than ever before (every key's records share one pool of list
//!   nodes, `super::records`); a [`DispatchId`] names its record's node and counts only while
//!   that node holds the id's sequence number; at most [`MAX_RECORDS_PER_KEY`] records are kept per key (a further
//!   dispatch is merged into the newest unanswered record, which over-counts rather than
//!   under-counts, and a merged record is never credited or marked finished, so finishing one of
//!   its dispatches cannot take the others' load away; when every kept record is answered, the
//!   oldest is dropped with its floor);
//! - a summary names its slot epoch: after a worker departs and its slot is reused, stale
//!   summaries read as zero.

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::Instant;

use super::records::{List, ListPool, NodeIx};
use super::seqcell::{SeqTable, Stamps};
use super::store::{KeyRead, LoadView, SlotRef};
use super::{DISPATCH_TTL, LoadKey, STALL_AFTER, STALL_MIN_BLOCKS, duration_nanos, nanos};

/// Records kept per key per shard.
pub const MAX_RECORDS_PER_KEY: usize = 4096;

const NONE: u64 = u64::MAX;
const WORDS: usize = 8;

/// `(high, low)` in one word, each saturated at `u32::MAX`.
fn pack(high: u64, low: u64) -> u64 {
    high.min(u64::from(u32::MAX)) << 32 | low.min(u64::from(u32::MAX))
}

fn unpack(w: u64) -> (u64, u64) {
    (w >> 32, w & u64::from(u32::MAX))
}

/// `ceil(prompt_tokens / block_size)`, the request size in blocks (PICK-01, Q-28); `None` without
/// a usable block size.
pub fn request_blocks(prompt_tokens: u64, block_size: Option<u32>) -> Option<u64> {
    let bs = u64::from(block_size.filter(|b| *b > 0)?);
    Some(prompt_tokens.div_ceil(bs))
}

/// Which side of a request a dispatch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchRole {
    /// An aggregated worker: it prefills and decodes.
    Aggregated,
    /// The prefill worker of a prefill/decode pair.
    PairPrefill,
    /// The decode worker of a pair: reached only after prefill, so never stall-eligible
    /// (LOAD-STORE-12).
    PairDecode,
}

/// What one dispatch adds to its key's backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchLoad {
    /// Added to the prefill backlog (prompt tokens).
    pub prefill_tokens: u64,
    /// Added to the decode backlog (blocks).
    pub decode_blocks: u64,
    /// Counts for the stall judgement (≥ 2 blocks, not the decode side of a pair).
    pub stall_eligible: bool,
}

impl DispatchLoad {
    /// The load of one request: prompt tokens go to a prefilling worker, blocks to a decoding
    /// one (LOAD-STORE-10); stall-eligible when `request_blocks >= 2` and not [`DispatchRole::
    /// PairDecode`] (LOAD-STORE-11/12, Q-28). Without a block size the request adds no blocks and
    /// is not eligible.
    pub fn for_role(role: DispatchRole, prompt_tokens: u64, block_size: Option<u32>) -> Self {
        let blocks = request_blocks(prompt_tokens, block_size);
        let eligible = blocks.is_some_and(|b| b >= STALL_MIN_BLOCKS);
        let blocks = blocks.unwrap_or(0);
        match role {
            DispatchRole::Aggregated => Self {
                prefill_tokens: prompt_tokens,
                decode_blocks: blocks,
                stall_eligible: eligible,
            },
            DispatchRole::PairPrefill => Self {
                prefill_tokens: prompt_tokens,
                decode_blocks: 0,
                stall_eligible: eligible,
            },
            DispatchRole::PairDecode => Self {
                prefill_tokens: 0,
                decode_blocks: blocks,
                stall_eligible: false,
            },
        }
    }
}

/// Handle of one recorded dispatch, for [`DispatchLedger::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchId {
    slot: SlotRef,
    seq: u64,
    /// The record's node in the ledger's pool (found there only while its `seq` matches).
    node: NodeIx,
}

impl DispatchId {
    /// This dispatch's number, unique within its ledger (the replicas' gossip names a dispatch
    /// by it).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// The summed in-flight additions of one key and its stall judgement input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inflight {
    /// Unanswered prompt tokens (prefill backlog addition).
    pub prefill_tokens: u64,
    /// Unanswered blocks (decode backlog addition).
    pub decode_blocks: u64,
    /// An eligible, unfinished, unanswered dispatch is between 5 s and 30 s old (LOAD-STORE-11).
    pub stalled: bool,
}

/// Request sizes summed over shards: what finished on a key since the worker's last sample
/// (subtracted from that sample), or what is still running there after a sample answered it (a
/// floor under the sample's blocks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finished {
    /// Prompt tokens of finished requests (off `active_prefill_tokens`).
    pub prefill_tokens: u64,
    /// Blocks of finished requests (off `active_decode_blocks` and `kv_used_blocks`).
    pub decode_blocks: u64,
}

impl Finished {
    fn add(&mut self, (prefill, decode): (u64, u64)) {
        self.prefill_tokens = self.prefill_tokens.saturating_add(prefill);
        self.decode_blocks = self.decode_blocks.saturating_add(decode);
    }
}

/// Everything the ledgers say about one key (see [`InflightReader::summary_slot`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Unanswered additions and the stall input.
    pub inflight: Inflight,
    /// Finished since the worker's last sample (credits).
    pub finished: Finished,
    /// Answered and still running (the floor under the sample's blocks).
    pub running: Finished,
}

/// One shard's published per-key summaries (single writer: that shard's ledger).
#[derive(Debug)]
pub struct InflightTable {
    cells: SeqTable<WORDS>,
}

#[derive(Debug)]
struct Record {
    t: u64,
    /// Answered by a sample: in the key's answered prefix, running, out of the sums.
    answered: bool,
    seq: u64,
    prefill: u64,
    decode: u64,
    eligible: bool,
    /// Finished while unanswered: it leaves when answered instead of running on.
    finished: bool,
    /// Holds more than one dispatch (the key was at [`MAX_RECORDS_PER_KEY`]): only the newest
    /// one's id finds it, and finishing that one must not take the others' load with it, so a
    /// merged record is never credited nor marked finished; it leaves at its expiry.
    merged: bool,
}

#[derive(Debug)]
struct SlotLedger {
    epoch: u64,
    /// Ordered by time, in the ledger's pool; a prefix of them is answered (kept only to be
    /// credited when they finish, not in the sums), `unanswered` is the first of the others.
    records: List,
    unanswered: Option<NodeIx>,
    prefill: u64,
    decode: u64,
    /// Credits of finished answered records, and the latest of their finish times.
    credit: Finished,
    credit_t: u64,
    /// The sums of the answered (running) records.
    running: Finished,
    published: [u64; WORDS],
    /// The store cell's stamp loaded before the read of the last prune (`None`: none yet).
    /// While the stamp is unchanged and no record has reached its expiry, a prune changes
    /// nothing, so [`DispatchLedger::refresh`] skips the entry.
    pruned_at_stamp: Option<u32>,
}

impl SlotLedger {
    fn new(epoch: u64) -> Self {
        Self {
            epoch,
            records: List::new(),
            unanswered: None,
            prefill: 0,
            decode: 0,
            credit: Finished::default(),
            credit_t: NONE,
            running: Finished::default(),
            published: [0; WORDS],
            pruned_at_stamp: None,
        }
    }

    fn reset(&mut self, pool: &mut ListPool<Record>, epoch: u64) {
        self.epoch = epoch;
        pool.clear(&mut self.records);
        self.unanswered = None;
        self.prefill = 0;
        self.decode = 0;
        self.credit = Finished::default();
        self.credit_t = NONE;
        self.running = Finished::default();
        self.pruned_at_stamp = None;
    }

    /// Whether a prune at `now` after a read at store stamp `stamp` could change anything: the
    /// cell was written since the last prune, or the oldest record has reached its expiry.
    fn prune_due(&self, pool: &ListPool<Record>, stamp: u32, now: u64) -> bool {
        self.pruned_at_stamp != Some(stamp)
            || self
                .records
                .front()
                .and_then(|at| pool.get(at))
                .is_some_and(|r| r.t.saturating_add(ttl_ns()) <= now)
    }

    /// Unlinks record `at`, moving the first-unanswered mark past it.
    fn unlink(&mut self, pool: &mut ListPool<Record>, at: NodeIx) -> Option<Record> {
        if self.unanswered == Some(at) {
            self.unanswered = pool.next(at);
        }
        pool.remove(&mut self.records, at)
    }

    /// Appends a record (the newest, so unanswered).
    fn push(&mut self, pool: &mut ListPool<Record>, record: Record) -> Option<NodeIx> {
        let at = pool.push_back(&mut self.records, record)?;
        self.unanswered.get_or_insert(at);
        Some(at)
    }

    /// Takes an answered record's size off the running sums.
    fn stop_running(&mut self, r: &Record) {
        self.running.prefill_tokens = self.running.prefill_tokens.saturating_sub(r.prefill);
        self.running.decode_blocks = self.running.decode_blocks.saturating_sub(r.decode);
    }

    /// Whether nothing is left to publish.
    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.credit_t == NONE
    }
}

/// One shard's exact dispatch records (module docs: `super`).
#[derive(Debug)]
pub struct DispatchLedger {
    table: Arc<InflightTable>,
    slots: HashMap<u32, SlotLedger>,
    /// Every key's records (`super::records`: the ledger allocates only past its total peak).
    pool: ListPool<Record>,
    next_seq: u64,
}

impl Default for DispatchLedger {
    fn default() -> Self {
        Self::new()
    }
}

fn ttl_ns() -> u64 {
    duration_nanos(DISPATCH_TTL)
}

impl DispatchLedger {
    /// An empty ledger with its own table.
    pub fn new() -> Self {
        Self {
            table: Arc::new(InflightTable {
                cells: SeqTable::new(),
            }),
            slots: HashMap::new(),
            pool: ListPool::new(),
            next_seq: 0,
        }
    }

    /// The table pickers on other shards read; register it once with every shard.
    pub fn table(&self) -> Arc<InflightTable> {
        Arc::clone(&self.table)
    }

    /// Records a dispatch to `key` at `now`. `None` (nothing recorded) if the key has no cell
    /// (not live, or over the cap).
    pub fn dispatch(
        &mut self,
        view: &LoadView<'_>,
        key: LoadKey,
        load: DispatchLoad,
        now: Instant,
    ) -> Option<DispatchId> {
        let slot = view.slot(key).ok()?;
        let stamp = view.stamp(slot.slot);
        let read = view.read_slot_checked(slot)?;
        let seq = self.next_seq;
        self.next_seq = seq.wrapping_add(1);
        let t = nanos(now);
        let pool = &mut self.pool;
        let entry = self
            .slots
            .entry(slot.slot)
            .or_insert_with(|| SlotLedger::new(slot.epoch));
        if entry.epoch != slot.epoch {
            entry.reset(pool, slot.epoch);
        }
        entry.prune(pool, &read, t, stamp);
        let mut full = entry.records.len() >= MAX_RECORDS_PER_KEY;
        if full && entry.unanswered.is_none() {
            // Every kept record is answered: the oldest gives up its floor and future credit.
            if let Some(r) = entry.records.front().and_then(|at| entry.unlink(pool, at)) {
                entry.stop_running(&r);
            }
            full = false;
        }
        let last = entry.records.back().filter(|_| full);
        let node = match last.and_then(|at| Some((at, pool.get_mut(at)?))) {
            Some((at, last)) => {
                last.t = last.t.max(t);
                last.seq = seq;
                last.prefill = last.prefill.saturating_add(load.prefill_tokens);
                last.decode = last.decode.saturating_add(load.decode_blocks);
                last.eligible |= load.stall_eligible;
                last.merged = true;
                at
            }
            None => entry.push(
                pool,
                Record {
                    t,
                    answered: false,
                    seq,
                    prefill: load.prefill_tokens,
                    decode: load.decode_blocks,
                    eligible: load.stall_eligible,
                    finished: false,
                    merged: false,
                },
            )?,
        };
        entry.prefill = entry.prefill.saturating_add(load.prefill_tokens);
        entry.decode = entry.decode.saturating_add(load.decode_blocks);
        entry.publish(pool, &self.table, slot.slot);
        Some(DispatchId { slot, seq, node })
    }

    /// Marks a dispatch finished (completed, rejected, failed or cancelled) at `now`. An
    /// unanswered one leaves the stall judgement but keeps counting as backlog until answered or
    /// expired (LOAD-STORE-10/12); an answered one becomes a credit of its key (module docs).
    pub fn finish(&mut self, view: &LoadView<'_>, id: DispatchId, now: Instant) {
        let Some(entry) = self.slots.get_mut(&id.slot.slot) else {
            return;
        };
        if entry.epoch != id.slot.epoch {
            return;
        }
        let stamp = view.stamp(id.slot.slot);
        let Some(read) = view.read_slot_checked(id.slot) else {
            return;
        };
        let t = nanos(now);
        let pool = &mut self.pool;
        entry.prune(pool, &read, t, stamp);
        // The record is still there while its node holds the id's sequence number (sequence
        // numbers are unique per ledger; a merged record took its newest dispatch's).
        match pool.get_mut(id.node).filter(|r| r.seq == id.seq) {
            Some(r) if r.answered && !r.merged => {
                if let Some(r) = entry.unlink(pool, id.node) {
                    entry.stop_running(&r);
                    entry.credit.add((r.prefill, r.decode));
                    entry.credit_t = t;
                }
            }
            Some(r) => {
                r.eligible = false;
                r.finished |= !r.merged;
            }
            None => {}
        }
        entry.publish(pool, &self.table, id.slot.slot);
    }

    /// Drops answered and expired records of every key, forgets departed keys and republishes
    /// changed summaries. Call before each pick and on the shard's housekeeping tick.
    pub fn refresh(&mut self, view: &LoadView<'_>, now: Instant) {
        let t = nanos(now);
        let table = &self.table;
        let pool = &mut self.pool;
        self.slots.retain(|slot, entry| {
            let stamp = view.stamp(*slot);
            if !entry.prune_due(pool, stamp, t) {
                // Nothing to prune, and the summary was published by the last prune's caller.
                return true;
            }
            let read = view.read_slot_checked(SlotRef {
                slot: *slot,
                epoch: entry.epoch,
            });
            let live = match read {
                Some(read) => {
                    entry.prune(pool, &read, t, stamp);
                    true
                }
                None => {
                    entry.reset(pool, entry.epoch);
                    false
                }
            };
            if entry.is_empty() {
                entry.reset(pool, entry.epoch);
                // Empty: nothing to prune until its cell changes (a departure zeroes it).
                entry.pruned_at_stamp = Some(stamp);
                entry.publish_words(table, *slot, [0; WORDS]);
                // A live key keeps its (empty) entry, so the next dispatch to it allocates
                // nothing; a departed key's entry goes.
                live
            } else {
                entry.publish(pool, table, *slot);
                true
            }
        });
    }

    /// Keys with records on this shard.
    pub fn tracked_keys(&self) -> usize {
        self.slots
            .values()
            .filter(|e| !e.records.is_empty())
            .count()
    }
}

impl SlotLedger {
    /// Applies `read` (taken after loading the cell's stamp `stamp`) and `now` to the records.
    fn prune(&mut self, pool: &mut ListPool<Record>, read: &KeyRead, now: u64, stamp: u32) {
        self.pruned_at_stamp = Some(stamp);
        let receipt = read.last_receipt.map(nanos);
        // Expired records leave (a prefix: records are in time order).
        while let Some(at) = self.records.front() {
            if pool
                .get(at)
                .is_none_or(|r| r.t.saturating_add(ttl_ns()) > now)
            {
                break;
            }
            let Some(r) = self.unlink(pool, at) else {
                break;
            };
            if r.answered {
                self.stop_running(&r);
            } else {
                self.prefill = self.prefill.saturating_sub(r.prefill);
                self.decode = self.decode.saturating_sub(r.decode);
            }
        }
        // Newly answered records leave the sums (the next prefix) and wait for their finish.
        while let Some(at) = self.unanswered {
            let Some(r) = pool.get_mut(at) else {
                break;
            };
            if receipt.is_none_or(|rc| rc <= r.t) {
                break;
            }
            self.prefill = self.prefill.saturating_sub(r.prefill);
            self.decode = self.decode.saturating_sub(r.decode);
            if r.finished {
                // Nothing of it runs any more: it leaves (and credits nothing).
                self.unlink(pool, at);
                continue;
            }
            r.answered = true;
            let size = (r.prefill, r.decode);
            self.running.add(size);
            self.unanswered = pool.next(at);
        }
        // A sample after the latest finish already shows every credited request gone.
        // (A sample at the very instant of the finish counts as after it.)
        if receipt.is_some_and(|rc| rc >= self.credit_t) || self.credit_t == NONE {
            self.credit = Finished::default();
            self.credit_t = NONE;
        }
    }

    fn publish(&mut self, pool: &ListPool<Record>, table: &InflightTable, slot: u32) {
        // The counted records: from the first unanswered one to the back.
        let counted = self.unanswered.and(self.records.back());
        let newest = counted.and_then(|at| pool.get(at)).map_or(NONE, |r| r.t);
        let eligible_t = |mut at: Option<NodeIx>, step: fn(&ListPool<Record>, NodeIx) -> _| {
            while let Some(r) = at.and_then(|i| Some((i, pool.get(i)?))) {
                if r.1.answered {
                    break;
                }
                if r.1.eligible {
                    return r.1.t;
                }
                at = step(pool, r.0);
            }
            NONE
        };
        let earliest = eligible_t(self.unanswered, ListPool::next);
        let latest = eligible_t(counted, ListPool::prev);
        let words = [
            self.epoch,
            pack(self.prefill, self.decode),
            newest,
            earliest,
            latest,
            pack(self.credit.prefill_tokens, self.credit.decode_blocks),
            self.credit_t,
            pack(self.running.prefill_tokens, self.running.decode_blocks),
        ];
        self.publish_words(table, slot, words);
    }

    fn publish_words(&mut self, table: &InflightTable, slot: u32, words: [u64; WORDS]) {
        if words == self.published {
            return;
        }
        self.published = words;
        table.cells.update(slot, true, |w| {
            *w = words;
            (true, ())
        });
    }
}

/// Sums every shard's summaries for a key (lock-free; one seqlock read per shard).
#[derive(Debug, Clone, Copy)]
pub struct InflightReader<'a> {
    tables: &'a [Arc<InflightTable>],
}

impl<'a> InflightReader<'a> {
    /// A reader over every shard's table (including this shard's).
    pub fn new(tables: &'a [Arc<InflightTable>]) -> Self {
        Self { tables }
    }

    /// The in-flight additions of `key` at `now`, given what the store holds for it. A key
    /// without a cell has none.
    pub fn inflight(
        &self,
        view: &LoadView<'_>,
        key: LoadKey,
        read: &KeyRead,
        now: Instant,
    ) -> Inflight {
        match view.slot(key) {
            Ok(s) => self.inflight_slot(s, read, now),
            Err(_) => Inflight::default(),
        }
    }

    /// [`InflightReader::inflight`] for a known cell.
    pub fn inflight_slot(&self, slot: SlotRef, read: &KeyRead, now: Instant) -> Inflight {
        self.summary_slot(slot, read, now).inflight
    }

    /// The in-flight additions of a known cell, what finished on it since the worker's last
    /// sample, and what still runs on it after a sample answered it (module docs).
    pub fn summary_slot(&self, slot: SlotRef, read: &KeyRead, now: Instant) -> Summary {
        self.summary_until(slot, read, now).0
    }

    /// [`InflightReader::summary_slot`], and the earliest instant (ns, `u64::MAX`: never) after
    /// `now` at which the same cells and read could summarise differently: each judgement of the
    /// summary that depends on time (a record's expiry, a stall's onset) flips at one of the
    /// recorded times plus the TTL or the stall delay. The load memo keeps a summary until then.
    pub(crate) fn summary_until(
        &self,
        slot: SlotRef,
        read: &KeyRead,
        now: Instant,
    ) -> (Summary, u64) {
        let now = nanos(now);
        let receipt = read.last_receipt.map(nanos);
        let live = |t: u64| {
            t != NONE && receipt.is_none_or(|rc| rc <= t) && t.saturating_add(ttl_ns()) > now
        };
        let stall_ns = duration_nanos(STALL_AFTER);
        let mut out = Summary::default();
        let mut until = NONE;
        for table in self.tables {
            let w = table.cells.read(slot.slot);
            if w[0] != slot.epoch {
                continue;
            }
            for t in [w[2], w[3], w[4]] {
                if t != NONE {
                    for flip in [t.saturating_add(ttl_ns()), t.saturating_add(stall_ns)] {
                        if flip > now {
                            until = until.min(flip);
                        }
                    }
                }
            }
            if w[6] != NONE && receipt.is_some_and(|rc| rc < w[6]) {
                out.finished.add(unpack(w[5]));
            }
            out.running.add(unpack(w[7]));
            if !live(w[2]) {
                // Answered since the writer's last refresh: the records run on (those that
                // finished unanswered included, an over-count until that refresh).
                let answered = receipt.is_some_and(|rc| w[2] != NONE && rc > w[2]);
                if answered && w[2].saturating_add(ttl_ns()) > now {
                    out.running.add(unpack(w[1]));
                }
                continue;
            }
            let (p, d) = unpack(w[1]);
            let inflight = &mut out.inflight;
            inflight.prefill_tokens = inflight.prefill_tokens.saturating_add(p);
            inflight.decode_blocks = inflight.decode_blocks.saturating_add(d);
            inflight.stalled |= [w[3], w[4]]
                .into_iter()
                .any(|t| live(t) && t.saturating_add(stall_ns) <= now);
        }
        (out, until)
    }

    /// The tables read, in order.
    pub(crate) fn tables(&self) -> &'a [Arc<InflightTable>] {
        self.tables
    }
}

impl InflightTable {
    /// The stamp of `slot`'s cell (`super::seqcell`).
    pub(crate) fn stamp(&self, slot: u32) -> u32 {
        self.cells.stamp(slot)
    }

    /// Every cell's stamp.
    pub(crate) fn stamps(&self) -> Stamps<'_> {
        self.cells.stamps()
    }

    /// Every group of cells' stamp (`super::seqcell`'s group stamps).
    pub(crate) fn groups(&self) -> Stamps<'_> {
        self.cells.groups()
    }
}

#[cfg(test)]
mod cap_tests {
    use super::super::test_support::{at_ms, key, sample, store_with, worker};
    use super::*;

    fn records(l: &DispatchLedger) -> usize {
        l.slots.values().map(|e| e.records.len()).sum()
    }

    /// A record that expired gives its pool node back; a dispatch to another key may take it.
    /// Finishing the expired dispatch afterwards (a request running past the 30 s expiry) must
    /// leave the new record alone: its id no longer matches the node's sequence number.
    #[test]
    fn finishing_an_expired_dispatch_leaves_the_record_that_reused_its_node_alone() {
        let store = store_with(vec![worker(1, 0, 1), worker(2, 0, 1)]);
        let (k1, k2) = (key(1, 0), key(2, 0));
        let one = DispatchLoad::for_role(DispatchRole::Aggregated, 16, Some(16)); // 1 block
        let mut ledger = DispatchLedger::new();
        let view = store.view();
        let old = ledger.dispatch(&view, k1, one, at_ms(1)).expect("recorded");
        let later = at_ms(1 + 31_000);
        ledger.refresh(&view, later); // expired: its node is free
        let new = ledger.dispatch(&view, k2, one, later).expect("recorded");
        assert_eq!(new.node, old.node, "the freed node was reused");
        ledger.finish(&view, old, at_ms(2 + 31_000));
        let tables = [ledger.table()];
        let reader = InflightReader::new(&tables);
        let now = at_ms(3 + 31_000);
        let inflight = reader.inflight(&view, k2, &view.read(k2), now);
        assert_eq!(inflight.decode_blocks, 1, "k2's dispatch still counts");
        assert!(
            ledger
                .slots
                .get(&view.slot(k2).expect("cell").slot)
                .is_some_and(|e| { e.records.len() == 1 && e.unanswered == e.records.front() }),
            "k2's list is intact"
        );
        // The new dispatch, answered by a sample and finished, is credited as usual.
        view.apply(k2, &sample(7, 1, Some(0), None), now);
        ledger.finish(&view, new, at_ms(4 + 31_000));
        let sum = reader.summary_slot(view.slot(k2).expect("cell"), &view.read(k2), now);
        assert_eq!(sum.finished.decode_blocks, 1);
        assert_eq!(records(&ledger), 0);
    }

    /// At most [`MAX_RECORDS_PER_KEY`] records per key: further unanswered dispatches merge into
    /// the newest (their load still counts, none is lost); once every kept record is answered, a
    /// new dispatch drops the oldest, and its floor with it.
    #[test]
    fn a_key_keeps_at_most_max_records_and_loses_no_unanswered_load() {
        let store = store_with(vec![worker(1, 0, 1)]);
        let k = key(1, 0);
        let one = DispatchLoad::for_role(DispatchRole::Aggregated, 16, Some(16)); // 1 block
        let mut ledger = DispatchLedger::new();
        let extra = 10;
        let mut merged = None;
        for i in 0..MAX_RECORDS_PER_KEY + extra {
            let t = at_ms(1 + i as u64);
            merged = ledger.dispatch(&store.view(), k, one, t);
            assert!(merged.is_some());
        }
        assert_eq!(records(&ledger), MAX_RECORDS_PER_KEY);
        let tables = [ledger.table()];
        let reader = InflightReader::new(&tables);
        let now = at_ms(10_000);
        let view = store.view();
        let total = (MAX_RECORDS_PER_KEY + extra) as u64;
        let read = view.read(k);
        assert_eq!(reader.inflight(&view, k, &read, now).decode_blocks, total);

        // A sample answers every record: they run on (the floor), uncounted as additions.
        view.apply(k, &sample(7, 1, Some(0), None), now);
        ledger.refresh(&view, now);
        let slot = view.slot(k).expect("cell");
        let sum = reader.summary_slot(slot, &view.read(k), now);
        assert_eq!(sum.inflight.decode_blocks, 0);
        assert_eq!(sum.running.decode_blocks, total);
        // Finishing the newest dispatch, merged with ten others into one record, credits nothing
        // and stops nothing: the others still run.
        let done = now.saturating_add(std::time::Duration::from_micros(500));
        ledger.finish(&view, merged.expect("dispatched"), done);
        let sum = reader.summary_slot(slot, &view.read(k), done);
        assert_eq!(
            sum.running.decode_blocks, total,
            "no merged request stops running"
        );
        assert_eq!(sum.finished.decode_blocks, 0, "and none is credited");
        // One more dispatch: the oldest answered record (1 block) leaves, the new one counts.
        let later = at_ms(10_001);
        assert!(ledger.dispatch(&view, k, one, later).is_some());
        assert_eq!(records(&ledger), MAX_RECORDS_PER_KEY);
        let sum = reader.summary_slot(slot, &view.read(k), later);
        assert_eq!(sum.running.decode_blocks, total - 1);
        assert_eq!(sum.inflight.decode_blocks, 1);
    }
}
