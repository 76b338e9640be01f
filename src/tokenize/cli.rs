//! Tokenizer room: the `tokenizer import` and `tokenize` subcommands (argument structs and
//! their `run_*` functions; the lead wires them into `src/cli.rs`).

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use serde_json::{json, Value};

use super::engine::Tokenizer;
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

/// `tokengate tokenize [--tokenizer PATH] [--count | --jsonl]`: tokenizes standard input.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenizeArgs {
    /// The `tokenizer.json` to load.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Print only the number of tokens of the whole input (taken as is, final newline included).
    #[arg(long, conflicts_with = "jsonl")]
    pub count: bool,
    /// Read JSON lines `{"text": "..."}` and print `{"count": N}` (or `{"error": "..."}`) for each,
    /// in order.
    #[arg(long)]
    pub jsonl: bool,
}

/// Runs `tokenize` on standard input and output, counting only plain-text lines in `--jsonl`
/// mode. A command that also counts `{"messages": [...]}` lines calls [`run_jsonl`] with its own
/// line counter that falls back to [`count_text_line`].
pub fn run_tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    let path = args
        .tokenizer
        .context("no tokenizer: pass --tokenizer PATH (a tokenizer.json)")?;
    let tokenizer = Tokenizer::load(&path)?;
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    if args.jsonl {
        return run_jsonl(stdin, stdout, |line| count_text_line(&tokenizer, line));
    }
    let mut text = String::new();
    { stdin }
        .read_to_string(&mut text)
        .context("reading standard input (UTF-8 text expected)")?;
    if args.count {
        writeln!(stdout, "{}", tokenizer.count(&text))?;
    } else {
        writeln!(
            stdout,
            "{}",
            serde_json::to_string(&tokenizer.encode(&text))?
        )?;
    }
    Ok(())
}

/// The `--jsonl` loop: one output line per input line, in order. `count_line` gets each parsed
/// line and returns its token count or an error message; bad lines (not UTF-8, not JSON, or
/// refused by `count_line`) print `{"error": "..."}` and processing continues.
pub fn run_jsonl<R: BufRead, W: Write>(
    mut input: R,
    mut output: W,
    mut count_line: impl FnMut(&Value) -> Result<usize, String>,
) -> anyhow::Result<()> {
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if input.read_until(b'\n', &mut raw)? == 0 {
            break;
        }
        let line = raw.strip_suffix(b"\n").unwrap_or(&raw);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let result = match std::str::from_utf8(line) {
            Err(e) => Err(format!("line is not UTF-8: {e}")),
            Ok(line) => match serde_json::from_str::<Value>(line) {
                Err(e) => Err(format!("invalid JSON: {e}")),
                Ok(value) => count_line(&value),
            },
        };
        let reply = match result {
            Ok(count) => json!({ "count": count }),
            Err(message) => json!({ "error": message }),
        };
        writeln!(output, "{reply}")?;
    }
    output.flush()?;
    Ok(())
}

/// Counts a `{"text": "..."}` line.
pub fn count_text_line(tokenizer: &Tokenizer, line: &Value) -> Result<usize, String> {
    match line.get("text") {
        Some(Value::String(text)) => Ok(tokenizer.count(text)),
        Some(_) => Err("\"text\" must be a string".to_owned()),
        None if line.get("messages").is_some() => {
            Err("\"messages\" lines need the chat template, not available here".to_owned())
        }
        None => Err("expected {\"text\": \"...\"}".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in counter: the number of chars of "text", so the loop is tested without a
    /// tokenizer file.
    fn chars(line: &Value) -> Result<usize, String> {
        line["text"]
            .as_str()
            .map(|t| t.chars().count())
            .ok_or_else(|| "no text".to_owned())
    }

    #[test]
    fn jsonl_answers_every_line_in_order_and_survives_bad_ones() {
        let input: &[u8] =
            b"{\"text\": \"abc\"}\r\nnot json\n{\"x\": 1}\n\xff\xfe\n\n{\"text\": \"\xc3\xa9\"}";
        let mut output = Vec::new();
        run_jsonl(input, &mut output, chars).unwrap();
        let lines: Vec<&str> = std::str::from_utf8(&output).unwrap().lines().collect();
        assert_eq!(
            lines,
            vec![
                r#"{"count":3}"#,
                r#"{"error":"invalid JSON: expected ident at line 1 column 2"}"#,
                r#"{"error":"no text"}"#,
                r#"{"error":"line is not UTF-8: invalid utf-8 sequence of 1 bytes from index 0"}"#,
                r#"{"error":"invalid JSON: EOF while parsing a value at line 1 column 0"}"#,
                r#"{"count":1}"#,
            ]
        );
    }

    #[test]
    fn jsonl_passes_messages_lines_to_the_plugged_counter() {
        let input: &[u8] = b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n";
        let mut output = Vec::new();
        run_jsonl(input, &mut output, |line| {
            Ok(line["messages"].as_array().map_or(0, Vec::len) * 10)
        })
        .unwrap();
        assert_eq!(output, b"{\"count\":10}\n");
    }
}
