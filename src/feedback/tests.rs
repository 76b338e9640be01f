use super::*;
use crate::admission::{BackendSpec, ClassShares, Need, Priority, QueueSpec};
use crate::util::get::get_text;

/// 100 bytes of KV for 100 prompt tokens.
const NEED: Need = Need {
    bytes: 100,
    prompt_tokens: 100,
    output_tokens: 0,
    sequences: 1,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        admission: admission.clone(),
        feedback: observed,
        metrics: metrics.clone(),
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

/// Issue 26: a backend serving `}{ 1` made the parser slice backwards and panic, which ended
/// the scrape task and froze the capacity scale. Now the garbage is counted as a parse failure
/// and the next good scrapes move the scale.
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
    let scrapers = spawn(&[(base.clone(), cfg)], &admission, &metrics);
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
