//! Room `sim`: the pure scheduler core of the simulated engine. Continuous batching like vLLM and
//! MindIE: a FIFO waiting queue, admission while the KV cache has room for a sequence's current
//! tokens (not its `max_tokens`), prefill passes that run alone and stall every decode (MindIE's
//! default) or chunks of prefills mixed into decode passes (`chunked_prefill`), one token per
//! running sequence per decode pass, and preemption of the newest sequence by recompute when the
//! growing sequences overflow the cache.
//!
//! With chunked prefill, up to `max_partial_prefills` prompts are prefilled at once (vLLM's
//! `max_num_partial_prefills`): the chunk budget is split evenly between them, and at most one of
//! them may be longer than `long_prefill_threshold` tokens, so a short prompt arriving behind a
//! long one is admitted past it and prefilled beside it instead of waiting for its end.
//!
//! No clock and no I/O: every method takes `now` (simulated time since the engine started) and
//! reports what happened as [`Event`]s stamped with the exact simulated instant.

use super::timing::StepTiming;
use crate::capacity::{sequence_footprint_bytes, CapacityInputs};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Identifies one sequence (one request) inside the engine.
pub type SeqId = u64;

/// The shape of the KV cache: paged blocks of `block_tokens` tokens plus a fixed per-sequence
/// state, inside a budget of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Tokens per cache block (MindIE `cacheBlockSize`, vLLM `block_size`).
    pub block_tokens: u64,
    /// KV bytes per resident token.
    pub kv_bytes_per_token: u64,
    /// Fixed bytes per resident sequence (Gated DeltaNet state).
    pub state_bytes_per_seq: u64,
    /// Bytes available for the cache.
    pub budget_bytes: u64,
}

impl KvGeometry {
    /// A cache that never fills (the fixed-pace mode).
    pub fn unlimited() -> Self {
        Self {
            block_tokens: 1,
            kv_bytes_per_token: 0,
            state_bytes_per_seq: 0,
            budget_bytes: u64::MAX,
        }
    }

    /// The cache of a deployment: its blocks, per-token KV, per-sequence state and budget.
    pub fn of_deployment(inputs: &CapacityInputs) -> Self {
        Self {
            block_tokens: inputs.block_tokens,
            kv_bytes_per_token: inputs.model.kv_bytes_per_token,
            state_bytes_per_seq: inputs.model.state_bytes_per_sequence,
            budget_bytes: inputs.kv_budget_bytes(),
        }
    }

    /// Bytes held by one sequence with `tokens` resident tokens: whole blocks plus its state.
    pub fn footprint_bytes(&self, tokens: u64) -> u64 {
        sequence_footprint_bytes(
            tokens,
            self.block_tokens,
            self.kv_bytes_per_token,
            self.state_bytes_per_seq,
        )
    }
}

/// Scheduler settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// The KV cache.
    pub kv: KvGeometry,
    /// Most sequences decoding at once (MindIE `maxBatchSize`).
    pub max_batch: usize,
    /// Token budget of one prefill pass (MindIE `maxPrefillTokens`); a single longer prompt
    /// still runs, alone.
    pub max_prefill_tokens: u64,
    /// `Some(n)`: prefills advance by chunks of `n` tokens mixed into decode passes.
    pub chunked_prefill: Option<u64>,
    /// Prompts prefilled at once with `chunked_prefill`, sharing its `n` tokens evenly per pass
    /// (1: one prompt at a time, in arrival order).
    pub max_partial_prefills: usize,
    /// Prompts longer than this many tokens are long: at most one of them is prefilled at a time,
    /// and shorter ones queued behind it are admitted past it (`None`: no prompt is long).
    pub long_prefill_threshold: Option<u64>,
    /// Longest prompt + output a request may ask for.
    pub max_model_len: u64,
}

impl EngineConfig {
    /// MindIE's defaults on cache `kv` (batch 200, prefill budget 8,192 tokens, prefills alone,
    /// not chunked), with the sim's own context limit of 65,536 tokens.
    pub fn mindie(kv: KvGeometry) -> Self {
        Self {
            kv,
            max_batch: 200,
            max_prefill_tokens: 8192,
            chunked_prefill: None,
            max_partial_prefills: 1,
            long_prefill_threshold: None,
            max_model_len: 65_536,
        }
    }

    /// Checks a request's lengths against `max_model_len`, as vLLM does before queueing it.
    pub fn check_lengths(&self, prompt_tokens: u64, output_tokens: u64) -> Result<(), String> {
        let total = prompt_tokens + output_tokens;
        if total > self.max_model_len || prompt_tokens >= self.max_model_len {
            return Err(format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                 tokens ({} in the messages, {} in the completion). Please reduce the length of \
                 the messages or completion.",
                self.max_model_len, total, prompt_tokens, output_tokens
            ));
        }
        Ok(())
    }

    /// Checks the settings: the longest allowed sequence fits the cache alone (so preemption
    /// always ends with at least that sequence running), counts are positive, and partial
    /// prefills have the chunks to share and are on when a long-prompt threshold is given.
    pub fn validate(&self) -> Result<(), String> {
        let longest = self.kv.footprint_bytes(self.max_model_len);
        if longest > self.kv.budget_bytes {
            return Err(format!(
                "max_model_len {} needs {} bytes of KV cache; the budget is {} bytes",
                self.max_model_len, longest, self.kv.budget_bytes
            ));
        }
        if self.max_batch == 0
            || self.chunked_prefill == Some(0)
            || self.kv.block_tokens == 0
            || self.max_partial_prefills == 0
        {
            return Err(
                "max_batch, chunked_prefill, block_tokens and max_partial_prefills must be positive"
                    .into(),
            );
        }
        if self.max_partial_prefills > 1
            && self
                .chunked_prefill
                .is_none_or(|n| n < self.max_partial_prefills as u64)
        {
            return Err(
                "max_partial_prefills > 1 needs chunked_prefill of at least that many tokens"
                    .into(),
            );
        }
        // One prompt prefilled at a time already keeps long ones apart and admits nothing
        // past them: the threshold would change nothing.
        if self.long_prefill_threshold.is_some() && self.max_partial_prefills < 2 {
            return Err("long_prefill_threshold needs max_partial_prefills of at least 2".into());
        }
        Ok(())
    }
}

/// A request as the engine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRequest {
    /// Caller-chosen unique id.
    pub id: SeqId,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens to generate before the sequence ends (at least 1).
    pub output_tokens: u64,
}

/// Something the engine did, at an exact simulated instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Sequence `id` produced its token number `index` (1-based); `last` when it is done.
    Token {
        /// The sequence.
        id: SeqId,
        /// 1-based token number.
        index: u64,
        /// When the pass that produced it ended.
        at: Duration,
        /// The sequence finished with this token.
        last: bool,
    },
    /// Sequence `id` was evicted to make room and will be recomputed from the waiting queue.
    Preempted {
        /// The sequence.
        id: SeqId,
        /// When.
        at: Duration,
    },
}

/// Counters and gauges of the engine at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineSnapshot {
    /// Sequences decoding or being prefilled.
    pub running: usize,
    /// Sequences waiting for admission.
    pub waiting: usize,
    /// Cache bytes held.
    pub used_bytes: u64,
    /// Cache bytes available in all.
    pub budget_bytes: u64,
    /// Preemptions so far.
    pub preemptions: u64,
}

#[derive(Debug, Clone)]
struct Seq {
    id: SeqId,
    prompt: u64,
    target: u64,
    generated: u64,
    allocated: u64,
    /// Tokens this (re)admission must prefill: prompt plus what was generated before a preemption.
    to_prefill: u64,
    prefilled: u64,
}

impl Seq {
    fn context(&self) -> u64 {
        self.prompt + self.generated
    }

    /// Prompt tokens a partial-prefill pass giving each sequence `share` prefills of this one.
    fn chunk(&self, share: u64) -> u64 {
        share.min(self.to_prefill - self.prefilled)
    }
}

#[derive(Debug)]
enum Pass {
    /// Whole prefills of these sequences, alone on the card.
    Prefill(Vec<Seq>),
    /// One decode token for every running sequence, plus up to `share` tokens of each sequence
    /// being prefilled (0 without chunked prefill).
    Decode { share: u64 },
}

#[derive(Debug)]
struct InFlight {
    ends: Duration,
    pass: Pass,
}

/// The scheduler: owns the queues and the cache ledger; driven by `submit`, `cancel`, `advance`.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    timing: Arc<dyn StepTiming>,
    waiting: VecDeque<Seq>,
    /// In admission order: the last is the newest, the first to be preempted.
    running: Vec<Seq>,
    /// The sequences whose chunked prefill is under way, in admission order (they are newer
    /// than every running one).
    prefilling: Vec<Seq>,
    in_flight: Option<InFlight>,
    used: u64,
    preemptions: u64,
}

impl Engine {
    /// An idle engine. `cfg` must have passed [`EngineConfig::validate`].
    pub fn new(cfg: EngineConfig, timing: Arc<dyn StepTiming>) -> Self {
        Self {
            cfg,
            timing,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefilling: Vec::new(),
            in_flight: None,
            used: 0,
            preemptions: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queues a request arriving now. The caller has advanced the engine to now, and advances
    /// it again afterwards to start a pass if the engine was idle: requests queued between two
    /// `advance` calls at the same instant are scheduled together.
    pub fn submit(&mut self, req: SeqRequest) {
        self.waiting.push_back(Seq {
            id: req.id,
            prompt: req.prompt_tokens,
            target: req.output_tokens.max(1),
            generated: 0,
            allocated: 0,
            to_prefill: 0,
            prefilled: 0,
        });
    }

    /// Forgets a sequence (its client went away) and frees its cache. Returns whether it was
    /// known. A pass already under way keeps its duration.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i);
            return true;
        }
        let removed = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            Some(self.running.remove(i))
        } else if let Some(i) = self.prefilling.iter().position(|s| s.id == id) {
            Some(self.prefilling.remove(i))
        } else if let Some(InFlight {
            pass: Pass::Prefill(batch),
            ..
        }) = &mut self.in_flight
        {
            batch
                .iter()
                .position(|s| s.id == id)
                .map(|i| batch.remove(i))
        } else {
            None
        };
        match removed {
            Some(seq) => {
                self.used -= seq.allocated;
                true
            }
            None => false,
        }
    }

    /// When the pass under way ends, if one is.
    pub fn next_event(&self) -> Option<Duration> {
        self.in_flight.as_ref().map(|f| f.ends)
    }

    /// Completes every pass that ends at or before `now`, starting the next one each time, and
    /// starts a pass at `now` if the engine is idle with work queued.
    pub fn advance(&mut self, now: Duration, out: &mut Vec<Event>) {
        loop {
            match self.next_event() {
                Some(ends) if ends <= now => {
                    if let Some(done) = self.in_flight.take() {
                        self.finish_pass(done, out);
                    }
                    self.start_pass(ends, out);
                }
                Some(_) => return,
                None => {
                    self.start_pass(now, out);
                    if self.in_flight.is_none() {
                        return;
                    }
                }
            }
        }
    }

    /// Counters and gauges now.
    pub fn snapshot(&self) -> EngineSnapshot {
        let prefilling = match &self.in_flight {
            Some(InFlight {
                pass: Pass::Prefill(batch),
                ..
            }) => batch.len(),
            _ => 0,
        };
        EngineSnapshot {
            running: self.running.len() + prefilling + self.prefilling.len(),
            waiting: self.waiting.len(),
            used_bytes: self.used,
            budget_bytes: self.cfg.kv.budget_bytes,
            preemptions: self.preemptions,
        }
    }

    fn free_bytes(&self) -> u64 {
        self.cfg.kv.budget_bytes - self.used
    }

    /// Takes the waiting sequence at `index` into the cache if it fits and the batch has a slot
    /// beside `extra_seqs` sequences admitted in this pass.
    fn admit_at(&mut self, index: usize, extra_seqs: usize) -> Option<Seq> {
        let candidate = self.waiting.get(index)?;
        let need = self.cfg.kv.footprint_bytes(candidate.context());
        let slots = self.running.len() + self.prefilling.len() + extra_seqs;
        if slots >= self.cfg.max_batch || need > self.free_bytes() {
            return None;
        }
        let mut seq = self.waiting.remove(index)?;
        seq.allocated = need;
        seq.to_prefill = seq.context();
        seq.prefilled = 0;
        self.used += need;
        Some(seq)
    }

    fn start_pass(&mut self, now: Duration, out: &mut Vec<Event>) {
        let (duration, pass) = match self.cfg.chunked_prefill {
            None => {
                let batch = self.admit_prefill_batch();
                if !batch.is_empty() {
                    let tokens: Vec<u64> = batch.iter().map(|s| s.to_prefill).collect();
                    (self.timing.prefill(&tokens), Pass::Prefill(batch))
                } else if !self.running.is_empty() {
                    self.make_room(now, out);
                    (self.decode_duration(0), Pass::Decode { share: 0 })
                } else {
                    return;
                }
            }
            Some(chunk_tokens) => {
                self.make_room(now, out);
                self.admit_partial_prefills();
                // vLLM's split: each of the n prompts gets at most budget / n tokens this pass.
                let share = chunk_tokens / self.prefilling.len().max(1) as u64;
                let chunk: u64 = self.prefilling.iter().map(|p| p.chunk(share)).sum();
                if self.running.is_empty() && chunk == 0 {
                    return;
                }
                (self.decode_duration(chunk), Pass::Decode { share })
            }
        };
        self.in_flight = Some(InFlight {
            ends: now + duration,
            pass,
        });
    }

    /// Whether `seq`'s prefill counts against the one-long-prefill limit.
    fn is_long(&self, seq: &Seq) -> bool {
        self.cfg
            .long_prefill_threshold
            .is_some_and(|t| seq.context() > t)
    }

    /// Admits waiting sequences in order into the partial prefills while there is a free one,
    /// passing over long prompts while a long one is being prefilled, and stopping at the first
    /// that does not fit the cache or the batch (the cache stays first come, first served).
    fn admit_partial_prefills(&mut self) {
        let mut index = 0;
        while self.prefilling.len() < self.cfg.max_partial_prefills {
            let Some(candidate) = self.waiting.get(index) else {
                return;
            };
            if self.is_long(candidate) && self.prefilling.iter().any(|p| self.is_long(p)) {
                index += 1;
                continue;
            }
            let Some(seq) = self.admit_at(index, 0) else {
                return;
            };
            self.prefilling.push(seq);
        }
    }

    /// FIFO admission of whole prefills, within the cache, the batch and the prefill budget.
    fn admit_prefill_batch(&mut self) -> Vec<Seq> {
        let mut batch: Vec<Seq> = Vec::new();
        let mut tokens = 0;
        while let Some(head) = self.waiting.front() {
            if !batch.is_empty() && tokens + head.context() > self.cfg.max_prefill_tokens {
                break;
            }
            let Some(seq) = self.admit_at(0, batch.len()) else {
                break;
            };
            tokens += seq.to_prefill;
            batch.push(seq);
        }
        batch
    }

    fn decode_duration(&self, chunk: u64) -> Duration {
        let contexts: Vec<u64> = self.running.iter().map(Seq::context).collect();
        self.timing.step(&contexts, chunk)
    }

    /// Grows every running sequence by the token this pass writes; while that overflows the
    /// cache, preempts the newest sequence (the one being prefilled first) by recompute.
    fn make_room(&mut self, now: Duration, out: &mut Vec<Event>) {
        loop {
            let growth: u64 = self
                .running
                .iter()
                .map(|s| self.cfg.kv.footprint_bytes(s.context()) - s.allocated)
                .sum();
            if growth <= self.free_bytes() {
                break;
            }
            // Invariant: growth > 0 implies a running sequence, and the longest sequence fits
            // alone (EngineConfig::validate), so this ends with at least one running.
            let Some(mut victim) = self.prefilling.pop().or_else(|| self.running.pop()) else {
                break;
            };
            self.used -= victim.allocated;
            victim.allocated = 0;
            self.preemptions += 1;
            out.push(Event::Preempted {
                id: victim.id,
                at: now,
            });
            self.waiting.push_front(victim);
        }
        for s in &mut self.running {
            let need = self.cfg.kv.footprint_bytes(s.context());
            self.used += need - s.allocated;
            s.allocated = need;
        }
    }

    fn finish_pass(&mut self, done: InFlight, out: &mut Vec<Event>) {
        let at = done.ends;
        match done.pass {
            Pass::Prefill(batch) => {
                for seq in batch {
                    self.emit_and_keep(seq, at, out);
                }
            }
            Pass::Decode { share } => {
                let running = std::mem::take(&mut self.running);
                for seq in running {
                    self.emit_and_keep(seq, at, out);
                }
                // Sequences join the partial prefills only when a pass starts (a cancel only
                // removes them), so each one here gets the chunk the pass was timed with.
                for mut p in std::mem::take(&mut self.prefilling) {
                    p.prefilled += p.chunk(share);
                    if p.prefilled == p.to_prefill {
                        self.emit_and_keep(p, at, out);
                    } else {
                        self.prefilling.push(p);
                    }
                }
            }
        }
    }

    /// Gives `seq` its next token; keeps it running unless that was its last.
    fn emit_and_keep(&mut self, mut seq: Seq, at: Duration, out: &mut Vec<Event>) {
        seq.generated += 1;
        let last = seq.generated >= seq.target;
        out.push(Event::Token {
            id: seq.id,
            index: seq.generated,
            at,
            last,
        });
        if last {
            self.used -= seq.allocated;
        } else {
            self.running.push(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::StateDtype;
    use crate::sim::timing::{Pace, Roofline};

    fn roofline() -> Arc<dyn StepTiming> {
        Arc::new(Roofline::qwen35_27b_on_910b3())
    }

    fn cfg(kv: KvGeometry) -> EngineConfig {
        EngineConfig::mindie(kv)
    }

    /// The pass time of [`paced`] engines.
    const PACE: Duration = Duration::from_millis(10);

    /// An engine on `c` whose every pass takes [`PACE`], and its event log.
    fn paced(c: EngineConfig) -> (Engine, Vec<Event>) {
        (Engine::new(c, Arc::new(Pace(PACE))), Vec::new())
    }

    /// One 910B3 with Qwen3.5-27B: 8e9 bytes in 128-token blocks.
    fn big_cache() -> KvGeometry {
        let kv = KvGeometry::of_deployment(&Roofline::qwen35_27b_on_910b3().0);
        assert_eq!(kv.budget_bytes, 8_000_000_000);
        kv
    }

    fn req(id: SeqId, prompt: u64, output: u64) -> SeqRequest {
        SeqRequest {
            id,
            prompt_tokens: prompt,
            output_tokens: output,
        }
    }

    /// Requests arriving together at `now`.
    fn arrive(engine: &mut Engine, now: Duration, reqs: &[SeqRequest], out: &mut Vec<Event>) {
        engine.advance(now, out);
        for r in reqs {
            engine.submit(*r);
        }
        engine.advance(now, out);
    }

    /// Runs passes until the engine is idle.
    fn drain(engine: &mut Engine, out: &mut Vec<Event>) {
        while let Some(t) = engine.next_event() {
            engine.advance(t, out);
        }
    }

    fn token_times(events: &[Event], seq: SeqId) -> Vec<Duration> {
        events
            .iter()
            .filter_map(|e| match *e {
                Event::Token { id, at, .. } if id == seq => Some(at),
                _ => None,
            })
            .collect()
    }

    fn gaps(times: &[Duration]) -> Vec<Duration> {
        times.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[test]
    fn lone_request_ttft_is_the_models_prefill_time() {
        let timing = roofline();
        let mut e = Engine::new(cfg(big_cache()), timing.clone());
        let mut out = Vec::new();
        arrive(&mut e, Duration::ZERO, &[req(1, 3000, 3)], &mut out);
        drain(&mut e, &mut out);
        let times = token_times(&out, 1);
        assert_eq!(times[0], timing.prefill(&[3000]));
        // 2 P L / (F x compute efficiency) on the 910B3
        assert_eq!(
            times[0],
            Duration::from_secs_f64(2.0 * 27e9 * 3000.0 / (313e12 * 0.35))
        );
        // Then one decode step per token, at the sequence's growing context.
        assert_eq!(
            gaps(&times),
            vec![timing.step(&[3001], 0), timing.step(&[3002], 0)]
        );
        assert_eq!(e.snapshot().used_bytes, 0);
    }

    #[test]
    fn batch_of_b_equal_requests_has_tpot_of_the_step_at_b() {
        const B: u64 = 16;
        let timing = roofline();
        let mut e = Engine::new(cfg(big_cache()), timing.clone());
        let mut out = Vec::new();
        let reqs: Vec<SeqRequest> = (0..B).map(|id| req(id, 200, 6)).collect();
        arrive(&mut e, Duration::ZERO, &reqs, &mut out);
        drain(&mut e, &mut out);
        // All B prompts fit one prefill pass (3,200 <= 8,192 tokens): first tokens together.
        let prefill = timing.prefill(&[200; B as usize]);
        let expected: Vec<Duration> = (1..6)
            .map(|k| timing.step(&[200 + k; B as usize], 0))
            .collect();
        for id in 0..B {
            let times = token_times(&out, id);
            assert_eq!(times[0], prefill);
            assert_eq!(gaps(&times), expected);
        }
        // The step at B = 16 streams the weights at 0.45 of 1.6 TB/s, then reads 16 sequences'
        // KV and reads and writes back their DeltaNet state at 0.61 of it (memory-bound).
        let weights = 54e9 / (1.6e12 * 0.45);
        let cache = 16.0 * (201.0 * 65_536.0 + 2.0 * 153_944_064.0) / (1.6e12 * 0.61);
        assert_eq!(expected[0], Duration::from_secs_f64(weights + cache));
        assert_eq!(expected[0].as_micros(), 80_263);
    }

    #[test]
    fn a_long_sequence_slows_every_step_it_shares() {
        // Two 910B3s: each card reads a 25,000-token sequence's two KV heads on two of its 20
        // cores, so the step waits for them whatever the rest of the batch is.
        let tp2 = Roofline::from_names("910b3", "qwen3.5-27b", StateDtype::Fp32, 2).unwrap();
        let mut c = cfg(KvGeometry::of_deployment(&tp2.0));
        c.max_prefill_tokens = 32_768;
        let timing: Arc<dyn StepTiming> = Arc::new(tp2);
        let mut e = Engine::new(c, timing.clone());
        let mut out = Vec::new();
        arrive(
            &mut e,
            Duration::ZERO,
            &[req(1, 200, 4), req(2, 25_000, 4)],
            &mut out,
        );
        drain(&mut e, &mut out);
        // one prefill pass for both, then decode steps over both
        let g = gaps(&token_times(&out, 1));
        assert_eq!(g[0], timing.step(&[201, 25_001], 0));
        // 37.5 ms of weights + 25,001 x 16,384 B at 1.6e12 x 0.61 / 20 + both states read and
        // written, against 37.9 ms beside another chat
        assert_eq!(g[0].as_micros(), 46_209);
        assert_eq!(timing.step(&[201, 201], 0).as_micros(), 37_882);
    }

    #[test]
    fn a_30k_prefill_stalls_running_decodes_by_its_duration() {
        let timing = roofline();
        let mut e = Engine::new(cfg(big_cache()), timing.clone());
        let mut out = Vec::new();
        arrive(
            &mut e,
            Duration::ZERO,
            &[req(1, 200, 50), req(2, 200, 50)],
            &mut out,
        );
        // Let the pair decode a few tokens, then a 30K prompt arrives mid-step.
        for _ in 0..4 {
            let t = e.next_event().unwrap();
            e.advance(t, &mut out);
        }
        let mid_step = e.next_event().unwrap() - Duration::from_millis(1);
        arrive(&mut e, mid_step, &[req(3, 30_000, 2)], &mut out);
        drain(&mut e, &mut out);
        let times = token_times(&out, 1);
        let g = gaps(&times);
        // Tokens 1..=5 came before the stall: the gap from token 5 to 6 holds the whole prefill
        // of the long prompt plus the decode step that follows it.
        assert_eq!(g[3], timing.step(&[204, 204], 0));
        // (The long request decodes in that step too.)
        assert_eq!(
            g[4] - timing.step(&[205, 205, 30_001], 0),
            timing.prefill(&[30_000])
        );
        assert!(timing.prefill(&[30_000]) > Duration::from_secs(5));
        // The long request's first token comes when its prefill ends.
        assert_eq!(
            token_times(&out, 3)[0],
            times[4] + timing.prefill(&[30_000])
        );
    }

    #[test]
    fn chunked_prefill_mixes_chunks_into_decode_steps() {
        let timing = roofline();
        let mut c = cfg(big_cache());
        c.chunked_prefill = Some(2048);
        let mut e = Engine::new(c, timing.clone());
        let mut out = Vec::new();
        arrive(&mut e, Duration::ZERO, &[req(1, 200, 30)], &mut out);
        // Alone, the first chunk is the whole short prompt: a pass of 200 prefill tokens.
        assert_eq!(e.next_event(), Some(timing.step(&[], 200)));
        // Request 2 arrives during that first pass and is chunked into the passes after it.
        let during = e.next_event().unwrap() - Duration::from_millis(1);
        arrive(&mut e, during, &[req(2, 5000, 2)], &mut out);
        drain(&mut e, &mut out);
        let g = gaps(&token_times(&out, 1));
        // 5,000 tokens = chunks of 2048, 2048, 904 riding on the decode of request 1.
        assert_eq!(g[0], timing.step(&[201], 2048));
        assert_eq!(g[1], timing.step(&[202], 2048));
        assert_eq!(g[2], timing.step(&[203], 904));
        assert_eq!(g[3], timing.step(&[204, 5001], 0));
        let first_of_2 = token_times(&out, 2)[0];
        assert_eq!(first_of_2, token_times(&out, 1)[3]);
    }

    /// A 2,000-token prompt `L` alone, then a 200-token prompt `S` arriving during the first
    /// pass, with 256-token chunks and `partial` prompts prefilled at once (threshold 1,000
    /// when there are several).
    fn long_then_short(partial: usize) -> (Vec<Event>, Arc<dyn StepTiming>) {
        let timing = roofline();
        let mut c = cfg(big_cache());
        c.chunked_prefill = Some(256);
        c.max_partial_prefills = partial;
        c.long_prefill_threshold = (partial > 1).then_some(1000);
        assert_eq!(c.validate(), Ok(()));
        let mut e = Engine::new(c, timing.clone());
        let mut out = Vec::new();
        arrive(&mut e, Duration::ZERO, &[req(1, 2000, 2)], &mut out);
        let during = e.next_event().unwrap() - Duration::from_millis(1);
        arrive(&mut e, during, &[req(2, 200, 3)], &mut out);
        drain(&mut e, &mut out);
        (out, timing)
    }

    #[test]
    fn a_short_prompt_is_prefilled_beside_a_long_one() {
        let (out, timing) = long_then_short(2);
        let full = timing.step(&[], 256);
        // Pass 1: L alone (256). Passes 2-3: the 256 tokens split 128/128 between L and S,
        // then L 128 and S's last 72: S's first token ends pass 3.
        let t3 = full + full + timing.step(&[], 200);
        let t4 = t3 + timing.step(&[201], 256);
        let t5 = t4 + timing.step(&[202], 256);
        assert_eq!(token_times(&out, 2), vec![t3, t4, t5]);
        // L has 512 tokens after pass 3 and 1,024 after pass 5; then three 256-token passes
        // alone and its last 208 tokens.
        let l_first = t5 + 3 * full + timing.step(&[], 208);
        assert_eq!(token_times(&out, 1)[0], l_first);
        // 2 x 126.2 ms (2 P x 256 / (F x 0.35)) + 98.6 ms.
        assert_eq!(t3.as_micros(), 350_963);
    }

    #[test]
    fn one_prefill_at_a_time_makes_the_short_prompt_wait_for_the_long_one() {
        let (out, timing) = long_then_short(1);
        let full = timing.step(&[], 256);
        // L takes seven 256-token passes and one of 208; S's 200 tokens ride on L's decode.
        let l_first = 7 * full + timing.step(&[], 208);
        assert_eq!(token_times(&out, 1)[0], l_first);
        let s_first = l_first + timing.step(&[2001], 200);
        assert_eq!(token_times(&out, 2)[0], s_first);
        // 7 x 126.2 ms + 102.5 ms + 99.1 ms, against 351.0 ms beside it.
        assert_eq!(s_first.as_micros(), 1_084_929);
    }

    #[test]
    fn a_second_long_prompt_waits_while_short_ones_pass_it() {
        let mut c = cfg(KvGeometry::unlimited());
        c.chunked_prefill = Some(256);
        c.max_partial_prefills = 3;
        c.long_prefill_threshold = Some(1000);
        let (mut e, mut out) = paced(c);
        let reqs = [req(1, 2000, 20), req(2, 1500, 2), req(3, 100, 20)];
        arrive(&mut e, Duration::ZERO, &reqs, &mut out);
        // 1 and 3 are being prefilled; 2 (long, behind the long 1) waits.
        assert_eq!(e.snapshot().running, 2);
        assert_eq!(e.snapshot().waiting, 1);
        drain(&mut e, &mut out);
        // Pass 1: 1 gets 128 tokens and 3 its 100. Then 1 alone: 7 x 256 and 80 (pass 9).
        assert_eq!(token_times(&out, 3)[0], PACE);
        assert_eq!(token_times(&out, 1)[0], 9 * PACE);
        // 2 is admitted at pass 10: 5 x 256 and 220 (pass 15).
        assert_eq!(token_times(&out, 2)[0], 15 * PACE);
        assert_eq!(e.snapshot().used_bytes, 0);
    }

    #[test]
    fn a_cancelled_partial_prefill_leaves_its_share_to_the_others() {
        let mut c = cfg(KvGeometry::unlimited());
        c.chunked_prefill = Some(8);
        c.max_partial_prefills = 2;
        let (mut e, mut out) = paced(c);
        arrive(
            &mut e,
            Duration::ZERO,
            &[req(1, 16, 1), req(2, 16, 1)],
            &mut out,
        );
        // Pass 1 gives each 4 tokens; 1 goes away during it. 2 then gets all 8: 4 + 8 + 4.
        assert!(e.cancel(1));
        drain(&mut e, &mut out);
        assert!(token_times(&out, 1).is_empty());
        assert_eq!(token_times(&out, 2), vec![3 * PACE]);
    }

    #[test]
    fn growth_preempts_the_newest_partial_prefill_first() {
        let mut c = cfg(tiny_cache(16));
        c.max_model_len = 16;
        c.chunked_prefill = Some(2);
        c.max_partial_prefills = 2;
        let (mut e, mut out) = paced(c);
        // 1 is prefilled in two passes; 2 and 3 arrive with its first token and are admitted at
        // the next pass (30 ms): 8 + 4 + 4 bytes fill the cache, and each gets 1 token a pass.
        arrive(&mut e, Duration::ZERO, &[req(1, 4, 10)], &mut out);
        arrive(&mut e, 2 * PACE, &[req(2, 4, 1), req(3, 4, 1)], &mut out);
        drain(&mut e, &mut out);
        // At 60 ms 1 reaches 9 tokens (12 bytes): 3, the newest, is preempted after 3 of its 4
        // tokens; 2 finishes alone at 70 ms and frees the room 3 is recomputed in (2 passes).
        let preempted: Vec<Event> = out
            .iter()
            .filter(|ev| matches!(ev, Event::Preempted { .. }))
            .copied()
            .collect();
        assert_eq!(
            preempted,
            vec![Event::Preempted {
                id: 3,
                at: 6 * PACE
            }]
        );
        assert_eq!(token_times(&out, 2), vec![7 * PACE]);
        assert_eq!(token_times(&out, 3), vec![9 * PACE]);
        assert_eq!(token_times(&out, 1).len(), 10);
        assert_eq!(e.snapshot().used_bytes, 0);
    }

    #[test]
    fn partial_prefills_need_chunks_to_share() {
        let no_chunks =
            "max_partial_prefills > 1 needs chunked_prefill of at least that many tokens";
        let mut c = cfg(big_cache());
        c.max_partial_prefills = 2;
        assert_eq!(c.validate().unwrap_err(), no_chunks);
        c.chunked_prefill = Some(1);
        assert_eq!(c.validate().unwrap_err(), no_chunks);
        c.chunked_prefill = Some(2);
        c.long_prefill_threshold = Some(100);
        assert_eq!(c.validate(), Ok(()));
        c.max_partial_prefills = 1;
        assert_eq!(
            c.validate().unwrap_err(),
            "long_prefill_threshold needs max_partial_prefills of at least 2"
        );
        c.max_partial_prefills = 0;
        assert_eq!(
            c.validate().unwrap_err(),
            "max_batch, chunked_prefill, block_tokens and max_partial_prefills must be positive"
        );
    }

    /// 4-token blocks of 1 byte per token, no state: footprints are easy to follow by hand.
    fn tiny_cache(budget_bytes: u64) -> KvGeometry {
        KvGeometry {
            block_tokens: 4,
            kv_bytes_per_token: 1,
            state_bytes_per_seq: 0,
            budget_bytes,
        }
    }

    #[test]
    fn preemption_happens_exactly_when_growth_overflows_the_cache() {
        let mut c = cfg(tiny_cache(16));
        c.max_model_len = 16;
        let (mut e, mut out) = paced(c);
        arrive(
            &mut e,
            Duration::ZERO,
            &[req(1, 4, 8), req(2, 4, 8)],
            &mut out,
        );
        // One prefill pass for both (4 bytes each), then contexts 5..=8 need 8 bytes each: 16
        // fits exactly. Context 9 needs 12 each: the pass after token 5 must preempt.
        let mut preempted_at = None;
        while let Some(t) = e.next_event() {
            e.advance(t, &mut out);
            if let Some(Event::Preempted { id, at }) =
                out.iter().find(|ev| matches!(ev, Event::Preempted { .. }))
            {
                preempted_at = Some((*id, *at));
                break;
            }
            assert!(e.snapshot().used_bytes <= 16);
        }
        let t1 = token_times(&out, 1);
        assert_eq!(t1.len(), 5);
        assert_eq!(preempted_at, Some((2, t1[4])));
        assert_eq!(e.snapshot().preemptions, 1);
        assert_eq!(e.snapshot().used_bytes, 12);
        drain(&mut e, &mut out);
        // Request 2 is recomputed (prompt + its 5 tokens) once request 1 is done and frees the
        // cache, and goes on from token 6.
        let t1 = token_times(&out, 1);
        let t2 = token_times(&out, 2);
        assert_eq!(t2.len(), 8);
        assert_eq!(t2[5], t1[7] + PACE);
        assert_eq!(e.snapshot().used_bytes, 0);
    }

    #[test]
    fn no_preemption_while_growth_fits() {
        let mut c = cfg(tiny_cache(24));
        c.max_model_len = 16;
        let mut e = Engine::new(c, Arc::new(Pace(Duration::from_millis(10))));
        let mut out = Vec::new();
        arrive(
            &mut e,
            Duration::ZERO,
            &[req(1, 4, 8), req(2, 4, 8)],
            &mut out,
        );
        drain(&mut e, &mut out);
        // Largest context fed is 4 + 7 = 11: 12 bytes each, 24 in all.
        assert_eq!(e.snapshot().preemptions, 0);
        assert_eq!(token_times(&out, 2).len(), 8);
    }

    #[test]
    fn admission_is_fifo_on_current_usage_and_batch_slots() {
        let mut c = cfg(tiny_cache(1000));
        c.max_batch = 2;
        let (mut e, mut out) = paced(c);
        let reqs: Vec<SeqRequest> = (1..=3).map(|id| req(id, 4, 3)).collect();
        arrive(&mut e, Duration::ZERO, &reqs, &mut out);
        assert_eq!(e.snapshot().running, 2);
        assert_eq!(e.snapshot().waiting, 1);
        drain(&mut e, &mut out);
        // 1 and 2: prefill then 2 decodes; 3 is admitted when they finish.
        assert_eq!(token_times(&out, 1), vec![PACE, 2 * PACE, 3 * PACE]);
        assert_eq!(token_times(&out, 3)[0], 4 * PACE);
    }

    #[test]
    fn cancel_frees_the_cache_everywhere() {
        let mut e = Engine::new(
            cfg(tiny_cache(1000)),
            Arc::new(Pace(Duration::from_millis(10))),
        );
        let mut out = Vec::new();
        arrive(&mut e, Duration::ZERO, &[req(1, 40, 5)], &mut out);
        assert_eq!(e.snapshot().used_bytes, 40);
        assert!(e.cancel(1));
        assert_eq!(e.snapshot().used_bytes, 0);
        arrive(&mut e, Duration::ZERO, &[req(2, 8, 5)], &mut out);
        drain(&mut e, &mut out);
        assert!(token_times(&out, 1).is_empty());
        assert_eq!(token_times(&out, 2).len(), 5);
        assert!(!e.cancel(2));
        assert_eq!(
            e.snapshot(),
            EngineSnapshot {
                budget_bytes: 1000,
                ..Default::default()
            }
        );
    }

    #[test]
    fn lengths_are_checked_like_vllm() {
        let c = cfg(big_cache());
        assert!(c.check_lengths(65_000, 536).is_ok());
        assert_eq!(
            c.check_lengths(65_000, 537).unwrap_err(),
            "This model's maximum context length is 65536 tokens. However, you requested 65537 \
             tokens (65000 in the messages, 537 in the completion). Please reduce the length of \
             the messages or completion."
        );
        assert!(c.validate().is_ok());
        let mut small = cfg(tiny_cache(15));
        small.max_model_len = 16;
        assert!(small.validate().is_err());
    }
}
