//! Which keys a client may put in the free-form maps it sends (run and thread metadata, run context,
//! message metadata, and the maps of the MCP and memory services): the one place that says which
//! keys are the server's and which look like credentials, so every surface applies the same rules.
//!
//! - **Reserved** keys belong to the server: any key starting with `antler_` or `__`, and the
//!   identity keys `user_id`, `owner_id`, `owner`, `auth_user`. A surface either refuses them
//!   (INVALID_ARGUMENT naming the key) or strips them, as its documentation says.
//! - **Credential** keys look like a secret (`auth_token`, `api_key`, `password`, `*_token`,
//!   `*_secret`, …, at any depth, case-insensitively). They are always refused: credentials travel
//!   in fields made for them (`CreateRunRequest.secrets`), which are never stored.

use prost_types::value::Kind;
use prost_types::{Struct, Value};

/// Identity keys only the server sets.
pub const IDENTITY_KEYS: [&str; 4] = ["user_id", "owner_id", "owner", "auth_user"];
/// Prefixes of keys only the server sets.
pub const RESERVED_PREFIXES: [&str; 2] = ["antler_", "__"];

/// Exact names (lower case) that carry credentials.
const CREDENTIAL_NAMES: [&str; 14] = [
    "auth_token",
    "access_token",
    "refresh_token",
    "id_token",
    "api_key",
    "apikey",
    "authorization",
    "password",
    "passwd",
    "secret",
    "token",
    "cookie",
    "private_key",
    "client_secret",
];
/// Suffixes (lower case) of names that carry credentials.
const CREDENTIAL_SUFFIXES: [&str; 5] = ["_token", "_secret", "_password", "_api_key", "_apikey"];

/// Whether only the server may set `key`.
pub fn is_reserved(key: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| key.starts_with(p)) || IDENTITY_KEYS.contains(&key)
}

/// Whether `key` names a credential.
pub fn is_credential(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    CREDENTIAL_NAMES.contains(&key.as_str()) || CREDENTIAL_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// What a surface does with a reserved key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// INVALID_ARGUMENT naming the key.
    Refuse,
    /// Removed silently (for maps a client may echo back from what it read, like message metadata).
    Strip,
}

/// A refused key: the field path (`metadata.auth_token`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct KeyError {
    pub field: String,
    pub message: String,
}

impl From<KeyError> for tonic::Status {
    fn from(e: KeyError) -> Self {
        crate::status::invalid_argument(&e.field, e.message)
    }
}

/// Applies the rules to `map`, sent by a client as the field `field` (for errors): credential keys at
/// any depth are refused, top-level reserved keys refused or stripped as `reserved` says, and
/// `also_reserved` names more top-level keys this surface owns (e.g. `thread_id` in a run's context).
pub fn check(field: &str, map: &mut Struct, reserved: Reserved, also_reserved: &[&str]) -> Result<(), KeyError> {
    if let Some(path) = credential_path(&map.fields) {
        return Err(KeyError {
            field: format!("{field}.{path}"),
            message: "looks like a credential and is refused: credentials are never stored in metadata\nhint: pass them in CreateRunRequest.secrets, which tools receive and nothing stores".to_owned(),
        });
    }
    let owned = |key: &str| is_reserved(key) || also_reserved.contains(&key);
    match reserved {
        Reserved::Strip => map.fields.retain(|key, _| !owned(key)),
        Reserved::Refuse => {
            if let Some(key) = map.fields.keys().find(|k| owned(k)) {
                return Err(KeyError {
                    field: format!("{field}.{key}"),
                    message: format!(
                        "is reserved for the server (keys starting with {}, and {})",
                        RESERVED_PREFIXES.map(|p| format!("`{p}`")).join(" or "),
                        IDENTITY_KEYS.iter().chain(also_reserved).map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The dotted path of the first credential key in `fields`, searching nested structs and lists.
fn credential_path(fields: &std::collections::BTreeMap<String, Value>) -> Option<String> {
    for (key, value) in fields {
        if is_credential(key) {
            return Some(key.clone());
        }
        if let Some(inner) = nested_credential(value) {
            return Some(format!("{key}.{inner}"));
        }
    }
    None
}

fn nested_credential(value: &Value) -> Option<String> {
    match &value.kind {
        Some(Kind::StructValue(s)) => credential_path(&s.fields),
        Some(Kind::ListValue(list)) => {
            list.values.iter().enumerate().find_map(|(i, v)| nested_credential(v).map(|inner| format!("[{i}].{inner}")))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, Value)]) -> Struct {
        Struct { fields: pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect() }
    }

    fn text(s: &str) -> Value {
        Value { kind: Some(Kind::StringValue(s.to_owned())) }
    }

    #[test]
    fn credentials_are_refused_at_any_depth_on_every_surface() {
        for reserved in [Reserved::Refuse, Reserved::Strip] {
            let mut flat = map(&[("Auth_Token", text("x"))]);
            assert_eq!(check("metadata", &mut flat, reserved, &[]).map_err(|e| e.field), Err("metadata.Auth_Token".to_owned()));
            let nested = Value { kind: Some(Kind::StructValue(map(&[("github_token", text("x"))]))) };
            let mut deep = map(&[("tools", nested)]);
            assert_eq!(check("metadata", &mut deep, reserved, &[]).map_err(|e| e.field), Err("metadata.tools.github_token".to_owned()));
        }
        assert!(!is_credential("max_tokens") && !is_credential("token_budget") && !is_credential("idempotency_key"));
    }

    #[test]
    fn reserved_keys_are_refused_or_stripped_as_the_surface_says() {
        let mut refused = map(&[("antler_owner", text("x")), ("topic", text("y"))]);
        let error = check("metadata", &mut refused, Reserved::Refuse, &[]).err();
        assert_eq!(error.map(|e| e.field), Some("metadata.antler_owner".to_owned()));

        let mut stripped = map(&[("antler_x", text("x")), ("__y", text("y")), ("user_id", text("z")), ("topic", text("t"))]);
        assert_eq!(check("input[0].metadata", &mut stripped, Reserved::Strip, &[]), Ok(()));
        assert_eq!(stripped.fields.keys().collect::<Vec<_>>(), ["topic"]);

        let mut context = map(&[("thread_id", text("t"))]);
        let error = check("config.context", &mut context, Reserved::Refuse, &["thread_id", "run_id", "is_internal"]).err();
        assert_eq!(error.as_ref().map(|e| e.field.as_str()), Some("config.context.thread_id"));
        assert!(error.map(|e| e.message).unwrap_or_default().contains("`is_internal`"));
    }
}
