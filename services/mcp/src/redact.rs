//! Keeping credentials out of errors and logs.
//!
//! One small function on purpose: the lead is adding a shared reserved-key / redaction module to
//! antler-kit, and this is the single place to swap for it.

/// The replacement shown instead of a secret.
pub const MASK: &str = "****";

/// Shortest value treated as a secret (shorter values would mask ordinary words).
const MIN_SECRET_LEN: usize = 4;

/// Returns `text` with every occurrence of each secret replaced by [`MASK`], and any `Bearer <token>` /
/// `Basic <token>` credential masked even when the token is not in `secrets` (a server may echo a header).
pub fn redact<S: AsRef<str>>(text: &str, secrets: &[S]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        let secret = secret.as_ref();
        if secret.len() >= MIN_SECRET_LEN && out.contains(secret) {
            out = out.replace(secret, MASK);
        }
    }
    mask_schemes(&out)
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
        if token_len > 0 && &after[..token_len] != MASK {
            out.push_str(MASK);
        } else {
            out.push_str(&after[..token_len]);
        }
        rest = &after[token_len..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_secrets_and_bearer_tokens_are_masked() {
        let text = "POST https://auth/token failed: client_secret=s3cr3t-value; header Authorization: Bearer abc.def";
        let out = redact(text, &["s3cr3t-value"]);
        assert!(!out.contains("s3cr3t-value") && !out.contains("abc.def"), "{out}");
        assert!(out.contains("Bearer ****"), "{out}");
    }

    #[test]
    fn short_values_are_not_treated_as_secrets() {
        assert_eq!(redact("a b c", &["a"]), "a b c");
    }
}
