//! How pydantic's lax mode reads a JSON value as a field's type, as vLLM's request models read
//! every body (FastAPI validates the parsed JSON in Python mode): booleans and whole numbers
//! also in the spellings it coerces (`"true"`, `1`, `"5"`, `5.0`). The gateway reads the fields
//! it acts on the same way, so a body vLLM serves is not refused for its spelling.

use serde_json::Value;

/// What a string standing for a number Python keeps and a `Value` cannot starts with (the
/// gateway reads a body as Python's `json.loads` does: see `tokenize::chat::pyjson`).
pub const NUMBER_MARK: &str = "\u{0}\u{1}python-number:";

/// The number a marked string stands for, as Python's `str` prints it (`nan`, `inf`, `-inf`,
/// digits), when `s` is one ([`NUMBER_MARK`] and nothing else after it).
pub fn python_number(s: &str) -> Option<&str> {
    let n = s.strip_prefix(NUMBER_MARK)?;
    let digits = n.strip_prefix('-').unwrap_or(n);
    let ok = matches!(n, "nan" | "inf" | "-inf")
        || (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
    ok.then_some(n)
}

/// A boolean as pydantic's lax mode reads one, as vLLM's request models take their fields: a
/// JSON boolean, the numbers 0 and 1 (`1.0` too), or one of the strings `true`/`false`,
/// `yes`/`no`, `on`/`off`, `t`/`f`, `y`/`n`, `1`/`0` in any case. `None` for anything else.
pub fn lax_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(1.0) => Some(true),
            Some(0.0) => Some(false),
            _ => None,
        },
        Value::String(s) => {
            const TRUE: [&str; 6] = ["1", "on", "t", "true", "y", "yes"];
            const FALSE: [&str; 6] = ["0", "off", "f", "false", "n", "no"];
            let s = s.to_ascii_lowercase();
            if TRUE.contains(&s.as_str()) {
                Some(true)
            } else if FALSE.contains(&s.as_str()) {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Python's truth value of a JSON value, as vLLM's validators test a raw field before its type
/// is read, and as a chat template tests an argument (`data.get("stream_options") and not data.get("stream")`): null, false, 0, and an
/// empty string, list or object are false; anything else (the string `"false"`, NaN) is true.
pub fn py_truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// A whole number as pydantic's lax mode reads an `int`: a JSON integer, a float without a
/// fraction within 64 bits (`5.0`), a boolean (0 or 1), or a string of one: whitespace around
/// it, a sign, digits with single `_` between them, and a fraction of zeros (`" +5_000.00 "`).
/// An integer literal past 64 bits (held as a [`NUMBER_MARK`]ed string) is one too: Python's
/// json keeps it exactly. Past `i128` a number saturates (pydantic keeps it; a field with an
/// upper bound refuses it as too large all the same). `None` for anything else (`5.5`, NaN,
/// `"1e3"`, `"0x5"`, null).
pub fn lax_int(v: &Value) -> Option<i128> {
    match v {
        Value::Bool(b) => Some(i128::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Some(i128::from(i));
            }
            if let Some(u) = n.as_u64() {
                return Some(i128::from(u));
            }
            let f = n.as_f64()?;
            // Within i64, as pydantic's float-to-int check (1e20 is refused).
            let fits = f.fract() == 0.0
                && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f);
            fits.then_some(f as i128)
        }
        Value::String(s) => match python_number(s) {
            // An integer's digits (NaN and the infinities are no integers).
            Some(number) => lax_int_text(number),
            None => lax_int_text(s),
        },
        _ => None,
    }
}

fn lax_int_text(s: &str) -> Option<i128> {
    let s = s.trim();
    let (negative, s) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    // A fraction is allowed when it is all zeros ("5.00", not "5." nor "5.5").
    let whole = match s.split_once('.') {
        Some((w, f)) if !f.is_empty() && f.bytes().all(|b| b == b'0') => w,
        Some(_) => return None,
        None => s,
    };
    let bytes = whole.as_bytes();
    let digits_ok = !bytes.is_empty()
        && bytes.first().is_some_and(u8::is_ascii_digit)
        && bytes.last().is_some_and(u8::is_ascii_digit)
        && bytes.iter().all(|b| b.is_ascii_digit() || *b == b'_')
        && !whole.contains("__");
    if !digits_ok {
        return None;
    }
    let mut n: i128 = 0;
    for b in bytes.iter().filter(|b| b.is_ascii_digit()) {
        n = n.saturating_mul(10).saturating_add(i128::from(b - b'0'));
    }
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Each as pydantic 2 reads it (checked against the vLLM venv's pydantic).
    #[test]
    fn booleans_and_integers_read_as_pydantic_reads_them() {
        for (v, b) in [
            (json!(true), Some(true)),
            (json!("TrUe"), Some(true)),
            (json!("yes"), Some(true)),
            (json!("on"), Some(true)),
            (json!("1"), Some(true)),
            (json!("t"), Some(true)),
            (json!("n"), Some(false)),
            (json!("OFF"), Some(false)),
            (json!(1), Some(true)),
            (json!(0.0), Some(false)),
            (json!(2), None),
            (json!(0.5), None),
            (json!(" yes"), None),
            (json!(""), None),
            (json!(null), None),
            (json!({}), None),
        ] {
            assert_eq!(lax_bool(&v), b, "{v}");
        }
        for (v, n) in [
            (json!(5), Some(5)),
            (json!(-3), Some(-3)),
            (json!(u64::MAX), Some(i128::from(u64::MAX))),
            (json!(5.0), Some(5)),
            (json!(true), Some(1)),
            (json!("5"), Some(5)),
            (json!(" 5 "), Some(5)),
            (json!("\t5\n"), Some(5)),
            (json!("\u{a0}5"), Some(5)),
            (json!("+5"), Some(5)),
            (json!("-0"), Some(0)),
            (json!("-0.0"), Some(0)),
            (json!("5.00"), Some(5)),
            (json!("5_000"), Some(5000)),
            (json!("0005"), Some(5)),
            (
                json!("99999999999999999999999"),
                Some(99_999_999_999_999_999_999_999),
            ),
            // Integer literals past 64 bits, as a body read as Python reads it holds them.
            (
                json!(format!("{NUMBER_MARK}1000000000000000000000000000000")),
                Some(1_000_000_000_000_000_000_000_000_000_000),
            ),
            (
                json!(format!("{NUMBER_MARK}-18446744073709551616")),
                Some(-18_446_744_073_709_551_616),
            ),
            (json!(format!("{NUMBER_MARK}nan")), None),
            (json!(format!("{NUMBER_MARK}inf")), None),
            (json!(5.5), None),
            (json!(1e20), None),
            (json!("5."), None),
            (json!("5.10"), None),
            (json!(".0"), None),
            (json!("_5"), None),
            (json!("5__0"), None),
            (json!("5_"), None),
            (json!("1e3"), None),
            (json!("0x5"), None),
            (json!("5 5"), None),
            (json!("+-5"), None),
            (json!(""), None),
            (json!(null), None),
            (json!([1]), None),
        ] {
            assert_eq!(lax_int(&v), n, "{v}");
        }
    }
}
