//! Building a whole gateway from a [`ValidConfig`], so `serve` and the tests start it the
//! same way (and tests can start many independent gateways in one process).

use crate::admission::{Admission, BackendSpec, LedgerStore, QueueSpec};
use crate::body::discard::Discarder;
use crate::body::Bodies;
use crate::clock::{SharedClock, SystemClock};
use crate::config::{BackendConfig, KvSource, ModelConfig, Runner, ValidConfig};
use crate::feedback::engine::HandSet;
use crate::feedback::{KvWatch, Watched};
use crate::gateway::{Gateway, Lane};
use crate::layers::admit::KvGeometry;
use crate::layers::count::{CountSettings, Counter, KvCheck};
use crate::limiter::config::StoreKind;
use crate::limiter::redis::{RedisStore, StoreMetrics};
use crate::limiter::{BucketStore, Limiter, LocalStore};
use crate::metrics::{CountMetrics, Metrics};
use crate::proxy::forward::{Backends, ForwardSettings};
use crate::proxy::upstream::Upstream;
use crate::quota::config::QuotaStoreKind;
use crate::quota::redis::RedisQuotaStore;
use crate::quota::store::{LocalQuotaStore, QuotaStore, WriteErrors};
use crate::quota::{Flusher, Prices, Quotas};
use crate::record::Recorder;
use crate::reload::live::LiveConfig;
use crate::reload::Reloader;
use crate::server::{self, Running};
use crate::settle::COUNT_WARNING_PERIOD;
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::chat::ChatTemplate;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::Tokenizer;
use crate::usage_log::{UsageLog, WallAnchor};
use crate::util::throttle::Throttle;
use anyhow::Context;
use std::sync::Arc;

/// What a gateway takes from outside its config.
#[derive(Clone)]
pub struct Deps {
    /// The limiter's and the workload profile's time source.
    pub clock: SharedClock,
    /// An already loaded tokenizer (tests share one); `None` loads `tokenizer.path`.
    pub tokenizer: Option<Arc<Tokenizer>>,
}

impl Default for Deps {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            tokenizer: None,
        }
    }
}

/// Loads a tokenizer file off the async executor.
pub async fn load_tokenizer(path: &std::path::Path) -> anyhow::Result<Arc<Tokenizer>> {
    let path = path.to_path_buf();
    let tok = tokio::task::spawn_blocking(move || {
        Tokenizer::load(&path).with_context(|| {
            format!(
                "loading tokenizer {} (run scripts/fetch-tokenizer to make the Qwen3.5 one)",
                path.display()
            )
        })
    })
    .await??;
    Ok(Arc::new(tok))
}

/// Chat answers that may wait to be counted ahead for their next turn.
const REPLY_QUEUE_DEPTH: usize = 64;

/// What steps 6-7 read and count with, for `config`: the tokenizer (`tokenizer`, or the one
/// `tokenizer.path` names), the chat template, the worker pool and the body reader, peeking at
/// `limiter`'s buckets and counting in `metrics`.
pub async fn counter(
    config: Arc<ValidConfig>,
    tokenizer: Option<Arc<Tokenizer>>,
    limiter: Limiter,
    metrics: Arc<CountMetrics>,
    kv: Option<KvCheck>,
) -> anyhow::Result<Counter> {
    let tokenizer = match tokenizer {
        Some(t) => t,
        None => load_tokenizer(&config.tokenizer.path).await?,
    };
    let template = match &config.tokenizer.chat_template {
        Some(path) => ChatTemplate::from_jinja_file(path)
            .with_context(|| format!("loading chat template {}", path.display()))?,
        None => ChatTemplate::builtin_qwen35(),
    };
    let chat = Arc::new(ChatCounter::new(
        template,
        config.tokenizer.cache_bytes as usize,
    ));
    let pool = Arc::new(TokenizePool::new(
        "tokenize",
        config.tokenizer.workers,
        config.tokenizer.queue_depth,
    ));
    let discarder = Arc::new(Discarder::new(
        config.server.refused_body_bytes_per_second,
        config.server.max_body_bytes,
        metrics.refused_body_bytes.clone(),
    ));
    let max_items = config.server.max_json_items;
    Ok(Counter {
        settings: Arc::new(CountSettings::of(&config)),
        limiter,
        bodies: Bodies {
            discarder,
            pool: pool.clone(),
            max_items,
        },
        tokenizer,
        chat,
        pool,
        metrics,
        kv,
    })
}

/// Builds the gateway state.
pub async fn build(config: ValidConfig, deps: Deps) -> anyhow::Result<Arc<Gateway>> {
    let config = Arc::new(config);
    // Chat answers are counted ahead for their next turn by one thread of their own, so this
    // background work never takes a request's place in the pool above; when it falls behind,
    // answers are skipped and the next turn counts them itself.
    let replies = (config.tokenizer.cache_bytes > 0)
        .then(|| Arc::new(TokenizePool::new("tokenize-replies", 1, REPLY_QUEUE_DEPTH)));
    let queue = QueueSpec {
        max_waiting: config.admission.queue_max_waiting,
        deadline: config.admission.queue_deadline,
        shares: config.admission.class_shares(),
    };
    let metrics = Arc::new(Metrics::new());
    metrics.config.config_loaded();
    // Spans are timed on the gateway's clock, so tests read exact timestamps.
    let otel = (config.otel.as_ref())
        .map(|o| crate::otel::Otel::start(o, deps.clock.clone(), &metrics.otel))
        .transpose()?;
    let store: Arc<dyn BucketStore> = match config.limiter.store {
        StoreKind::Local => Arc::new(LocalStore::default()),
        StoreKind::Redis => Arc::new(RedisStore::new(
            &config.limiter,
            metrics.limiter_store.clone(),
        )?),
    };
    let admission = admit_on(&config, Runner::Generate, queue, &metrics.limiter_store)?;
    let usage_log = match &config.usage_log {
        Some(log) => {
            let anchor = WallAnchor {
                instant: deps.clock.now(),
                wall: deps.clock.wall(),
            };
            let prices = Prices::from_config(&config.prices, &config.model.served_names)?;
            Some(UsageLog::start(
                log,
                &metrics.usage_log,
                anchor,
                Arc::new(prices),
            )?)
        }
        None => None,
    };
    let recorder = Arc::new(Recorder::new(
        deps.clock.clone(),
        config.profile.window,
        usage_log,
    ));
    let live = Arc::new(LiveConfig::new(config.clone()));
    let (quotas, quota_flusher) = quotas_of(&config, &deps.clock, &metrics)?;
    // One throttle for both lanes' count warnings, so a backend counting otherwise writes one
    // line a period whichever lane it is on.
    let count_warnings = Arc::new(Throttle::every(COUNT_WARNING_PERIOD, deps.clock.clone()));
    let limiter = Limiter::new(store, deps.clock);
    let kv = KvCheck {
        admission: admission.clone(),
        geometry: KvGeometry::from(&config.model),
    };
    let counter = counter(
        config.clone(),
        deps.tokenizer,
        limiter.clone(),
        metrics.count.clone(),
        Some(kv),
    );
    let counter = Arc::new(counter.await?);
    // Feedback reads generation engines (validation refuses it on a pooling backend), and
    // learns their versions for the counter.
    let feedback = crate::feedback::spawn(
        &watched(&config),
        &admission,
        &counter.settings.versions,
        &metrics.feedback,
    );
    let chat = counter.chat.clone();
    let settings = ForwardSettings::of(&config);
    let backends = Arc::new(Backends {
        upstreams: upstreams_of(&config, Runner::Generate)?,
        settings: settings.clone(),
        metrics: metrics.settle.clone(),
        tokenizer: counter.tokenizer.clone(),
        pool: counter.pool.clone(),
        chat: chat.clone(),
        replies,
        count_warnings: count_warnings.clone(),
    });
    // The pooling backends, when there are any: admitted on their own, in their own queue.
    let pooling = match config.running(Runner::Pooling).next() {
        None => None,
        Some(_) => {
            let admission = admit_on(&config, Runner::Pooling, queue, &metrics.limiter_store)?;
            let kv = KvCheck {
                admission: admission.clone(),
                geometry: KvGeometry::from(&config.model),
            };
            // Nothing is generated there: no answer to count ahead.
            let backends = Backends {
                upstreams: upstreams_of(&config, Runner::Pooling)?,
                settings,
                metrics: metrics.settle.clone(),
                tokenizer: counter.tokenizer.clone(),
                pool: counter.pool.clone(),
                chat: chat.clone(),
                replies: None,
                count_warnings,
            };
            Some(Lane {
                admission,
                counter: Arc::new(counter.with_kv(kv)),
                backends: Arc::new(backends),
            })
        }
    };
    let reloader = Reloader {
        live: live.clone(),
        limiter: limiter.clone(),
        admission: admission.clone(),
        pooling: (pooling.as_ref()).map(|l| l.admission.clone()),
        metrics: metrics.config.clone(),
        gauges: metrics.state.clone(),
    };
    Ok(Arc::new(Gateway {
        config,
        live,
        limiter,
        admission,
        counter,
        backends,
        chat,
        metrics,
        recorder,
        reloader,
        feedback,
        pooling,
        quotas,
        quota_flusher,
        otel,
    }))
}

/// The generation backends as the feedback loops read them, in config order.
pub fn watched(config: &ValidConfig) -> Vec<Watched> {
    (config.running(Runner::Generate))
        .map(|(b, _)| Watched {
            url: b.url.clone(),
            feedback: b.feedback.clone(),
            kv: kv_watch(&config.model, b),
        })
        .collect()
}

/// What backend `b`'s engine's KV geometry is for: learned and admitted by (`kv = "engine"`),
/// or held against the geometry set by hand.
fn kv_watch(model: &ModelConfig, b: &BackendConfig) -> KvWatch {
    match b.kv {
        KvSource::Engine => KvWatch::Learn {
            max_batch: b.max_batch,
            kv_bytes_per_token: model.kv_bytes_per_token,
            max_model_len: model.max_model_len,
        },
        KvSource::Configured => KvWatch::Check(HandSet {
            block_tokens: model.block_tokens,
            kv_bytes_per_token: model.kv_bytes_per_token,
            state_bytes_per_sequence: model.state_bytes_per_sequence,
            prefix_caching: model.prefix_caching,
            max_model_len: model.max_model_len,
            kv_capacity_bytes: b.kv_capacity_bytes(),
            max_batch: b.max_batch(),
        }),
    }
}

/// The tenants' quotas: kept in this process and written to `quotas.path` (with the task that
/// writes them), or in the limiter's Redis.
fn quotas_of(
    config: &ValidConfig,
    clock: &crate::clock::SharedClock,
    metrics: &Metrics,
) -> anyhow::Result<(Quotas, Option<Flusher>)> {
    let prices = Prices::from_config(&config.prices, &config.model.served_names)?;
    // A gateway started without any quota keeps none in a file (a reload that adds the first
    // keeps its spend in memory until the next restart).
    let quoted = config.tenants.iter().any(|t| !t.quota_meters.is_empty());
    let store: Arc<dyn QuotaStore> = match config.quotas.store {
        QuotaStoreKind::Local if quoted => {
            let write_errors = WriteErrors {
                policy: config.quotas.on_write_error,
                metrics: metrics.quota_file.clone(),
            };
            Arc::new(LocalQuotaStore::persisted(
                &config.quotas.path,
                write_errors,
            )?)
        }
        QuotaStoreKind::Local => Arc::new(LocalQuotaStore::in_memory()),
        QuotaStoreKind::Redis => Arc::new(RedisQuotaStore::with_metrics(
            &config.limiter,
            metrics.limiter_store.clone(),
        )?),
    };
    let quotas = Quotas::new(store, clock.clone(), prices);
    let flusher = (quoted && config.quotas.store == QuotaStoreKind::Local)
        .then(|| quotas.flush_every(config.quotas.flush_interval));
    Ok((quotas, flusher))
}

/// The admission over the backends that run `runner`, in config order: local, or shared through
/// Redis with the other replicas (backends named by their url) when the buckets are.
fn admit_on(
    config: &ValidConfig,
    runner: Runner,
    queue: QueueSpec,
    metrics: &StoreMetrics,
) -> anyhow::Result<Admission> {
    let backends = (config.running(runner))
        .map(|(b, _)| BackendSpec {
            name: b.url.clone(),
            kv_capacity_bytes: b.kv_capacity_bytes(),
            max_batch: b.max_batch(),
            engine: b.kv == KvSource::Engine,
        })
        .collect();
    Ok(match config.limiter.store {
        StoreKind::Local => Admission::new(backends, queue),
        StoreKind::Redis => {
            let namespace = match runner {
                Runner::Generate => "",
                Runner::Pooling => "pooling:",
            };
            let store = LedgerStore::new(&config.limiter, namespace, metrics.clone())?;
            Admission::shared(backends, queue, store)
        }
    })
}

/// A client for each backend that runs `runner`, in config order (the indices of its
/// admission's leases).
fn upstreams_of(config: &ValidConfig, runner: Runner) -> anyhow::Result<Arc<[Upstream]>> {
    (config.running(runner))
        // Pool 0 for the process's own runtime (health checks), one for each worker.
        .map(|(backend, base)| Upstream::new(backend, base, config.server.workers() + 1))
        .collect()
}

/// Builds and serves a gateway.
pub async fn start(config: ValidConfig, deps: Deps) -> anyhow::Result<Running> {
    let gw = build(config, deps).await?;
    server::serve(gw).await
}
