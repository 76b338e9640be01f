use super::*;
use crate::admission::{BackendSpec, ClassShares, Need, Priority, QueueSpec};
use crate::metrics::Metrics;
use crate::util::get::get_text;

/// 100 bytes of KV for 100 prompt tokens.
const NEED: Need = Need {
    bytes: 100,
    prompt_tokens: 100,
    output_tokens: 0,
    sequences: 1,
    alone: None,
    in_turns: false,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The scrapers' hand-set geometry: 1,000 bytes of 1-byte tokens, 8 sequences.
const HAND: HandSet = HandSet {
    block_tokens: 1,
    kv_bytes_per_token: 1,
    state_bytes_per_sequence: 0,
    prefix_caching: false,
    max_model_len: 1000,
    kv_capacity_bytes: 1000,
    max_batch: 8,
};
use tokio::net::TcpListener;

/// A one-route HTTP server on 127.0.0.1 answering every request with `answer` (raw HTTP/1.1
/// bytes), or never answering with `None`.
async fn fake_backend(answer: Option<String>) -> (http::Uri, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                match answer {
                    Some(a) => {
                        let _ = stream.write_all(a.as_bytes()).await;
                    }
                    None => std::future::pending::<()>().await,
                }
            });
        }
    });
    let url = format!("http://{addr}/metrics").parse().expect("uri");
    (url, task)
}

fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn a_scrape_is_bounded_in_size_and_time() {
    let t = Duration::from_secs(5);
    let body = "vllm:num_requests_waiting 2\n";
    let (url, _server) = fake_backend(Some(ok(body))).await;
    assert_eq!(get_text(&url, t, 1024, None).await, Ok(body.to_string()));
    assert_eq!(
        get_text(&url, t, 10, None).await,
        Err("larger than 10 bytes".to_string())
    );
    let (url, _server) = fake_backend(Some(
        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string(),
    ))
    .await;
    assert_eq!(
        get_text(&url, t, 1024, None).await,
        Err("answered 404 Not Found".to_string())
    );
    let (url, _server) = fake_backend(None).await;
    assert_eq!(
        get_text(&url, Duration::from_millis(50), 1024, None).await,
        Err("no answer within 50ms".to_string())
    );
}

fn scraper(cfg: FeedbackConfig) -> (Scraper, Admission, Arc<Metrics>) {
    let admission = Admission::new(
        vec![BackendSpec {
            name: "http://npu0".to_string(),
            kv_capacity_bytes: 1000,
            max_batch: 8,
            engine: false,
        }],
        QueueSpec {
            max_waiting: 4,
            deadline: Duration::from_secs(1),
            shares: ClassShares::FULL,
        },
    );
    let metrics = Arc::new(Metrics::new());
    let observed = Arc::new(Observations {
        observed: vec![Mutex::new(None)],
    });
    let s = Scraper {
        index: 0,
        backend_url: "http://npu0".to_string(),
        metrics_url: "http://npu0/metrics".parse().expect("uri"),
        pressure: Pressure::new(cfg.bounds()),
        cfg,
        kv: KvWatch::Check(HAND),
        learned_from: None,
        batch_cap_tries: 0,
        version_learned: false,
        versions: unlearned(),
        admission: admission.clone(),
        feedback: observed,
        metrics: metrics.feedback.clone(),
    };
    (s, admission, metrics)
}

/// A MindIE scrape.
fn mindie_text(waiting: u64, preemptions: u64) -> String {
    format!(
        "num_requests_waiting{{model_name=\"q\"}} {waiting}\n\
         num_requests_running{{model_name=\"q\"}} 3\n\
         num_preemptions_total{{model_name=\"q\"}} {preemptions}\n\
         npu_cache_usage_perc{{model_name=\"q\"}} 0.95\n"
    )
}

fn text(waiting: u64, preemptions: u64) -> Result<BackendReading, ScrapeError> {
    Ok(parse::parse(&mindie_text(waiting, preemptions)).expect("prometheus text"))
}

fn effective(adm: &Admission) -> u64 {
    adm.snapshot().backends[0].kv_effective_capacity_bytes
}

#[tokio::test(start_paused = true)]
async fn preemptions_shrink_the_ledger_and_calm_grows_it_back() {
    let (mut s, adm, metrics) = scraper(FeedbackConfig {
        enabled: true,
        floor: 0.8,
        ..FeedbackConfig::default()
    });
    let _lease = adm
        .admit("a", Priority::Standard, NEED)
        .await
        .expect("room");
    s.take(text(0, 4));
    assert_eq!(effective(&adm), 1000);
    s.take(text(0, 6));
    assert_eq!(effective(&adm), 900);
    s.take(text(0, 7));
    assert_eq!(effective(&adm), 810);
    s.take(text(0, 8));
    assert_eq!(effective(&adm), 800);
    let seen = s.feedback.observed(0).expect("observed");
    assert_eq!((seen.scrapes, seen.capacity_scale_permille), (4, 800));
    assert_eq!(
        seen.last_adjustment,
        Some(Adjustment {
            from_permille: 810,
            to_permille: 800,
            reason: pressure::Reason::Preempted { preempted: 1 }
        })
    );
    let exported = metrics.encode();
    assert!(exported.contains("tokengate_kv_capacity_scale{backend=\"http://npu0\"} 0.8\n"));
    assert!(exported.contains("tokengate_backend_kv_usage{backend=\"http://npu0\"} 0.95\n"));
    assert!(exported.contains("tokengate_backend_requests_running{backend=\"http://npu0\"} 3\n"));
    // A failed scrape is counted and changes nothing.
    s.take(Err(ScrapeError::Fetch(
        "answered 503 Service Unavailable".to_string(),
    )));
    assert_eq!(effective(&adm), 800);
    let seen = s.feedback.observed(0).expect("observed");
    assert_eq!(
        (seen.failures, seen.last_error.as_deref()),
        (1, Some("answered 503 Service Unavailable"))
    );
    assert!(metrics.encode().contains(
        "tokengate_backend_scrape_failures_total{backend=\"http://npu0\",reason=\"fetch\"} 1\n"
    ));
    // Four calm periods of three scrapes: 850, 900, 950, 1000.
    let mut seen = Vec::new();
    for _ in 0..12 {
        s.take(text(0, 8));
        seen.push(effective(&adm));
    }
    assert_eq!(
        seen,
        [800, 800, 850, 850, 850, 900, 900, 900, 950, 950, 950, 1000]
    );
}

#[tokio::test(start_paused = true)]
async fn the_engines_queue_while_a_request_runs_in_turns_there_leaves_the_ledger_alone() {
    let (mut s, adm, _) = scraper(FeedbackConfig {
        enabled: true,
        ..FeedbackConfig::default()
    });
    // 20 sequences on a batch of 8: the engine runs 8 and keeps 12 waiting until theirs end.
    let turns = adm
        .admit(
            "a",
            Priority::Standard,
            Need {
                sequences: 20,
                ..NEED
            },
        )
        .await
        .expect("in turns");
    for _ in 0..4 {
        s.take(text(12, 0));
    }
    assert_eq!(effective(&adm), 1000);
    // A queue beside requests that run at once is the ledger's: two scrapes in a row shrink it.
    drop(turns);
    let _lease = adm
        .admit("a", Priority::Standard, NEED)
        .await
        .expect("room");
    s.take(text(3, 0));
    assert_eq!(effective(&adm), 1000);
    s.take(text(3, 0));
    assert_eq!(effective(&adm), 900);
}

#[tokio::test(start_paused = true)]
async fn with_adjustment_off_readings_are_kept_and_the_ledger_left_alone() {
    let (mut s, adm, _metrics) = scraper(FeedbackConfig {
        enabled: true,
        adjust_capacity: false,
        ..FeedbackConfig::default()
    });
    let _lease = adm
        .admit("a", Priority::Standard, NEED)
        .await
        .expect("room");
    for n in 0..5 {
        s.take(text(4, n));
    }
    assert_eq!(effective(&adm), 1000);
    let seen = s.feedback.observed(0).expect("observed");
    assert_eq!(seen.reading.and_then(|r| r.waiting), Some(4));
}

#[test]
fn the_section_is_checked() {
    let at = "backends[0]";
    let bad = |f: FeedbackConfig| f.check(at).expect_err("refused").to_string();
    let d = FeedbackConfig::default;
    assert_eq!(
        bad(FeedbackConfig { floor: 0.0, ..d() }),
        "backends[0].feedback.floor is 0; it must be in (0, 1]"
    );
    assert_eq!(
        bad(FeedbackConfig {
            overcommit: 2.5,
            ..d()
        }),
        "backends[0].feedback.overcommit is 2.5; it must be from 1 (none) to 2"
    );
    assert_eq!(
        bad(FeedbackConfig {
            metrics_url: Some("https://h:1027/metrics".into()),
            ..d()
        }),
        "backends[0].feedback.metrics_url `https://h:1027/metrics` must be http://HOST:PORT/PATH"
    );
    assert_eq!(
        bad(FeedbackConfig {
            interval: Duration::ZERO,
            ..d()
        }),
        "backends[0].feedback.interval must be positive"
    );
    assert!(d().check(at).is_ok());
    assert_eq!(d().url_for("http://h:8000/"), "http://h:8000/metrics");
    assert_eq!(
        FeedbackConfig {
            overcommit: 1.25,
            floor: 0.6,
            ..d()
        }
        .bounds(),
        Bounds {
            floor_permille: 600,
            ceiling_permille: 1250
        }
    );
}

/// A metrics server on 127.0.0.1 that answers its scrapes with `bodies` in order, one per
/// connection, and never answers any after them (so a test sees exactly what they did).
async fn scripted_metrics(bodies: Vec<String>) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut bodies = bodies.into_iter();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let answer = bodies.next().map(|b| ok(&b));
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                match answer {
                    Some(a) => {
                        let _ = stream.write_all(a.as_bytes()).await;
                    }
                    None => std::future::pending::<()>().await,
                }
            });
        }
    });
    (format!("http://{addr}"), task)
}

/// A backend serving `}{ 1` must not end the scrape task (a panicking parser did, and froze
/// the capacity scale): the garbage is counted as a parse failure and the next good scrapes
/// move the scale.
#[tokio::test]
async fn a_scrape_that_is_not_prometheus_text_is_counted_and_the_scraper_goes_on() {
    let mut bodies = vec!["}{ 1".to_string(); 3];
    // Requests waiting for two scrapes in a row, while the gateway holds a lease: one shrink.
    bodies.extend([mindie_text(2, 0), mindie_text(2, 0)]);
    let (base, _server) = scripted_metrics(bodies).await;
    let (_, admission, metrics) = scraper(FeedbackConfig::default());
    let _lease = admission
        .admit("a", Priority::Standard, NEED)
        .await
        .expect("room");
    let cfg = FeedbackConfig {
        enabled: true,
        interval: Duration::from_millis(5),
        // The scrape after the script waits for ever, and nothing more happens.
        timeout: Duration::from_secs(3600),
        ..FeedbackConfig::default()
    };
    let watched = Watched {
        url: base.clone(),
        feedback: cfg,
        kv: KvWatch::Check(HAND),
    };
    let scrapers = spawn(&[watched], &admission, &unlearned(), &metrics.feedback);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let seen = scrapers.observed.observed(0).expect("feedback on");
        if seen.scrapes == 2 {
            break seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the scraper stopped: {seen:?}"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(
        (seen.failures, seen.last_error, seen.capacity_scale_permille),
        (3, None, 900)
    );
    assert_eq!(effective(&admission), 900);
    let exported = metrics.encode();
    let failures = |reason: &str| {
        format!(
            "tokengate_backend_scrape_failures_total{{backend=\"{base}\",reason=\"{reason}\"}} 3\n"
        )
    };
    assert!(exported.contains(&failures("parse")), "{exported}");
    assert!(!exported.contains("reason=\"fetch\""), "{exported}");
    assert!(exported.contains(&format!(
        "tokengate_kv_capacity_scale{{backend=\"{base}\"}} 0.9\n"
    )));
}

/// A scrape's answer in [`fake_engine`]'s list that is a 503: the engine is down.
const DOWN: &str = "down";

/// A vLLM engine's answers by path: its metrics (the `k`-th scrape gets `metrics[k]`, the last
/// one after; [`DOWN`] a 503), `/v1/models`, `/version` (the `k`-th ask gets `versions[k]`, the
/// last one after; a 404 without any) and, when `max_num_seqs` is given, `/server_info`.
async fn fake_engine(
    metrics: Vec<String>,
    versions: &[&'static str],
    max_num_seqs: Option<u32>,
) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let scrapes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let versions = versions.to_vec();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let (metrics, scrapes) = (metrics.clone(), scrapes.clone());
            let (versions, asked) = (versions.clone(), asked.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let not_found =
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let answer = match path {
                    "/metrics" => {
                        let k = scrapes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        match &metrics[k.min(metrics.len() - 1)] {
                            m if m == DOWN => "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
                            m => ok(m),
                        }
                    }
                    "/version" if !versions.is_empty() => {
                        let k = asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        ok(&format!(
                            r#"{{"version":"{}"}}"#,
                            versions[k.min(versions.len() - 1)]
                        ))
                    }
                    "/v1/models" => ok(
                        r#"{"object":"list","data":[{"id":"qwen3.5-27b","max_model_len":4096}]}"#,
                    ),
                    "/server_info?config_format=json" if max_num_seqs.is_some() => ok(&format!(
                        r#"{{"vllm_config":{{"scheduler_config":{{"max_num_seqs":{}}}}}}}"#,
                        max_num_seqs.unwrap_or(0)
                    )),
                    _ => not_found.to_string(),
                };
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}"), task)
}

/// vLLM 0.32's `cache_config_info` of the toy Qwen3.5 in 1 GiB with `blocks` pages of 384
/// tokens: 11 attention pages for 4,096 tokens and 3 state groups of 2 pages (prefix caching).
fn cache_config(blocks: u64) -> String {
    format!(
        "vllm:cache_config_info{{block_size=\"384\",enable_prefix_caching=\"True\",engine=\"0\",kv_cache_max_concurrency=\"{}\",kv_cache_memory_bytes=\"1073741824\",mamba_cache_mode=\"align\",mamba_page_size_padded=\"None\",num_gpu_blocks=\"{blocks}\",num_gpu_blocks_override=\"{blocks}\"}} 1.0\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"qwen3.5-27b\"}} 0.0\n",
        blocks as f64 / 17.0
    )
}

/// Waits (yielding, bounded) until backend 0's observation satisfies `done`.
async fn observed_until(scrapers: &Scrapers, done: impl Fn(&Observed) -> bool) -> Observed {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = scrapers.observed.observed(0).expect("read");
        if done(&seen) {
            return seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {seen:?}");
        tokio::task::yield_now().await;
    }
}

/// One backend that declares no vLLM version.
fn unlearned() -> Arc<EngineVersions> {
    Arc::new(EngineVersions::declared([None]))
}

fn engine_admission() -> Admission {
    Admission::new(
        vec![BackendSpec {
            name: "engine".to_string(),
            kv_capacity_bytes: 0,
            max_batch: 0,
            engine: true,
        }],
        QueueSpec {
            max_waiting: 4,
            deadline: Duration::from_secs(1),
            shares: ClassShares::FULL,
        },
    )
}

#[tokio::test]
async fn an_engine_backend_learns_its_pages_and_relearns_them_when_the_engine_restarts() {
    // The engine restarts with 128 pages after three readings of 64.
    let mut readings = vec![cache_config(64); 3];
    readings.push(cache_config(128));
    let (base, _server) = fake_engine(readings, &[], Some(16)).await;
    let admission = engine_admission();
    let metrics = Arc::new(Metrics::new());
    let watched = Watched {
        url: base.clone(),
        feedback: FeedbackConfig {
            interval: Duration::from_millis(5),
            ..FeedbackConfig::default()
        },
        kv: KvWatch::Learn {
            max_batch: None,
            kv_bytes_per_token: 512,
            max_model_len: 8192,
        },
    };
    let scrapers = spawn(&[watched], &admission, &unlearned(), &metrics.feedback);
    let seen = observed_until(&scrapers, |o| o.engine_kv.is_some()).await;
    let kv = seen.engine_kv.expect("learned");
    assert_eq!(
        (
            kv.page_tokens,
            kv.page_bytes,
            kv.pages,
            kv.state_pages_per_sequence
        ),
        (384, 384 * 512, 63, 6)
    );
    assert_eq!((seen.kv, kv.max_num_seqs), ("engine", Some(16)));
    // The file's context length is not the engine's: said, and exported.
    assert_eq!(
        seen.kv_differences
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["model.max_model_len is 8192 tokens but the engine's is 4096"]
    );
    assert!(metrics.encode().contains(&format!(
        "tokengate_backend_kv_mismatch{{backend=\"{base}\",key=\"model.max_model_len\"}} 1\n"
    )));
    let page = 384 * 512;
    let snap = &admission.snapshot().backends[0];
    assert_eq!((snap.kv_capacity_bytes, snap.max_batch), (63 * page, 16));
    let seen = observed_until(&scrapers, |o| {
        o.engine_kv.as_ref().is_some_and(|k| k.pages == 127)
    })
    .await;
    assert_eq!(seen.engine_kv_error, None);
    assert_eq!(
        admission.snapshot().backends[0].kv_capacity_bytes,
        127 * page
    );
}

#[tokio::test]
async fn an_engine_that_cannot_be_read_is_said_so_and_admits_nothing() {
    // A MindIE scrape: no cache configuration to learn from.
    let (base, _server) = fake_engine(vec![mindie_text(0, 0)], &["0.32.0"], None).await;
    let admission = engine_admission();
    let watched = Watched {
        url: base,
        feedback: FeedbackConfig {
            interval: Duration::from_millis(5),
            ..FeedbackConfig::default()
        },
        kv: KvWatch::Learn {
            max_batch: Some(4),
            kv_bytes_per_token: 512,
            max_model_len: 4096,
        },
    };
    let scrapers = spawn(&[watched], &admission, &unlearned(), &Arc::default());
    let seen = observed_until(&scrapers, |o| o.engine_kv_error.is_some()).await;
    assert_eq!(
        seen.engine_kv_error.as_deref(),
        Some("its metrics have no vllm:cache_config_info with block_size and num_gpu_blocks (not a vLLM engine, or its cache is not sized yet)")
    );
    assert_eq!(seen.engine_kv, None);
    let snap = &admission.snapshot().backends[0];
    assert_eq!((snap.kv_capacity_bytes, snap.max_batch), (0, 0));
    // Not a vLLM: its /version is not asked (each scrape is taken after that would be).
    let seen = observed_until(&scrapers, |o| o.scrapes >= 2).await;
    assert_eq!(seen.engine_version, None);
}

#[tokio::test]
async fn a_hand_set_geometry_is_checked_against_the_engines() {
    let (base, _server) = fake_engine(vec![cache_config(64)], &[], None).await;
    let (_, admission, metrics) = scraper(FeedbackConfig::default());
    let watched = Watched {
        url: base.clone(),
        feedback: FeedbackConfig {
            enabled: true,
            interval: Duration::from_millis(5),
            ..FeedbackConfig::default()
        },
        kv: KvWatch::Check(HandSet {
            block_tokens: 128,
            kv_bytes_per_token: 512,
            state_bytes_per_sequence: 6 * 384 * 512,
            prefix_caching: true,
            max_model_len: 4096,
            kv_capacity_bytes: 63 * 384 * 512,
            max_batch: 32,
        }),
    };
    let scrapers = spawn(&[watched], &admission, &unlearned(), &metrics.feedback);
    // Without /server_info the batch cap is asked for at most BATCH_CAP_TRIES readings.
    let seen = observed_until(&scrapers, |o| o.engine_kv.is_some()).await;
    assert_eq!(
        seen.kv_differences
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["model.block_tokens is 128 tokens but the engine's is 384"]
    );
    let exported = metrics.encode();
    assert!(
        exported.contains(&format!(
            "tokengate_backend_kv_mismatch{{backend=\"{base}\",key=\"model.block_tokens\"}} 1\n"
        )),
        "{exported}"
    );
    // The configured backend's capacity is what the file says.
    assert_eq!(admission.snapshot().backends[0].kv_capacity_bytes, 1000);
}

/// The scrape loop of the engine at `base` (feedback on, geometry set by hand), learning its
/// version into `versions`.
fn read_versions(base: String, versions: &Arc<EngineVersions>) -> (Scrapers, Arc<Metrics>) {
    let watched = Watched {
        url: base,
        feedback: FeedbackConfig {
            enabled: true,
            interval: Duration::from_millis(5),
            ..FeedbackConfig::default()
        },
        kv: KvWatch::Check(HAND),
    };
    let (_, admission, metrics) = scraper(FeedbackConfig::default());
    (
        spawn(&[watched], &admission, versions, &metrics.feedback),
        metrics,
    )
}

#[tokio::test]
async fn an_engine_says_its_version_and_is_asked_again_once_a_scrape_failed() {
    // Readings of an engine at 0.31.2, a failed scrape, then readings of the engine at 0.32.0.
    let mut readings = vec![cache_config(64); 20];
    readings.push(DOWN.to_string());
    readings.push(cache_config(64));
    let (base, _server) = fake_engine(readings, &["0.31.2", "0.32.0+cpu"], None).await;
    let versions = unlearned();
    let (scrapers, _metrics) = read_versions(base, &versions);
    let said = |v: &'static str| move |o: &Observed| o.engine_version.as_deref() == Some(v);
    observed_until(&scrapers, said("0.31.2")).await;
    assert!(!versions.clamps_output_to_context());
    let seen = observed_until(&scrapers, said("0.32.0+cpu")).await;
    assert_eq!((seen.failures, seen.engine_version_difference), (1, None));
    assert!(versions.clamps_output_to_context());
    assert_eq!(
        versions.in_force(0),
        Some((VllmVersion::parse("0.32.0").expect("a version"), "learned"))
    );
}

#[tokio::test]
async fn a_declared_version_the_engine_does_not_run_is_said_and_kept() {
    let (base, _server) = fake_engine(vec![cache_config(64)], &["0.32.0"], None).await;
    let versions = Arc::new(EngineVersions::declared([VllmVersion::parse("0.31.0")]));
    let (scrapers, _metrics) = read_versions(base, &versions);
    let seen = observed_until(&scrapers, |o| o.engine_version.is_some()).await;
    assert_eq!(
        seen.engine_version_difference.as_deref(),
        Some("backends[].vllm_version is 0.31.0 but the engine says it runs 0.32.0: the gateway refuses an output limit past the context, which the engine serves with what the context leaves")
    );
    // The declared version stays in force.
    assert!(!versions.clamps_output_to_context());
    assert_eq!(
        versions.in_force(0),
        Some((VllmVersion::parse("0.31.0").expect("a version"), "declared"))
    );
}
