//! JSON ⇄ `google.protobuf.Struct`.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value as PValue};
use serde_json::{Map, Number, Value};

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

pub fn map_to_struct(map: &Map<String, Value>) -> Struct {
    Struct { fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect() }
}

/// Whole numbers come back as integers, so `{"n": 3}` reaches a schema that says `integer` as `3`.
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

pub fn struct_to_map(s: &Struct) -> Map<String, Value> {
    s.fields.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect()
}
