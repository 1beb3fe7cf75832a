//! Who is calling: bearer API keys or JWTs, turned into an [`Identity`] that handlers read from the
//! request and that outbound calls forward.
//!
//! With authentication disabled every caller is the configured local user; that is only allowed on a
//! loopback listen address unless `server.allow_insecure` is set (checked at start-up by the server).
//! Services call each other with a *service* principal that may name the user it acts for in the
//! `x-antler-user` metadata; a plain user's key can never do that. Services in one process call each
//! other without a token: the process's mark ([`crate::internal`]) makes such a call a service
//! principal acting for the user it names.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use http::{HeaderMap, Request, Response};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::error::ConfigError;

/// Metadata key a service principal uses to name the user it acts for.
pub const ACT_AS_HEADER: &str = "x-antler-user";

/// The `server.auth` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Require a bearer token on every call except health checks (and reflection, see below).
    pub enabled: bool,
    /// The user every call runs as while authentication is disabled.
    pub local_user: String,
    /// Static API keys.
    pub api_keys: Vec<ApiKeyConfig>,
    /// JSON Web Tokens signed by your identity provider.
    pub jwt: Option<JwtConfig>,
    /// Serve reflection (the schema, no data) without a token, so `grpcurl list` works.
    pub public_reflection: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self { enabled: false, local_user: "local".to_owned(), api_keys: Vec::new(), jwt: None, public_reflection: true }
    }
}

/// One static API key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The secret (at least 16 characters); write `$VAR` to keep it out of the file.
    pub key: String,
    /// The user id calls with this key run as.
    pub user: String,
    /// A service principal (another Antler service) may act for any user via `x-antler-user`.
    #[serde(default)]
    pub service: bool,
}

/// JWT verification settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// `HS256` (shared secret) or `RS256` (public key).
    pub algorithm: JwtAlgorithm,
    /// HS256 secret, at least 32 bytes.
    #[serde(default)]
    pub secret: String,
    /// RS256 public key in PEM, inline.
    #[serde(default)]
    pub public_key_pem: String,
    /// RS256 public key in PEM, from a file (used when `public_key_pem` is empty).
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
    /// The claim holding the user id.
    #[serde(default = "default_user_claim")]
    pub user_claim: String,
    /// Required `iss`, if set.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Required `aud`, if set.
    #[serde(default)]
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` / `nbf`, in seconds.
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
}

fn default_user_claim() -> String {
    "sub".to_owned()
}

fn default_leeway() -> u64 {
    30
}

/// Supported JWT signature algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JwtAlgorithm {
    HS256,
    RS256,
}

impl AuthConfig {
    pub(crate) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid { path: format!("{path}.{field}"), message };
        if !valid_user_id(&self.local_user) {
            return Err(invalid("local_user", format!("`{}` is not a valid user id (1-128 of A-Z a-z 0-9 _ . @ -)", self.local_user)));
        }
        if self.enabled && self.api_keys.is_empty() && self.jwt.is_none() {
            return Err(invalid("enabled", "authentication is enabled but neither api_keys nor jwt is configured".to_owned()));
        }
        for (i, key) in self.api_keys.iter().enumerate() {
            if key.key.chars().count() < 16 {
                return Err(invalid(&format!("api_keys[{i}].key"), "API keys must be at least 16 characters".to_owned()));
            }
            if !valid_user_id(&key.user) {
                return Err(invalid(&format!("api_keys[{i}].user"), format!("`{}` is not a valid user id", key.user)));
            }
        }
        if let Some(jwt) = &self.jwt {
            match jwt.algorithm {
                JwtAlgorithm::HS256 if jwt.secret.len() < 32 => {
                    return Err(invalid("jwt.secret", "HS256 needs a secret of at least 32 bytes".to_owned()));
                }
                JwtAlgorithm::RS256 if jwt.public_key_pem.is_empty() && jwt.public_key_file.is_none() => {
                    return Err(invalid("jwt.public_key_pem", "RS256 needs public_key_pem or public_key_file".to_owned()));
                }
                _ => {}
            }
            if jwt.user_claim.is_empty() {
                return Err(invalid("jwt.user_claim", "must name a claim".to_owned()));
            }
        }
        Ok(())
    }
}

/// User ids are used in paths and metadata: keep them to a safe alphabet.
pub fn valid_user_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
}

/// What kind of caller an [`Identity`] stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Authentication is disabled; the caller is the configured local user.
    Local,
    /// A user authenticated by API key or JWT.
    User,
    /// Another service, possibly acting for `user_id`; `service` is its own id.
    Service { service: String },
}

/// The authenticated caller of a request, available to handlers in the request extensions.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The user whose resources the call may touch.
    pub user_id: String,
    pub principal: Principal,
    /// The bearer token the call carried, forwarded on calls to other services.
    pub(crate) credential: Option<Arc<str>>,
}

impl Identity {
    /// The identity of the local user (authentication disabled).
    pub fn local(user_id: impl Into<String>) -> Self {
        Self { user_id: user_id.into(), principal: Principal::Local, credential: None }
    }

    /// Reads the identity the auth layer put on a request.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<&Identity, tonic::Status> {
        request
            .extensions()
            .get::<Identity>()
            .ok_or_else(|| tonic::Status::internal("no caller identity on the request: the auth layer is not installed"))
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing `authorization` metadata\nhint: send `authorization: Bearer <api key or JWT>`")]
    Missing,
    #[error("malformed `authorization` metadata: expected `Bearer <token>`")]
    Malformed,
    #[error("unknown API key\nhint: check the key, or ask an operator to add it to server.auth.api_keys")]
    UnknownKey,
    #[error("token expired\nhint: obtain a fresh token")]
    Expired,
    #[error("invalid token: {0}")]
    InvalidToken(String),
    #[error("`x-antler-user` may only be sent by a service principal")]
    ActAsForbidden,
    #[error("`x-antler-user` value is not a valid user id")]
    BadActAs,
}

impl AuthError {
    /// The gRPC status for this refusal.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            AuthError::ActAsForbidden => tonic::Status::permission_denied(self.to_string()),
            _ => tonic::Status::unauthenticated(self.to_string()),
        }
    }
}

struct KeyEntry {
    user: String,
    service: bool,
}

struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    user_claim: String,
}

struct State {
    enabled: bool,
    local_user: String,
    public_reflection: bool,
    /// API keys by their SHA-256, so a lookup does not compare secrets byte by byte.
    keys: HashMap<[u8; 32], KeyEntry>,
    jwt: Option<JwtVerifier>,
}

/// Turns request metadata into an [`Identity`]. Cheap to clone; [`Authenticator::reload`] swaps the
/// keys in place (for example when the config file changes) without restarting the server.
#[derive(Clone)]
pub struct Authenticator {
    state: Arc<RwLock<Arc<State>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Builds an authenticator; fails if a JWT key cannot be read or parsed.
    pub fn new(config: &AuthConfig) -> Result<Self, ConfigError> {
        Ok(Self { state: Arc::new(RwLock::new(Arc::new(build_state(config)?))) })
    }

    /// Replaces the keys and settings; requests already past the check are not affected.
    pub fn reload(&self, config: &AuthConfig) -> Result<(), ConfigError> {
        let state = Arc::new(build_state(config)?);
        *self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = state;
        Ok(())
    }

    /// Whether calls must carry a token.
    pub fn enabled(&self) -> bool {
        self.current().enabled
    }

    fn current(&self) -> Arc<State> {
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Whether `path` (`/package.Service/Method`) is served without a token.
    fn is_public(state: &State, path: &str) -> bool {
        path.starts_with("/grpc.health.v1.Health/") || (state.public_reflection && path.starts_with("/grpc.reflection."))
    }

    /// Authenticates one call from its metadata.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, AuthError> {
        Self::authenticate_with(&self.current(), headers)
    }

    fn authenticate_with(state: &State, headers: &HeaderMap) -> Result<Identity, AuthError> {
        if !state.enabled {
            return Ok(Identity::local(state.local_user.clone()));
        }
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Self::internal(headers);
        };
        let value = value.to_str().map_err(|_| AuthError::Malformed)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Malformed)?;

        let (user, service) = match (&state.jwt, looks_like_jwt(token)) {
            (Some(jwt), true) => (verify_jwt(jwt, token)?, false),
            _ => {
                let entry = state.keys.get(&<[u8; 32]>::from(Sha256::digest(token.as_bytes()))).ok_or(AuthError::UnknownKey)?;
                (entry.user.clone(), entry.service)
            }
        };
        let credential = Some(Arc::<str>::from(token));
        let act_as = headers.get(ACT_AS_HEADER).map(|v| v.to_str().map_err(|_| AuthError::BadActAs)).transpose()?;
        match (service, act_as) {
            (false, Some(_)) => Err(AuthError::ActAsForbidden),
            (false, None) => Ok(Identity { user_id: user, principal: Principal::User, credential }),
            (true, Some(acting)) if valid_user_id(acting) => {
                Ok(Identity { user_id: acting.to_owned(), principal: Principal::Service { service: user }, credential })
            }
            (true, Some(_)) => Err(AuthError::BadActAs),
            (true, None) => Ok(Identity { user_id: user.clone(), principal: Principal::Service { service: user }, credential }),
        }
    }
}

impl Authenticator {
    /// A call without a token: only this process may make one, acting for the user it names. Its
    /// services (`antler up`) then need no `service_token` to do background work for a user, which
    /// with auth on used to fail quietly at every call of a worker whose token was not configured.
    fn internal(headers: &HeaderMap) -> Result<Identity, AuthError> {
        if !crate::internal::is_mark(headers.get(crate::internal::INTERNAL_HEADER).map(|v| v.as_bytes())) {
            return Err(AuthError::Missing);
        }
        let acting = headers.get(ACT_AS_HEADER).ok_or(AuthError::Missing)?.to_str().map_err(|_| AuthError::BadActAs)?;
        if !valid_user_id(acting) {
            return Err(AuthError::BadActAs);
        }
        Ok(Identity {
            user_id: acting.to_owned(),
            principal: Principal::Service { service: INTERNAL_SERVICE.to_owned() },
            credential: None,
        })
    }
}

/// The service id of calls this process makes to itself without a token (see [`crate::internal`]).
pub const INTERNAL_SERVICE: &str = "antler-internal";

fn looks_like_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.matches('.').count() == 2
}

fn verify_jwt(jwt: &JwtVerifier, token: &str) -> Result<String, AuthError> {
    use jsonwebtoken::errors::ErrorKind;
    let data =
        jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &jwt.key, &jwt.validation).map_err(|err| {
            match err.kind() {
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::InvalidSignature => AuthError::InvalidToken("signature does not verify".to_owned()),
                ErrorKind::ImmatureSignature => AuthError::InvalidToken("token is not valid yet (nbf)".to_owned()),
                ErrorKind::InvalidIssuer => AuthError::InvalidToken("wrong issuer (iss)".to_owned()),
                ErrorKind::InvalidAudience => AuthError::InvalidToken("wrong audience (aud)".to_owned()),
                ErrorKind::InvalidAlgorithm => AuthError::InvalidToken("unexpected signature algorithm".to_owned()),
                ErrorKind::MissingRequiredClaim(claim) => AuthError::InvalidToken(format!("missing required claim `{claim}`")),
                _ => AuthError::InvalidToken(err.to_string()),
            }
        })?;
    match data.claims.get(&jwt.user_claim) {
        Some(serde_json::Value::String(user)) if valid_user_id(user) => Ok(user.clone()),
        Some(_) => Err(AuthError::InvalidToken(format!("claim `{}` is not a valid user id", jwt.user_claim))),
        None => Err(AuthError::InvalidToken(format!("missing user claim `{}`", jwt.user_claim))),
    }
}

fn build_state(config: &AuthConfig) -> Result<State, ConfigError> {
    config.validate("server.auth")?;
    let keys = config
        .api_keys
        .iter()
        .map(|k| (Sha256::digest(k.key.as_bytes()).into(), KeyEntry { user: k.user.clone(), service: k.service }))
        .collect();
    let jwt = config.jwt.as_ref().map(build_jwt).transpose()?;
    Ok(State { enabled: config.enabled, local_user: config.local_user.clone(), public_reflection: config.public_reflection, keys, jwt })
}

fn build_jwt(config: &JwtConfig) -> Result<JwtVerifier, ConfigError> {
    let invalid = |field: &str, message: String| ConfigError::Invalid { path: format!("server.auth.jwt.{field}"), message };
    let (key, algorithm) = match config.algorithm {
        JwtAlgorithm::HS256 => {
            let key = DecodingKey::from_secret(config.secret.as_bytes()).map_err(|e| invalid("secret", e.to_string()))?;
            (key, Algorithm::HS256)
        }
        JwtAlgorithm::RS256 => {
            let pem = if config.public_key_pem.is_empty() {
                let path = config.public_key_file.as_ref().ok_or_else(|| invalid("public_key_file", "not set".to_owned()))?;
                std::fs::read(path).map_err(|e| invalid("public_key_file", format!("cannot read {}: {e}", path.display())))?
            } else {
                config.public_key_pem.as_bytes().to_vec()
            };
            let key =
                DecodingKey::from_rsa_pem(&pem).map_err(|e| invalid("public_key_pem", format!("not an RSA public key in PEM: {e}")))?;
            (key, Algorithm::RS256)
        }
    };
    let mut validation = Validation::new(algorithm);
    validation.leeway = config.leeway_secs;
    validation.validate_nbf = true;
    match &config.audience {
        Some(aud) => validation.set_audience(&[aud]),
        None => validation.validate_aud = false,
    }
    if let Some(iss) = &config.issuer {
        validation.set_issuer(&[iss]);
    }
    Ok(JwtVerifier { key, validation, user_claim: config.user_claim.clone() })
}

/// Tower layer that authenticates every request and puts the [`Identity`] in its extensions.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    auth: Authenticator,
}

impl AuthLayer {
    pub fn new(auth: Authenticator) -> Self {
        Self { auth }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AuthService { inner, auth: self.auth.clone() }
    }
}

/// See [`AuthLayer`].
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    auth: Authenticator,
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for AuthService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<ResBody>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let state = self.auth.current();
        let result = if Authenticator::is_public(&state, request.uri().path()) {
            Ok(Identity::local(state.local_user.clone()))
        } else {
            Authenticator::authenticate_with(&state, request.headers())
        };
        match result {
            Ok(identity) => {
                request.extensions_mut().insert(identity);
                Either::Right(self.inner.call(request))
            }
            Err(error) => {
                tracing::debug!(%error, path = request.uri().path(), "request refused by authentication");
                metrics::counter!("antler_auth_failures_total").increment(1);
                Either::Left(ready(Ok(error.to_status().into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests;
