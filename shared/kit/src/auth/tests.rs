use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use jsonwebtoken::{EncodingKey, Header, encode};

use super::*;

const ALICE_KEY: &str = "alice-key-0123456789";
const RUNS_KEY: &str = "runs-service-key-0123456789";
const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!!";

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn config() -> AuthConfig {
    AuthConfig {
        enabled: true,
        api_keys: vec![
            ApiKeyConfig { key: ALICE_KEY.into(), user: "alice".into(), service: false },
            ApiKeyConfig { key: RUNS_KEY.into(), user: "antler-runs".into(), service: true },
        ],
        jwt: Some(JwtConfig {
            algorithm: JwtAlgorithm::HS256,
            secret: SECRET.into(),
            public_key_pem: String::new(),
            public_key_file: None,
            user_claim: "sub".into(),
            issuer: None,
            audience: None,
            leeway_secs: 0,
        }),
        ..AuthConfig::default()
    }
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(value) = HeaderValue::from_str(value) {
            map.insert(*name, value);
        }
    }
    map
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn sign_hs256(secret: &[u8], claims: &serde_json::Value) -> String {
    EncodingKey::from_secret(secret).and_then(|key| encode(&Header::new(Algorithm::HS256), claims, &key)).unwrap_or_default()
}

fn hs256(claims: serde_json::Value) -> String {
    sign_hs256(SECRET.as_bytes(), &claims)
}

#[test]
fn disabled_auth_makes_every_caller_the_local_user() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&AuthConfig::default())?;
    let id = auth.authenticate(&HeaderMap::new());
    assert!(matches!(id, Ok(Identity { ref user_id, principal: Principal::Local, .. }) if user_id == "local"));
    Ok(())
}

#[test]
fn api_keys_map_to_their_users() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&config())?;
    let id = auth.authenticate(&headers(&[("authorization", &bearer(ALICE_KEY))]));
    assert!(matches!(id, Ok(Identity { ref user_id, principal: Principal::User, .. }) if user_id == "alice"), "{id:?}");
    Ok(())
}

#[test]
fn missing_malformed_and_unknown_credentials_say_which() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&config())?;
    assert_eq!(auth.authenticate(&HeaderMap::new()).err(), Some(AuthError::Missing));
    assert_eq!(auth.authenticate(&headers(&[("authorization", ALICE_KEY)])).err(), Some(AuthError::Malformed));
    assert_eq!(auth.authenticate(&headers(&[("authorization", "Bearer ")])).err(), Some(AuthError::Malformed));
    assert_eq!(auth.authenticate(&headers(&[("authorization", &bearer("not-a-known-key-at-all"))])).err(), Some(AuthError::UnknownKey));
    Ok(())
}

#[test]
fn hs256_tokens_are_verified_and_expiry_is_reported() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&config())?;
    let good = hs256(serde_json::json!({"sub": "bob", "exp": now() + 60}));
    let id = auth.authenticate(&headers(&[("authorization", &bearer(&good))]));
    assert!(matches!(id, Ok(Identity { ref user_id, .. }) if user_id == "bob"), "{id:?}");

    let expired = hs256(serde_json::json!({"sub": "bob", "exp": now() - 120}));
    assert_eq!(auth.authenticate(&headers(&[("authorization", &bearer(&expired))])).err(), Some(AuthError::Expired));

    let forged = sign_hs256(b"some-other-secret-of-32-bytes-or-more", &serde_json::json!({"sub": "bob", "exp": now() + 60}));
    let err = auth.authenticate(&headers(&[("authorization", &bearer(&forged))])).err();
    assert!(matches!(err, Some(AuthError::InvalidToken(ref m)) if m.contains("signature")), "{err:?}");

    let no_user = hs256(serde_json::json!({"exp": now() + 60}));
    let err = auth.authenticate(&headers(&[("authorization", &bearer(&no_user))])).err();
    assert!(matches!(err, Some(AuthError::InvalidToken(ref m)) if m.contains("sub")), "{err:?}");
    Ok(())
}

#[test]
fn rs256_tokens_are_verified_with_the_public_key() -> Result<(), ConfigError> {
    let mut cfg = config();
    cfg.jwt = Some(JwtConfig {
        algorithm: JwtAlgorithm::RS256,
        secret: String::new(),
        public_key_pem: include_str!("testdata/rs256_public.pem").to_owned(),
        public_key_file: None,
        user_claim: "email".into(),
        issuer: Some("https://idp.example".into()),
        audience: Some("antler".into()),
        leeway_secs: 0,
    });
    let auth = Authenticator::new(&cfg)?;
    let key = EncodingKey::from_rsa_pem(include_bytes!("testdata/rs256_private.pem"))
        .map_err(|e| ConfigError::Invalid { path: "test".into(), message: e.to_string() })?;
    let sign = |claims: serde_json::Value| encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap_or_default();

    let good = sign(serde_json::json!({"email": "carol@example.com", "iss": "https://idp.example", "aud": "antler", "exp": now() + 60}));
    let id = auth.authenticate(&headers(&[("authorization", &bearer(&good))]));
    assert!(matches!(id, Ok(Identity { ref user_id, .. }) if user_id == "carol@example.com"), "{id:?}");

    let wrong_aud =
        sign(serde_json::json!({"email": "carol@example.com", "iss": "https://idp.example", "aud": "other", "exp": now() + 60}));
    let err = auth.authenticate(&headers(&[("authorization", &bearer(&wrong_aud))])).err();
    assert!(matches!(err, Some(AuthError::InvalidToken(ref m)) if m.contains("audience")), "{err:?}");
    Ok(())
}

#[test]
fn only_service_principals_may_act_for_a_user() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&config())?;
    let id = auth.authenticate(&headers(&[("authorization", &bearer(RUNS_KEY)), (ACT_AS_HEADER, "alice")]));
    assert!(
        matches!(id, Ok(Identity { ref user_id, principal: Principal::Service { ref service }, .. }) if user_id == "alice" && service == "antler-runs"),
        "{id:?}"
    );
    let err = auth.authenticate(&headers(&[("authorization", &bearer(ALICE_KEY)), (ACT_AS_HEADER, "bob")])).err();
    assert_eq!(err, Some(AuthError::ActAsForbidden));
    let err = auth.authenticate(&headers(&[("authorization", &bearer(RUNS_KEY)), (ACT_AS_HEADER, "../etc")])).err();
    assert_eq!(err, Some(AuthError::BadActAs));
    Ok(())
}

#[test]
fn reload_swaps_keys_in_place() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&config())?;
    let mut rotated = config();
    rotated.api_keys[0].key = "alice-rotated-key-0123456789".into();
    auth.reload(&rotated)?;
    assert_eq!(auth.authenticate(&headers(&[("authorization", &bearer(ALICE_KEY))])).err(), Some(AuthError::UnknownKey));
    assert!(auth.authenticate(&headers(&[("authorization", &bearer("alice-rotated-key-0123456789"))])).is_ok());
    Ok(())
}

#[test]
fn enabling_auth_without_credentials_is_a_config_error() {
    let cfg = AuthConfig { enabled: true, ..AuthConfig::default() };
    assert!(matches!(Authenticator::new(&cfg), Err(ConfigError::Invalid { ref path, .. }) if path == "server.auth.enabled"));
}

#[test]
fn this_process_calls_itself_without_a_token_for_the_user_it_names() -> Result<(), ConfigError> {
    let auth = Authenticator::new(&config())?;
    let mark = crate::internal::internal_mark();
    let internal = auth.authenticate(&headers(&[(crate::internal::INTERNAL_HEADER, mark), (ACT_AS_HEADER, "bob")]));
    let identity = internal.map_err(|e| ConfigError::Invalid { path: "internal".into(), message: e.to_string() })?;
    assert_eq!(identity.user_id, "bob");
    assert_eq!(identity.principal, Principal::Service { service: INTERNAL_SERVICE.to_owned() });
    assert!(identity.credential.is_none(), "nothing to forward: the next hop marks its own call");
    // Anything short of the exact mark is a caller without a token.
    let forged = auth.authenticate(&headers(&[(crate::internal::INTERNAL_HEADER, "0123456789abcdef"), (ACT_AS_HEADER, "bob")]));
    assert_eq!(forged.err(), Some(AuthError::Missing));
    assert_eq!(auth.authenticate(&headers(&[(ACT_AS_HEADER, "bob")])).err(), Some(AuthError::Missing));
    // The mark must name whom it acts for, with a valid id.
    assert_eq!(auth.authenticate(&headers(&[(crate::internal::INTERNAL_HEADER, mark)])).err(), Some(AuthError::Missing));
    let bad = auth.authenticate(&headers(&[(crate::internal::INTERNAL_HEADER, mark), (ACT_AS_HEADER, "../etc")]));
    assert_eq!(bad.err(), Some(AuthError::BadActAs));
    // A user's own token still speaks for that user only, mark or not.
    let user = auth.authenticate(&headers(&[
        ("authorization", &bearer(ALICE_KEY)),
        (crate::internal::INTERNAL_HEADER, mark),
        (ACT_AS_HEADER, "bob"),
    ]));
    assert_eq!(user.err(), Some(AuthError::ActAsForbidden));
    Ok(())
}
