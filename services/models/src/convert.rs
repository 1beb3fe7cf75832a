//! Tool-call argument text ⇄ `google.protobuf.Struct`, shared by the gateway and the providers. The conversion
//! itself is `antler_kit::json`; tool arguments write whole numbers as integers (`Numbers::WholeAsInteger`).

use antler_kit::json::{Numbers, map_to_struct, struct_to_json_text_as};
use prost_types::Struct;
use serde_json::Value;

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
        Some(args) => struct_to_json_text_as(args, Numbers::WholeAsInteger),
        None if !call.raw_arguments.is_empty() => call.raw_arguments.clone(),
        None => "{}".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_kit::json::struct_to_map;
    use serde_json::json;

    #[test]
    fn json_round_trips_through_struct_with_integers_intact() {
        let original = json!({"cmd": "ls", "n": 3, "ratio": 0.5, "flags": [true, null], "nested": {"a": "b"}});
        let Value::Object(map) = &original else { return };
        assert_eq!(Value::Object(struct_to_map(&map_to_struct(map), Numbers::WholeAsInteger)), original);
    }

    #[test]
    fn arguments_that_are_not_an_object_are_kept_raw() {
        assert!(parse_arguments(r#"{"a":1}"#).is_ok());
        assert!(parse_arguments("").is_ok());
        assert_eq!(parse_arguments(r#"{"a":"#), Err(r#"{"a":"#.to_owned()));
        assert_eq!(parse_arguments("[1]"), Err("[1]".to_owned()));
    }
}
