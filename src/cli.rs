//! The command line: one binary, one subcommand per tool. Each subcommand's arguments and
//! work live in its own room; this file only dispatches.

pub mod tokenize;

use crate::app::{self, Deps};
use crate::config::Config;
use crate::feedback::Watched;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// tokengate: token-aware rate limiting and KV admission in front of vLLM / MindIE.
#[derive(Debug, Parser)]
#[command(name = "tokengate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate a config file and print what it sets up; read the engines whose KV geometry is
    /// learned (`kv = "engine"`) or checked (`feedback.enabled`) and print theirs.
    CheckConfig {
        /// Config file (TOML).
        config: PathBuf,
        /// Do not read the engines (the file alone is checked).
        #[arg(long)]
        offline: bool,
    },
    /// Tokenizer tools.
    Tokenizer {
        #[command(subcommand)]
        command: TokenizerCommand,
    },
    /// Count or encode text from standard input with the model's tokenizer.
    Tokenize(tokenize::TokenizeArgs),
    /// Capacity model of an accelerator + model (roofline, or the article formula docs/capacity.md corrects).
    Capacity(crate::capacity::cli::CapacityArgs),
    /// Run the simulated backend (OpenAI + MindIE APIs on a 910B3 capacity model).
    Sim(crate::sim::cli::SimArgs),
    /// Ask a health URL (the admin `/healthz` by default); exit 0 on a 2xx, 1 otherwise.
    Healthcheck(crate::healthcheck::HealthcheckArgs),
    /// Open-loop load generator: Poisson or trace arrivals, TTFT/TPOT percentiles, SLA, plots.
    Loadgen(crate::loadgen::LoadgenArgs),
    /// A decision tree from latency symptoms to causes over a running gateway's live numbers.
    Diagnose(crate::diagnose::cli::DiagnoseArgs),
    /// The workload profile a running gateway measured (its admin `/admin/profile`).
    Profile(crate::profile::cli::ProfileArgs),
    /// Every tenant's quotas on a running gateway: limit, spent, reserved, remaining, reset
    /// (its admin `/admin/quotas`).
    Usage(crate::quota::cli::UsageArgs),
}

#[derive(Debug, Subcommand)]
enum TokenizerCommand {
    /// Build a HuggingFace tokenizer.json from tiktoken ranks.
    Import(tokenize::ImportArgs),
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Colours only for a person at a terminal. A log file or collector gets plain text, its
    // fields written as `name=value` with no styles run over every request span's fields.
    let _ = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        log.try_init()
    } else {
        let plain =
            tracing_subscriber::fmt::format::debug_fn(|out, field, value| match field.name() {
                "message" => write!(out, "{value:?}"),
                name => write!(out, "{name}={value:?}"),
            });
        log.with_ansi(false)
            .fmt_fields(tracing_subscriber::field::MakeExt::delimited(plain, " "))
            .try_init()
    };
}

/// Parses the command line and runs it; errors are printed with their causes.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What each engine read says of its KV geometry (`check-config`), and where the geometry in
/// force differs from it; an engine that cannot be read is said so, and is no error: the file
/// is checked.
async fn engines(watched: &[Watched]) -> String {
    let mut out = String::new();
    for (i, b) in watched.iter().enumerate().filter(|(_, b)| b.read()) {
        match crate::feedback::read_engine(b).await {
            Ok(kv) => {
                out += &format!(
                    "engine of backends[{i}] ({}): pages of {} tokens ({} bytes), {} pages, {} state pages a sequence, {} draft tokens, prefix caching {}, max_model_len {}, max_num_seqs {}\n",
                    b.url,
                    kv.page_tokens,
                    kv.page_bytes,
                    kv.pages,
                    kv.state_pages_per_sequence,
                    kv.lookahead_tokens,
                    if kv.prefix_caching { "on" } else { "off" },
                    kv.max_model_len,
                    kv.max_num_seqs.map_or("not said (set max_batch)".to_string(), |n| n.to_string()),
                );
                for d in b.kv.differences(&kv) {
                    out += &format!("warning: backends[{i}]: {d}\n");
                }
                out += &match crate::feedback::read_engine_version(b).await {
                    Ok(Some(v)) => {
                        format!("engine of backends[{i}] runs vLLM {v} (GET /version)\n")
                    }
                    Ok(None) => {
                        format!("engine of backends[{i}]: its /version names no vLLM version\n")
                    }
                    Err(e) => format!("engine of backends[{i}]: version not read: {e}\n"),
                };
            }
            Err(e) => out += &format!("engine of backends[{i}] ({}) not read: {e}\n", b.url),
        }
    }
    out
}

/// The process's own runtime: one thread for the admin listener, signals, reloads and the
/// background tasks. The API is served by the server's workers, threads of their own.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { config } => {
            let cfg = Config::load(&config)?;
            for line in crate::config::describe::describe(&cfg).lines() {
                tracing::info!("{line}");
            }
            runtime()?.block_on(async move {
                let running = app::start(cfg, Deps::default()).await?;
                running.run_until_signal().await;
                anyhow::Ok(())
            })
        }
        Command::CheckConfig { config, offline } => {
            let cfg = Config::load(&config)?;
            println!("{}: ok", config.display());
            print!("{}", crate::config::describe::describe(&cfg));
            let watched = app::watched(&cfg);
            if !offline && watched.iter().any(Watched::read) {
                print!("{}", runtime()?.block_on(engines(&watched)));
            }
            Ok(())
        }
        Command::Tokenizer {
            command: TokenizerCommand::Import(args),
        } => tokenize::run_import(args),
        Command::Tokenize(args) => {
            let from_config = args.config.as_deref().map(|file| {
                let tokenizer = crate::config::Config::load(file)?.into_inner().tokenizer;
                anyhow::Ok((tokenizer.path, tokenizer.chat_template))
            });
            tokenize::run_tokenize(args, from_config.transpose()?)
        }
        Command::Capacity(args) => crate::capacity::cli::run_capacity(args),
        Command::Sim(args) => crate::sim::cli::run_sim(args),
        Command::Healthcheck(args) => crate::healthcheck::run_healthcheck(args),
        Command::Loadgen(args) => crate::loadgen::run_loadgen(args),
        Command::Diagnose(args) => crate::diagnose::cli::run_diagnose(args),
        Command::Profile(args) => crate::profile::cli::run_profile(args),
        Command::Usage(args) => crate::quota::cli::run_usage(args),
    }
}
