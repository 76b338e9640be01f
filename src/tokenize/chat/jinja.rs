//! Jinja chat templates (tokenize room, chat templates): a model's own `chat_template` rendered
//! with minijinja configured to behave like transformers' jinja2 environment: `trim_blocks`,
//! `lstrip_blocks`, loop controls, no autoescape, `raise_exception`, and Python's semantics for
//! `tojson` (`json.dumps(x, ensure_ascii=False)`), `trim`, `string`, printing values, and the
//! string methods templates call (`split`, `strip`, `startswith`, ...).

use super::pyfmt::{self, is_space, json_dumps, py_str};
use super::{ChatPrompt, TemplateError};
use minijinja::value::{from_args, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use std::collections::{BTreeMap, HashSet};

const NAME: &str = "chat_template";

/// A parsed Jinja chat template with its environment.
#[derive(Debug)]
pub(super) struct JinjaTemplate {
    env: Environment<'static>,
    /// The variables the template reads without setting them (minijinja's
    /// `undeclared_variables`, nested attributes not followed).
    pub(super) reads: HashSet<String>,
}

/// The error `raise_exception` returns, found again in the error's source chain so the
/// template's own message reaches the client unchanged.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl JinjaTemplate {
    /// Parses `source`; syntax errors are reported here, not at the first request.
    pub(super) fn parse(source: String) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_formatter(|out, _state, value| out.write_str(&py_text(value)).map_err(Error::from));
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", trim);
        env.add_filter("string", |value: &Value| Value::from(py_text(value)));
        env.set_unknown_method_callback(|_state, value, method, args| {
            string_method(value, method, args)
        });
        env.add_template_owned(NAME, source)?;
        let reads = env.get_template(NAME)?.undeclared_variables(false);
        Ok(Self { env, reads })
    }

    /// Whether the template reads the variable `name` (one it does not set itself).
    pub(super) fn reads(&self, name: &str) -> bool {
        self.reads.contains(name)
    }

    /// Renders `prompt` with the variables transformers passes (`messages`, `tools`,
    /// `documents`, `add_generation_prompt`, and `enable_thinking` and `add_vision_id` only when
    /// set) into `out`.
    pub(super) fn render(
        &self,
        prompt: &ChatPrompt,
        out: &mut String,
    ) -> Result<(), TemplateError> {
        let mut ctx = BTreeMap::new();
        ctx.insert("messages", Value::from_serialize(&prompt.messages));
        ctx.insert("tools", Value::from_serialize(&prompt.tools));
        ctx.insert("documents", Value::from_serialize(&prompt.documents));
        ctx.insert(
            "add_generation_prompt",
            Value::from(prompt.add_generation_prompt),
        );
        if let Some(enable_thinking) = prompt.enable_thinking {
            ctx.insert("enable_thinking", Value::from(enable_thinking));
        }
        if let Some(add_vision_id) = &prompt.add_vision_id {
            ctx.insert("add_vision_id", Value::from_serialize(add_vision_id));
        }
        let template = self.env.get_template(NAME).map_err(render_error)?;
        let text = template.render(ctx).map_err(render_error)?;
        out.push_str(&text);
        Ok(())
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn render_error(err: Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(Raised(message)) = e.downcast_ref::<Raised>() {
            return TemplateError::Rejected(message.clone());
        }
        source = e.source();
    }
    TemplateError::Unrenderable(err.to_string())
}

/// Python's `str(value)`: what jinja2 prints for `{{ value }}` (undefined prints nothing).
fn py_text(value: &Value) -> String {
    if value.is_undefined() {
        return String::new();
    }
    if let Some(s) = value.as_str() {
        return super::pyjson::python_number(s).unwrap_or(s).to_owned();
    }
    match serde_json::to_value(value) {
        Ok(json) => py_str(&json),
        // Callables and other engine objects have no JSON form; minijinja's text is all we have.
        Err(_) => value.to_string(),
    }
}

fn tojson(value: &Value) -> Result<Value, Error> {
    let json = serde_json::to_value(value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            "value is not JSON serializable",
        )
        .with_source(e)
    })?;
    Ok(Value::from(json_dumps(&json)))
}

/// jinja2's `trim` is Python's `str.strip(chars)`.
fn trim(value: &Value, chars: Option<String>) -> Value {
    let text = py_text(value);
    Value::from(strip_with(&text, chars.as_deref(), Side::Both))
}

#[derive(Clone, Copy)]
enum Side {
    Both,
    Start,
    End,
}

/// Python's `strip`/`lstrip`/`rstrip`: whitespace, or any of `chars` when given.
fn strip_with<'a>(text: &'a str, chars: Option<&str>, side: Side) -> &'a str {
    match (chars, side) {
        (None, Side::Both) => pyfmt::strip(text),
        (None, Side::Start) => pyfmt::lstrip(text),
        (None, Side::End) => pyfmt::rstrip(text),
        (Some(chars), side) => {
            let set = |c: char| chars.contains(c);
            match side {
                Side::Both => text.trim_matches(set),
                Side::Start => text.trim_start_matches(set),
                Side::End => text.trim_end_matches(set),
            }
        }
    }
}

/// The Python `str` methods chat templates call.
fn string_method(value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let Some(text) = value.as_str() else {
        return Err(Error::from(ErrorKind::UnknownMethod));
    };
    let side = match method {
        "strip" => Some(Side::Both),
        "lstrip" => Some(Side::Start),
        "rstrip" => Some(Side::End),
        _ => None,
    };
    if let Some(side) = side {
        let (chars,): (Option<String>,) = from_args(args)?;
        return Ok(Value::from(strip_with(text, chars.as_deref(), side)));
    }
    match method {
        "startswith" => {
            let (prefix,): (String,) = from_args(args)?;
            Ok(Value::from(text.starts_with(prefix.as_str())))
        }
        "endswith" => {
            let (suffix,): (String,) = from_args(args)?;
            Ok(Value::from(text.ends_with(suffix.as_str())))
        }
        "split" => {
            let (sep,): (Option<String>,) = from_args(args)?;
            let parts: Vec<Value> = match sep.as_deref() {
                Some("") => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
                }
                Some(sep) => text.split(sep).map(Value::from).collect(),
                None => text
                    .split(is_space)
                    .filter(|part| !part.is_empty())
                    .map(Value::from)
                    .collect(),
            };
            Ok(Value::from(parts))
        }
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}
