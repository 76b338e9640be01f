//! Room `loadgen`: the numbers of a run. Per-request samples become per-tenant and overall
//! summaries: P50/P95/P99 of TTFT, TPOT and end-to-end latency, requests/s, prefill and decode
//! tokens/s, SLA attainment and goodput. Pure: samples in, summaries out.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// 2xx and a complete answer.
    Ok,
    /// 429.
    RateLimited,
    /// 503.
    Unavailable,
    /// Another 4xx.
    ClientError,
    /// Another 5xx, a broken stream or a failed connection.
    ServerError,
    /// No complete answer within the client's timeout (the client hung up).
    Timeout,
}

/// What one request measured. Durations are in the server's (simulated) time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Tenant.
    pub tenant: String,
    /// Planned arrival, seconds from the start.
    pub at_s: f64,
    /// How it ended.
    pub outcome: Outcome,
    /// HTTP status of the last attempt (0 when the connection failed).
    pub status: u16,
    /// Time from the planned arrival to the first token, ms.
    pub ttft_ms: Option<f64>,
    /// Mean gap between tokens after the first, ms (needs 2 tokens or more).
    pub tpot_ms: Option<f64>,
    /// Time from the planned arrival to the end of the answer, ms.
    pub e2e_ms: f64,
    /// Prompt tokens (the server's `usage` when it reported one, else the plan's).
    pub prompt_tokens: u64,
    /// Tokens received.
    pub output_tokens: u64,
    /// Attempts made (more than 1 only with `--retry`).
    pub attempts: u32,
}

/// The SLA a request must meet to count for attainment and goodput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sla {
    /// Largest acceptable TTFT, ms.
    pub ttft_ms: f64,
    /// Largest acceptable TPOT, ms.
    pub tpot_ms: f64,
}

impl Sla {
    /// Whether `s` completed within both targets (a one-token answer has no TPOT to miss).
    pub fn met_by(&self, s: &Sample) -> bool {
        s.outcome == Outcome::Ok
            && s.ttft_ms.is_some_and(|t| t <= self.ttft_ms)
            && s.tpot_ms.is_none_or(|t| t <= self.tpot_ms)
    }
}

/// The `p`-th percentile (0..=100) of `sorted` by linear interpolation between the closest
/// ranks (numpy's default, which vLLM's benchmarks use); `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let (first, last) = (sorted.first()?, sorted.last()?);
    if p <= 0.0 {
        return Some(*first);
    }
    if p >= 100.0 {
        return Some(*last);
    }
    let h = (sorted.len() - 1) as f64 * p / 100.0;
    let lo = h.floor() as usize;
    let frac = h - lo as f64;
    if frac == 0.0 {
        return Some(sorted[lo]);
    }
    Some(sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]))
}

/// P50 / P95 / P99 and mean of one latency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Quantiles {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Mean.
    pub mean: Option<f64>,
}

impl Quantiles {
    /// Of these values (any order).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
        Self {
            p50: percentile(&values, 50.0),
            p95: percentile(&values, 95.0),
            p99: percentile(&values, 99.0),
            mean,
        }
    }
}

/// The summary of a set of requests (one tenant, or all).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Requests planned and sent.
    pub requests: u64,
    /// Completed.
    pub requests_ok: u64,
    /// 429 or 503: told to come back later.
    pub requests_rejected: u64,
    /// 429.
    pub rate_limited: u64,
    /// 503.
    pub unavailable: u64,
    /// Other 4xx.
    pub client_errors: u64,
    /// Other 5xx and failures.
    pub server_errors: u64,
    /// Given up after the client's timeout.
    pub timeouts: u64,
    /// Share of the requests served (`requests_ok / requests`).
    pub served_share: f64,
    /// TTFT P50, ms (completed requests).
    pub ttft_p50_ms: Option<f64>,
    /// TTFT P95, ms.
    pub ttft_p95_ms: Option<f64>,
    /// TTFT P99, ms.
    pub ttft_p99_ms: Option<f64>,
    /// TPOT P50, ms.
    pub tpot_p50_ms: Option<f64>,
    /// TPOT P95, ms.
    pub tpot_p95_ms: Option<f64>,
    /// TPOT P99, ms.
    pub tpot_p99_ms: Option<f64>,
    /// End-to-end P50, ms.
    pub e2e_p50_ms: Option<f64>,
    /// End-to-end P95, ms.
    pub e2e_p95_ms: Option<f64>,
    /// End-to-end P99, ms.
    pub e2e_p99_ms: Option<f64>,
    /// Completed requests per second.
    pub requests_per_s: f64,
    /// Prompt tokens of completed requests per second.
    pub prefill_tokens_per_s: f64,
    /// Output tokens received per second.
    pub decode_tokens_per_s: f64,
    /// Share of all requests (rejected ones included) that completed within the SLA.
    pub sla_attainment: f64,
    /// Output tokens of SLA-meeting requests per second.
    pub goodput_tokens_per_s: f64,
}

impl Summary {
    /// Summarizes `samples` over a run of `elapsed`.
    pub fn of<'a>(
        samples: impl IntoIterator<Item = &'a Sample>,
        elapsed: Duration,
        sla: &Sla,
    ) -> Self {
        let samples: Vec<&Sample> = samples.into_iter().collect();
        let count = |o: Outcome| samples.iter().filter(|s| s.outcome == o).count() as u64;
        let ok: Vec<&&Sample> = samples
            .iter()
            .filter(|s| s.outcome == Outcome::Ok)
            .collect();
        let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let ttft = Quantiles::of(ok.iter().filter_map(|s| s.ttft_ms).collect());
        let tpot = Quantiles::of(ok.iter().filter_map(|s| s.tpot_ms).collect());
        let e2e = Quantiles::of(ok.iter().map(|s| s.e2e_ms).collect());
        let met: Vec<&&Sample> = samples.iter().filter(|s| sla.met_by(s)).collect();
        let requests = samples.len() as u64;
        let share = |n: usize| {
            if requests == 0 {
                0.0
            } else {
                n as f64 / requests as f64
            }
        };
        let (rate_limited, unavailable) =
            (count(Outcome::RateLimited), count(Outcome::Unavailable));
        Self {
            requests,
            requests_ok: ok.len() as u64,
            requests_rejected: rate_limited + unavailable,
            rate_limited,
            unavailable,
            client_errors: count(Outcome::ClientError),
            server_errors: count(Outcome::ServerError),
            timeouts: count(Outcome::Timeout),
            served_share: share(ok.len()),
            ttft_p50_ms: ttft.p50,
            ttft_p95_ms: ttft.p95,
            ttft_p99_ms: ttft.p99,
            tpot_p50_ms: tpot.p50,
            tpot_p95_ms: tpot.p95,
            tpot_p99_ms: tpot.p99,
            e2e_p50_ms: e2e.p50,
            e2e_p95_ms: e2e.p95,
            e2e_p99_ms: e2e.p99,
            requests_per_s: ok.len() as f64 / secs,
            prefill_tokens_per_s: ok.iter().map(|s| s.prompt_tokens).sum::<u64>() as f64 / secs,
            decode_tokens_per_s: samples.iter().map(|s| s.output_tokens).sum::<u64>() as f64 / secs,
            sla_attainment: share(met.len()),
            goodput_tokens_per_s: met.iter().map(|s| s.output_tokens).sum::<u64>() as f64 / secs,
        }
    }
}

/// A whole run: settings, summaries per tenant and overall, and every sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Simulated seconds from the start to the last answer.
    pub elapsed_s: f64,
    /// The SLA used.
    pub sla: Sla,
    /// All tenants together.
    pub overall: Summary,
    /// Per tenant, by name.
    pub tenants: BTreeMap<String, Summary>,
    /// Every request.
    pub samples: Vec<Sample>,
}

impl Report {
    /// Summarizes a run.
    pub fn new(samples: Vec<Sample>, elapsed: Duration, sla: Sla) -> Self {
        let mut tenants = BTreeMap::new();
        for name in samples.iter().map(|s| s.tenant.as_str()) {
            if !tenants.contains_key(name) {
                let of_tenant = samples.iter().filter(|s| s.tenant == name);
                tenants.insert(name.to_string(), Summary::of(of_tenant, elapsed, &sla));
            }
        }
        Self {
            elapsed_s: elapsed.as_secs_f64(),
            sla,
            overall: Summary::of(&samples, elapsed, &sla),
            tenants,
            samples,
        }
    }

    /// The human table: one row per tenant and one for all.
    pub fn table(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut out = format!(
            "{:<10} {:>6} {:>6} {:>6} {:>5} {:>5} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9}\n",
            "tenant", "sent", "ok", "rej", "t/o", "err", "ttft p50", "ttft p95", "ttft p99", "tpot p50",
            "tpot p95", "tpot p99", "req/s", "prefill/s", "decode/s", "sla", "goodput/s"
        );
        let rows = self
            .tenants
            .iter()
            .map(|(n, s)| (n.as_str(), s))
            .chain(std::iter::once(("all", &self.overall)));
        for (name, s) in rows {
            out.push_str(&format!(
                "{:<10} {:>6} {:>6} {:>6} {:>5} {:>5} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8.2} {:>9.0} {:>9.0} {:>5.1}% {:>9.0}\n",
                name,
                s.requests,
                s.requests_ok,
                s.requests_rejected,
                s.timeouts,
                s.client_errors + s.server_errors,
                ms(s.ttft_p50_ms),
                ms(s.ttft_p95_ms),
                ms(s.ttft_p99_ms),
                ms(s.tpot_p50_ms),
                ms(s.tpot_p95_ms),
                ms(s.tpot_p99_ms),
                s.requests_per_s,
                s.prefill_tokens_per_s,
                s.decode_tokens_per_s,
                s.sla_attainment * 100.0,
                s.goodput_tokens_per_s,
            ));
        }
        out.push_str(&format!(
            "rej: 429 or 503; t/o: given up at the client's timeout; err: other 4xx, 5xx and failures\nlatencies in ms; SLA: TTFT <= {} ms and TPOT <= {} ms; elapsed {:.1} s\n",
            self.sla.ttft_ms, self.sla.tpot_ms, self.elapsed_s
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_samples() {
        let hundred: Vec<f64> = (0..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 50.0), Some(50.0));
        assert_eq!(percentile(&hundred, 95.0), Some(95.0));
        assert_eq!(percentile(&hundred, 99.0), Some(99.0));
        assert_eq!(percentile(&hundred, 0.0), Some(0.0));
        assert_eq!(percentile(&hundred, 100.0), Some(100.0));
        // Interpolation between the two closest ranks (numpy: np.percentile([10, 20], 50) = 15,
        // np.percentile([1, 2, 3, 5], 50) = 2.5, np.percentile([0, 8], 75) = 6).
        assert_eq!(percentile(&[10.0, 20.0], 50.0), Some(15.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 5.0], 50.0), Some(2.5));
        assert_eq!(percentile(&[0.0, 8.0], 75.0), Some(6.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let q = Quantiles::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!(q.mean, Some(2.5));
        assert_eq!(q.p50, Some(2.5));
    }

    fn sample(tenant: &str, outcome: Outcome, ttft: f64, tpot: Option<f64>, out: u64) -> Sample {
        Sample {
            tenant: tenant.into(),
            at_s: 0.0,
            outcome,
            status: if outcome == Outcome::Ok { 200 } else { 429 },
            ttft_ms: (outcome == Outcome::Ok).then_some(ttft),
            tpot_ms: if outcome == Outcome::Ok { tpot } else { None },
            e2e_ms: ttft + tpot.unwrap_or(0.0) * (out.saturating_sub(1)) as f64,
            prompt_tokens: 100,
            output_tokens: if outcome == Outcome::Ok { out } else { 0 },
            attempts: 1,
        }
    }

    #[test]
    fn sla_attainment_and_goodput_count_only_requests_within_both_targets() {
        let sla = Sla {
            ttft_ms: 800.0,
            tpot_ms: 50.0,
        };
        let samples = vec![
            sample("alice", Outcome::Ok, 200.0, Some(30.0), 100), // meets
            sample("alice", Outcome::Ok, 800.0, Some(50.0), 60),  // meets, on the boundary
            sample("alice", Outcome::Ok, 900.0, Some(30.0), 100), // TTFT too slow
            sample("alice", Outcome::Ok, 100.0, Some(51.0), 100), // TPOT too slow
            sample("alice", Outcome::Ok, 100.0, None, 1),         // one token: no TPOT to miss
            sample("bob", Outcome::RateLimited, 0.0, None, 0),    // rejected: not met
        ];
        let r = Report::new(samples, Duration::from_secs(10), sla);
        let alice = &r.tenants["alice"];
        assert_eq!(alice.requests, 5);
        assert_eq!(alice.sla_attainment, 3.0 / 5.0);
        assert_eq!(alice.goodput_tokens_per_s, (100 + 60 + 1) as f64 / 10.0);
        assert_eq!(alice.decode_tokens_per_s, 361.0 / 10.0);
        assert_eq!(alice.prefill_tokens_per_s, 500.0 / 10.0);
        assert_eq!(alice.requests_per_s, 0.5);
        assert_eq!(alice.ttft_p50_ms, Some(200.0));
        let bob = &r.tenants["bob"];
        assert_eq!(
            (bob.requests, bob.requests_ok, bob.requests_rejected),
            (1, 0, 1)
        );
        assert_eq!(bob.sla_attainment, 0.0);
        assert_eq!(bob.ttft_p50_ms, None);
        assert_eq!(r.overall.requests, 6);
        assert_eq!(r.overall.sla_attainment, 3.0 / 6.0);
        assert_eq!(r.overall.served_share, 5.0 / 6.0);
        assert!(r.table().lines().any(|l| l.starts_with("bob ")));
    }

    #[test]
    fn the_table_shows_timeouts_and_errors_beside_refusals() {
        let sla = Sla {
            ttft_ms: 800.0,
            tpot_ms: 50.0,
        };
        let samples = vec![
            sample("alice", Outcome::Ok, 200.0, Some(30.0), 10),
            sample("alice", Outcome::Timeout, 0.0, None, 0),
            sample("alice", Outcome::Timeout, 0.0, None, 0),
            sample("alice", Outcome::Unavailable, 0.0, None, 0),
            sample("alice", Outcome::ClientError, 0.0, None, 0),
            sample("alice", Outcome::ServerError, 0.0, None, 0),
        ];
        let table = Report::new(samples, Duration::from_secs(10), sla).table();
        let mut lines = table.lines();
        let head: Vec<&str> = lines.next().unwrap().split_whitespace().take(6).collect();
        assert_eq!(head, ["tenant", "sent", "ok", "rej", "t/o", "err"]);
        let alice: Vec<&str> = lines.next().unwrap().split_whitespace().take(6).collect();
        assert_eq!(alice, ["alice", "6", "1", "1", "2", "2"]);
    }
}
