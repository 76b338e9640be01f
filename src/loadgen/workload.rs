//! Room `loadgen`: what to send. Workload profiles with long-tailed prompt and output lengths
//! (the seed article's chat / rag / code / summary means, lognormal tails), `--mix` streams of
//! `profile:tenant:rate`, JSONL traces, and the resulting plan: every request's arrival instant,
//! tenant and lengths, fixed before the run starts.

use super::arrivals::PoissonArrivals;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A distribution of token counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lengths {
    /// Lognormal with this mean and log-space spread, clamped to `[min, max]`.
    LogNormal {
        /// Mean of the unclamped distribution.
        mean: f64,
        /// Sigma of the logarithm (the tail: P95 = mean * exp(1.645 sigma - sigma^2 / 2)).
        sigma: f64,
        /// Smallest value.
        min: u64,
        /// Largest value.
        max: u64,
    },
    /// Uniform over `[lo, hi]`.
    Uniform {
        /// Smallest value.
        lo: u64,
        /// Largest value.
        hi: u64,
    },
}

impl Lengths {
    /// One draw.
    pub fn sample(&self, rng: &mut StdRng) -> u64 {
        match *self {
            Lengths::LogNormal {
                mean,
                sigma,
                min,
                max,
            } => {
                let d = LogNormal::new(mean.ln() - sigma * sigma / 2.0, sigma)
                    .expect("profile sigmas are positive constants");
                (d.sample(rng).round() as u64).clamp(min, max)
            }
            Lengths::Uniform { lo, hi } => rng.gen_range(lo..=hi),
        }
    }
}

/// A named kind of request: how long its prompt and its answer are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Name used on the command line.
    pub name: &'static str,
    /// Prompt tokens.
    pub input: Lengths,
    /// Output tokens.
    pub output: Lengths,
}

const fn lognormal(mean: f64, sigma: f64, min: u64, max: u64) -> Lengths {
    Lengths::LogNormal {
        mean,
        sigma,
        min,
        max,
    }
}

/// The profiles: the article's chat 200/150, rag 3000/800, code 1500/300, summary 6000/1200
/// (means), each lognormal so P95 is about 2-2.5x and P99 3-4x the mean, clamped at 8x; and
/// `longdoc`, the benchmark's long-document stream (16K-32K prompts, 1-2K answers).
pub const PROFILES: [Profile; 5] = [
    Profile {
        name: "chat",
        input: lognormal(200.0, 0.7, 16, 1600),
        output: lognormal(150.0, 0.6, 8, 1200),
    },
    Profile {
        name: "rag",
        input: lognormal(3000.0, 0.5, 256, 24_000),
        output: lognormal(800.0, 0.5, 32, 6400),
    },
    Profile {
        name: "code",
        input: lognormal(1500.0, 0.6, 64, 12_000),
        output: lognormal(300.0, 0.6, 16, 2400),
    },
    Profile {
        name: "summary",
        input: lognormal(6000.0, 0.4, 512, 48_000),
        output: lognormal(1200.0, 0.4, 64, 9600),
    },
    Profile {
        name: "longdoc",
        input: Lengths::Uniform {
            lo: 16_384,
            hi: 32_768,
        },
        output: Lengths::Uniform { lo: 1024, hi: 2048 },
    },
];

/// `mixed`: chat, rag, code and summary in these shares of the arrivals.
const MIXED: [(&str, f64); 4] = [
    ("chat", 0.6),
    ("rag", 0.15),
    ("code", 0.15),
    ("summary", 0.1),
];

/// The profile called `name`.
pub fn profile(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// One stream of arrivals: a profile (or `mixed`) sent by a tenant at a rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    /// Profile name, or `mixed`.
    pub profile: String,
    /// Tenant name (reports are split by it; API keys are looked up by it).
    pub tenant: String,
    /// Arrivals per second.
    pub rate: f64,
}

/// Parses `--mix`: comma-separated `profile:tenant:rate`, rate as `8`, `8/s`, `30/m` or `60/h`.
pub fn parse_mix(spec: &str) -> Result<Vec<Stream>, String> {
    spec.split(',')
        .map(|entry| {
            let parts: Vec<&str> = entry.trim().split(':').collect();
            let [profile_name, tenant, rate] = parts[..] else {
                return Err(format!(
                    "mix entry {entry:?} is not profile:tenant:rate (e.g. chat:alice:8/s)"
                ));
            };
            if profile_name != "mixed" && profile(profile_name).is_none() {
                return Err(format!(
                    "unknown profile {profile_name:?} in {entry:?}; known: {}, mixed",
                    PROFILES.map(|p| p.name).join(", ")
                ));
            }
            if tenant.is_empty() {
                return Err(format!("mix entry {entry:?} has an empty tenant"));
            }
            Ok(Stream {
                profile: profile_name.to_string(),
                tenant: tenant.to_string(),
                rate: parse_rate(rate)?,
            })
        })
        .collect()
}

/// `8`, `8/s`, `30/m`, `60/h` as arrivals per second.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let (num, per) = match s.split_once('/') {
        Some((n, unit)) => (n, unit),
        None => (s, "s"),
    };
    let divisor = match per {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("rate unit {other:?} in {s:?} is not s, m or h")),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("rate {s:?} is not a number per s, m or h"))?;
    if !(n > 0.0 && n.is_finite()) {
        return Err(format!("rate {s:?} must be positive"));
    }
    Ok(n / divisor)
}

/// One request of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planned {
    /// Arrival, from the start of the run (simulated seconds when time is scaled).
    #[serde(rename = "t", with = "secs_f64")]
    pub at: Duration,
    /// Tenant.
    pub tenant: String,
    /// Prompt tokens as the server counts them.
    pub input_tokens: u64,
    /// Output tokens asked for (`max_tokens` with `ignore_eos`).
    pub output_tokens: u64,
}

mod secs_f64 {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

/// The plan of an open-loop run: each stream's Poisson arrivals over `duration`, lengths drawn
/// from its profile; all from `seed` (stream `i` uses its own derived seeds), sorted by time.
pub fn plan(streams: &[Stream], duration: Duration, seed: u64) -> Vec<Planned> {
    let mut all = Vec::new();
    for (i, stream) in streams.iter().enumerate() {
        let stream_seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64 * 2);
        let mut rng = StdRng::seed_from_u64(stream_seed + 1);
        for at in PoissonArrivals::new(stream.rate, stream_seed).until(duration) {
            let p = pick_profile(&stream.profile, &mut rng);
            all.push(Planned {
                at,
                tenant: stream.tenant.clone(),
                input_tokens: p.input.sample(&mut rng),
                output_tokens: p.output.sample(&mut rng),
            });
        }
    }
    all.sort_by_key(|p| p.at);
    all
}

fn pick_profile(name: &str, rng: &mut StdRng) -> &'static Profile {
    if let Some(p) = profile(name) {
        return p;
    }
    // `mixed`: parse_mix admitted no other name.
    let mut x: f64 = rng.gen();
    for (name, share) in MIXED {
        if x < share {
            return profile(name).expect("MIXED names known profiles");
        }
        x -= share;
    }
    profile(MIXED[0].0).expect("MIXED names known profiles")
}

/// Parses a JSONL trace: one `{"t": seconds, "tenant", "input_tokens", "output_tokens"}` per
/// line (blank lines skipped), returned sorted by time.
pub fn parse_trace(text: &str) -> Result<Vec<Planned>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let p: Planned =
            serde_json::from_str(line).map_err(|e| format!("trace line {}: {e}", i + 1))?;
        if p.input_tokens == 0 || p.output_tokens == 0 {
            return Err(format!(
                "trace line {}: token counts must be positive",
                i + 1
            ));
        }
        out.push(p);
    }
    out.sort_by_key(|p| p.at);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses_profiles_tenants_and_rates() {
        assert_eq!(
            parse_mix("chat:alice:8/s, longdoc:bob:12/m").unwrap(),
            vec![
                Stream {
                    profile: "chat".into(),
                    tenant: "alice".into(),
                    rate: 8.0
                },
                Stream {
                    profile: "longdoc".into(),
                    tenant: "bob".into(),
                    rate: 0.2
                },
            ]
        );
        assert_eq!(parse_rate("0.5").unwrap(), 0.5);
        assert_eq!(parse_rate("36/h").unwrap(), 0.01);
        assert!(parse_mix("chat:alice").is_err());
        assert!(parse_mix("poem:alice:1/s")
            .unwrap_err()
            .contains("unknown profile"));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("3/d").is_err());
    }

    #[test]
    fn lognormal_profiles_have_their_mean_and_a_long_tail() {
        let mut rng = StdRng::seed_from_u64(3);
        let chat = profile("chat").unwrap();
        let mut xs: Vec<u64> = (0..40_000).map(|_| chat.input.sample(&mut rng)).collect();
        xs.sort_unstable();
        let mean = xs.iter().sum::<u64>() as f64 / xs.len() as f64;
        // Clamping at 16 and 1,600 moves the mean by well under 1 %; the standard error of the
        // mean is 200 * 0.76 / sqrt(40,000) = 0.8 tokens.
        assert!((mean - 200.0).abs() < 5.0, "mean {mean}");
        let p95 = xs[xs.len() * 95 / 100] as f64;
        let p99 = xs[xs.len() * 99 / 100] as f64;
        // Theory: P95 = 200 exp(1.645*0.7 - 0.245) = 495, P99 = 200 exp(2.326*0.7 - 0.245) = 798.
        assert!((p95 - 495.0).abs() < 25.0, "p95 {p95}");
        assert!((p99 - 798.0).abs() < 60.0, "p99 {p99}");
    }

    #[test]
    fn plan_merges_streams_in_time_order_deterministically() {
        let streams = parse_mix("chat:alice:8/s,longdoc:bob:0.2/s").unwrap();
        let a = plan(&streams, Duration::from_secs(300), 9);
        assert_eq!(a, plan(&streams, Duration::from_secs(300), 9));
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        let bob: Vec<&Planned> = a.iter().filter(|p| p.tenant == "bob").collect();
        let alice = a.len() - bob.len();
        // 2,400 and 60 expected; 4 Poisson standard deviations.
        assert!(
            (alice as f64 - 2400.0).abs() < 4.0 * 2400f64.sqrt(),
            "{alice}"
        );
        assert!(
            (bob.len() as f64 - 60.0).abs() < 4.0 * 60f64.sqrt(),
            "{}",
            bob.len()
        );
        assert!(bob
            .iter()
            .all(|p| (16_384..=32_768).contains(&p.input_tokens)
                && (1024..=2048).contains(&p.output_tokens)));
    }

    #[test]
    fn trace_lines_become_a_sorted_plan() {
        let trace = "{\"t\": 1.5, \"tenant\": \"bob\", \"input_tokens\": 30000, \"output_tokens\": 1500}\n\n\
                     {\"t\": 0.25, \"tenant\": \"alice\", \"input_tokens\": 200, \"output_tokens\": 150}\n";
        let p = parse_trace(trace).unwrap();
        assert_eq!(
            p,
            vec![
                Planned {
                    at: Duration::from_millis(250),
                    tenant: "alice".into(),
                    input_tokens: 200,
                    output_tokens: 150
                },
                Planned {
                    at: Duration::from_millis(1500),
                    tenant: "bob".into(),
                    input_tokens: 30_000,
                    output_tokens: 1500
                },
            ]
        );
        assert!(parse_trace("{\"t\": 1}")
            .unwrap_err()
            .starts_with("trace line 1:"));
    }
}
