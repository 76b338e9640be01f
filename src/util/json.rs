//! How a refusal names a JSON value it was sent: by its kind, or, when short, as written. A
//! body may hold megabytes in one field, and a message never repeats them.

use serde_json::Value;

/// The kind of `v`, as a message names it ("a string", "an object").
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `v` as a refusal shows it: a string of at most `max_chars` characters, a number, a boolean
/// or null as written; a longer string by its length; an array or an object by its kind.
pub fn shown(v: &Value, max_chars: usize) -> String {
    match v {
        Value::String(s) => match s.chars().nth(max_chars) {
            None => v.to_string(),
            Some(_) => format!("a string of {} characters", s.chars().count()),
        },
        Value::Array(_) | Value::Object(_) => type_name(v).to_owned(),
        Value::Null | Value::Bool(_) | Value::Number(_) => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::shown;
    use serde_json::json;

    #[test]
    fn long_and_nested_values_are_named_not_repeated() {
        assert_eq!(shown(&json!("abc"), 3), r#""abc""#);
        assert_eq!(shown(&json!("abcd"), 3), "a string of 4 characters");
        assert_eq!(shown(&json!("ééé"), 3), r#""ééé""#);
        assert_eq!(shown(&json!(7), 3), "7");
        assert_eq!(shown(&json!(null), 3), "null");
        assert_eq!(shown(&json!([1]), 3), "an array");
        assert_eq!(shown(&json!({"a": 1}), 3), "an object");
    }
}
