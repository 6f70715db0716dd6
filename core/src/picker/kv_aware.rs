//! The KV-aware picker (`kv_aware`, KV-PICK-01..09, DISC-MULTI-08): the ranks that will prefill a
//! request compete on Dynamo's KV-overlap cost ([`super::kv_cost::kv_cost`]); a prefill/decode
//! pair's decode side then keeps the load-only rules inside the chosen namespace (KV-PICK-06),
//! unless conditional disaggregation is on (KV-PICK-12..14, [`super::kv_conditional`]): then the
//! namespace's decode ranks compete on `max(0, decode_cost_blocks - overlap_credit_blocks)` and
//! the chosen one may prefill locally, the pick then carrying no prefill (reason
//! `conditional_bypass`, no alternates).
//!
//! Role: [`score_candidates`] turns a [`PickInput`] into one [`ScoredCandidate`] per candidate
//! rank (overlap, backlog terms, standing, cost); [`KvAwarePicker`] selects from exactly that
//! list, so an explain view built on [`score_candidates`] can never disagree with a pick. Without
//! prompt blocks (the prompt could not be tokenized) the picker is the load-only picker, cursors
//! included ([`super::LoadBasedPicker`]).
//!
//! Candidates (KV stage), per candidate namespace (DISC-MULTI-05), in `fleet.workers` order then
//! ascending rank (what the cursors index):
//! - a namespace with prefill **and** decode workers for the model (a pool): its prefill ranks
//!   (KV-PICK-08, DISC-MULTI-08); its aggregated workers are never candidates (PICK-12);
//! - every other namespace: its decode and aggregated ranks, which prefill their own requests
//!   ("self-prefilling", KV-PICK-07/08: prefill workers beside aggregated workers without a decode
//!   worker are not candidates and the namespace is evaluated as an aggregated fleet).
//!
//! Both kinds compete in one selection: a pool's prefill ranks and the other namespaces'
//! self-prefilling ranks are scored with the same formula, each judged by the backlog rules of
//! its own stage (below), so a namespace is costed the same whether or not other namespaces
//! exist. A winning prefill rank is paired with a decode worker of its namespace chosen with the
//! load-only rules and the decode cursor; a winning self-prefilling rank is the decode pin and the
//! pick carries no prefill (`{role="prefill", reason="no_prefill_pool"}`, PICK-14).
//!
//! Backlog terms (KV-PICK-04/05/07, Q-26, LOAD-STORE-07..13), judged separately for the prefill
//! ranks (stage field `active_prefill_tokens`) and the self-prefilling ranks (stage field
//! `active_decode_blocks`, else `kv_used_blocks`, PICK-03):
//! - if some rank of the group has a fresh sample (within `max_staleness`) carrying the stage
//!   field, the group competes **with backlog**: a fresh rank with the field and a quiet rank
//!   compete, every other rank (fresh without the field, silent with load, stalled) is excluded;
//! - otherwise the whole group competes **without backlog** terms (both 0, in-flight additions
//!   ignored): overlap and request size only;
//! - with backlog, a prefill rank's `active_prefill_tokens` is its sample's field plus the router's
//!   unanswered prompt tokens, and its `active_decode_blocks` the sample's decode field (0 when
//!   nil) plus unanswered blocks; a self-prefilling rank's `active_decode_blocks` is its sample's
//!   decode field plus unanswered blocks, and its `active_prefill_tokens` the sample's
//!   `active_prefill_tokens` when present (else 0) plus unanswered prompt tokens. A quiet rank's
//!   terms are the unanswered additions alone;
//! - `overlap_blocks` comes from the [`PromptBlocks`] entry whose block size is the worker's
//!   (none: 0), the largest count the [`OverlapSource`] reports for the rank, capped at the
//!   prompt's block count; a worker without a block size has no cost.
//!
//! Selection: at temperature 0 the lowest cost wins and exact ties rotate with the stage cursor
//! (KV-PICK-02); above 0 one [`UnitSource`] draw samples [`softmax_sample_index`] over the ranks
//! with a cost (KV-PICK-03). The stage cursor is the prefill cursor when the KV stage holds a
//! prefill rank, else the decode cursor; it advances one step per selection. When no rank has a
//! cost (every one excluded or without a block size) the cursor rotates over all of them
//! (`round_robin_stale`). The stage the formula decided is reported as `kv_aware`, and the pick
//! carries the chosen rank's [`KvOutcome`].
//!
//! Invariants: never panics; allocation-free once its scratch buffers have grown; reads no clock
//! and no randomness except the injected [`UnitSource`] (one draw per positive-temperature
//! selection that has a costed rank); rank headers exactly as the load-only picker (SHIM-12); at most
//! [`MAX_CANDIDATES`] candidate ranks.

use std::ops::ControlFlow;

use crate::discovery::{InstanceId, Role, Worker};
use crate::load::rules::{Lowest, Stage};
use crate::load::{DigestStanding, FreshWindow, LoadDigest, LoadKey, ProbeSet, RankProbe};

use super::candidates::{ListId, RankRef, Scope, visit_namespace_ranks, visit_ranks};
use super::kv_conditional::{
    BypassDecision, ConditionalDisagg, DecodeRank, conditional_request_cost, decide_bypass,
};
use super::kv_cost::{KvParams, KvRequest, KvTerms, softmax_sample_index};
use super::load_based::{
    PickScratch, cheapest_others, pair_decode, pick_with, push_ordered, rank_header, with_decode,
};
use super::positions::RankPositions;
use super::rank_index::RankIndex;
use super::{
    Chosen, DpRankHeaders, KvOutcome, MAX_CANDIDATES, MAX_PICKS, NoWorker, OverlapSource, Pick,
    PickInput, PickerCursors, Picks, PromptBlocks, SelectionReason, WorkerPicker,
};
use crate::rng::UnitSource;

/// How a candidate rank stands in the KV stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvStatus {
    /// Competes with its backlog terms (KV-PICK-04).
    Backlog,
    /// Competes without backlog terms: no rank of its stage has a fresh stage backlog
    /// (KV-PICK-05).
    NoBacklog,
    /// Excluded: a fresh sample without the stage's field (KV-PICK-04).
    NoStageField,
    /// Excluded: no fresh sample and the last one showed backlog (LOAD-STORE-08).
    SilentWithLoad,
    /// Excluded: possibly stalled (LOAD-STORE-11).
    Stalled,
    /// No usable block size: no cost.
    NoBlockSize,
}

/// One candidate rank as the KV stage sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoredCandidate {
    /// Index of the worker in `fleet.workers` (its namespace is that worker's).
    pub worker: usize,
    /// The worker's instance id.
    pub instance_id: InstanceId,
    /// The rank.
    pub dp_rank: u32,
    /// `Prefill` in a pool, else `Decode` or `Aggregated` (self-prefilling).
    pub role: Role,
    /// The worker's block size (0: none declared).
    pub block_size: u32,
    /// Contiguous prompt-prefix blocks the rank holds.
    pub overlap_blocks: u32,
    /// The backlog terms used (0 without backlog or when excluded).
    pub terms: KvTerms,
    /// Standing.
    pub status: KvStatus,
    /// The KV-PICK-01 cost; `None` when excluded or without a block size.
    pub cost: Option<f64>,
}

/// Reusable buffers of the KV stage (one per shard): after warm-up scoring and selection
/// allocate nothing.
#[derive(Debug, Default)]
pub struct KvScratch {
    scored: Vec<ScoredCandidate>,
    /// Each scored candidate's key and load-store cell hint ([`super::RankCard::slot`]), with
    /// its last load.
    probes: ProbeSet,
    /// What `scored` and `probes` were built from (kept across picks while it holds).
    list: ListId,
    /// The candidates by rank, for the overlap source's reports.
    ranks: RankIndex,
    /// The overlap source's rank numbering mapped to candidate positions (kept across picks).
    positions: RankPositions,
    /// Whether `ranks` indexes the current `scored`.
    indexed: bool,
    /// How many of `scored` are prefill ranks (counted when the list is built).
    prefill_ranks: usize,
    /// The overlap source's reports by position (scratch of [`read_overlap`]).
    best: Vec<u32>,
    /// Each candidate's block size, index for index with `scored` (built with the list): the
    /// overlap read runs over these compact arrays, not the candidate records.
    sizes: Vec<u32>,
    /// Each candidate's overlap as [`read_overlap`] found it, index for index with `scored`.
    overlaps: Vec<u32>,
    /// The lowest cost of the last scoring, offered in candidate order (temperature 0 selects
    /// from it without another pass).
    lowest: Lowest<f64>,
    rows: Vec<usize>,
    costs: Vec<f64>,
    probabilities: Vec<f64>,
}

impl KvScratch {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The candidates of the last [`score_candidates`] call.
    pub fn scored(&self) -> &[ScoredCandidate] {
        &self.scored
    }
}

/// Scores every KV-stage candidate of `input` (module docs) into `scratch` and returns them in
/// candidate order. The picker selects from exactly this list.
pub fn score_candidates<'s>(
    input: &PickInput<'_>,
    params: &KvParams,
    scratch: &'s mut KvScratch,
) -> &'s [ScoredCandidate] {
    score_with(
        input,
        params,
        scratch,
        (Scope::Candidates, push_candidates),
        |params, request, overlap, terms| request.cost(params, overlap, terms),
    )
}

/// The cost of one competing rank: `(params, request at the rank's block size, overlap_blocks,
/// terms)`.
type CostFn = fn(&KvParams, &KvRequest, u32, KvTerms) -> Option<f64>;

/// Where a push of candidates goes: the candidates and, index for index, their probes.
type Pushed<'a> = (&'a mut Vec<ScoredCandidate>, &'a mut ProbeSet);

/// Scores the ranks `push` adds (or, while `scope` holds for the scratch's kept list, the same
/// ranks kept from the last pick), each group by its own backlog rules (module docs), with `cost`.
fn score_with<'s>(
    input: &PickInput<'_>,
    params: &KvParams,
    scratch: &'s mut KvScratch,
    (scope, push): (Scope, impl FnOnce(&PickInput<'_>, Pushed<'_>)),
    cost: CostFn,
) -> &'s [ScoredCandidate] {
    let KvScratch {
        scored,
        probes,
        list,
        ranks,
        indexed,
        positions,
        prefill_ranks,
        best,
        sizes,
        overlaps,
        lowest,
        ..
    } = scratch;
    if !list.holds(input, scope) {
        scored.clear();
        probes.clear();
        *indexed = false;
        push(input, (&mut *scored, &mut *probes));
        *prefill_ranks = scored.iter().filter(|c| c.role == Role::Prefill).count();
        sizes.clear();
        sizes.extend(scored.iter().map(|c| c.block_size));
    }
    // Kept or rebuilt, the scoring below writes every candidate's overlap, status, terms and
    // cost (each is in a group it scores).
    read_overlap(
        input.prompt_blocks,
        input.overlap,
        (sizes, overlaps),
        (ranks, indexed, positions, best),
        || {
            scored
                .iter()
                .map(|c| LoadKey::new(c.instance_id, c.dp_rank))
        },
    );
    let window = FreshWindow::new(input.max_staleness, input.now);
    let digests = input.loads.read_digests(probes, input.now);
    let isl = input.prompt_tokens.get();
    // Each group's backlog rules, judged over its members; a group without members is never
    // consulted (an aggregated fleet has no prefill group).
    let rules = |stage: Stage, present: bool| {
        let in_group = |c: &ScoredCandidate| (c.role == Role::Prefill) == (stage == Stage::Prefill);
        let members = || {
            scored
                .iter()
                .zip(digests.iter())
                .filter(move |(c, _)| in_group(c))
        };
        let judge = present && members().any(|(_, d)| d.is_fresh_in(window));
        let with_backlog = present
            && members().any(|(_, d)| {
                d.backlog_of(d.standing_in(window, judge), stage)
                    .fresh_field
            });
        GroupRules {
            stage,
            judge,
            with_backlog,
        }
    };
    let prefill = rules(Stage::Prefill, *prefill_ranks > 0);
    let decode = rules(Stage::Decode, *prefill_ranks < scored.len());
    *lowest = Lowest::default();
    // The request at the block size of the last costed rank (nearly always the only one).
    let mut request: Option<KvRequest> = None;
    let each = scored.iter_mut().zip(digests.iter().zip(overlaps.iter()));
    for (i, (c, (d, &overlap))) in each.enumerate() {
        let g = if c.role == Role::Prefill {
            &prefill
        } else {
            &decode
        };
        c.overlap_blocks = overlap;
        (c.status, c.terms) = if g.with_backlog {
            backlog_terms(d, d.standing_in(window, g.judge), g.stage)
        } else {
            (KvStatus::NoBacklog, KvTerms::default())
        };
        let competes = matches!(c.status, KvStatus::Backlog | KvStatus::NoBacklog);
        if competes && c.block_size == 0 {
            c.status = KvStatus::NoBlockSize;
        }
        c.cost = match c.status {
            KvStatus::Backlog | KvStatus::NoBacklog => {
                if request.is_none_or(|r| r.block_size() != c.block_size) {
                    request = KvRequest::new(isl, c.block_size);
                }
                let r = request.as_ref();
                r.and_then(|r| cost(params, r, c.overlap_blocks, c.terms))
            }
            _ => None,
        };
        if let Some(cost) = c.cost {
            lowest.offer(i, cost);
        }
    }
    scored
}

/// One group's backlog rules for a pick (module docs): its stage, whether the stall judgement
/// applies (some member is fresh) and whether it competes with backlog terms.
struct GroupRules {
    stage: Stage,
    judge: bool,
    with_backlog: bool,
}

/// Pushes the KV-stage candidate ranks in candidate order (module docs).
fn push_candidates(input: &PickInput<'_>, (scored, probes): Pushed<'_>) {
    let kv_stage = |role: Role, pool: bool| match role {
        Role::Prefill => pool,
        Role::Decode | Role::Aggregated => !pool,
        Role::Unknown => false,
    };
    visit_ranks(input, &kv_stage, &mut |r, _| push_rank(scored, probes, r));
}

/// Pushes the candidate of rank `r`; breaks once [`MAX_CANDIDATES`] are held.
fn push_rank(
    scored: &mut Vec<ScoredCandidate>,
    probes: &mut ProbeSet,
    r: RankRef,
) -> ControlFlow<()> {
    if scored.len() >= MAX_CANDIDATES {
        return ControlFlow::Break(());
    }
    probes.push(RankProbe {
        key: LoadKey::new(r.card.instance_id, r.rank),
        hint: r.card.slot,
    });
    scored.push(ScoredCandidate {
        worker: r.worker as usize,
        instance_id: r.card.instance_id,
        dp_rank: r.rank,
        role: r.role,
        block_size: r.card.block_size.unwrap_or(0),
        overlap_blocks: 0,
        terms: KvTerms::default(),
        status: KvStatus::NoBacklog,
        cost: None,
    });
    ControlFlow::Continue(())
}

/// Writes each candidate's overlap into `overlaps` (index for index with `sizes`, the
/// candidates' block sizes) from the prompt blocks of its block size: the source writes its
/// reports by position into `best`, then every candidate takes its rank's (the largest report
/// for the first position of its key, capped at the prompt's blocks); 0 without a report.
/// `keys` lists the candidates' keys, asked only when `ranks` must be rebuilt.
fn read_overlap<K: Iterator<Item = LoadKey>>(
    prompt_blocks: &[PromptBlocks<'_>],
    overlap: &dyn OverlapSource,
    (sizes, overlaps): (&[u32], &mut Vec<u32>),
    (ranks, indexed, cache, best): (&mut RankIndex, &mut bool, &mut RankPositions, &mut Vec<u32>),
    keys: impl Fn() -> K,
) {
    overlaps.clear();
    overlaps.resize(sizes.len(), 0);
    for (i, pb) in prompt_blocks.iter().enumerate() {
        let first_of_size = !prompt_blocks
            .get(..i)
            .unwrap_or(&[])
            .iter()
            .any(|p| p.block_size == pb.block_size);
        let used = sizes.contains(&pb.block_size);
        if !first_of_size || !used || pb.hashes.is_empty() || pb.block_size == 0 {
            continue;
        }
        if !*indexed {
            ranks.rebuild(keys());
            *indexed = true;
        }
        let cap = u32::try_from(pb.hashes.len()).unwrap_or(u32::MAX);
        best.clear();
        best.resize(sizes.len(), 0);
        overlap.fill_positions(*pb, &*ranks, cache, best);
        let each = overlaps.iter_mut().zip(sizes).zip(ranks.heads());
        for ((o, &size), &head) in each {
            if size == pb.block_size
                && let Some(&b) = best.get(head as usize)
            {
                *o = (*o).max(b.min(cap));
            }
        }
    }
}

/// The status and terms of a rank whose stage competes with backlog (module docs).
fn backlog_terms(d: &LoadDigest, standing: DigestStanding, stage: Stage) -> (KvStatus, KvTerms) {
    let Some(own) = d.backlog_of(standing, stage).backlog else {
        let status = match standing {
            DigestStanding::SilentWithLoad => KvStatus::SilentWithLoad,
            DigestStanding::Stalled => KvStatus::Stalled,
            DigestStanding::Fresh | DigestStanding::Quiet => KvStatus::NoStageField,
        };
        return (status, KvTerms::default());
    };
    let terms = match stage {
        Stage::Prefill => KvTerms {
            active_prefill_tokens: own,
            active_decode_blocks: d.other_stage(standing, Stage::Decode),
        },
        Stage::Decode => KvTerms {
            active_prefill_tokens: d.other_stage(standing, Stage::Prefill),
            active_decode_blocks: own,
        },
    };
    (KvStatus::Backlog, terms)
}

/// Selects among `scored` (module docs), whose lowest cost in candidate order is `lowest`: the
/// chosen index and reason; `None` only when empty.
fn select_kv(
    (scored, lowest): (&[ScoredCandidate], &Lowest<f64>),
    temperature: f64,
    cursor: &mut u64,
    units: &mut dyn UnitSource,
    buffers: (&mut Vec<usize>, &mut Vec<f64>, &mut Vec<f64>),
) -> Option<(usize, SelectionReason)> {
    let (rows, costs, probabilities) = buffers;
    if scored.is_empty() {
        return None;
    }
    let turn = *cursor;
    *cursor = cursor.wrapping_add(1);
    let round_robin = || {
        let index = usize::try_from(turn % scored.len() as u64).unwrap_or(0);
        Some((index, SelectionReason::RoundRobinStale))
    };
    if temperature > 0.0 {
        rows.clear();
        costs.clear();
        for (i, c) in scored.iter().enumerate() {
            if let Some(cost) = c.cost {
                rows.push(i);
                costs.push(cost);
            }
        }
        if rows.is_empty() {
            return round_robin();
        }
        let row = softmax_sample_index(costs, temperature, units.next_unit(), probabilities)?;
        return Some((*rows.get(row)?, SelectionReason::KvAware));
    }
    // Temperature 0: the lowest cost, exact ties in candidate order rotated by the cursor.
    match lowest.choose(turn, scored.len(), |i| scored.get(i).and_then(|c| c.cost)) {
        Some(index) => Some((index, SelectionReason::KvAware)),
        None => round_robin(),
    }
}

/// The KV-aware [`WorkerPicker`] (module docs): its tunables, cursors, scratch space and sample
/// source (one instance per shard).
#[derive(Debug)]
pub struct KvAwarePicker {
    params: KvParams,
    cursors: PickerCursors,
    kv: KvScratch,
    load: PickScratch,
    units: Box<dyn UnitSource>,
    /// Conditional disaggregation (KV-PICK-12..15); `None`: off, the default.
    conditional: Option<ConditionalDisagg>,
    /// The pool's decode ranks as the last conditional pick scored them.
    pool_decode: KvScratch,
    /// How the last conditional pick decided.
    last_bypass: Option<BypassDecision>,
}

impl KvAwarePicker {
    /// A picker whose cursors start at zero, sampling from `units` at a positive temperature.
    pub fn new(params: KvParams, units: Box<dyn UnitSource>) -> Self {
        Self {
            params,
            cursors: PickerCursors::default(),
            kv: KvScratch::new(),
            load: PickScratch::new(),
            units,
            conditional: None,
            pool_decode: KvScratch::new(),
            last_bypass: None,
        }
    }

    /// The same picker with conditional disaggregation set (`None`: off).
    pub fn with_conditional(mut self, conditional: Option<ConditionalDisagg>) -> Self {
        self.conditional = conditional;
        self
    }

    /// How the last pick that went through conditional disaggregation decided.
    pub fn last_bypass(&self) -> Option<BypassDecision> {
        self.last_bypass
    }

    /// A pool's pair under conditional disaggregation (KV-PICK-12/13): the decode ranks of the
    /// prefill rank's namespace compete on [`super::conditional_decode_cost`] (decode backlog
    /// rules, decode cursor); the chosen one either prefills locally (the pick has no prefill,
    /// reason `conditional_bypass`, the decode rank's KV outcome) or is paired with `prefill`.
    fn conditional_pair<'f>(
        &mut self,
        input: &PickInput<'f>,
        cond: &ConditionalDisagg,
        prefill: ScoredCandidate,
        prefill_chosen: Chosen,
        prefill_kv: Option<KvOutcome>,
    ) -> Result<Pick<'f>, NoWorker> {
        let workers = input.fleet.workers.as_slice();
        let pw = workers.get(prefill.worker).ok_or(NoWorker)?;
        let ns_start = workers.partition_point(|x| x.namespace < pw.namespace);
        let push = |input: &PickInput<'_>, (scored, probes): Pushed<'_>| {
            visit_namespace_ranks(input, ns_start, Role::Decode, &mut |r| {
                push_rank(scored, probes, r)
            });
        };
        let scope = Scope::Namespace {
            start: ns_start,
            role: Role::Decode,
        };
        score_with(
            input,
            &self.params,
            &mut self.pool_decode,
            (scope, push),
            conditional_request_cost,
        );
        let KvScratch {
            scored,
            probes,
            rows,
            costs,
            probabilities,
            lowest,
            ..
        } = &mut self.pool_decode;
        let (index, reason) = select_kv(
            (scored, lowest),
            self.params.temperature,
            &mut self.cursors.decode,
            self.units.as_mut(),
            (rows, costs, probabilities),
        )
        .ok_or(NoWorker)?;
        let d = *scored.get(index).ok_or(NoWorker)?;
        let dw = workers.get(d.worker).ok_or(NoWorker)?;
        let sampled_blocks = probes
            .answers()
            .get(index)
            .filter(|d| d.is_fresh(input.max_staleness, input.now))
            .and_then(|d| d.backlog_of(DigestStanding::Fresh, Stage::Decode).backlog);
        let rank = DecodeRank {
            block_size: d.block_size,
            overlap_blocks: d.overlap_blocks,
            sampled_blocks,
            total_kv_blocks: dw.capacity.total_kv_blocks,
        };
        let decision = decide_bypass(cond, &self.params, input.prompt_tokens.get(), rank);
        self.last_bypass = Some(decision);
        let decode_rank = rank_header(dw, d.dp_rank);
        if decision.bypass() {
            return Ok(Pick {
                namespace: dw.namespace.as_str(),
                decode: Chosen {
                    instance_id: d.instance_id,
                    dp_rank: d.dp_rank,
                    reason: SelectionReason::ConditionalBypass,
                },
                prefill: None,
                dp_rank_headers: DpRankHeaders {
                    decode_rank,
                    prefill_rank: None,
                },
                kv: Some(KvOutcome {
                    overlap_blocks: d.overlap_blocks,
                    block_size: d.block_size,
                }),
            });
        }
        Ok(Pick {
            namespace: dw.namespace.as_str(),
            decode: Chosen {
                instance_id: d.instance_id,
                dp_rank: d.dp_rank,
                reason,
            },
            prefill: Some(prefill_chosen),
            dp_rank_headers: DpRankHeaders {
                decode_rank,
                prefill_rank: rank_header(pw, prefill.dp_rank),
            },
            kv: prefill_kv,
        })
    }

    /// The same picker with its cursors at `cursors` (shards start apart).
    pub fn with_cursors(mut self, cursors: PickerCursors) -> Self {
        self.cursors = cursors;
        self
    }

    /// The cursors' current positions.
    pub fn cursors(&self) -> PickerCursors {
        self.cursors
    }

    /// The tunables.
    pub fn params(&self) -> KvParams {
        self.params
    }
}

impl WorkerPicker for KvAwarePicker {
    fn name(&self) -> &'static str {
        "kv_aware"
    }

    fn pick<'f>(&mut self, input: &PickInput<'f>, out: &mut Picks<'f>) -> Result<(), NoWorker> {
        out.clear();
        if input.prompt_blocks.is_empty() {
            return pick_with(input, &mut self.cursors, &mut self.load, out).map(|_| ());
        }
        score_candidates(input, &self.params, &mut self.kv);
        let prefill_ranks = self.kv.prefill_ranks;
        let KvScratch {
            scored,
            rows,
            costs,
            probabilities,
            lowest,
            ..
        } = &mut self.kv;
        let cursor = if prefill_ranks > 0 {
            &mut self.cursors.prefill
        } else {
            &mut self.cursors.decode
        };
        let (index, reason) = select_kv(
            (scored, lowest),
            self.params.temperature,
            cursor,
            self.units.as_mut(),
            (rows, costs, probabilities),
        )
        .ok_or(NoWorker)?;
        let c = *scored.get(index).ok_or(NoWorker)?;
        let workers = input.fleet.workers.as_slice();
        let w = workers.get(c.worker).ok_or(NoWorker)?;
        let chosen = Chosen {
            instance_id: c.instance_id,
            dp_rank: c.dp_rank,
            reason,
        };
        let kv = Some(KvOutcome {
            overlap_blocks: c.overlap_blocks,
            block_size: c.block_size,
        });
        if c.role != Role::Prefill {
            let pick = Pick {
                namespace: w.namespace.as_str(),
                decode: chosen,
                prefill: None,
                dp_rank_headers: DpRankHeaders {
                    decode_rank: rank_header(w, c.dp_rank),
                    prefill_rank: None,
                },
                kv,
            };
            out.push(pick);
            push_kv_runners_up(out, &pick, scored, index, workers);
            return Ok(());
        }
        if let Some(cond) = self.conditional {
            let pick = self.conditional_pair(input, &cond, c, chosen, kv)?;
            out.push(pick);
            return Ok(());
        }
        // The decode side of the pair: load-only rules inside the prefill rank's namespace.
        let ns_start = workers.partition_point(|x| x.namespace < w.namespace);
        let mut alternates = [None; MAX_PICKS - 1];
        let want = out.limit().saturating_sub(1).min(alternates.len());
        let (dslot, dreason) = pair_decode(
            input,
            ns_start,
            &mut self.load,
            &mut self.cursors.decode,
            &mut alternates[..want],
        )
        .ok_or(NoWorker)?;
        let dw = workers.get(dslot.worker).ok_or(NoWorker)?;
        let pick = Pick {
            namespace: dw.namespace.as_str(),
            decode: Chosen {
                instance_id: dw.instance_id,
                dp_rank: dslot.rank,
                reason: dreason,
            },
            prefill: Some(chosen),
            dp_rank_headers: DpRankHeaders {
                decode_rank: rank_header(dw, dslot.rank),
                prefill_rank: rank_header(w, c.dp_rank),
            },
            kv,
        };
        push_ordered(out, &pick, workers, &alternates);
        Ok(())
    }

    fn preview(&self) -> Option<Box<dyn WorkerPicker>> {
        let units = Box::new(super::SplitMix64::new(PREVIEW_SEED));
        Some(Box::new(
            KvAwarePicker::new(self.params, units)
                .with_cursors(self.cursors)
                .with_conditional(self.conditional),
        ))
    }
}

/// The sample source of a [`WorkerPicker::preview`] copy (a fixed seed: previews repeat).
const PREVIEW_SEED: u64 = 0x6578_706c_6169_6e00;

/// After a self-prefilling pick, appends the next-cheapest candidates of the same namespace and
/// role (defined costs only, ascending, ties in candidate order), each with its own rank header
/// and KV outcome, until `out` is full. Only runs when the caller wants more than one.
fn push_kv_runners_up<'f>(
    out: &mut Picks<'f>,
    pick: &Pick<'f>,
    scored: &[ScoredCandidate],
    chosen: usize,
    workers: &[Worker],
) {
    let Some(role) = scored.get(chosen).map(|c| c.role) else {
        return;
    };
    let mut picked = [None; MAX_PICKS - 1];
    let want = out.limit().saturating_sub(out.len()).min(MAX_PICKS - 1);
    let picked = &mut picked[..want];
    cheapest_others(
        scored.len(),
        chosen,
        |i| scored.get(i).and_then(|c| c.cost),
        |i| {
            scored.get(i).is_some_and(|c| {
                c.role == role
                    && workers
                        .get(c.worker)
                        .is_some_and(|w| w.namespace == pick.namespace)
            })
        },
        picked,
    );
    for c in picked.iter().flatten().filter_map(|&i| scored.get(i)) {
        let Some(w) = workers.get(c.worker) else {
            return;
        };
        let mut alt = with_decode(pick, w, c.dp_rank);
        alt.kv = Some(KvOutcome {
            overlap_blocks: c.overlap_blocks,
            block_size: c.block_size,
        });
        out.push(alt);
    }
}
