//! The default load-only picker (PICK-01..14, DISC-MULTI-05..07, SHIM-06/07).
//!
//! Role: builds the decode candidates across every candidate namespace, selects one with the
//! shared best-effort rules ([`crate::load::rules`]), then, when the chosen worker is a decode
//! worker, builds and selects the prefill candidates of that worker's namespace.
//!
//! Rules, per candidate `(worker, dp_rank)` (one per declared rank, PICK-04):
//! - decode cost `(backlog_blocks + ceil(prompt_tokens / block_size)) / total_kv_blocks`, prefill
//!   cost `backlog_tokens / max_num_batched_tokens` (PICK-01); the backlog is the fresh sample's
//!   stage field (`active_decode_blocks`, else `kv_used_blocks`, PICK-03) or 0 for a quiet
//!   candidate, plus the router's unanswered dispatches (LOAD-STORE-10, Q-06); a missing
//!   capacity or block size, a zero capacity, a silent-with-load or stalled candidate, or
//!   a fresh sample without the stage field leaves the cost undefined (PICK-05, LOAD-STORE-08/11);
//! - the stall judgement applies only when some candidate **of the stage** has a fresh sample
//!   (LOAD-STORE-13);
//! - [`select`]: lowest defined cost with cursor-rotated ties when some candidate has a fresh
//!   sample with the stage's field (PICK-06), else the cursor rotates over all (PICK-07/10). A
//!   list whose candidates share one capacity and block size applies the same rule to their
//!   backlogs alone ([`super::lanes::scan_uniform`]).
//!
//! Candidate order (what the cursors index): `fleet.workers` order, i.e. `(namespace,
//! instance_id)`, then ascending rank. Mixed namespaces (PICK-11..14): where a namespace has both
//! prefill and decode workers for the model, its aggregated workers are not decode candidates;
//! elsewhere decode and aggregated workers compete. A pick whose decode side is aggregated, or a
//! decode worker whose namespace has no prefill worker for the model, carries no prefill and
//! yields the `{role="prefill", reason="no_prefill_pool"}` event.
//!
//! Bounds: at most [`MAX_CANDIDATES`] candidates per stage (the load store's key cap); ranks
//! beyond it, and ranks whose number would overflow `u32`, are not candidates.

use std::num::{NonZeroU32, NonZeroU64};
use std::ops::ControlFlow;

use crate::discovery::{Role, Worker};
use crate::load::rules::{Candidate, Selector, Stage, select};
use crate::load::{FreshWindow, LoadKey, ProbeSet, RankProbe, Renewed};

use super::candidates::{
    ListId, MAX_CANDIDATES, RankCard, RankRef, Scope, visit_namespace_ranks, visit_ranks,
};
use super::lanes::{Lane, LaneCost, Scan, Shape, cost_lanes, scan_uniform};
use super::{
    Chosen, DpRankHeaders, MAX_PICKS, NoWorker, Pick, PickInput, PickerCursors, Picks,
    SelectionReason, WorkerPicker,
};

/// One candidate rank: an index into `fleet.workers` and the rank (what a pick reads of it is
/// kept apart: [`RankProbe`] for the load, [`CostCard`] for the cost).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) worker: usize,
    pub(super) rank: u32,
}

/// Caller-owned scratch buffers, reused across picks (one per shard). After warm-up a pick
/// allocates nothing.
///
/// Each stage keeps its candidate list ([`StageList`]) between picks: a pick whose table, model
/// and candidate namespaces (or chosen namespace and role) are those of the list's last build
/// reuses it instead of walking the table again. Only the loads are read anew.
#[derive(Debug, Default)]
pub struct PickScratch {
    /// The decode stage's candidates (all candidate namespaces, or one namespace's decode
    /// workers for a pair).
    decode: StageList,
    /// The prefill stage's candidates (the chosen namespace's prefill workers).
    prefill: StageList,
    /// What selecting a stage writes as it goes.
    work: StageWork,
}

/// The buffers one stage selection writes (either stage's; a pick selects one at a time).
#[derive(Debug, Default)]
struct StageWork {
    /// Each candidate's cost (when they are kept, or selected the general way).
    candidates: Vec<Candidate>,
    /// Indices of the stalled candidates of the stage being selected.
    stalled: Vec<usize>,
    /// The keys of a uniform scan ([`scan_uniform`]).
    keys: Vec<u64>,
}

/// One stage's candidate list and what it was built from.
#[derive(Debug, Default)]
struct StageList {
    id: ListId,
    slots: Vec<Slot>,
    /// Each slot's key and cell hint, index for index, with its last load (what the load source
    /// reads).
    probes: ProbeSet,
    /// Each slot's cost figures, index for index (what the cost reads).
    cards: Vec<CostCard>,
    /// Each slot's load and card as the cost loop of `lanes_stage` reads them, index for index
    /// (renewed from the probes' answers the last read renewed).
    lanes: Vec<Lane>,
    /// The stage `lanes` were built for.
    lanes_stage: Option<Stage>,
    /// The cost shape every lane shares, if one (set when `lanes` are built; a renewal keeps
    /// each lane's card, so it holds until they are built again).
    shape: Option<Shape>,
}

/// The figures a load-only cost reads of a rank, packed (24 bytes instead of a 88-byte slot): a
/// zero figure is none, as the cost treats a zero capacity or block size.
#[derive(Debug, Clone, Copy)]
struct CostCard {
    total_kv_blocks: Option<NonZeroU64>,
    max_num_batched_tokens: Option<NonZeroU64>,
    block_size: Option<NonZeroU32>,
}

impl CostCard {
    fn of(card: &RankCard) -> Self {
        Self {
            total_kv_blocks: card.total_kv_blocks.and_then(NonZeroU64::new),
            max_num_batched_tokens: card.max_num_batched_tokens.and_then(NonZeroU64::new),
            block_size: card.block_size.and_then(NonZeroU32::new),
        }
    }
}

impl StageList {
    fn clear(&mut self) {
        self.slots.clear();
        self.probes.clear();
        self.cards.clear();
        self.lanes.clear();
    }

    /// Brings `lanes` up to date with the probes' answers for `stage`: the renewed ones, or all
    /// when the last read renewed all or the lanes are of another stage or list.
    fn renew_lanes(&mut self, stage: Stage) {
        let answers = self.probes.answers();
        let all = self.lanes_stage != Some(stage)
            || self.lanes.len() != answers.len()
            || self.cards.len() != answers.len();
        let lane = |i: usize| {
            let (d, card) = (answers.get(i)?, self.cards.get(i)?);
            let den = match stage {
                Stage::Prefill => card.max_num_batched_tokens,
                Stage::Decode => card.total_kv_blocks,
            };
            Some(Lane::of(d.stage_figures(stage), den, card.block_size))
        };
        match self.probes.renewed() {
            Renewed::These(renewed) if !all => {
                for &i in renewed {
                    let i = i as usize;
                    if let (Some(new), Some(l)) = (lane(i), self.lanes.get_mut(i)) {
                        *l = new;
                    }
                }
            }
            _ => {
                self.lanes.clear();
                self.lanes.extend((0..answers.len()).filter_map(lane));
                self.lanes_stage = Some(stage);
                self.shape = Shape::of(&self.lanes);
            }
        }
    }

    /// Pushes `r`'s slot; breaks once [`MAX_CANDIDATES`] are held.
    fn push(&mut self, r: RankRef) -> ControlFlow<()> {
        if self.slots.len() >= MAX_CANDIDATES {
            return ControlFlow::Break(());
        }
        self.slots.push(Slot {
            worker: r.worker as usize,
            rank: r.rank,
        });
        self.probes.push(RankProbe {
            key: LoadKey::new(r.card.instance_id, r.rank),
            hint: r.card.slot,
        });
        self.cards.push(CostCard::of(&r.card));
        ControlFlow::Continue(())
    }

    /// Fills the list with the decode stage's candidates, unless it holds them already.
    fn fill_decode(&mut self, input: &PickInput<'_>) {
        if self.id.holds(input, Scope::Candidates) {
            return;
        }
        self.clear();
        let decode_stage = |role: Role, pool: bool| match role {
            Role::Decode => true,
            Role::Aggregated => !pool,
            Role::Prefill | Role::Unknown => false,
        };
        visit_ranks(input, &decode_stage, &mut |r, _| self.push(r));
    }

    /// Fills the list with the `role` ranks of the namespace run at `start`, unless it holds
    /// them already.
    fn fill_namespace(&mut self, input: &PickInput<'_>, start: usize, role: Role) {
        if self.id.holds(input, Scope::Namespace { start, role }) {
            return;
        }
        self.clear();
        visit_namespace_ranks(input, start, role, &mut |r| self.push(r));
    }
}

impl PickScratch {
    /// Empty scratch space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scratch space pre-sized for `n` candidates per stage.
    pub fn with_capacity(n: usize) -> Self {
        let list = || StageList {
            slots: Vec::with_capacity(n),
            probes: ProbeSet::with_capacity(n),
            cards: Vec::with_capacity(n),
            lanes: Vec::with_capacity(n),
            ..StageList::default()
        };
        Self {
            decode: list(),
            prefill: list(),
            work: StageWork {
                candidates: Vec::with_capacity(n),
                stalled: Vec::new(),
                keys: Vec::with_capacity(n),
            },
        }
    }
}

/// The default load-only [`WorkerPicker`] (PICK-01): [`pick_load_based`] over its own cursors
/// and scratch space (one instance per shard).
#[derive(Debug, Default)]
pub struct LoadBasedPicker {
    cursors: PickerCursors,
    scratch: PickScratch,
}

impl LoadBasedPicker {
    /// A picker whose cursors start at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A picker whose cursors start at `cursors` (shards start apart so that they do not
    /// round-robin in lockstep).
    pub fn with_cursors(cursors: PickerCursors) -> Self {
        Self {
            cursors,
            scratch: PickScratch::new(),
        }
    }

    /// The cursors' current positions.
    pub fn cursors(&self) -> PickerCursors {
        self.cursors
    }
}

impl WorkerPicker for LoadBasedPicker {
    fn name(&self) -> &'static str {
        "load_based"
    }

    fn pick<'f>(&mut self, input: &PickInput<'f>, out: &mut Picks<'f>) -> Result<(), NoWorker> {
        out.clear();
        pick_with(input, &mut self.cursors, &mut self.scratch, out).map(|_| ())
    }

    fn preview(&self) -> Option<Box<dyn WorkerPicker>> {
        Some(Box::new(LoadBasedPicker::with_cursors(self.cursors)))
    }
}

/// Reads the loads of `list`'s slots, costs them for `stage` and selects one. Returns the
/// chosen candidate's index, its slot and the reason.
///
/// One set read brings every load's digest up to date ([`super::LoadSource::read_digests`]) and costs
/// each candidate without the stall judgement, noting whether any is fresh and which are
/// stalled. The judgement applies when some candidate is fresh
/// ([`crate::load::rules::any_fresh`]) and then only makes a stalled candidate's cost undefined
/// ([`crate::load::DigestStanding::Stalled`]), so a second pass over the stalled ones alone gives the same
/// costs as classifying every load with it.
fn select_stage(
    input: &PickInput<'_>,
    list: &mut StageList,
    work: &mut StageWork,
    (stage, costs): (Stage, Costs),
    cursor: &mut u64,
) -> Option<(usize, Slot, SelectionReason)> {
    let _ = input.loads.read_digests(&mut list.probes, input.now);
    list.renew_lanes(stage);
    let bound = FreshWindow::new(input.max_staleness, input.now).bound();
    let prompt = input.prompt_tokens.get();
    let lanes = list.lanes.as_slice();
    if let (Costs::Dropped, Some(shape)) = (costs, list.shape) {
        // One denominator and block size: compare backlogs alone (`super::lanes`).
        match scan_uniform(lanes, shape, (stage, bound, prompt), cursor, &mut work.keys) {
            Scan::Chose(sel) => {
                let slot = *list.slots.get(sel.index)?;
                return Some((sel.index, slot, sel.reason.into()));
            }
            Scan::Empty => return None,
            Scan::Declined => {}
        }
    }
    let StageWork {
        candidates,
        stalled,
        ..
    } = work;
    stalled.clear();
    let mut cost = LaneCost::new(bound, prompt, stage);
    // The costs go to the list when the caller keeps them, else straight to a selector (one
    // loop each, so the usual one carries no branch on where they go).
    let mut selector = Selector::default();
    candidates.clear();
    let judge = match costs {
        Costs::Kept => cost_lanes(lanes, &mut cost, stalled, |c| candidates.push(c)),
        Costs::Dropped => cost_lanes(lanes, &mut cost, stalled, |c| selector.offer(c)),
    };
    // Under the stall judgement a stalled candidate has no backlog and no fresh field
    // ([`crate::load::DigestStanding::Stalled`]): then select over the list of candidates.
    let judged = judge && !stalled.is_empty();
    let sel = if judged || costs == Costs::Kept {
        if costs == Costs::Dropped {
            candidates.extend(lanes.iter().map(|l| cost.of(l).0));
        }
        if judged {
            for &i in stalled.iter() {
                if let Some(c) = candidates.get_mut(i) {
                    *c = Candidate {
                        cost: None,
                        fresh_field: false,
                    };
                }
            }
        }
        select(candidates, cursor)?
    } else {
        selector.finish(cursor, |i| lanes.get(i).map(|l| cost.of(l).0))?
    };
    let slot = *list.slots.get(sel.index)?;
    Some((sel.index, slot, sel.reason.into()))
}

/// [`Costs::Kept`] when runners-up are wanted.
fn kept(runners_up: bool) -> Costs {
    if runners_up {
        Costs::Kept
    } else {
        Costs::Dropped
    }
}

/// Whether a stage selection leaves every candidate's cost in the scratch list (for
/// [`runners_up`]) or only makes its choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Costs {
    Dropped,
    Kept,
}

/// The rank header for `w`'s chosen rank (SHIM-12).
pub(super) fn rank_header(w: &Worker, rank: u32) -> Option<u32> {
    w.dp_size.map(|_| rank)
}

/// One load-only pick (the whole rule set above) with the caller's cursors and scratch space.
pub fn pick_load_based<'f>(
    input: &PickInput<'f>,
    cursors: &mut PickerCursors,
    scratch: &mut PickScratch,
) -> Result<Pick<'f>, NoWorker> {
    pick_with(input, cursors, scratch, &mut Picks::new(1))
}

/// [`pick_load_based`], also writing the ordered candidates into `out`: the pick first, then (when
/// `out` wants more than one) the next-cheapest decode candidates of the pick's namespace and
/// role (defined costs only, ascending, ties in candidate order), each paired with the pick's
/// prefill worker. With `out.limit() == 1` nothing beyond the pick is computed.
pub(super) fn pick_with<'f>(
    input: &PickInput<'f>,
    cursors: &mut PickerCursors,
    scratch: &mut PickScratch,
    out: &mut Picks<'f>,
) -> Result<Pick<'f>, NoWorker> {
    let fleet = input.fleet;
    let workers = fleet.workers.as_slice();

    // Decode candidates across every candidate namespace (DISC-MULTI-05/07, PICK-12/13).
    scratch.decode.fill_decode(input);
    let (dindex, dslot, dreason) = select_stage(
        input,
        &mut scratch.decode,
        &mut scratch.work,
        (Stage::Decode, kept(out.limit() > 1)),
        &mut cursors.decode,
    )
    .ok_or(NoWorker)?;
    let dw = workers.get(dslot.worker).ok_or(NoWorker)?;
    let mut alternates = [None; MAX_PICKS - 1];
    if out.limit() > 1 {
        runners_up(
            scratch,
            workers,
            dindex,
            dw,
            &mut alternates[..out.limit() - 1],
        );
    }
    let decode = Chosen {
        instance_id: dw.instance_id,
        dp_rank: dslot.rank,
        reason: dreason,
    };
    let mut pick = Pick {
        namespace: dw.namespace.as_str(),
        decode,
        prefill: None,
        dp_rank_headers: DpRankHeaders {
            decode_rank: rank_header(dw, dslot.rank),
            prefill_rank: None,
        },
        kv: None,
    };
    if dw.role != Role::Decode {
        // An aggregated pick never carries a prefill (PICK-11/14).
        push_ordered(out, &pick, workers, &alternates);
        return Ok(pick);
    }

    // Prefill candidates inside the chosen namespace only (DISC-MULTI-06/07, SHIM-06).
    let ns_start = workers.partition_point(|w| w.namespace < dw.namespace);
    scratch
        .prefill
        .fill_namespace(input, ns_start, Role::Prefill);
    if let Some((_, pslot, preason)) = select_stage(
        input,
        &mut scratch.prefill,
        &mut scratch.work,
        (Stage::Prefill, Costs::Dropped),
        &mut cursors.prefill,
    ) && let Some(pw) = workers.get(pslot.worker)
    {
        pick.prefill = Some(Chosen {
            instance_id: pw.instance_id,
            dp_rank: pslot.rank,
            reason: preason,
        });
        pick.dp_rank_headers.prefill_rank = rank_header(pw, pslot.rank);
    }
    push_ordered(out, &pick, workers, &alternates);
    Ok(pick)
}

/// The decode side of a prefill/decode pair inside the namespace run starting at `ns_start`,
/// selected with the load-only rules above (decode-role workers only, the decode cursor;
/// KV-PICK-06). When `alternates` is not empty it is filled like [`pick_with`]'s runners-up.
/// Returns the chosen slot and reason; `None` when the run has no decode candidate.
pub(super) fn pair_decode(
    input: &PickInput<'_>,
    ns_start: usize,
    scratch: &mut PickScratch,
    cursor: &mut u64,
    alternates: &mut [Option<Slot>],
) -> Option<(Slot, SelectionReason)> {
    let workers = input.fleet.workers.as_slice();
    scratch.decode.fill_namespace(input, ns_start, Role::Decode);
    let (index, slot, reason) = select_stage(
        input,
        &mut scratch.decode,
        &mut scratch.work,
        (Stage::Decode, kept(!alternates.is_empty())),
        cursor,
    )?;
    if !alternates.is_empty() {
        let dw = workers.get(slot.worker)?;
        runners_up(scratch, workers, index, dw, alternates);
    }
    Some((slot, reason))
}

/// Fills `into` with the cheapest decode candidates other than `chosen` that share its
/// namespace and role, ascending by defined cost (ties in candidate order). Only run when the
/// caller asked for more than one candidate.
fn runners_up(
    scratch: &PickScratch,
    workers: &[Worker],
    chosen: usize,
    dw: &Worker,
    into: &mut [Option<Slot>],
) {
    let mut picked = [None; MAX_PICKS - 1];
    let picked = &mut picked[..into.len().min(MAX_PICKS - 1)];
    let slots = &scratch.decode.slots;
    cheapest_others(
        slots.len(),
        chosen,
        |i| scratch.work.candidates.get(i).and_then(|c| c.cost),
        |i| {
            slots
                .get(i)
                .and_then(|s| workers.get(s.worker))
                .is_some_and(|w| w.namespace == dw.namespace && w.role == dw.role)
        },
        picked,
    );
    for (slot, i) in into.iter_mut().zip(picked.iter()) {
        *slot = i.and_then(|i| slots.get(i).copied());
    }
}

/// Fills `into`, in order, with up to `into.len()` candidates (indices below `len`) other than
/// `chosen` that `eligible` admits and that have a cost: the cheapest first, ties in candidate
/// order; entries past the last such candidate are left as they are. O(`len` × `into.len()`).
/// Both pickers' runners-up (the ordered alternates a caller may ask for).
pub(super) fn cheapest_others<C: PartialOrd + Copy>(
    len: usize,
    chosen: usize,
    cost: impl Fn(usize) -> Option<C>,
    eligible: impl Fn(usize) -> bool,
    into: &mut [Option<usize>],
) {
    for n in 0..into.len() {
        let mut best: Option<(usize, C)> = None;
        for i in 0..len {
            let Some(c) = cost(i) else { continue };
            let free = i != chosen && !into[..n].contains(&Some(i));
            if free && eligible(i) && best.is_none_or(|(_, b)| c < b) {
                best = Some((i, c));
            }
        }
        let Some((i, _)) = best else { return };
        into[n] = Some(i);
    }
}

/// `pick` with its decode side moved to rank `rank` of `w` (same reason, prefill and namespace).
pub(super) fn with_decode<'f>(pick: &Pick<'f>, w: &Worker, rank: u32) -> Pick<'f> {
    let mut alt = *pick;
    alt.decode = Chosen {
        instance_id: w.instance_id,
        dp_rank: rank,
        reason: pick.decode.reason,
    };
    alt.dp_rank_headers.decode_rank = rank_header(w, rank);
    alt
}

/// Writes `pick`, then one candidate per alternate slot (same prefill, its own decode rank).
pub(super) fn push_ordered<'f>(
    out: &mut Picks<'f>,
    pick: &Pick<'f>,
    workers: &[Worker],
    alternates: &[Option<Slot>],
) {
    out.push(*pick);
    for slot in alternates.iter().flatten() {
        if let Some(w) = workers.get(slot.worker) {
            out.push(with_decode(pick, w, slot.rank));
        }
    }
}
