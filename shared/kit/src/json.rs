//! JSON ⇄ `google.protobuf.Struct` / `Value` / `ListValue`: the one implementation in the workspace.
//!
//! A protobuf number is an `f64`, so JSON → protobuf rounds integers beyond 2^53 to the nearest double (the
//! wire type cannot hold more). Protobuf → JSON has two ways to write numbers, chosen by the caller with
//! [`Numbers`]: stored text and API payloads keep every number a float (`3` reads back as `3.0`, as it always
//! has, so stored metadata compares equal to what a filter sends), while tool arguments and schemas write whole
//! numbers as integers (`3`), because a JSON Schema `integer` refuses `3.0`. A non-finite number (NaN, ±∞) has
//! no JSON form and becomes `null` either way.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use serde_json::{Map, Number};

/// How protobuf numbers are written as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbers {
    /// Every number as a JSON float (`3.0`): metadata, state and event data.
    Float,
    /// A whole number whose magnitude is below 9·10^15 (so the `f64` holds it exactly) as a JSON integer
    /// (`3`), anything else as a float: tool arguments and schemas, where `integer` must stay `3`.
    WholeAsInteger,
}

/// A protobuf `Struct` as a JSON object, every number a float.
pub fn struct_to_json(value: &Struct) -> serde_json::Value {
    serde_json::Value::Object(struct_to_map(value, Numbers::Float))
}

/// A protobuf `Value` as JSON, every number a float.
pub fn value_to_json(value: &Value) -> serde_json::Value {
    value_to_json_as(value, Numbers::Float)
}

/// A protobuf `Struct` as a JSON map, numbers written as `numbers` says.
pub fn struct_to_map(value: &Struct, numbers: Numbers) -> Map<String, serde_json::Value> {
    value.fields.iter().map(|(k, v)| (k.clone(), value_to_json_as(v, numbers))).collect()
}

/// A protobuf `Value` as JSON, numbers written as `numbers` says; a `Value` with no kind is `null`.
pub fn value_to_json_as(value: &Value, numbers: Numbers) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => number_to_json(*n, numbers),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(list)) => serde_json::Value::Array(list.values.iter().map(|v| value_to_json_as(v, numbers)).collect()),
        Some(Kind::StructValue(s)) => serde_json::Value::Object(struct_to_map(s, numbers)),
    }
}

fn number_to_json(n: f64, numbers: Numbers) -> serde_json::Value {
    // 9e15 sits just under 2^53, so every whole f64 below it converts to i64 exactly.
    if numbers == Numbers::WholeAsInteger && n.is_finite() && n.fract() == 0.0 && n.abs() < 9.0e15 {
        return serde_json::Value::Number(Number::from(n as i64));
    }
    Number::from_f64(n).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null)
}

/// A JSON value as a protobuf `Value` (integers beyond 2^53 round to the nearest `f64`).
pub fn json_to_value(value: &serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        // Without serde_json's arbitrary_precision every Number has an f64 form; 0.0 only guards that feature.
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue { values: items.iter().map(json_to_value).collect() }),
        serde_json::Value::Object(map) => Kind::StructValue(map_to_struct(map)),
    };
    Value { kind: Some(kind) }
}

/// A JSON object as a protobuf `Struct`.
pub fn map_to_struct(map: &Map<String, serde_json::Value>) -> Struct {
    Struct { fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect() }
}

/// Parses stored JSON text into a Struct (an object; anything else gives an empty Struct).
pub fn json_text_to_struct(text: &str) -> Struct {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => map_to_struct(&map),
        _ => Struct::default(),
    }
}

/// A Struct as JSON object text for storage, every number a float (the inverse of [`json_text_to_struct`]).
pub fn struct_to_json_text(value: &Struct) -> String {
    struct_to_json_text_as(value, Numbers::Float)
}

/// A Struct as JSON object text with its numbers as `numbers` says (tool schemas and arguments:
/// [`Numbers::WholeAsInteger`]).
pub fn struct_to_json_text_as(value: &Struct, numbers: Numbers) -> String {
    // Displaying a serde_json::Value cannot fail (string keys only).
    serde_json::Value::Object(struct_to_map(value, numbers)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: serde_json::Value) -> Map<String, serde_json::Value> {
        match value {
            serde_json::Value::Object(map) => map,
            other => panic!("test fixture is not an object: {other}"),
        }
    }

    fn number(n: f64) -> Value {
        Value { kind: Some(Kind::NumberValue(n)) }
    }

    #[test]
    fn nested_objects_arrays_null_and_bool_round_trip() {
        let original = json!({"cmd": "ls", "flags": [true, false, null, "x"], "nested": {"a": {"b": [[], {}]}}, "none": null});
        let back = serde_json::Value::Object(struct_to_map(&map_to_struct(&object(original.clone())), Numbers::WholeAsInteger));
        assert_eq!(back, original);
    }

    #[test]
    fn whole_numbers_stay_integers_only_when_asked() {
        let s = map_to_struct(&object(json!({"n": 3, "neg": -42, "ratio": 0.5, "list": [1, -2.25]})));
        assert_eq!(
            serde_json::Value::Object(struct_to_map(&s, Numbers::WholeAsInteger)),
            json!({"n": 3, "neg": -42, "ratio": 0.5, "list": [1, -2.25]})
        );
        // The float form is what stored metadata has always been written with.
        assert_eq!(struct_to_json_text(&s), r#"{"list":[1.0,-2.25],"n":3.0,"neg":-42.0,"ratio":0.5}"#);
        assert_eq!(struct_to_json(&s)["n"], json!(3.0));
        assert!(struct_to_json(&s)["n"].is_f64());
    }

    #[test]
    fn numbers_beyond_exact_range_stay_floats() {
        // 2^53 is whole but not below the 9e15 bound: written as a float even when integers are asked for.
        let big = value_to_json_as(&number(9_007_199_254_740_992.0), Numbers::WholeAsInteger);
        assert!(big.is_f64(), "{big}");
        assert_eq!(big.as_f64(), Some(9_007_199_254_740_992.0));
        let below = value_to_json_as(&number(-8_999_999_999_999_999.0), Numbers::WholeAsInteger);
        assert_eq!(below, json!(-8_999_999_999_999_999_i64));
        assert_eq!(value_to_json_as(&number(1e300), Numbers::WholeAsInteger), json!(1e300));
    }

    #[test]
    fn integers_beyond_two_to_the_53_round_to_the_nearest_double() {
        let v = json_to_value(&json!(u64::MAX));
        assert_eq!(v.kind, Some(Kind::NumberValue(u64::MAX as f64)));
        let v = json_to_value(&json!(9_007_199_254_740_993_i64));
        assert_eq!(v.kind, Some(Kind::NumberValue(9_007_199_254_740_992.0)));
        assert_eq!(json_to_value(&json!(i64::MIN)).kind, Some(Kind::NumberValue(-9.223_372_036_854_776e18)));
    }

    #[test]
    fn non_finite_numbers_become_null() {
        for n in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(value_to_json(&number(n)), serde_json::Value::Null, "{n}");
            assert_eq!(value_to_json_as(&number(n), Numbers::WholeAsInteger), serde_json::Value::Null, "{n}");
        }
    }

    #[test]
    fn a_value_without_kind_is_null_and_null_maps_to_null_value() {
        assert_eq!(value_to_json(&Value { kind: None }), serde_json::Value::Null);
        assert_eq!(json_to_value(&serde_json::Value::Null).kind, Some(Kind::NullValue(0)));
    }

    #[test]
    fn stored_text_that_is_not_an_object_gives_an_empty_struct() {
        assert_eq!(json_text_to_struct("[1]"), Struct::default());
        assert_eq!(json_text_to_struct("not json"), Struct::default());
        let s = json_text_to_struct(r#"{"title":"t","step":3}"#);
        assert_eq!(struct_to_json_text(&s), r#"{"step":3.0,"title":"t"}"#);
        assert_eq!(struct_to_json_text(&Struct::default()), "{}");
    }
}
