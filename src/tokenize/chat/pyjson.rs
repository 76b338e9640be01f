//! JSON as Python's `json.loads` reads it (tokenize room, chat templates). vLLM reads a request
//! body, and a tool call's `arguments` string, with Python's json, which takes `NaN`, `Infinity`
//! and `-Infinity`, keeps integers of any size exactly, reads `-0` as the integer 0 and a float
//! past the double range (`1e400`) as infinity. serde_json refuses the first and last, rounds
//! big integers to a double, and reads `-0` as the float -0.0: a chat template then prints them
//! differently (`1.2345678901234568e+29` for `123456789012345678901234567890`, `-0.0` for `0`),
//! and a body vLLM serves is refused.
//!
//! [`parse`] reads such text into a [`Value`] in which what a `Value` cannot hold is a string
//! marked as a number: [`NUMBER_MARK`] and the number as Python prints it (`nan`, `inf`, `-inf`,
//! or the integer's digits). [`super::pyfmt`] prints a marked string as Python prints the
//! number (`str`: `nan`; `json.dumps`: `NaN`). A client may send such a string itself; it is
//! then printed as the number, a few tokens shorter than vLLM renders it, which the backend's
//! usage settles (each marked string saves at most the mark's own tokens).
//!
//! A text is read with serde_json first; only when serde_json refuses it, or [`lossy`] finds
//! in its value a number serde_json read otherwise, is it read here.

use serde_json::{Map, Number, Value};

pub use crate::util::pydantic::{python_number, NUMBER_MARK};

/// Whether `v`, read by serde_json, holds a number it read otherwise than Python: a float
/// that is a whole number past 64 bits (an integer serde_json rounded, or a float Python
/// prints alike) or -0.0 (`-0`, which Python reads as the integer 0). Only then is the text
/// read again here; what serde_json refuses (NaN, infinities, 1e400) is read here too.
pub fn lossy(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_f64().is_some_and(|f| {
            // Past i64 and u64 serde_json reads an integer as a double.
            let past_64_bits = f.fract() == 0.0 && f.abs() >= 2f64.powi(63);
            n.is_f64() && ((f == 0.0 && f.is_sign_negative()) || past_64_bits)
        }),
        Value::Array(items) => items.iter().any(lossy),
        Value::Object(map) => map.values().any(lossy),
        _ => false,
    }
}

/// The number a marked string stands for, as `json.dumps` writes it (`NaN`, `Infinity`,
/// `-Infinity`, digits).
pub fn json_number(python: &str) -> &str {
    match python {
        "nan" => "NaN",
        "inf" => "Infinity",
        "-inf" => "-Infinity",
        digits => digits,
    }
}

/// Why a text is not JSON to Python either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJson {
    /// Where reading stopped, in bytes.
    pub at: usize,
}

impl std::fmt::Display for NotJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not valid JSON at byte {}", self.at)
    }
}

/// The deepest nesting read, as serde_json's default (Python's recursion limit is deeper; a
/// body nested past this is refused either way by the gateway).
const MAX_DEPTH: usize = 128;

/// `text` read as Python's `json.loads` reads it (see the module's notes), with the number of
/// members of its top-level object when it is one (a key sent twice counts twice).
pub fn parse(text: &str) -> Result<(Value, usize), NotJson> {
    let mut r = Reader::new(text);
    let v = r.value(0)?;
    r.end()?;
    Ok((v, r.top_members))
}

/// The top-level members of a JSON object `text` (as [`parse`] reads it), each key with the
/// byte range of its value, in the order written; `None` when `text` is not an object.
pub fn members(text: &str) -> Option<Vec<(String, std::ops::Range<usize>)>> {
    let mut r = Reader::new(text);
    r.eat(b'{').ok()?;
    let mut out = Vec::new();
    r.items(b'}', |r| {
        let key = r.key()?;
        let start = r.at;
        r.value(1)?;
        out.push((key, start..r.at));
        Ok(())
    })
    .ok()?;
    r.end().ok()?;
    Some(out)
}

struct Reader<'a> {
    b: &'a [u8],
    text: &'a str,
    at: usize,
    top_members: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `text`'s first value.
    fn new(text: &'a str) -> Self {
        let mut r = Reader {
            b: text.as_bytes(),
            text,
            at: 0,
            top_members: 0,
        };
        r.ws();
        r
    }

    /// Only whitespace is left.
    fn end(&mut self) -> Result<(), NotJson> {
        self.ws();
        match self.at == self.b.len() {
            true => Ok(()),
            false => Err(self.err()),
        }
    }

    /// An object member's key and the colon after it.
    fn key(&mut self) -> Result<String, NotJson> {
        let key = self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Ok(key)
    }

    fn err(&self) -> NotJson {
        NotJson { at: self.at }
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.b.get(self.at).copied();
        self.at += usize::from(c.is_some());
        c
    }

    fn eat(&mut self, c: u8) -> Result<(), NotJson> {
        match self.b.get(self.at) {
            Some(&x) if x == c => {
                self.at += 1;
                Ok(())
            }
            _ => Err(self.err()),
        }
    }

    fn word(&mut self, w: &[u8]) -> Result<(), NotJson> {
        match self.b[self.at..].starts_with(w) {
            true => {
                self.at += w.len();
                Ok(())
            }
            false => Err(self.err()),
        }
    }

    /// JSON's whitespace (Python's json takes these four only).
    fn ws(&mut self) {
        while matches!(self.b.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, NotJson> {
        if depth > MAX_DEPTH {
            return Err(self.err());
        }
        match self.b.get(self.at) {
            Some(b'{') => self.object(depth),
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.items(b']', |r| {
                    items.push(r.value(depth + 1)?);
                    Ok(())
                })?;
                Ok(Value::Array(items))
            }
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.word(b"true").map(|()| Value::Bool(true)),
            Some(b'f') => self.word(b"false").map(|()| Value::Bool(false)),
            Some(b'n') => self.word(b"null").map(|()| Value::Null),
            Some(b'N') => self.word(b"NaN").map(|()| marked("nan")),
            Some(b'I') => self.word(b"Infinity").map(|()| marked("inf")),
            Some(b'-') if self.b[self.at..].starts_with(b"-Infinity") => {
                self.at += "-Infinity".len();
                Ok(marked("-inf"))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.err()),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, NotJson> {
        self.at += 1;
        let mut map = Map::new();
        self.items(b'}', |r| {
            let key = r.key()?;
            let v = r.value(depth + 1)?;
            // As Python's dict (and serde_json's map): a repeated key keeps its place, with the
            // last value.
            map.insert(key, v);
            if depth == 0 {
                r.top_members += 1;
            }
            Ok(())
        })?;
        Ok(Value::Object(map))
    }

    /// The items of an array or object whose opening bracket was read, up to `close`: each
    /// read by `item`, commas between them.
    fn items(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), NotJson>,
    ) -> Result<(), NotJson> {
        self.ws();
        if self.eat(close).is_ok() {
            return Ok(());
        }
        loop {
            self.ws();
            item(self)?;
            self.ws();
            match self.next() {
                Some(b',') => continue,
                Some(c) if c == close => return Ok(()),
                _ => return Err(self.err()),
            }
        }
    }

    fn string(&mut self) -> Result<String, NotJson> {
        let start = self.at;
        self.eat(b'"')?;
        let mut end = self.at;
        // Find the closing quote (escapes skipped), then let serde_json unescape the literal:
        // the same rules as Python's (control characters refused, surrogate pairs joined).
        loop {
            match self.b.get(end) {
                Some(b'"') => break,
                Some(b'\\') => end += 2,
                Some(_) => end += 1,
                None => return Err(NotJson { at: end }),
            }
        }
        self.at = end + 1;
        serde_json::from_str::<String>(&self.text[start..self.at])
            .map_err(|_| NotJson { at: start })
    }

    /// One or more digits.
    fn digits(&mut self) -> Result<(), NotJson> {
        let start = self.at;
        while matches!(self.b.get(self.at), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        match self.at > start {
            true => Ok(()),
            false => Err(self.err()),
        }
    }

    fn number(&mut self) -> Result<Value, NotJson> {
        let start = self.at;
        let negative = self.b[self.at] == b'-';
        self.at += usize::from(negative);
        let int_start = self.at;
        match self.b.get(self.at) {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits()?,
            _ => return Err(self.err()),
        }
        let int_end = self.at;
        let mut float = false;
        if self.b.get(self.at) == Some(&b'.') {
            float = true;
            self.at += 1;
            self.digits()?;
        }
        if matches!(self.b.get(self.at), Some(b'e' | b'E')) {
            float = true;
            self.at += 1;
            if matches!(self.b.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.digits()?;
        }
        let literal = &self.text[start..self.at];
        if float {
            // Rust's parse rounds correctly, as Python's float() does; past the range it is
            // infinite.
            let f: f64 = literal.parse().map_err(|_| NotJson { at: start })?;
            return Ok(match Number::from_f64(f) {
                Some(n) => Value::Number(n),
                None if f > 0.0 => marked("inf"),
                None => marked("-inf"),
            });
        }
        let digits = &self.text[int_start..int_end];
        if let Ok(u) = digits.parse::<u64>() {
            if !negative {
                return Ok(Value::Number(u.into()));
            }
            // -0 is the integer 0.
            if u == 0 {
                return Ok(Value::Number(0u64.into()));
            }
            if let Ok(i) = literal.parse::<i64>() {
                return Ok(Value::Number(i.into()));
            }
        }
        Ok(marked(literal))
    }
}

fn marked(python: &str) -> Value {
    Value::String(format!("{NUMBER_MARK}{python}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(text: &str) -> Value {
        parse(text).unwrap().0
    }

    #[test]
    fn numbers_are_read_as_python_keeps_them() {
        let mark = |n: &str| Value::String(format!("{NUMBER_MARK}{n}"));
        assert_eq!(read("-0"), json!(0));
        assert_eq!(read("-0").as_u64(), Some(0));
        assert_eq!(read("-0.0").as_f64().map(f64::is_sign_negative), Some(true));
        assert_eq!(
            read("123456789012345678901234567890"),
            mark("123456789012345678901234567890")
        );
        assert_eq!(read("-18446744073709551616"), mark("-18446744073709551616"));
        assert_eq!(
            read("18446744073709551615"),
            json!(18_446_744_073_709_551_615u64)
        );
        assert_eq!(read("-9223372036854775808"), json!(i64::MIN));
        assert_eq!(read("NaN"), mark("nan"));
        assert_eq!(
            read("[Infinity, -Infinity, 1e400, -1E+999]"),
            json!([mark("inf"), mark("-inf"), mark("inf"), mark("-inf")])
        );
        assert_eq!(read("1e-400"), json!(0.0));
        assert_eq!(read("0.1"), json!(0.1));
        assert_eq!(
            read(r#" {"a": [1, {"b": "c\u00e9\ud83d\ude00"}], "a": 2, "z": null} "#),
            json!({"a": 2, "z": null})
        );
        assert_eq!(parse(r#"{"a": 1, "a": 2, "b": 3}"#).unwrap().1, 3);
        for bad in [
            "",
            "01",
            "1.",
            ".5",
            "-",
            "nan",
            "infinity",
            "[1,]",
            "{\"a\" 1}",
            "\"\u{1}\"",
            "1 2",
            "+1",
            "--1",
            "NaNa",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_mark_and_a_python_number_is_a_number() {
        assert_eq!(python_number(&format!("{NUMBER_MARK}nan")), Some("nan"));
        assert_eq!(python_number(&format!("{NUMBER_MARK}-12")), Some("-12"));
        for not in [
            "nan",
            "\u{0}\u{1}python-number:",
            "\u{0}\u{1}python-number:1.5",
            "\u{0}\u{1}python-number:--1",
            "\u{0}\u{1}python-number:12a",
        ] {
            assert_eq!(python_number(not), None, "{not:?}");
        }
        assert_eq!(json_number("inf"), "Infinity");
        assert_eq!(json_number("-12"), "-12");
    }

    #[test]
    fn lossy_finds_what_serde_reads_otherwise() {
        let serde = |t: &str| serde_json::from_str::<Value>(t).unwrap();
        for yes in [
            r#"{"n": -0}"#,
            "[1, [-0.0]]",
            "123456789012345678901234567890",
            "-9223372036854775809",
            "1e20",
        ] {
            assert!(lossy(&serde(yes)), "{yes}");
        }
        for no in [
            r#"{"n": -0.5, "m": 0}"#,
            "[18446744073709551615, -9223372036854775808, 1.5e18]",
            r#"{"a": "-0 NaN"}"#,
        ] {
            assert!(!lossy(&serde(no)), "{no}");
        }
    }

    #[test]
    fn members_are_found_with_their_bytes() {
        let text = r#" {"a": NaN, "b" : [1, {"c": "}"}] ,"a":-Infinity} "#;
        let m = members(text).unwrap();
        let got: Vec<(&str, &str)> = m
            .iter()
            .map(|(k, r)| (k.as_str(), &text[r.clone()]))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "NaN"),
                ("b", r#"[1, {"c": "}"}]"#),
                ("a", "-Infinity")
            ]
        );
        assert_eq!(members("{}"), Some(vec![]));
        assert_eq!(members("[1]"), None);
        assert_eq!(members("{\"a\": 1} x"), None);
    }
}
