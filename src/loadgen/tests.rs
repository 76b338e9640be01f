//! Room `loadgen`: the runner end to end against an in-process simulated backend on 127.0.0.1
//! (fixed-pace engine at a scaled clock). Real time: hyper's pooled client stalls on paused
//! tokio time, so latencies are checked against the floor the engine's pace sets (a missing
//! time-scale conversion would land 10x under it), and counts and outcomes exactly.

use super::cli::{run_plan, ApiKeys};
use super::client::{Api, Client, Target};
use super::prompt::PromptBuilder;
use super::report::{Outcome, Report, Sla};
use super::sla::target_tpot_sla;
use super::workload::Planned;
use crate::sim::{start, Faults, SimConfig, DEFAULT_MODEL};
use crate::tokenize::chat::ChatTemplate;
use crate::tokenize::test_tokenizer as tokenizer;
use std::sync::Arc;
use std::time::Duration;

fn planned(at_ms: u64, tenant: &str, input: u64, output: u64) -> Planned {
    Planned {
        at: Duration::from_millis(at_ms),
        tenant: tenant.into(),
        input_tokens: input,
        output_tokens: output,
    }
}

#[tokio::test]
async fn measures_latencies_in_server_time_and_classifies_outcomes() {
    let tok = tokenizer();
    // The sim runs 10x faster than real time; passes of 20 simulated ms.
    let mut cfg = SimConfig::pace(Duration::from_millis(20));
    cfg.time_scale = 10.0;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = start(cfg, tok.clone(), listener).await.unwrap();
    let prompts =
        Arc::new(PromptBuilder::new(tok.as_ref(), &ChatTemplate::builtin_qwen35()).unwrap());
    let client = Client::new(Target {
        url: sim.url(),
        endpoint: Api::Chat,
        model: DEFAULT_MODEL.into(),
        time_scale: 10.0,
        retry: false,
        timeout: Duration::from_secs(60),
    });
    // Apart in time: each request runs alone (a pass is 2 ms of real time).
    let plan = vec![
        planned(0, "alice", 200, 6),
        planned(1_000, "bob", 3000, 11),
        planned(2_000, "alice", 50, 1),
    ];
    let (samples, elapsed) = run_plan(
        client.clone(),
        plan,
        prompts.clone(),
        &ApiKeys::default(),
        1,
        false,
    )
    .await;
    assert_eq!(samples.len(), 3);
    for s in &samples {
        assert_eq!(
            (s.outcome, s.status, s.attempts),
            (Outcome::Ok, 200, 1),
            "{s:?}"
        );
        // One pass of prefill, then one token per pass: in simulated milliseconds.
        assert!(s.ttft_ms.unwrap() >= 20.0, "{s:?}");
        assert!(s.e2e_ms >= 20.0 * s.output_tokens as f64, "{s:?}");
    }
    // TPOT has no causal floor on the client (the first chunk may arrive late), only a value.
    assert!(samples[0].tpot_ms.is_some());
    assert_eq!(
        samples.iter().map(|s| s.output_tokens).collect::<Vec<_>>(),
        vec![6, 11, 1]
    );
    assert_eq!(samples[2].tpot_ms, None);
    assert_eq!(
        samples
            .iter()
            .map(|s| (s.tenant.as_str(), s.at_s))
            .collect::<Vec<_>>(),
        vec![("alice", 0.0), ("bob", 1.0), ("alice", 2.0)]
    );
    // The server counted exactly the planned prompt lengths.
    assert_eq!(
        samples.iter().map(|s| s.prompt_tokens).collect::<Vec<_>>(),
        vec![200, 3000, 50]
    );
    assert_eq!(sim.stats().prompt_tokens, 3250);
    assert_eq!(sim.stats().max_tokens, vec![Some(6), Some(11), Some(1)]);
    // The last request is sent at 2,000 ms and its one token comes with its prefill pass.
    assert!(elapsed >= Duration::from_millis(2_020), "{elapsed:?}");

    let report = Report::new(
        samples,
        elapsed,
        // Targets no request misses on a loaded machine (at 10x, a 5 ms stall of the test
        // process is 50 simulated ms): the attainment arithmetic itself is pinned in report.rs.
        Sla {
            ttft_ms: 60_000.0,
            tpot_ms: 10_000.0,
        },
    );
    assert_eq!(report.tenants["alice"].requests_ok, 2);
    assert_eq!(report.overall.sla_attainment, 1.0);

    // A backend answering 503 is counted as such, and a cut stream as a server error.
    sim.set_faults(Faults {
        status: Some(503),
        ..Faults::default()
    });
    let (s, _) = run_plan(
        client.clone(),
        vec![planned(0, "alice", 20, 3)],
        prompts.clone(),
        &ApiKeys::default(),
        1,
        false,
    )
    .await;
    assert_eq!((s[0].outcome, s[0].status), (Outcome::Unavailable, 503));
    sim.set_faults(Faults {
        fail_after_tokens: Some(2),
        ..Faults::default()
    });
    let one = |output| vec![planned(0, "alice", 20, output)];
    let keys = ApiKeys::default();
    let (s, _) = run_plan(client.clone(), one(5), prompts.clone(), &keys, 1, false).await;
    assert_eq!(s[0].outcome, Outcome::ServerError);
    assert_eq!(s[0].output_tokens, 0);

    // 1,000 passes of 2 real ms cannot end within 100 real ms: the client gives up.
    sim.set_faults(Faults::default());
    let mut target = client.target().clone();
    target.timeout = Duration::from_millis(100);
    let (s, _) = run_plan(
        Client::new(target),
        one(1000),
        prompts.clone(),
        &keys,
        1,
        false,
    )
    .await;
    assert_eq!((s[0].outcome, s[0].status), (Outcome::Timeout, 0));

    // A 429 with `retry-after: 0` is retried only with --retry, at most 5 attempts in all; a 429
    // without `retry-after` is not retried.
    sim.set_faults(Faults {
        status: Some(429),
        retry_after: Some(Duration::ZERO),
        ..Faults::default()
    });
    let mut target = client.target().clone();
    target.retry = true;
    let retrying = Client::new(target);
    let (s, _) = run_plan(retrying.clone(), one(3), prompts.clone(), &keys, 1, false).await;
    assert_eq!((s[0].outcome, s[0].attempts), (Outcome::RateLimited, 5));
    let (s, _) = run_plan(client, one(3), prompts.clone(), &keys, 1, false).await;
    assert_eq!((s[0].outcome, s[0].attempts), (Outcome::RateLimited, 1));
    sim.set_faults(Faults {
        status: Some(429),
        ..Faults::default()
    });
    let (s, _) = run_plan(retrying, one(3), prompts, &keys, 1, false).await;
    assert_eq!((s[0].outcome, s[0].attempts), (Outcome::RateLimited, 1));
}

#[tokio::test]
async fn the_default_tpot_sla_is_what_the_target_holds() {
    let tok = tokenizer();
    let plan = vec![planned(0, "alice", 200, 150)];
    let target = |url: String| {
        Client::new(Target {
            url,
            endpoint: Api::Chat,
            model: DEFAULT_MODEL.into(),
            time_scale: 1.0,
            retry: false,
            timeout: Duration::from_secs(60),
        })
    };
    // One simulated 910B3 holds 100 ms, the 1 ms fixed pace the article's 50 ms.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let card = start(SimConfig::roofline_910b3(), tok.clone(), listener)
        .await
        .unwrap();
    let sla = target_tpot_sla(&target(card.url()), &plan).await;
    assert_eq!(sla.ms, 100.0);
    assert!(
        sla.from
            .starts_with("what the target holds for this plan's mean request (200 in / 150 out): one such sequence decodes in 75.41 ms a step"),
        "{}",
        sla.from
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paced = start(SimConfig::default(), tok, listener).await.unwrap();
    let sla = target_tpot_sla(&target(paced.url()), &plan).await;
    assert_eq!(sla.ms, 50.0);
    // Nothing listens: the capacity model's default deployment, one 910B3.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let sla = target_tpot_sla(&target(format!("http://{dead}")), &plan).await;
    assert_eq!(sla.ms, 100.0);
    assert!(sla.from.ends_with("got no answer)"), "{}", sla.from);
}
