//! A log-bucketed histogram of non-negative integers (token counts, microseconds) whose
//! quantiles are within [`RELATIVE_ERROR`] of the exact ones, in memory bounded by the range of
//! values, not by how many were recorded.
//!
//! Bucket `k >= 1` holds the values in `(γ^(k-2), γ^(k-1)]` with `γ = (1 + α) / (1 - α)`, and
//! answers for them with `2γ^(k-1) / (γ + 1)`, which is within `α` of every value in it (the
//! DDSketch mapping); bucket 0 holds 0 exactly. Values are clamped to [`MAX_VALUE`], so a
//! histogram has at most [`MAX_BUCKETS`] buckets however much is recorded; it stores only the
//! buckets it has seen, sorted, so a minute of chat traffic costs a few hundred bytes.

/// The stated relative error `α` of every quantile: the estimate `q̂` of a quantile whose
/// exact (nearest-rank) value is `v` satisfies `|q̂ - v| <= α v`.
pub const RELATIVE_ERROR: f64 = 0.01;

/// Values above this are recorded as this (2^30: a billion tokens, or 1,074 s in µs).
pub const MAX_VALUE: u64 = 1 << 30;

/// `γ`: the ratio between a bucket's upper and lower bounds.
const GAMMA: f64 = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR);

/// The most buckets a histogram can have: 0, and one per power of `γ` up to [`MAX_VALUE`].
pub const MAX_BUCKETS: usize = 1 + 1 + 1050;

/// Counts per bucket, only for buckets with a count, sorted by bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogHistogram {
    buckets: Vec<(u16, u64)>,
    count: u64,
}

/// The bucket of `v`.
fn bucket(v: u64) -> u16 {
    if v == 0 {
        return 0;
    }
    let v = v.min(MAX_VALUE) as f64;
    // ln(2^30) / ln(γ) is 1,039.6: the key fits in a u16 with room to spare.
    1 + (v.ln() / GAMMA.ln()).ceil() as u16
}

/// The value bucket `k` answers with: the one integer it holds when it holds only one (every
/// value below 50 has a bucket to itself), else the DDSketch representative.
fn representative(k: u16) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let r = 2.0 * GAMMA.powi(i32::from(k) - 1) / (GAMMA + 1.0);
    // What is recorded is integers (token counts, microseconds): answering 7.92 for a bucket
    // that can only hold 8 would be an error of our own making. The bucket is an interval
    // around `r`, so it holds one integer exactly when one integer of `r - 2 ..= r + 2` is in
    // it: a bucket reaching past that window holds at least two of its integers.
    let low = (r.floor() as u64).saturating_sub(2);
    let mut inside = (low..=r.ceil() as u64 + 2).filter(|&n| bucket(n) == k);
    match (inside.next(), inside.next()) {
        (Some(n), None) => n as f64,
        _ => r,
    }
}

impl LogHistogram {
    /// Records one value.
    pub fn record(&mut self, v: u64) {
        let k = bucket(v);
        match self.buckets.binary_search_by_key(&k, |&(b, _)| b) {
            Ok(i) => self.buckets[i].1 += 1,
            Err(i) => self.buckets.insert(i, (k, 1)),
        }
        self.count += 1;
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// How many buckets it holds (its memory is proportional to this).
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Adds `other`'s counts to this one's.
    pub fn merge(&mut self, other: &LogHistogram) {
        if other.count == 0 {
            return;
        }
        let mut merged = Vec::with_capacity(self.buckets.len().max(other.buckets.len()));
        let (mut a, mut b) = (
            self.buckets.iter().peekable(),
            other.buckets.iter().peekable(),
        );
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&(ka, ca)), Some(&&(kb, cb))) => match ka.cmp(&kb) {
                    std::cmp::Ordering::Less => {
                        a.next();
                        (ka, ca)
                    }
                    std::cmp::Ordering::Greater => {
                        b.next();
                        (kb, cb)
                    }
                    std::cmp::Ordering::Equal => {
                        a.next();
                        b.next();
                        (ka, ca + cb)
                    }
                },
                (Some(&&x), None) => {
                    a.next();
                    x
                }
                (None, Some(&&x)) => {
                    b.next();
                    x
                }
                (None, None) => break,
            };
            merged.push(next);
        }
        self.buckets = merged;
        self.count += other.count;
    }

    /// The `q` quantile (0 < q <= 1) by nearest rank: the value of rank `ceil(q n)` among the
    /// `n` recorded, within [`RELATIVE_ERROR`]. `None` when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for &(k, c) in &self.buckets {
            seen += c;
            if seen >= rank {
                return Some(representative(k));
            }
        }
        unreachable!("the counts add up to `count`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact nearest-rank quantile of sorted `values`.
    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    fn within_error(estimate: f64, exact: u64) -> bool {
        (estimate - exact as f64).abs() <= RELATIVE_ERROR * exact as f64
    }

    #[test]
    fn every_value_up_to_a_million_answers_within_the_stated_error() {
        for v in 0..=1_000_000u64 {
            let r = representative(bucket(v));
            assert!(within_error(r, v), "{v} answered as {r}");
        }
        // and the largest values, around the powers of two
        for p in 20..=30 {
            for v in [(1u64 << p) - 1, 1 << p, (1 << p) + 1] {
                assert!(within_error(representative(bucket(v)), v), "{v}");
            }
        }
    }

    #[test]
    fn an_integer_alone_in_its_bucket_answers_exactly() {
        // Below 50 a bucket is narrower than one: each integer comes back as itself.
        for v in 0..50u64 {
            assert_eq!(representative(bucket(v)), v as f64);
        }
        // Above, wherever a bucket holds one integer only.
        let alone: Vec<u64> = (50..1000u64)
            .filter(|&v| bucket(v - 1) != bucket(v) && bucket(v + 1) != bucket(v))
            .collect();
        assert!(!alone.is_empty());
        for v in alone {
            assert_eq!(representative(bucket(v)), v as f64);
        }
    }

    #[test]
    fn quantiles_of_small_integers_are_exact() {
        let of = |values: &[u64]| {
            let mut h = LogHistogram::default();
            for &v in values {
                h.record(v);
            }
            [0.5, 0.95, 0.99].map(|q| h.quantile(q).expect("recorded"))
        };
        // Twelve answers of exactly 8 tokens (reported as 7.92 before).
        assert_eq!(of(&[8; 12]), [8.0, 8.0, 8.0]);
        // 1..=12: ranks 6, 12 and 12.
        assert_eq!(of(&(1..=12).collect::<Vec<_>>()), [6.0, 12.0, 12.0]);
        // Ten of 3 and two of 40: ranks 6, 12 and 12.
        let mut mix = vec![3; 10];
        mix.extend([40, 40]);
        assert_eq!(of(&mix), [3.0, 40.0, 40.0]);
        // Zeros and ones, and one value of 49.
        let mut mix = vec![0; 60];
        mix.extend([1; 39]);
        mix.push(49);
        assert_eq!(of(&mix), [0.0, 1.0, 1.0]);
        let mut mix = vec![0; 98];
        mix.extend([49, 49]);
        assert_eq!(of(&mix), [0.0, 0.0, 49.0]);
        assert_eq!(of(&[49; 100]), [49.0, 49.0, 49.0]);
    }

    #[test]
    fn quantiles_of_known_inputs_are_within_the_error_of_the_exact_ones() {
        // 1..=1000: P50 is 500, P95 950, P99 990 exactly.
        let mut h = LogHistogram::default();
        for v in 1..=1000 {
            h.record(v);
        }
        for (q, want) in [(0.5, 500), (0.95, 950), (0.99, 990)] {
            let got = h.quantile(q).expect("recorded");
            assert!(within_error(got, want), "q{q}: {got} vs {want}");
        }
        // A skewed mix: 900 short chats of 212, 90 RAG prompts of 3,000, 10 of 32,000.
        let mut h = LogHistogram::default();
        let mut all = Vec::new();
        for (v, n) in [(212, 900), (3000, 90), (32_000, 10)] {
            for _ in 0..n {
                h.record(v);
                all.push(v);
            }
        }
        all.sort_unstable();
        for q in [0.5, 0.9, 0.95, 0.99, 1.0] {
            let (got, want) = (h.quantile(q).expect("recorded"), exact(&all, q));
            assert!(within_error(got, want), "q{q}: {got} vs {want}");
        }
        assert_eq!(exact(&all, 0.95), 3000);
        assert_eq!(exact(&all, 0.99), 3000);
        assert_eq!(exact(&all, 0.995), 32_000);
        assert_eq!(LogHistogram::default().quantile(0.5), None);
    }

    #[test]
    fn pseudo_random_inputs_stay_within_the_error_and_merging_equals_recording_together() {
        // A fixed LCG: the same 20,000 values every run, spread over six decades.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let decade = (x >> 60) % 6;
            (x >> 20) % 10u64.pow(decade as u32 + 1)
        };
        let (mut a, mut b, mut both) = Default::default();
        let mut all = Vec::new();
        for i in 0..20_000 {
            let v = next();
            all.push(v);
            let h: &mut LogHistogram = if i % 3 == 0 { &mut a } else { &mut b };
            h.record(v);
            LogHistogram::record(&mut both, v);
        }
        all.sort_unstable();
        a.merge(&b);
        assert_eq!(a, both);
        for q in [0.01, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0] {
            let (got, want) = (both.quantile(q).expect("recorded"), exact(&all, q));
            assert!(within_error(got, want), "q{q}: {got} vs {want}");
        }
    }

    #[test]
    fn memory_is_bounded_by_the_range_not_the_traffic() {
        let mut h = LogHistogram::default();
        for v in (0..=MAX_VALUE * 4).step_by(99_991) {
            h.record(v);
        }
        for v in [u64::MAX, MAX_VALUE, 0, 1] {
            h.record(v);
        }
        assert!(h.buckets() <= MAX_BUCKETS, "{}", h.buckets());
        assert_eq!(bucket(u64::MAX), bucket(MAX_VALUE));
        assert!(usize::from(bucket(MAX_VALUE)) < MAX_BUCKETS);
    }
}
