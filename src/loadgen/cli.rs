//! Room `loadgen`: `tokengate loadgen`, the command line and the open-loop runner: every planned
//! request is sent at its planned instant whatever the server does, with a progress line, then
//! the report is printed and optionally written as JSON and SVG.

use super::client::{Api, Client, Job, Target};
use super::prompt::PromptBuilder;
use super::report::{Outcome, Report, Sample, Sla};
use super::sla::{target_tpot_sla, TpotSla};
use super::workload::{parse_mix, parse_rate, parse_trace, plan, Planned};
use crate::sim::DEFAULT_MODEL;
use crate::tokenize::chat::ChatTemplate;
use crate::tokenize::Tokenizer;
use anyhow::Context;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The TTFT SLA by default, ms (the common interactive target).
const DEFAULT_SLA_TTFT_MS: f64 = 800.0;

/// `tokengate loadgen`: open-loop load with realistic token lengths, measured per tenant.
///
/// Tenants and keys: a tenant is a name in `--mix` (or `--tenant`); its requests carry
/// `Authorization: Bearer KEY` with the key given by `--tenant-key TENANT=KEY`, else the
/// `--api-key` of all tenants, else no key.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Base URL of the server (the gateway, or a backend directly).
    #[arg(long)]
    pub url: String,
    /// API key of every tenant without its own `--tenant-key`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// `TENANT=KEY`: the API key of one tenant (repeatable).
    #[arg(long = "tenant-key", value_name = "TENANT=KEY")]
    pub tenant_keys: Vec<String>,
    /// Profile of the single stream: chat, rag, code, summary, longdoc or mixed.
    #[arg(long, default_value = "chat")]
    pub profile: String,
    /// Arrival rate of the single stream: `8`, `8/s`, `30/m`.
    #[arg(long, default_value = "1/s")]
    pub rate: String,
    /// Tenant name of the single stream.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Several streams instead: `profile:tenant:rate,...`, e.g. `chat:alice:8/s,longdoc:bob:0.2/s`.
    #[arg(long)]
    pub mix: Option<String>,
    /// Replay a JSONL trace (`{"t", "tenant", "input_tokens", "output_tokens"}` per line)
    /// instead of Poisson arrivals.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// How long arrivals go on (server time), e.g. `60s`, `10m`.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Seed of arrivals, lengths and prompt words.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// API to call.
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub endpoint: Api,
    /// `model` of the requests.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// The model's `tokenizer.json` (prompts are built to exact token counts with it).
    /// Default: `qwen3.5/tokenizer.json` found beside the binary (in `assets/` next to it, in
    /// `share/tokengate/` above its folder, or in the `assets/` of the checkout that built it).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The server's clock runs this many times faster than real time (`tokengate sim
    /// --time-scale`): arrivals are compressed and latencies scaled back to server time.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Retry 429 and 503 answers after their `retry-after` (up to 5 attempts).
    #[arg(long)]
    pub retry: bool,
    /// Give up on one attempt after this long (real time).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// SLA on time to first token, ms [default: 800].
    #[arg(long)]
    pub sla_ttft_ms: Option<f64>,
    /// SLA on time per output token, ms. Default: the TPOT SLO the target holds for the plan's
    /// mean request (`tokengate sim` answers `GET /sim/tpot-slo`), else what the capacity
    /// model's default deployment (one 910B3 with Qwen3.5-27B) holds for it.
    #[arg(long)]
    pub sla_tpot_ms: Option<f64>,
    /// Write the whole report (summaries and every request) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency CDFs and latency over time as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// API keys by tenant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiKeys {
    default: Option<String>,
    by_tenant: HashMap<String, String>,
}

impl ApiKeys {
    /// From `--api-key` and `--tenant-key TENANT=KEY` values.
    pub fn parse(default: Option<String>, tenant_keys: &[String]) -> Result<Self, String> {
        let mut by_tenant = HashMap::new();
        for entry in tenant_keys {
            let (tenant, key) = entry
                .split_once('=')
                .filter(|(t, k)| !t.is_empty() && !k.is_empty())
                .ok_or_else(|| format!("--tenant-key {entry:?} is not TENANT=KEY"))?;
            by_tenant.insert(tenant.to_string(), key.to_string());
        }
        Ok(Self { default, by_tenant })
    }

    /// The key `tenant` sends.
    pub fn for_tenant(&self, tenant: &str) -> Option<&str> {
        self.by_tenant
            .get(tenant)
            .or(self.default.as_ref())
            .map(String::as_str)
    }
}

impl LoadgenArgs {
    /// The plan these arguments describe.
    pub fn plan(&self) -> anyhow::Result<Vec<Planned>> {
        if let Some(path) = &self.trace {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading trace {}", path.display()))?;
            return parse_trace(&text).map_err(anyhow::Error::msg);
        }
        let streams = match &self.mix {
            Some(mix) => parse_mix(mix).map_err(anyhow::Error::msg)?,
            None => parse_mix(&format!("{}:{}:{}", self.profile, self.tenant, self.rate))
                .map_err(anyhow::Error::msg)?,
        };
        Ok(plan(&streams, self.duration, self.seed))
    }
}

/// Counters behind the progress line.
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicU64,
    ok: AtomicU64,
    rate_limited: AtomicU64,
    unavailable: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    fn record(&self, s: &Sample) {
        let counter = match s.outcome {
            Outcome::Ok => &self.ok,
            Outcome::RateLimited => &self.rate_limited,
            Outcome::Unavailable => &self.unavailable,
            Outcome::ClientError | Outcome::ServerError | Outcome::Timeout => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn line(&self, server_s: f64, total_s: f64) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let done =
            get(&self.ok) + get(&self.rate_limited) + get(&self.unavailable) + get(&self.failed);
        format!(
            "\rloadgen {server_s:7.1}s/{total_s:.0}s  sent {}  ok {}  429 {}  503 {}  err {}  in flight {}   ",
            get(&self.sent),
            get(&self.ok),
            get(&self.rate_limited),
            get(&self.unavailable),
            get(&self.failed),
            get(&self.sent) - done,
        )
    }
}

/// Sends `plan` open-loop through `client`; returns every sample (in plan order) and the server
/// time from the start to the last answer.
pub async fn run_plan(
    client: Client,
    plan: Vec<Planned>,
    prompts: Arc<PromptBuilder>,
    keys: &ApiKeys,
    seed: u64,
    show_progress: bool,
) -> (Vec<Sample>, Duration) {
    let scale = client.target().time_scale;
    let endpoint = client.target().endpoint;
    let total_s = plan.last().map_or(0.0, |p| p.at.as_secs_f64());
    let progress = Arc::new(Progress::default());
    let start = Instant::now();
    let ticker = show_progress.then(|| {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let server_s = start.elapsed().as_secs_f64() * scale;
                eprint!("{}", progress.line(server_s, total_s));
            }
        })
    });
    let mut tasks = JoinSet::new();
    for (i, p) in plan.into_iter().enumerate() {
        // Build the prompt before the planned instant so the send is not late by its cost.
        let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let text = match endpoint {
            Api::Chat => prompts.chat_content(p.input_tokens, &mut rng),
            Api::Completions => prompts.text(p.input_tokens, &mut rng),
        };
        let job = Job {
            api_key: keys.for_tenant(&p.tenant).map(str::to_string),
            tenant: p.tenant,
            at: p.at,
            text,
            input_tokens: p.input_tokens,
            output_tokens: p.output_tokens,
        };
        let planned = start + p.at.div_f64(scale);
        tokio::time::sleep_until(planned).await;
        progress.sent.fetch_add(1, Ordering::Relaxed);
        let client = client.clone();
        let progress = progress.clone();
        tasks.spawn(async move {
            let sample = client.run(&job, planned).await;
            progress.record(&sample);
            (i, sample)
        });
    }
    let mut samples = Vec::with_capacity(tasks.len());
    while let Some(done) = tasks.join_next().await {
        samples.push(done.expect("a request task panicked"));
    }
    let elapsed = start.elapsed().mul_f64(scale);
    if let Some(t) = ticker {
        t.abort();
        eprintln!("{}", progress.line(elapsed.as_secs_f64(), total_s));
    }
    samples.sort_by_key(|(i, _)| *i);
    (samples.into_iter().map(|(_, s)| s).collect(), elapsed)
}

/// Runs `tokengate loadgen`.
pub fn run_loadgen(args: LoadgenArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale > 0.0 && args.time_scale.is_finite(),
        "--time-scale must be positive"
    );
    parse_rate(&args.rate).map_err(anyhow::Error::msg)?;
    let keys =
        ApiKeys::parse(args.api_key.clone(), &args.tenant_keys).map_err(anyhow::Error::msg)?;
    let plan = args.plan()?;
    anyhow::ensure!(
        !plan.is_empty(),
        "the plan has no requests: raise --rate or --duration"
    );
    let tokenizer = Tokenizer::load_default(args.tokenizer.as_deref(), "--tokenizer PATH")?;
    let prompts = Arc::new(PromptBuilder::new(
        &tokenizer,
        &ChatTemplate::builtin_qwen35(),
    )?);
    let target = Target {
        url: args.url.trim_end_matches('/').to_string(),
        endpoint: args.endpoint,
        model: args.model.clone(),
        time_scale: args.time_scale,
        retry: args.retry,
        timeout: args.timeout,
    };
    let client = Client::new(target);
    let runtime = tokio::runtime::Runtime::new()?;
    let (sla, samples, elapsed) = runtime.block_on(async {
        let tpot = match args.sla_tpot_ms {
            Some(ms) => TpotSla {
                ms,
                from: "--sla-tpot-ms".into(),
            },
            None => target_tpot_sla(&client, &plan).await,
        };
        let (ttft_ms, ttft_from) = match args.sla_ttft_ms {
            Some(ms) => (ms, "--sla-ttft-ms"),
            None => (DEFAULT_SLA_TTFT_MS, "the default"),
        };
        println!(
            "SLA: TTFT <= {ttft_ms} ms ({ttft_from}), TPOT <= {} ms ({})",
            tpot.ms, tpot.from
        );
        let sla = Sla {
            ttft_ms,
            tpot_ms: tpot.ms,
        };
        let (samples, elapsed) =
            run_plan(client, plan, prompts, &keys, args.seed, !args.quiet).await;
        (sla, samples, elapsed)
    });
    let report = Report::new(samples, elapsed, sla);
    print!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, super::plot::svg(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_resolve_per_tenant_then_default() {
        let keys = ApiKeys::parse(
            Some("shared".into()),
            &["alice=ka".into(), "bob=k=b".into()],
        )
        .unwrap();
        assert_eq!(keys.for_tenant("alice"), Some("ka"));
        assert_eq!(keys.for_tenant("bob"), Some("k=b"));
        assert_eq!(keys.for_tenant("carol"), Some("shared"));
        assert_eq!(ApiKeys::parse(None, &[]).unwrap().for_tenant("x"), None);
        assert!(ApiKeys::parse(None, &["alice".into()]).is_err());
    }
}
