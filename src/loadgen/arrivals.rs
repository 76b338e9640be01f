//! Room `loadgen`: the open-loop arrival process. Arrival instants are drawn up front from a
//! seeded RNG as absolute offsets from the start of the run, so a slow server can never slow the
//! arrivals down (no coordinated omission).

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use std::time::Duration;

/// A Poisson process of `rate` arrivals per second: exponential gaps, seeded.
#[derive(Debug, Clone)]
pub struct PoissonArrivals {
    rng: StdRng,
    gaps: Exp<f64>,
    t: f64,
}

impl PoissonArrivals {
    /// Arrivals at `rate` per second (must be positive) from `seed`.
    pub fn new(rate: f64, seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            gaps: Exp::new(rate).expect("arrival rate must be positive and finite"),
            t: 0.0,
        }
    }

    /// Every arrival before `horizon`.
    pub fn until(self, horizon: Duration) -> Vec<Duration> {
        let end = horizon.as_secs_f64();
        self.take_while(|t| t.as_secs_f64() < end).collect()
    }
}

impl Iterator for PoissonArrivals {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.t += self.gaps.sample(&mut self.rng);
        Some(Duration::from_secs_f64(self.t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_matches_the_rate_within_four_poisson_standard_deviations() {
        // N(T) ~ Poisson(rate * T): mean 8,000 and standard deviation sqrt(8,000) = 89.4 for
        // 8/s over 1,000 s. The seed is fixed, so this is deterministic; the bound says the
        // generator has the right rate, not luck.
        for seed in 0..5 {
            let n = PoissonArrivals::new(8.0, seed)
                .until(Duration::from_secs(1000))
                .len() as f64;
            let sd = 8000f64.sqrt();
            assert!((n - 8000.0).abs() <= 4.0 * sd, "seed {seed}: {n} arrivals");
        }
        // A low rate too: 0.2/s over 10,000 s, mean 2,000, sd 44.7.
        let n = PoissonArrivals::new(0.2, 7)
            .until(Duration::from_secs(10_000))
            .len() as f64;
        assert!((n - 2000.0).abs() <= 4.0 * 2000f64.sqrt(), "{n} arrivals");
    }

    #[test]
    fn gaps_are_exponential_mean_and_variance() {
        // Exp(rate): mean 1/rate and variance 1/rate^2. Over 20,000 gaps the sample mean has a
        // standard error of (1/rate)/sqrt(20,000) = 0.7 % of the mean.
        let rate = 4.0;
        let times: Vec<f64> = PoissonArrivals::new(rate, 42)
            .take(20_001)
            .map(|t| t.as_secs_f64())
            .collect();
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((mean - 0.25).abs() <= 4.0 * 0.25 / n.sqrt(), "mean {mean}");
        assert!(
            (var / (mean * mean) - 1.0).abs() < 0.05,
            "cv^2 {}",
            var / (mean * mean)
        );
    }

    #[test]
    fn same_seed_same_instants_and_strictly_increasing() {
        let a = PoissonArrivals::new(8.0, 1).until(Duration::from_secs(60));
        let b = PoissonArrivals::new(8.0, 1).until(Duration::from_secs(60));
        assert_eq!(a, b);
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        assert!(a.last().unwrap() < &Duration::from_secs(60));
        assert_ne!(
            a,
            PoissonArrivals::new(8.0, 2).until(Duration::from_secs(60))
        );
    }
}
