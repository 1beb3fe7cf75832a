//! Editing DeerFlow's `extensions_config.json` (GetConfig / UpdateConfig): the entries as written, with
//! their secrets masked for display, the masked values put back on the way in, the new `mcpServers`
//! computed (replace or merge), and the file replaced atomically. Checking the entries is the loader's
//! job ([`crate::extensions::parse_entry`]); applying the file is [`crate::service::Hub::reload`]'s.

use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::McpError;

/// What a secret reads as in GetConfig, and what keeps the stored value in UpdateConfig.
pub const MASK: &str = "***";

/// The keys of an entry whose values are maps of secrets (env values, HTTP headers).
const SECRET_MAPS: &[&str] = &["env", "headers"];
/// The secret keys of an entry's `oauth` object.
const OAUTH_SECRETS: &[&str] = &["client_secret", "refresh_token"];

/// A `$VAR` reference names a secret without being one, so it is shown as written.
fn is_reference(value: &Value) -> bool {
    value.as_str().is_some_and(|s| s.starts_with('$'))
}

/// An entry as GetConfig shows it.
pub fn mask(entry: &Value) -> Value {
    let mut entry = entry.clone();
    let Some(map) = entry.as_object_mut() else { return entry };
    for key in SECRET_MAPS {
        if let Some(Value::Object(values)) = map.get_mut(*key) {
            for value in values.values_mut() {
                if !is_reference(value) {
                    *value = Value::String(MASK.to_owned());
                }
            }
        }
    }
    if let Some(Value::Object(oauth)) = map.get_mut("oauth") {
        for key in OAUTH_SECRETS {
            if let Some(value) = oauth.get_mut(*key)
                && !value.is_null()
                && !is_reference(value)
            {
                *value = Value::String(MASK.to_owned());
            }
        }
    }
    entry
}

/// Every entry of a `mcpServers` object, masked.
pub fn mask_all(servers: &Map<String, Value>) -> Map<String, Value> {
    servers.iter().map(|(name, entry)| (name.clone(), mask(entry))).collect()
}

fn is_mask(value: &Value) -> bool {
    value.as_str() == Some(MASK)
}

/// Puts the stored secrets back where `incoming` (server `name`) says "***". A mask with nothing stored
/// behind it is an error naming the field.
pub fn unmask(name: &str, mut incoming: Value, stored: Option<&Value>) -> Result<Value, McpError> {
    let Some(map) = incoming.as_object_mut() else { return Ok(incoming) };
    let stored = stored.and_then(Value::as_object);
    let missing = |field: String| {
        McpError::invalid(format!("servers.{name}.{field}"), format!("is \"{MASK}\" but no value is stored for it; send the value"))
    };
    for key in SECRET_MAPS {
        if let Some(Value::Object(values)) = map.get_mut(*key) {
            for (k, value) in values.iter_mut() {
                if is_mask(value) {
                    let old = stored.and_then(|s| s.get(*key)).and_then(|m| m.get(k)).filter(|v| !is_mask(v));
                    *value = old.cloned().ok_or_else(|| missing(format!("{key}.{k}")))?;
                }
            }
        }
    }
    if let Some(Value::Object(oauth)) = map.get_mut("oauth") {
        for key in OAUTH_SECRETS {
            if oauth.get(*key).is_some_and(is_mask) {
                let old = stored.and_then(|s| s.get("oauth")).and_then(|o| o.get(*key)).filter(|v| !v.is_null() && !is_mask(v));
                oauth.insert((*key).to_owned(), old.cloned().ok_or_else(|| missing(format!("oauth.{key}")))?);
            }
        }
    }
    Ok(incoming)
}

/// The new `mcpServers`: `servers` as a whole (`replace`), or each merged key by key into the current
/// entry of its name (which must exist). Masked secrets are restored from the current entries.
pub fn apply(current: &Map<String, Value>, servers: Map<String, Value>, replace: bool) -> Result<Map<String, Value>, McpError> {
    if replace {
        return servers.into_iter().map(|(name, entry)| Ok((name.clone(), unmask(&name, entry, current.get(&name))?))).collect();
    }
    let mut next = current.clone();
    for (name, patch) in servers {
        let Value::Object(patch) = patch else {
            return Err(McpError::invalid(format!("servers.{name}"), "must be an object of the entry's keys to change"));
        };
        let Some(Value::Object(entry)) = next.get(&name).cloned() else {
            return Err(McpError::NotFound(format!(
                "MCP server `{name}` is not in the extensions file\nhint: send replace: true with the whole set to add one"
            )));
        };
        let mut merged = entry;
        merged.extend(patch);
        let merged = unmask(&name, Value::Object(merged), current.get(&name))?;
        next.insert(name, merged);
    }
    Ok(next)
}

/// The file's top-level object; a file that does not exist yet reads as `{}`.
pub fn read_root(path: &Path) -> Result<Map<String, Value>, McpError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => return Err(McpError::FailedPrecondition(format!("cannot read the extensions file: {}", e.kind()))),
    };
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(root)) => Ok(root),
        Ok(_) => {
            Err(McpError::FailedPrecondition("the extensions file's top level is not a JSON object\nhint: fix it by hand first".to_owned()))
        }
        Err(e) => Err(McpError::FailedPrecondition(format!("the extensions file is not valid JSON ({e})\nhint: fix it by hand first"))),
    }
}

/// The servers of a root object (`mcpServers`, or DeerFlow's legacy `mcp_servers`).
pub fn servers_of(root: &Map<String, Value>) -> Map<String, Value> {
    match root.get("mcpServers").or_else(|| root.get("mcp_servers")) {
        Some(Value::Object(servers)) => servers.clone(),
        _ => Map::new(),
    }
}

/// Replaces the file with `root` atomically: a new file in the same directory, synced, renamed over it.
pub fn write_root(path: &Path, root: &Map<String, Value>) -> Result<(), McpError> {
    let failed =
        |what: &str, e: std::io::Error| McpError::unavailable(format!("cannot write the extensions file ({what}): {}", e.kind()), 1);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| Path::new("."));
    let mut text = serde_json::to_string_pretty(&Value::Object(root.clone())).unwrap_or_else(|_| "{}".to_owned());
    text.push('\n');
    let mut temp = tempfile::NamedTempFile::new_in(dir).map_err(|e| failed("create", e))?;
    temp.write_all(text.as_bytes()).map_err(|e| failed("write", e))?;
    temp.as_file().sync_all().map_err(|e| failed("sync", e))?;
    temp.persist(path).map_err(|e| failed("rename", e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn servers(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn secrets_are_masked_but_references_are_shown() {
        let entry = json!({"command": "npx", "env": {"TOKEN": "ghp-real", "REF": "$GITHUB_TOKEN"},
            "headers": {"Authorization": "Bearer x"}, "oauth": {"client_id": "id", "client_secret": "s", "refresh_token": null}});
        let masked = mask(&entry);
        assert_eq!(masked["env"], json!({"TOKEN": "***", "REF": "$GITHUB_TOKEN"}));
        assert_eq!(masked["headers"]["Authorization"], "***");
        assert_eq!(masked["oauth"], json!({"client_id": "id", "client_secret": "***", "refresh_token": null}));
        assert_eq!(masked["command"], "npx");
    }

    #[test]
    fn a_masked_value_keeps_the_stored_secret_and_a_new_one_replaces_it() -> Result<(), McpError> {
        let current = servers(json!({"gh": {"command": "npx", "env": {"TOKEN": "ghp-real", "OTHER": "o"}}}));
        let incoming = servers(json!({"gh": {"command": "npx", "env": {"TOKEN": "***", "OTHER": "new"}}, "web": {"url": "http://h"}}));
        let next = apply(&current, incoming, true)?;
        assert_eq!(next["gh"]["env"], json!({"TOKEN": "ghp-real", "OTHER": "new"}));
        assert_eq!(next["web"], json!({"url": "http://h"}));
        let nothing_stored = apply(&current, servers(json!({"web": {"url": "http://h", "headers": {"X": "***"}}})), true);
        assert!(
            matches!(nothing_stored, Err(McpError::InvalidArgument { ref field, .. }) if field == "servers.web.headers.X"),
            "{nothing_stored:?}"
        );
        Ok(())
    }

    #[test]
    fn a_merge_changes_only_the_keys_sent_and_needs_the_server() -> Result<(), McpError> {
        let current = servers(json!({"gh": {"command": "npx", "enabled": true, "env": {"TOKEN": "ghp-real"}}}));
        let next = apply(&current, servers(json!({"gh": {"enabled": false}})), false)?;
        assert_eq!(next["gh"], json!({"command": "npx", "enabled": false, "env": {"TOKEN": "ghp-real"}}));
        let missing = apply(&current, servers(json!({"nope": {"enabled": false}})), false);
        assert!(matches!(missing, Err(McpError::NotFound(_))), "{missing:?}");
        Ok(())
    }

    #[test]
    fn the_file_is_replaced_whole_and_keeps_its_other_keys() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("extensions_config.json");
        assert!(read_root(&path)?.is_empty());
        std::fs::write(&path, r#"{"skills": {"a": {"enabled": false}}, "mcpServers": {"x": {"command": "npx"}}}"#)?;
        let mut root = read_root(&path)?;
        assert_eq!(servers_of(&root).len(), 1);
        root.insert("mcpServers".to_owned(), json!({"y": {"url": "http://h"}}));
        write_root(&path, &root)?;
        let written: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        assert_eq!(written, json!({"skills": {"a": {"enabled": false}}, "mcpServers": {"y": {"url": "http://h"}}}));
        std::fs::write(&path, "{broken")?;
        assert!(matches!(read_root(&path), Err(McpError::FailedPrecondition(_))));
        Ok(())
    }
}
