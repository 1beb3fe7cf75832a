//! `google.protobuf.Struct` ⇄ JSON, for metadata and state stored as JSON text.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

pub fn struct_to_json(value: &Struct) -> serde_json::Value {
    serde_json::Value::Object(value.fields.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect())
}

pub fn value_to_json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(list)) => serde_json::Value::Array(list.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

pub fn json_to_value(value: &serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue { values: items.iter().map(json_to_value).collect() }),
        serde_json::Value::Object(map) => {
            Kind::StructValue(Struct { fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect() })
        }
    };
    Value { kind: Some(kind) }
}

/// Parses stored JSON text into a Struct (an object; anything else gives an empty Struct).
pub fn json_text_to_struct(text: &str) -> Struct {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Struct { fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect() },
        _ => Struct::default(),
    }
}
