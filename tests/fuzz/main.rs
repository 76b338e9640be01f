//! Fuzz targets on stable Rust: structure-aware property tests (proptest) of what the gateway
//! reads from outside: request bodies, chat conversations, backends' SSE byte streams, image
//! headers and media URLs, configuration files. Each target asserts properties (round trips, split invariance,
//! exact error shapes, renderer parity, exact sizes and charges), not only the absence of
//! panics.
//!
//! Cases per target: `FUZZ_CASES` (default 500: the short run every `cargo test`, and so
//! `scripts/test`, includes); `scripts/fuzz` runs the long campaign, target by target. A
//! failing case is shrunk, then saved under `tests/fuzz/regressions/` and replayed first on
//! every later run; each bug found also has an explicit regression test beside the code it
//! fixed. docs/fuzzing.md lists the targets, the campaigns and the findings.

#[path = "../common/mod.rs"]
mod common;

mod chat;
mod config;
mod gen;
mod image;
mod metrics;
mod request;
mod sse;

use proptest::strategy::Strategy;
use proptest::test_runner::{
    Config, FileFailurePersistence, TestCaseResult, TestError, TestRunner,
};
use std::fmt::Debug;
use std::time::Duration;
use tokengate::clock::SystemClock;

/// Cases per target when `FUZZ_CASES` is not set: seconds per target in a debug build.
const SHORT_RUN_CASES: u32 = 500;

/// Longest time spent shrinking a failure before reporting it as found.
const MAX_SHRINK_TIME: Duration = Duration::from_secs(120);

/// Cases per target for this run.
fn cases() -> u32 {
    match std::env::var("FUZZ_CASES") {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("FUZZ_CASES must be a whole number, got {v:?}")),
        Err(_) => SHORT_RUN_CASES,
    }
}

/// Runs `property` on `cases()` inputs drawn from `strategy`, replaying the target's saved
/// regressions (`regressions`, a path from the package root) first. Prints the cases run and
/// the time taken; panics with the shrunk input on failure.
fn fuzz<S>(
    target: &str,
    regressions: &'static str,
    strategy: S,
    property: impl Fn(S::Value) -> TestCaseResult,
) where
    S: Strategy,
    S::Value: Debug,
{
    let cases = cases();
    let config = Config {
        cases,
        max_shrink_time: MAX_SHRINK_TIME.as_millis() as u32,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        // A few generators filter out the rare valid value; rejections are never failures.
        max_local_rejects: cases.max(65_536),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let started = SystemClock.instant();
    match runner.run(&strategy, property) {
        Ok(()) => println!(
            "fuzz {target}: {cases} cases passed in {:.1} s",
            started.elapsed().as_secs_f64()
        ),
        Err(TestError::Fail(why, input)) => {
            panic!("fuzz {target}: {why}\nminimal failing input: {input:#?}")
        }
        Err(TestError::Abort(why)) => panic!("fuzz {target}: aborted: {why}"),
    }
}
