//! Checking tool arguments before anything is sent: the tool's own JSON Schema, the size cap, and keys
//! that belong to the protocol rather than to the tool.

use serde_json::{Map, Value};

use crate::catalog::ToolEntry;
use crate::error::McpError;

/// Top-level argument keys a client may not send: `_meta` is MCP's request metadata (progress tokens,
/// identity on 2026-07-28) and is set by Antler alone; keys with the kit's reserved prefixes (`antler_`,
/// `__`) belong to the server on every Antler surface. The kit's identity and credential names are not
/// applied here: tool arguments follow the tool's own schema, where `owner` (GitHub) or `token` are
/// ordinary parameters, and nothing here stores them.
const RESERVED_ARGUMENT_KEYS: &[&str] = &["_meta"];

fn reserved(key: &str) -> bool {
    RESERVED_ARGUMENT_KEYS.contains(&key) || antler_kit::input_keys::RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Most schema violations listed in one error.
const MAX_LISTED: usize = 5;

/// Checks `arguments` for `tool`. Errors are INVALID_ARGUMENT naming `arguments` plus the JSON path.
pub fn check(tool: &ToolEntry, arguments: &Map<String, Value>, max_bytes: usize) -> Result<(), McpError> {
    if let Some(key) = arguments.keys().find(|k| reserved(k)) {
        return Err(McpError::invalid(
            format!("arguments.{key}"),
            "is reserved (MCP's `_meta`, or a key starting with `antler_` or `__`) and may not be sent",
        ));
    }
    let size = serde_json::to_vec(arguments).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > max_bytes {
        return Err(McpError::invalid(
            "arguments",
            format!("{size} bytes of JSON exceeds the limit of {max_bytes} (mcp.calls.max_argument_bytes)"),
        ));
    }
    let Some(validator) = tool.validator() else { return Ok(()) };
    let instance = Value::Object(arguments.clone());
    let errors: Vec<(String, String)> =
        validator.iter_errors(&instance).take(MAX_LISTED).map(|e| (e.instance_path().to_string(), e.to_string())).collect();
    let Some((path, _)) = errors.first() else { return Ok(()) };
    let field = format!("arguments{}", pointer_to_path(path));
    let details: Vec<String> = errors.iter().map(|(p, m)| format!("{}: {m}", if p.is_empty() { "/" } else { p })).collect();
    Err(McpError::invalid(field, format!("does not match the input schema of {}: {}", tool.name, details.join("; "))))
}

/// `/a/0/b` → `.a[0].b`.
fn pointer_to_path(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').skip(1) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if part.parse::<usize>().is_ok() {
            out.push_str(&format!("[{part}]"));
        } else {
            out.push('.');
            out.push_str(&part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_become_field_paths() {
        assert_eq!(pointer_to_path(""), "");
        assert_eq!(pointer_to_path("/items/2/name"), ".items[2].name");
    }
}
