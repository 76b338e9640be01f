//! Tokenizer room: the `tokenizer import` and `tokenize` subcommands (argument structs and
//! their `run_*` functions; the lead wires them into `src/cli.rs`).

use std::path::PathBuf;

use anyhow::Context;

use super::import::import_file;
use super::preset::{preset, PRESETS};

/// `tokengate tokenizer import --tiktoken FILE --preset qwen3.5 --out PATH`
#[derive(Debug, Clone, clap::Args)]
pub struct ImportArgs {
    /// tiktoken ranks file (one `base64(token) rank` per line).
    #[arg(long, value_name = "FILE")]
    pub tiktoken: PathBuf,
    /// Preset giving the split regex and the added tokens (`qwen3.5`).
    #[arg(long)]
    pub preset: String,
    /// Where to write the HuggingFace `tokenizer.json`.
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
}

/// Runs `tokenizer import`: converts the ranks and prints a one-line summary.
pub fn run_import(args: ImportArgs) -> anyhow::Result<()> {
    let chosen = preset(&args.preset).with_context(|| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        format!(
            "unknown preset {:?} (known: {})",
            args.preset,
            names.join(", ")
        )
    })?;
    let summary = import_file(&args.tiktoken, chosen, &args.out)?;
    println!(
        "wrote {}: {} vocab, {} merges, {} added tokens",
        args.out.display(),
        summary.vocab,
        summary.merges,
        summary.added_tokens
    );
    Ok(())
}
