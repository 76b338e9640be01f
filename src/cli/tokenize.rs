//! The `tokenizer import` and `tokenize` subcommands (argument structs and their `run_*`
//! functions, dispatched by `src/cli.rs`). They stand above the tokenizer, the request readers
//! and the vision rules they drive, so none of those rooms imports back up to a command.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use serde_json::{json, Value};

use crate::api::openai::parse_chat_prompt;
use crate::api::Prompt;
use crate::tokenize::chat::{ChatRoute, ChatTemplate};
use crate::tokenize::import::import_file;
use crate::tokenize::preset::{preset, PRESETS};
use crate::tokenize::Tokenizer;
use crate::vision::{self, VisionRules};

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
    /// The `tokenizer.json` to load. Default: `qwen3.5/tokenizer.json` found beside the binary
    /// (in `assets/` next to it, in `share/tokengate/` above its folder, or in the `assets/` of
    /// the checkout that built it).
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pub tokenizer: Option<PathBuf>,
    /// Take the tokenizer and chat template from a gateway config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A Jinja chat template for `{"messages": ...}` lines (default: the built-in Qwen3.5
    /// renderer, or the config's `tokenizer.chat_template`).
    #[arg(long, value_name = "PATH")]
    pub chat_template: Option<PathBuf>,
    /// Print only the number of tokens of the whole input (taken as is, final newline included).
    #[arg(long, conflicts_with = "jsonl")]
    pub count: bool,
    /// Read JSON lines, `{"text": "..."}` or a chat completions body `{"messages": [...], ...}`
    /// (counted as the gateway charges it), and print `{"count": N}` (or `{"error": "..."}`) for
    /// each, in order.
    #[arg(long)]
    pub jsonl: bool,
}

/// Runs `tokenize` on standard input and output. In `--jsonl` mode `{"text": ...}` lines are
/// counted as they are and `{"messages": ...}` lines through the chat template.
///
/// `from_config` is what `--config`'s file names, when it was given: the tokenizer and the
/// chat template.
pub fn run_tokenize(
    args: TokenizeArgs,
    from_config: Option<(PathBuf, Option<PathBuf>)>,
) -> anyhow::Result<()> {
    let (path, template_path) = match from_config {
        Some((path, template)) => (Some(path), args.chat_template.clone().or(template)),
        None => (args.tokenizer.clone(), args.chat_template.clone()),
    };
    let tokenizer = Tokenizer::load_default(path.as_deref(), "--tokenizer PATH or --config FILE")?;
    let template = match template_path {
        Some(p) => ChatTemplate::from_jinja_file(&p)?,
        None => ChatTemplate::builtin_qwen35(),
    };
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    if args.jsonl {
        return run_jsonl(stdin, stdout, |line| {
            count_line(&tokenizer, &template, line)
        });
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

/// Counts a `{"text": "..."}` line as is, or a `{"messages": [...], ...}` line as the gateway
/// charges that body sent to `/v1/chat/completions`: the same fields read the same way (`tools`,
/// `add_generation_prompt` true unless false, `chat_template_kwargs`, `reasoning_effort`,
/// vLLM's normalization of the messages), images and videos expanded as the engine expands
/// them.
pub fn count_line(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    line: &Value,
) -> Result<usize, String> {
    match (line.get("text"), line.get("messages")) {
        (Some(Value::String(text)), None) => Ok(tokenizer.count(text)),
        (Some(_), None) => Err("\"text\" must be a string".to_owned()),
        (None, Some(_)) => {
            let Value::Object(body) = line else {
                unreachable!("a line with a member is an object")
            };
            if body.contains_key("enable_thinking") {
                return Err("\"enable_thinking\" goes in \"chat_template_kwargs\", as in a request to the gateway".to_owned());
            }
            let vision = VisionRules::default();
            let prompt = parse_chat_prompt(body, &vision, ChatRoute::ChatCompletions)
                .map_err(|e| e.message)?;
            let Prompt::Chat { prompt, media } = prompt else {
                unreachable!("a chat's prompt is a chat")
            };
            let text = template.render(&prompt).map_err(|e| e.to_string())?;
            vision::check_placeholders(&text, &media)?;
            let media =
                usize::try_from(vision::extra_tokens(&media, tokenizer)).unwrap_or(usize::MAX);
            Ok(tokenizer.count(&text).saturating_add(media))
        }
        (Some(_), Some(_)) => Err("give \"text\" or \"messages\", not both".to_owned()),
        (None, None) => Err("expected {\"text\": \"...\"} or {\"messages\": [...]}".to_owned()),
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
