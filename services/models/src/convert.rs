//! JSON ⇄ `google.protobuf.Struct` and the small proto builders shared by the gateway and the providers.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value as PValue};
use serde_json::{Map, Number, Value};

/// A JSON value as a protobuf `Value`.
pub fn json_to_value(value: &Value) -> PValue {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(ListValue { values: items.iter().map(json_to_value).collect() }),
        Value::Object(map) => Kind::StructValue(map_to_struct(map)),
    };
    PValue { kind: Some(kind) }
}

/// A JSON object as a protobuf `Struct`.
pub fn map_to_struct(map: &Map<String, Value>) -> Struct {
    Struct { fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect() }
}

/// A protobuf `Value` as JSON. Whole numbers come back as integers, so `{"n": 3}` round-trips as `3`, not
/// `3.0` (tool arguments are often counts or indexes).
pub fn value_to_json(value: &PValue) -> Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_map(s)),
    }
}

fn number(n: f64) -> Value {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 9.0e15 {
        Value::Number(Number::from(n as i64))
    } else {
        Number::from_f64(n).map(Value::Number).unwrap_or(Value::Null)
    }
}

/// A protobuf `Struct` as a JSON object.
pub fn struct_to_map(s: &Struct) -> Map<String, Value> {
    s.fields.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect()
}

/// Parses accumulated tool-call argument text. `Ok` = a JSON object (an empty text counts as `{}`, which
/// some providers send for tools without parameters); `Err` = anything else, kept verbatim.
pub fn parse_arguments(raw: &str) -> Result<Struct, String> {
    if raw.trim().is_empty() {
        return Ok(Struct::default());
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => Ok(map_to_struct(&map)),
        _ => Err(raw.to_owned()),
    }
}

/// The JSON text of a tool call's arguments as sent back upstream.
pub fn arguments_text(call: &antler_proto::common::ToolCall) -> String {
    match &call.arguments {
        Some(args) => Value::Object(struct_to_map(args)).to_string(),
        None if !call.raw_arguments.is_empty() => call.raw_arguments.clone(),
        None => "{}".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trips_through_struct_with_integers_intact() {
        let original = json!({"cmd": "ls", "n": 3, "ratio": 0.5, "flags": [true, null], "nested": {"a": "b"}});
        let Value::Object(map) = &original else { return };
        assert_eq!(Value::Object(struct_to_map(&map_to_struct(map))), original);
    }

    #[test]
    fn arguments_that_are_not_an_object_are_kept_raw() {
        assert!(parse_arguments(r#"{"a":1}"#).is_ok());
        assert!(parse_arguments("").is_ok());
        assert_eq!(parse_arguments(r#"{"a":"#), Err(r#"{"a":"#.to_owned()));
        assert_eq!(parse_arguments("[1]"), Err("[1]".to_owned()));
    }
}
