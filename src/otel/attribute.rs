//! OTLP attributes from the gateway's values.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};

/// A string attribute.
pub(super) fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

/// An integer attribute.
pub(super) fn int(key: &str, value: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(
                i64::try_from(value).unwrap_or(i64::MAX),
            )),
        }),
        ..Default::default()
    }
}
