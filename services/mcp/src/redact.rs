//! Keeping credentials out of errors and logs, on the kit's process-wide redactor
//! ([`antler_kit::redact`]): every credential this service learns — credential-looking headers and
//! environment values of server entries, OAuth client secrets and refresh tokens (for the process's
//! life, as rotated ones may still sit in an old error), OAuth access tokens (while they are cached) — is
//! registered there, so the kit's status and log layers mask it wherever it shows up. Messages built
//! here also mask `Bearer …` / `Basic …` credentials the registry cannot know (a server echoing a header).

use crate::spec::ServerSpec;

/// Headers whose value is a credential whatever it looks like.
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"];

/// `text` with registered secrets and any `Bearer` / `Basic` credential masked.
pub fn redact(text: &str) -> String {
    antler_kit::redact::redact(&mask_schemes(text)).into_owned()
}

/// Registers the credentials of a server entry for the life of the process.
pub fn register_spec(spec: &ServerSpec) {
    let looks_secret = |key: &str| {
        let key = key.to_ascii_lowercase();
        CREDENTIAL_HEADERS.contains(&key.as_str())
            || antler_kit::input_keys::is_credential(&key)
            || ["key", "secret", "token", "password", "credential"].iter().any(|w| key.contains(w))
    };
    for (key, value) in spec.headers.iter().chain(spec.env.iter()) {
        if looks_secret(key) {
            antler_kit::redact::register_static(value);
            // "Bearer abc…": the bare token may show up on its own too.
            if let Some((_, token)) = value.split_once(' ') {
                antler_kit::redact::register_static(token);
            }
        }
    }
    if let Some(oauth) = &spec.oauth {
        antler_kit::redact::register_static(&oauth.client_secret);
        antler_kit::redact::register_static(&oauth.refresh_token);
    }
}

fn mask_schemes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let found = ["Bearer ", "bearer ", "Basic ", "basic "].iter().filter_map(|s| rest.find(s).map(|i| (i, s.len()))).min();
        let Some((at, len)) = found else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at + len]);
        let after = &rest[at + len..];
        let token_len = after.find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';')).unwrap_or(after.len());
        if token_len > 0 {
            out.push_str(antler_kit::redact::REDACTED);
        }
        rest = &after[token_len..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_and_bearer_tokens_are_masked() {
        antler_kit::redact::register_static("s3cr3t-value-for-mcp-test");
        let text = "POST https://auth/token failed: client_secret=s3cr3t-value-for-mcp-test; header Authorization: Bearer abc.def";
        let out = redact(text);
        assert!(!out.contains("s3cr3t-value-for-mcp-test") && !out.contains("abc.def"), "{out}");
        assert!(out.contains("Bearer [redacted]"), "{out}");
    }
}
