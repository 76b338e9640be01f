//! Python formatting semantics (tokenize room, chat templates): the exact text Python produces
//! for `str(x)`, `json.dumps(x, ensure_ascii=False)` and `str.strip()`. Chat templates are
//! written for jinja2 running in Python (transformers), so both renderers need these to match
//! the prompt vLLM and MindIE build byte for byte. A string [`super::pyjson`] marked as a number
//! Python keeps (NaN, infinity, an integer past 64 bits) prints as that number.

use super::pyjson::{json_number, python_number};
use serde_json::{Number, Value};

/// Python's `str.isspace()`: Unicode `White_Space` plus the four information separators
/// U+001C..U+001F, which Python counts as whitespace and Rust's `char::is_whitespace` does not.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.strip()` (and jinja2's `|trim`).
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Python's `s.lstrip()`.
pub fn lstrip(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

/// Python's `s.rstrip()`.
pub fn rstrip(s: &str) -> &str {
    s.trim_end_matches(is_space)
}

/// Python's `repr(f)` for a float (also what `str(f)` and `json.dumps(f)` print): the shortest
/// digits that round-trip, positional when the decimal exponent is in -4..16, else scientific
/// with a signed, at least two-digit exponent (`1e+16`, `1.5e-07`), and always a `.0` on whole
/// numbers.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // `{:e}` gives the same shortest round-trip digits as Python, only laid out differently.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Position of the decimal point relative to the first digit, as in CPython's dtoa.
    let decpt = exponent + 1;
    if !(-3..=16).contains(&decpt) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{exp_sign}{:02}", exponent.abs());
    }
    let n = digits.len() as i32;
    if decpt <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{sign}{int}.{frac}")
    }
}

fn number_str(n: &Number) -> String {
    match n.as_f64() {
        Some(f) if !n.is_i64() && !n.is_u64() => float_repr(f),
        _ => n.to_string(),
    }
}

/// Python's `str(x)` of a value decoded from JSON (`None`, `True`, `1.0`, `['a', 1]`,
/// `{'k': 'v'}`), which jinja2 prints for `{{ x }}` and `x | string`. Strings print raw.
pub fn py_str(v: &Value) -> String {
    let mut out = String::new();
    write_py_str(v, &mut out);
    out
}

/// [`py_str`] appended to `out`.
pub fn write_py_str(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(python_number(s).unwrap_or(s)),
        other => write_value(other, Style::Repr, out),
    }
}

/// How Python prints a value: `repr` (`str` of a container uses `repr` for its items) or
/// `json.dumps`. Both write containers alike; they differ in the scalars.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Repr,
    Json,
}

fn write_value(v: &Value, style: Style, out: &mut String) {
    match v {
        Value::Null => out.push_str(if style == Style::Repr { "None" } else { "null" }),
        Value::Bool(b) => out.push_str(match (style, b) {
            (Style::Repr, true) => "True",
            (Style::Repr, false) => "False",
            (Style::Json, true) => "true",
            (Style::Json, false) => "false",
        }),
        Value::Number(n) => out.push_str(&number_str(n)),
        Value::String(s) => match (python_number(s), style) {
            (Some(n), Style::Repr) => out.push_str(n),
            (Some(n), Style::Json) => out.push_str(json_number(n)),
            (None, _) => write_string(s, style, out),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(item, style, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(k, style, out);
                out.push_str(": ");
                write_value(item, style, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, style: Style, out: &mut String) {
    match style {
        Style::Repr => write_str_repr(s, out),
        Style::Json => write_str_json(s, out),
    }
}

/// A JSON string literal as Python's `json.dumps(s, ensure_ascii=False)` writes it (and
/// serde_json): the seven short escapes (`\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`),
/// `\u00XX` for the other control characters, everything else raw. Unescaped runs are copied
/// whole.
fn write_str_json(s: &str, out: &mut String) {
    out.push('"');
    // Most strings need no escape: one branch-free pass (which the compiler vectorizes) finds
    // that out and copies them whole.
    let needs_escape = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    if !s.bytes().fold(false, |any, b| any | needs_escape(b)) {
        out.push_str(s);
        out.push('"');
        return;
    }
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..0x20 => "",
            _ => continue,
        };
        // Every byte matched above is ASCII, so `run..i` and `i + 1..` are on char boundaries.
        out.push_str(&s[run..i]);
        run = i + 1;
        if escape.is_empty() {
            out.push_str(&format!("\\u{b:04x}"));
        } else {
            out.push_str(escape);
        }
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Python's `repr(s)`: single quotes unless the text has a `'` and no `"`; backslash escapes for
/// the quote, `\`, `\n`, `\r`, `\t` and `\xNN` for the other C0/C1 controls, DEL, NBSP and the
/// soft hyphen. Other non-ASCII characters print as themselves, which is what Python does for
/// every printable one (rare unprintable ones, such as U+200B, Python would escape as `\u200b`).
fn write_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) || c == '\u{ad}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `json.dumps(v, ensure_ascii=False)`, which transformers installs as the templates'
/// `tojson`: separators `", "` and `": "`, key order kept, non-ASCII text raw, floats as
/// [`float_repr`]. String escaping is the same as serde_json's (the seven short escapes and
/// `\u00XX` for the other control characters).
pub fn json_dumps(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

/// [`json_dumps`] appended to `out`.
pub fn write_json(v: &Value, out: &mut String) {
    write_value(v, Style::Json, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (2.5, "2.5"),
            (-3.25, "-3.25"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e22, "1e+22"),
            (100.0, "100.0"),
            (std::f64::consts::PI, "3.141592653589793"),
            (1e300, "1e+300"),
            (5e-324, "5e-324"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(*f), *want, "repr({f:?})");
        }
    }

    #[test]
    fn py_str_of_json_values() {
        assert_eq!(py_str(&json!(null)), "None");
        assert_eq!(py_str(&json!(true)), "True");
        assert_eq!(py_str(&json!(false)), "False");
        assert_eq!(py_str(&json!(42)), "42");
        assert_eq!(py_str(&json!(-7)), "-7");
        assert_eq!(
            py_str(&json!(18446744073709551615u64)),
            "18446744073709551615"
        );
        assert_eq!(py_str(&json!(2.0)), "2.0");
        assert_eq!(py_str(&json!("raw 'text'\n")), "raw 'text'\n");
        assert_eq!(
            py_str(&json!(["a", 1, null, {"k": "it's", "q": "\"\t"}])),
            r#"['a', 1, None, {'k': "it's", 'q': '"\t'}]"#
        );
        assert_eq!(py_str(&json!(["\u{1}\u{7f}é"])), r"['\x01\x7fé']");
    }

    #[test]
    fn json_dumps_uses_python_separators_and_keeps_order() {
        let v = json!({"z": [1, 2.0, "é\"\n\u{1f}"], "a": {}, "m": [], "n": null, "b": true});
        assert_eq!(
            json_dumps(&v),
            r#"{"z": [1, 2.0, "é\"\n\u001f"], "a": {}, "m": [], "n": null, "b": true}"#
        );
    }

    #[test]
    fn json_strings_escape_as_serde_json_does() {
        let mut text: String = (0u8..0x80).map(char::from).collect();
        text.push_str("é\u{2028}杭州😀\u{7f}\u{85}");
        for s in [text.as_str(), "", "plain", "\"", "a\nb\u{1f}"] {
            let mut out = String::new();
            write_str_json(s, &mut out);
            assert_eq!(out, serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(strip("\u{1c}\u{1f} x \u{3000}\u{85}"), "x");
        assert_eq!(lstrip("\n\t x \n"), "x \n");
        assert_eq!(rstrip("\n\t x \n"), "\n\t x");
        assert!(!is_space('\u{200b}'));
    }
}
