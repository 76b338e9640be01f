//! Target `config`: configuration files through `Config::parse` (TOML, capacity-model sizing,
//! validation) and what the gateway builds from an accepted one (its tenant directory).
//!
//! Valid configs are generated as TOML tables (hand-sized and capacity-model backends, tenants
//! with rates or a `share`, `[vision]`, `[otel]`), then mutated: a required key removed, an unknown key added, a value
//! of the wrong type, a value validation refuses, profile figures of any float (zero, negative,
//! NaN, infinite, huge), and some byte edits of the text. Properties: a config is refused only
//! for something a mutation broke, and the message names it; an accepted config keeps every
//! figure given by hand, has positive capacities and finite positive rates, and each API key
//! authenticates its own tenant; nothing panics.

use proptest::prelude::*;
use proptest::sample::{select, Index};
use tokengate::capacity::HardwareProfile;
use tokengate::config::describe::describe;
use tokengate::config::{Config, ValidConfig};
use tokengate::tenant::TenantDirectory;
use toml::{Table, Value};

// ---- valid configs ------------------------------------------------------------------------

fn duration() -> impl Strategy<Value = Value> {
    select(vec!["1s", "250ms", "30s", "2m", "1h 5m", "10ms", "3days"]).prop_map(Value::from)
}

fn int(range: std::ops::RangeInclusive<i64>) -> impl Strategy<Value = Value> {
    range.prop_map(Value::Integer)
}

/// A table of some of `fields` (each present or not).
fn some_of(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> impl Strategy<Value = Table> {
    let parts: Vec<_> = fields
        .into_iter()
        .map(|(k, s)| proptest::option::of(s).prop_map(move |v| v.map(|v| (k.to_owned(), v))))
        .collect();
    parts.prop_map(|kv| kv.into_iter().flatten().collect())
}

fn server() -> impl Strategy<Value = Table> {
    some_of(vec![
        ("listen", Just(Value::from("127.0.0.1:8080")).boxed()),
        ("admin_listen", Just(Value::from("[::1]:9090")).boxed()),
        ("max_body_bytes", int(1..=1 << 30).boxed()),
        ("header_read_timeout", duration().boxed()),
        ("idle_timeout", duration().boxed()),
        ("client_write_timeout", duration().boxed()),
        ("body_read_timeout", duration().boxed()),
        ("refused_body_bytes_per_second", int(1..=1 << 30).boxed()),
        ("shutdown_grace", duration().boxed()),
        ("max_connections", int(1..=100_000).boxed()),
        (
            "admin_token",
            "[a-z0-9]{1,16}".prop_map(Value::from).boxed(),
        ),
    ])
}

fn tokenizer() -> impl Strategy<Value = Table> {
    some_of(vec![
        ("workers", int(1..=16).boxed()),
        ("queue_depth", int(1..=1024).boxed()),
        ("cache_bytes", int(0..=1 << 30).boxed()),
    ])
    .prop_map(|mut t| {
        t.insert("path".into(), "tokenizer.json".into());
        t
    })
}

fn model() -> impl Strategy<Value = Table> {
    let names = prop::collection::vec(
        select(vec!["qwen3.5-27b", "Qwen/Qwen3.5-27B", "gpt-4o", "q"]),
        1..=3,
    );
    (names, 2i64..=262_144)
        .prop_flat_map(|(names, len)| (Just(names), Just(len), 1..len))
        .prop_map(|(names, len, default)| {
            let mut t = Table::new();
            t.insert("served_names".into(), names.into());
            t.insert("max_model_len".into(), len.into());
            t.insert("default_max_tokens".into(), default.into());
            t
        })
}

fn admission() -> impl Strategy<Value = Table> {
    some_of(vec![
        ("queue_max_waiting", int(0..=1024).boxed()),
        ("queue_deadline", duration().boxed()),
    ])
}

/// A local store, or a Redis one (never connected to: parsing and validation only).
fn limiter() -> impl Strategy<Value = Table> {
    let lease = select(vec!["1s", "30s", "2m", "1h 5m"]).prop_map(Value::from);
    (
        any::<bool>(),
        some_of(vec![
            ("connect_timeout", duration().boxed()),
            ("command_timeout", duration().boxed()),
            ("retry_interval", duration().boxed()),
            ("lease_ttl", lease.clone().boxed()),
            ("kv_lease_ttl", lease.boxed()),
            ("kv_recheck_interval", duration().boxed()),
            ("failures_before_down", int(1..=10).boxed()),
            ("key_prefix", "[a-z:]{0,8}".prop_map(Value::from).boxed()),
        ]),
    )
        .prop_map(|(redis, mut t)| {
            if redis {
                t.insert("store".into(), "redis".into());
                t.insert("redis_url".into(), "redis://127.0.0.1:6379".into());
            }
            t
        })
}

/// `[vision]`: on or off, with any charges and media cap validation accepts.
fn vision() -> impl Strategy<Value = Table> {
    some_of(vec![
        ("enabled", any::<bool>().prop_map(Value::Boolean).boxed()),
        ("remote_image_tokens", int(1..=1 << 20).boxed()),
        ("video_tokens", int(3..=1 << 20).boxed()),
        (
            "max_media_per_request",
            int(1..=i64::from(u32::MAX)).boxed(),
        ),
    ])
}

/// `[otel]`: absent (empty), or on with any figures validation accepts (the export batch never
/// above the queue, so the two come together).
fn otel() -> impl Strategy<Value = Table> {
    let endpoints = vec![
        "http://127.0.0.1:4318",
        "http://collector:4318/",
        "http://[::1]:4318/otlp",
    ];
    let on = (
        select(endpoints),
        some_of(vec![
            (
                "service_name",
                select(vec!["tokengate", "gw-eu"])
                    .prop_map(Value::from)
                    .boxed(),
            ),
            ("export_interval", duration().boxed()),
            ("export_timeout", duration().boxed()),
            (
                "sampling_ratio",
                (0.0..=1.0f64).prop_map(Value::from).boxed(),
            ),
        ]),
        proptest::option::of((1i64..=1_000_000).prop_flat_map(|q| (Just(q), 1..=q))),
    )
        .prop_map(|(endpoint, mut t, spans)| {
            t.insert("endpoint".into(), endpoint.into());
            if let Some((queued, batch)) = spans {
                t.insert("max_queued_spans".into(), Value::Integer(queued));
                t.insert("max_export_batch".into(), Value::Integer(batch));
            }
            t
        });
    prop_oneof![Just(Table::new()), on]
}

fn workload() -> impl Strategy<Value = Table> {
    some_of(vec![
        ("avg_input_tokens", int(1..=32_768).boxed()),
        ("avg_output_tokens", int(1..=8_192).boxed()),
    ])
}

/// Options every backend may carry.
fn backend_common() -> impl Strategy<Value = Table> {
    (
        1u16..=65_535,
        some_of(vec![
            ("connect_timeout", duration().boxed()),
            ("first_byte_timeout", duration().boxed()),
            ("stream_idle_timeout", duration().boxed()),
            ("body_read_timeout", duration().boxed()),
            ("health_timeout", duration().boxed()),
            ("max_response_bytes", int(1..=1 << 40).boxed()),
            ("max_event_bytes", int(1..=1 << 30).boxed()),
            ("health_path", Just(Value::from("/v2/health/ready")).boxed()),
        ]),
    )
        .prop_map(|(port, mut t)| {
            t.insert("url".into(), format!("http://127.0.0.1:{port}").into());
            t
        })
}

/// A backend sized by hand.
fn manual_backend() -> impl Strategy<Value = Table> {
    (backend_common(), 1..=i64::MAX, 1..=i64::from(u32::MAX)).prop_map(|(mut t, kv, batch)| {
        t.insert("kv_capacity_bytes".into(), kv.into());
        t.insert("max_batch".into(), batch.into());
        t
    })
}

/// A backend sized by the capacity model (the model's cache figures agree with `[model]`'s
/// defaults).
fn sized_backend() -> impl Strategy<Value = Table> {
    (
        backend_common(),
        select(HardwareProfile::names()),
        some_of(vec![
            ("tp", int(1..=8).boxed()),
            ("replicas", int(1..=4).boxed()),
            ("efficiency", (0.05f64..=1.0).prop_map(Value::Float).boxed()),
            (
                "tpot_slo_ms",
                (20.0f64..=500.0).prop_map(Value::Float).boxed(),
            ),
            ("engine_max_batch", int(1..=512).boxed()),
        ]),
    )
        .prop_map(|(mut t, hardware, options)| {
            t.insert("hardware".into(), hardware.into());
            t.insert("model".into(), "qwen3.5-27b".into());
            t.extend(options);
            t
        })
}

/// A tenant with token rates, or (when every backend is sized) a share of their capacity.
fn tenant(i: usize, may_share: bool) -> impl Strategy<Value = Table> {
    let rates = (
        0.001f64..=1e7,
        0.001f64..=1e6,
        0.01f64..=1e4,
        100.0f64..=3600.0,
    )
        .prop_map(|(prefill, decode, requests, burst)| {
            let mut t = Table::new();
            t.insert("prefill_tokens_per_second".into(), prefill.into());
            t.insert("decode_tokens_per_second".into(), decode.into());
            // requests x burst >= 1 (0.01 x 100), or no request ever fits.
            t.insert("requests_per_second".into(), requests.into());
            t.insert("burst_seconds".into(), burst.into());
            t
        });
    let share = (0.001f64..=1.0).prop_map(|share| {
        let mut t = Table::new();
        t.insert("share".into(), share.into());
        t
    });
    let budget = if may_share {
        prop_oneof![rates, share].boxed()
    } else {
        rates.boxed()
    };
    let caps = some_of(vec![
        ("max_inflight", int(1..=4096).boxed()),
        ("max_queued", int(0..=4096).boxed()),
    ]);
    (budget, any::<bool>(), caps).prop_map(move |(mut t, hashed, caps)| {
        t.extend(caps);
        t.insert("name".into(), format!("tenant-{i}").into());
        let key = format!("sk-{i}");
        if hashed {
            let digest = tokengate::digest::hash_key(&key);
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            t.insert("api_key_sha256".into(), vec![hex].into());
        } else {
            t.insert("api_keys".into(), vec![key].into());
        }
        t
    })
}

/// A valid config, as a table.
fn valid_config() -> impl Strategy<Value = Table> {
    let backends = prop::collection::vec(
        prop_oneof![
            manual_backend().prop_map(|t| (t, false)),
            sized_backend().prop_map(|t| (t, true))
        ],
        1..=3,
    );
    (
        server(),
        tokenizer(),
        model(),
        (admission(), limiter()),
        (workload(), vision(), otel()),
        backends,
        1usize..=4,
    )
        .prop_flat_map(
            |(server, tokenizer, model, admission, workload, backends, n)| {
                let all_sized = backends.iter().all(|(_, sized)| *sized);
                let tenants: Vec<_> = (0..n).map(|i| tenant(i, all_sized)).collect();
                let backends: Vec<Table> = backends.into_iter().map(|(t, _)| t).collect();
                (
                    Just((server, tokenizer, model, admission, workload, backends)),
                    tenants,
                )
            },
        )
        .prop_map(
            |(
                (
                    server,
                    tokenizer,
                    model,
                    (admission, limiter),
                    (workload, vision, otel),
                    backends,
                ),
                tenants,
            )| {
                let mut t = Table::new();
                for (key, table) in [
                    ("server", server),
                    ("admission", admission),
                    ("limiter", limiter),
                    ("workload", workload),
                    ("vision", vision),
                    ("otel", otel),
                ] {
                    if !table.is_empty() {
                        t.insert(key.into(), table.into());
                    }
                }
                t.insert("tokenizer".into(), tokenizer.into());
                t.insert("model".into(), model.into());
                t.insert("backends".into(), backends.into());
                t.insert("tenants".into(), tenants.into());
                t
            },
        )
}

// ---- mutations ----------------------------------------------------------------------------

/// One step of a path into the config table.
#[derive(Debug, Clone)]
enum Seg {
    Key(&'static str),
    /// The n-th entry (modulo their number) of an array of tables.
    Nth(&'static str, Index),
}

type Path = Vec<Seg>;

/// The table at `path`, and the path as validation messages spell it (`tenants[1]`).
fn table_at<'a>(mut t: &'a mut Table, path: &[Seg]) -> Option<(&'a mut Table, String)> {
    let mut name = String::new();
    for seg in path {
        let dot = if name.is_empty() { "" } else { "." };
        t = match seg {
            Seg::Key(k) => {
                name = format!("{name}{dot}{k}");
                t.get_mut(*k)?.as_table_mut()?
            }
            Seg::Nth(k, i) => {
                let array = t.get_mut(*k)?.as_array_mut()?;
                if array.is_empty() {
                    return None;
                }
                let i = i.index(array.len());
                name = format!("{name}{dot}{k}[{i}]");
                array[i].as_table_mut()?
            }
        };
    }
    Some((t, name))
}

/// What a mutation does to the table at its path.
#[derive(Debug, Clone)]
enum Mutation {
    /// Removes a key the file must have.
    Remove(Path, &'static str),
    /// Adds a key no table has.
    Unknown(Path),
    /// Replaces a present value by one of another TOML type.
    WrongType(Path, Index),
    /// Sets a present key to a value validation refuses; the message names `field`.
    Invalid(Path, &'static str, Value),
    /// Sets profile figures of a sized backend to any floats: accepted or refused naming the
    /// backend, never a panic.
    Wild(Index, Table),
}

/// What the refusal of a mutated config must mention (any one of `texts`, of any one
/// expectation), and whether the mutation may also leave the config valid.
#[derive(Debug)]
struct Expect {
    texts: Vec<String>,
    may_pass: bool,
}

impl Mutation {
    fn apply(&self, config: &mut Table) -> Option<Expect> {
        let must = |text: String| {
            Some(Expect {
                texts: vec![text],
                may_pass: false,
            })
        };
        match self {
            Mutation::Remove(path, key) => {
                let (t, _) = table_at(config, path)?;
                t.remove(*key)?;
                must(format!("missing field `{key}`"))
            }
            Mutation::Unknown(path) => {
                let (t, _) = table_at(config, path)?;
                t.insert("colour_scheme".into(), Value::Integer(1));
                must("unknown field `colour_scheme`".into())
            }
            Mutation::WrongType(path, which) => {
                let (t, _) = table_at(config, path)?;
                if t.is_empty() {
                    return None;
                }
                let key = t.keys().nth(which.index(t.len()))?.clone();
                // A key is retyped once: three retypes led an integer back to an integer
                // (true, then "x", then 7), which the first million of a campaign found. A
                // value that is one of these three is not retyped again (nor is a field whose
                // own value happens to be one).
                if matches!(&t[&key], Value::Integer(7) | Value::Boolean(true))
                    || t[&key].as_str() == Some("x")
                {
                    return None;
                }
                let wrong = match &t[&key] {
                    Value::String(_) => Value::Integer(7),
                    Value::Array(_) | Value::Boolean(_) => Value::from("x"),
                    _ => Value::Boolean(true),
                };
                t.insert(key.clone(), wrong);
                // The message quotes the line of the value, which starts with its key (an
                // array of tables is quoted from its header, `[[key]]`).
                must(key)
            }
            Mutation::Invalid(path, field, value) => {
                let (t, at) = table_at(config, path)?;
                t.get(*field)?;
                t.insert((*field).into(), value.clone());
                must(at)
            }
            Mutation::Wild(i, figures) => {
                let backends = config.get_mut("backends")?.as_array_mut()?;
                let i = i.index(backends.len());
                let b = backends[i].as_table_mut()?;
                b.get("hardware")?;
                // Once: a second table would undo what a mutation did to the first.
                if b.contains_key("overrides") {
                    return None;
                }
                b.insert("overrides".into(), figures.clone().into());
                // Refused for the backend, or for a share of its capacity now too small for
                // one request in a tenant's burst.
                Some(Expect {
                    texts: vec![format!("backends[{i}]"), "derived from share".into()],
                    may_pass: true,
                })
            }
        }
    }
}

fn required() -> impl Strategy<Value = Mutation> {
    (0..11, any::<Index>()).prop_map(|(which, i)| {
        let (path, key) = match which {
            0 => (vec![], "tokenizer"),
            1 => (vec![], "model"),
            2 => (vec![], "backends"),
            3 => (vec![], "tenants"),
            4 => (vec![Seg::Key("tokenizer")], "path"),
            5 => (vec![Seg::Key("model")], "served_names"),
            6 => (vec![Seg::Key("model")], "max_model_len"),
            7 => (vec![Seg::Key("model")], "default_max_tokens"),
            8 => (vec![Seg::Nth("backends", i)], "url"),
            9 => (vec![Seg::Key("otel")], "endpoint"),
            _ => (vec![Seg::Nth("tenants", i)], "name"),
        };
        Mutation::Remove(path, key)
    })
}

fn any_table() -> impl Strategy<Value = Path> {
    any::<Index>().prop_flat_map(|i| {
        select(vec![
            vec![],
            vec![Seg::Key("server")],
            vec![Seg::Key("tokenizer")],
            vec![Seg::Key("model")],
            vec![Seg::Key("admission")],
            vec![Seg::Key("limiter")],
            vec![Seg::Key("workload")],
            vec![Seg::Key("vision")],
            vec![Seg::Key("otel")],
            vec![Seg::Nth("backends", i)],
            vec![Seg::Nth("tenants", i)],
            vec![Seg::Nth("backends", i), Seg::Key("overrides")],
        ])
    })
}

fn invalid() -> impl Strategy<Value = Mutation> {
    let zero = || Value::Integer(0);
    let no_time = || Value::from("0s");
    // (table, field, a value validation refuses); `backends` and `tenants` are any entry.
    let mut cases: Vec<(&'static str, &'static str, Value)> = vec![
        ("tokenizer", "workers", zero()),
        ("model", "served_names", Value::Array(vec![])),
        ("model", "default_max_tokens", zero()),
        ("model", "max_model_len", zero()),
        ("admission", "queue_deadline", no_time()),
        ("limiter", "connect_timeout", no_time()),
        ("limiter", "command_timeout", no_time()),
        ("limiter", "retry_interval", no_time()),
        ("limiter", "lease_ttl", "500ms".into()),
        ("limiter", "kv_lease_ttl", "500ms".into()),
        ("limiter", "kv_recheck_interval", no_time()),
        ("limiter", "failures_before_down", zero()),
        ("limiter", "key_prefix", "a{b".into()),
        ("limiter", "redis_url", "http://127.0.0.1:6379".into()),
        ("server", "max_connections", zero()),
        ("server", "refused_body_bytes_per_second", zero()),
        ("server", "admin_token", "".into()),
        ("tenants", "name", "".into()),
        ("tenants", "api_keys", Value::Array(vec!["".into()])),
        (
            "tenants",
            "api_key_sha256",
            Value::Array(vec!["abc".into()]),
        ),
        ("tenants", "share", 1.5.into()),
        ("tenants", "max_inflight", zero()),
        ("vision", "remote_image_tokens", zero()),
        ("vision", "video_tokens", Value::Integer(2)),
        ("vision", "max_media_per_request", zero()),
        ("otel", "endpoint", "https://127.0.0.1:4318".into()),
        ("otel", "endpoint", "127.0.0.1:4318".into()),
        ("otel", "service_name", "".into()),
        ("otel", "export_interval", no_time()),
        ("otel", "export_timeout", no_time()),
        ("otel", "max_queued_spans", zero()),
        ("otel", "max_queued_spans", Value::Integer(1_000_001)),
        ("otel", "max_export_batch", zero()),
        ("otel", "sampling_ratio", 1.5.into()),
        ("otel", "sampling_ratio", (-0.1).into()),
    ];
    for url in ["https://127.0.0.1:1", "127.0.0.1:80", "not a url", ""] {
        cases.push(("backends", "url", url.into()));
    }
    for field in [
        "first_byte_timeout",
        "stream_idle_timeout",
        "body_read_timeout",
        "health_timeout",
    ] {
        cases.push(("backends", field, no_time()));
    }
    for field in ["max_response_bytes", "max_event_bytes", "max_batch"] {
        cases.push(("backends", field, zero()));
    }
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for field in [
            "prefill_tokens_per_second",
            "decode_tokens_per_second",
            "requests_per_second",
            "burst_seconds",
            "share",
        ] {
            cases.push(("tenants", field, rate.into()));
        }
    }
    (select(cases), any::<Index>()).prop_map(|((table, field, value), i)| {
        let path = match table {
            "backends" | "tenants" => vec![Seg::Nth(table, i)],
            _ => vec![Seg::Key(table)],
        };
        Mutation::Invalid(path, field, value)
    })
}

/// Any float, the edges most of all.
fn wild_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        select(vec![
            0.0,
            -0.0,
            -1.0,
            f64::MIN_POSITIVE,
            1e-300,
            1e300,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ]),
        any::<f64>(),
        0.001f64..1e6,
    ]
}

fn wild() -> impl Strategy<Value = Mutation> {
    let figure = |k: &'static str| (k, wild_float().prop_map(Value::Float).boxed());
    (
        any::<Index>(),
        some_of(vec![
            figure("tflops"),
            figure("bandwidth_gbs"),
            figure("hbm_gb"),
            figure("params_b"),
            figure("weights_gb"),
        ]),
    )
        .prop_map(|(i, t)| Mutation::Wild(i, t))
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => required(),
        1 => any_table().prop_map(Mutation::Unknown),
        2 => (any_table(), any::<Index>()).prop_map(|(p, i)| Mutation::WrongType(p, i)),
        4 => invalid(),
        2 => wild(),
    ]
}

/// A byte edit of the text: its outcome is unknown, but nothing may panic.
#[derive(Debug, Clone)]
enum Edit {
    None,
    Truncate(Index),
    Insert(Index, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        8 => Just(Edit::None),
        1 => any::<Index>().prop_map(Edit::Truncate),
        1 => (any::<Index>(), select(b"\"[]{}=\n#'.,0\\\x00\xff".to_vec()))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
    ]
}

// ---- the target ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Case {
    config: Table,
    mutations: Vec<Mutation>,
    edit: Edit,
}

fn case() -> impl Strategy<Value = Case> {
    (
        valid_config(),
        prop_oneof![
            2 => Just(Vec::new()),
            3 => prop::collection::vec(mutation(), 1..2),
            1 => prop::collection::vec(mutation(), 2..4),
        ],
        edit(),
    )
        .prop_map(|(config, mutations, edit)| Case {
            config,
            mutations,
            edit,
        })
}

/// What holds for every accepted config, whatever its text.
fn check_accepted(cfg: &ValidConfig) -> Result<(), TestCaseError> {
    let again = cfg.clone().into_inner().validated();
    prop_assert!(again.is_ok(), "{:?}", again);
    for b in &cfg.backends {
        prop_assert!(b.kv_capacity_bytes() > 0 && b.max_batch() > 0, "{b:?}");
    }
    for t in &cfg.tenants {
        let rates = t.rates();
        for rate in [
            rates.prefill_tokens_per_second,
            rates.decode_tokens_per_second,
            rates.requests_per_second,
        ] {
            prop_assert!(rate.is_finite() && rate > 0.0, "{t:?}");
        }
    }
    prop_assert!(!describe(cfg).is_empty());
    Ok(())
}

/// What holds for an accepted config generated as `table`: figures given by hand are kept and
/// every key authenticates its tenant.
fn check_as_given(cfg: &ValidConfig, table: &Table) -> Result<(), TestCaseError> {
    let backends = table["backends"].as_array().unwrap();
    prop_assert_eq!(cfg.backends.len(), backends.len());
    for (b, t) in cfg.backends.iter().zip(backends) {
        prop_assert_eq!(&b.url, t["url"].as_str().unwrap());
        if let Some(kv) = t.get("kv_capacity_bytes").and_then(Value::as_integer) {
            prop_assert_eq!(b.kv_capacity_bytes(), kv as u64);
        }
        if let Some(batch) = t.get("max_batch").and_then(Value::as_integer) {
            prop_assert_eq!(u64::from(b.max_batch()), batch as u64);
        }
        prop_assert_eq!(b.derived.is_some(), t.get("hardware").is_some());
    }
    let vision = table.get("vision").and_then(Value::as_table);
    let given = |k: &str| vision.and_then(|v| v.get(k)).and_then(Value::as_integer);
    let rules = &cfg.vision_rules;
    prop_assert_eq!(
        u64::from(rules.max_media_per_request),
        given("max_media_per_request").unwrap_or(999) as u64
    );
    if let Some(tokens) = given("remote_image_tokens") {
        prop_assert_eq!(rules.remote_image_tokens, tokens as u64);
    }
    let shown = format!(
        "at most {} of each per request",
        rules.max_media_per_request
    );
    prop_assert_eq!(describe(cfg).contains(&shown), rules.enabled);
    let tenants = table["tenants"].as_array().unwrap();
    prop_assert_eq!(cfg.tenants.len(), tenants.len());
    let directory = TenantDirectory::from_config(cfg);
    for (i, (c, t)) in cfg.tenants.iter().zip(tenants).enumerate() {
        prop_assert_eq!(&c.name, t["name"].as_str().unwrap());
        if let Some(rate) = t.get("prefill_tokens_per_second") {
            prop_assert_eq!(
                c.rates().prefill_tokens_per_second,
                rate.as_float().unwrap()
            );
        }
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            format!("Bearer sk-{i}").parse().unwrap(),
        );
        let who = directory
            .authenticate(&headers)
            .map_err(|e| TestCaseError::fail(format!("sk-{i} refused: {}", e.message)))?;
        prop_assert_eq!(&who.name, &c.name);
    }
    Ok(())
}

fn check(case: Case) -> Result<(), TestCaseError> {
    let base_text = toml::to_string(&case.config).unwrap();
    let base = match Config::parse(&base_text) {
        Ok(cfg) => cfg,
        // The refusals a generated config may get, both the capacity model's answer: a sized
        // backend with no safe batch for the declared workload, or a share of it too small for
        // one request in the tenant's burst.
        Err(e) => {
            let message = format!("{e:#}");
            prop_assert!(
                message.contains("no batch of the declared workload")
                    || message.contains("derived from share"),
                "a valid config was refused: {message}\n{base_text}"
            );
            return Ok(());
        }
    };
    check_accepted(&base)?;
    check_as_given(&base, &case.config)?;

    let mut table = case.config.clone();
    let expected: Vec<Expect> = case
        .mutations
        .iter()
        .filter_map(|m| m.apply(&mut table))
        .collect();
    let mut text = toml::to_string(&table).unwrap();
    let edited = match case.edit {
        Edit::None => false,
        Edit::Truncate(at) => {
            let cut = at.index(text.len() + 1);
            text = String::from_utf8_lossy(&text.as_bytes()[..cut]).into_owned();
            true
        }
        Edit::Insert(at, byte) => {
            let mut bytes = text.into_bytes();
            bytes.insert(at.index(bytes.len() + 1), byte);
            text = String::from_utf8_lossy(&bytes).into_owned();
            true
        }
    };
    match Config::parse(&text) {
        Ok(cfg) => {
            check_accepted(&cfg)?;
            if !edited {
                prop_assert!(
                    expected.iter().all(|e| e.may_pass),
                    "accepted a config that should be refused for one of {:?}\n{text}",
                    expected
                );
                check_as_given(&cfg, &table)?;
            }
        }
        Err(e) if !edited => {
            let message = format!("{e:#}");
            prop_assert!(
                expected
                    .iter()
                    .any(|x| x.texts.iter().any(|t| message.contains(t.as_str()))),
                "refused with `{message}`, expected a mention of one of {:?}\n{text}",
                expected
            );
        }
        Err(_) => {}
    }
    Ok(())
}

#[test]
fn config() {
    crate::fuzz("config", "tests/fuzz/regressions/config.txt", case(), check);
}
