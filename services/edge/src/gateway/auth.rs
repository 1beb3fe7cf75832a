//! `/api/v1/auth/*`: what DeerFlow's UI asks before anything else (who am I, which sign-in providers,
//! is set-up needed) and its local sign-in / sign-out. How a browser session maps onto Antler's users
//! is in `session.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use antler_kit::auth::Principal;
use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::session;
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::read_body;

/// The sign-in routes: served without credentials (login checks the one it is given).
pub fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/api/v1/auth/login/local"
            | "/api/v1/auth/logout"
            | "/api/v1/auth/providers"
            | "/api/v1/auth/setup-status"
            | "/api/v1/auth/register"
            | "/api/v1/auth/initialize"
    ) || path.starts_with("/api/v1/auth/oauth/")
        || path.starts_with("/api/v1/auth/callback/")
}

/// DeerFlow's `UserResponse` for an Antler user. Antler has no roles: skills and memory are per user
/// and the MCP service checks its own operators, so every signed-in user is `admin` to the UI (which
/// only uses the role to show controls). The email is the user id when it is one, else
/// `<id>@antler.local` (the UI requires an email-shaped value).
fn user_json(user_id: &str) -> Value {
    let email = if user_id.contains('@') && user_id.rsplit('@').next().is_some_and(|d| d.contains('.')) {
        user_id.to_owned()
    } else {
        format!("{user_id}@antler.local")
    };
    json!({ "id": user_id, "email": email, "system_role": "admin", "needs_setup": false, "oauth_provider": null })
}

/// `GET /api/v1/auth/me`: the caller. With auth off, the local user (DeerFlow's auth-disabled mode
/// answers its synthetic user the same way); without a credential the gate has already answered 401.
pub async fn me(Extension(caller): Extension<Caller>) -> Response {
    json_response(&user_json(&caller.identity.user_id))
}

/// `GET /api/v1/auth/providers`: no single sign-on providers (a JWT of your identity provider is
/// accepted as the password instead).
pub async fn providers() -> Response {
    json_response(&json!({ "providers": [] }))
}

/// `GET /api/v1/auth/setup-status`: never needs set-up (users come from `server.auth`), and no
/// self-registration.
pub async fn setup_status() -> Response {
    json_response(&json!({ "needs_setup": false, "registration_enabled": false }))
}

/// DeerFlow's auth error body: `{"detail": {"code", "message"}}`, which the UI's login page reads.
fn auth_error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = (status, crate::json::json_body(&json!({ "detail": { "code": code, "message": message } }))).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `POST /api/v1/auth/login/local` (a form, as OAuth2's password grant: `username`, `password`,
/// `remember_me`). The password is an Antler credential: an API key of `server.auth.api_keys` or a
/// JWT. It is checked exactly as a gRPC call's bearer token; the username is not (the credential names
/// the user). Service keys (`service: true`) cannot sign a browser in. Answers DeerFlow's
/// `{expires_in, needs_setup}` with the session cookies. Failed sign-ins are bounded per username and
/// client address (`login_limit.rs`): past the bound, 429 with `Retry-After`. With auth off any
/// password signs in as the local user.
pub async fn login(
    State(edge): State<Arc<Edge>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, edge.config.max_body_bytes).await?;
    let form: Vec<(String, String)> = form_urlencoded::parse(&bytes).into_owned().collect();
    let field = |name: &str| form.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.trim().to_owned());
    let remember = match field("remember_me").as_deref() {
        None | Some("" | "true" | "True" | "1" | "on") => true,
        Some("false" | "False" | "0" | "off") => false,
        Some(other) => return Err(ApiError::invalid("remember_me", format!("`{other}` is not true or false"))),
    };
    let password = field("password").unwrap_or_default();
    let session_value = if edge.auth.enabled() {
        // Bounded guessing: past `edge.gateway.auth`'s failures the credential is not even checked.
        let username = field("username").unwrap_or_default();
        let address = edge.logins.client_address(&headers, peer.map(|Extension(ConnectInfo(addr))| addr.ip()));
        if let Err(throttled) = edge.logins.check(&username, address, Instant::now()) {
            tracing::warn!(what = %throttled.what, retry_after_secs = throttled.retry_after_secs, "browser sign-ins throttled");
            let mut response = auth_error(StatusCode::TOO_MANY_REQUESTS, "too_many_attempts", &throttled.message());
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(throttled.retry_after_secs));
            return Ok(response);
        }
        if password.is_empty() {
            return Err(ApiError::invalid("password", "is required: your Antler API key (or a JWT your identity provider signed)"));
        }
        let mut probe = HeaderMap::new();
        let bearer = HeaderValue::from_str(&format!("Bearer {password}"))
            .map_err(|_| ApiError::invalid("password", "holds characters a credential cannot have"))?;
        probe.insert(header::AUTHORIZATION, bearer);
        let identity = match edge.auth.authenticate(&probe) {
            Ok(identity) => identity,
            Err(error) => {
                tracing::debug!(%error, "browser sign-in refused");
                metrics::counter!("antler_auth_failures_total").increment(1);
                edge.logins.failed(&username, address, Instant::now());
                return Ok(auth_error(
                    StatusCode::UNAUTHORIZED,
                    "invalid_credentials",
                    "Incorrect credentials: the password must be an Antler API key or JWT",
                ));
            }
        };
        if identity.principal != Principal::User {
            return Ok(auth_error(
                StatusCode::FORBIDDEN,
                "invalid_credentials",
                "A service key cannot sign a browser in: use a user's API key",
            ));
        }
        tracing::info!(user = %identity.user_id, "browser signed in");
        session::encode_credential(&password)
    } else {
        session::LOCAL_SESSION.to_owned()
    };
    let max_age = remember.then_some(edge.config.gateway.session_max_age_secs);
    let secure = session::is_secure(&headers);
    let mut response = json_response(&json!({ "expires_in": edge.config.gateway.session_max_age_secs, "needs_setup": false }));
    for cookie in session::set_cookies(&session_value, &session::random_token(), max_age, secure) {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    Ok(response)
}

/// `POST /api/v1/auth/logout`: clears the session cookies.
pub async fn logout(headers: HeaderMap) -> Response {
    let mut response = json_response(&json!({ "message": "Successfully logged out" }));
    for cookie in session::clear_cookies(session::is_secure(&headers)) {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_get_an_email_shaped_address() {
        assert_eq!(user_json("alice")["email"], "alice@antler.local");
        assert_eq!(user_json("bob@example.com")["email"], "bob@example.com");
        assert_eq!(user_json("local")["system_role"], "admin");
    }
}
