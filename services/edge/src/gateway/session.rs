//! The browser session DeerFlow's UI keeps: an HttpOnly `access_token` cookie and a `csrf_token`
//! cookie the page echoes as `X-CSRF-Token` on every state-changing request (double submit).
//!
//! With `server.auth` on, `POST /api/v1/auth/login/local` checks the password field as an Antler
//! credential (an API key of `server.auth.api_keys`, or a JWT your identity provider signed) exactly
//! as the gRPC stack does, and answers with the two cookies. The `access_token` cookie carries that
//! credential (base64url, so any key fits a cookie), HttpOnly so page scripts cannot read it. The
//! edge's gate then accepts it where a request has no `Authorization` or `x-api-key`: the request runs
//! as the credential's user, with the same per-user isolation as every RPC (the credential is what is
//! forwarded to the services). A state-changing request authenticated by the cookie must carry
//! `X-CSRF-Token` equal to the `csrf_token` cookie, else 403: another site's page can make the browser
//! send the cookies but cannot read `csrf_token` to echo it. Nothing is kept on the server, so every
//! edge replica accepts every session; logging out clears the cookies (the key itself stays valid
//! until an operator removes it, as with any bearer credential).
//!
//! With `server.auth` off every request is the local user: cookies are set (the UI's server side
//! looks for `access_token` before it calls `/api/v1/auth/me`) but never read.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use base64::Engine;

use crate::error::ApiError;

/// The session cookie (DeerFlow's name).
pub const ACCESS_COOKIE: &str = "access_token";
/// The double-submit cookie (DeerFlow's name), readable by the page.
pub const CSRF_COOKIE: &str = "csrf_token";
/// The header the page echoes the CSRF cookie in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// What the session cookie holds when authentication is off (nothing is read from it then).
pub const LOCAL_SESSION: &str = "local";

/// The value of cookie `name`, if the request sent it.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim_matches('"'))
}

/// The credential as it travels in the cookie.
pub fn encode_credential(credential: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(credential.as_bytes())
}

fn decode_credential(value: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(value).ok()?;
    String::from_utf8(bytes).ok().filter(|c| !c.is_empty())
}

fn state_changing(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE)
}

/// Equal without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The headers to authenticate a request with when its credential is the session cookie: a copy
/// with `Authorization: Bearer <credential>`. None when the request carries its own `Authorization`
/// or `x-api-key` (those win, and need no CSRF token), has no session cookie, or authentication is off.
/// A state-changing request authenticated by the cookie must echo `csrf_token` as `X-CSRF-Token`.
pub fn cookie_headers(auth_enabled: bool, method: &Method, headers: &HeaderMap) -> Result<Option<HeaderMap>, ApiError> {
    if !auth_enabled || headers.contains_key(header::AUTHORIZATION) || headers.contains_key("x-api-key") {
        return Ok(None);
    }
    let Some(value) = cookie(headers, ACCESS_COOKIE) else { return Ok(None) };
    let credential = decode_credential(value)
        .ok_or_else(|| ApiError::unauthenticated("the access_token cookie is not a session this server issued\nhint: sign in again"))?;
    if state_changing(method) {
        let expected = cookie(headers, CSRF_COOKIE).unwrap_or_default();
        let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
        if expected.is_empty() || !same(expected.as_bytes(), sent.as_bytes()) {
            return Err(ApiError {
                status: StatusCode::FORBIDDEN,
                ..ApiError::unauthenticated(
                    "CSRF token missing or invalid: a request signed in by the session cookie must send the csrf_token cookie's value as X-CSRF-Token",
                )
            });
        }
    }
    let bearer = HeaderValue::from_str(&format!("Bearer {credential}"))
        .map_err(|_| ApiError::unauthenticated("the access_token cookie holds characters a credential cannot have\nhint: sign in again"))?;
    let mut effective = headers.clone();
    effective.insert(header::AUTHORIZATION, bearer);
    Ok(Some(effective))
}

/// A fresh random token (the CSRF cookie's value), from the operating system's random source.
pub fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Whether the browser reached the edge over TLS (directly, or through a proxy that says so): then
/// the cookies are marked `Secure`.
pub fn is_secure(headers: &HeaderMap) -> bool {
    let forwarded = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).unwrap_or_default();
    forwarded.split(',').next().is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        || headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).is_some_and(|o| o.starts_with("https://"))
}

/// The `Set-Cookie` values a sign-in answers with: the session (HttpOnly, SameSite=Lax, so a link from
/// another site still opens the UI signed in) and the CSRF token (readable by the page, SameSite=Strict).
/// `max_age` None: the cookies end with the browser session.
pub fn set_cookies(session: &str, csrf: &str, max_age: Option<u64>, secure: bool) -> [String; 2] {
    let age = max_age.map(|a| format!("; Max-Age={a}")).unwrap_or_default();
    let secure = if secure { "; Secure" } else { "" };
    [
        format!("{ACCESS_COOKIE}={session}; Path=/; HttpOnly; SameSite=Lax{age}{secure}"),
        format!("{CSRF_COOKIE}={csrf}; Path=/; SameSite=Strict{age}{secure}"),
    ]
}

/// The `Set-Cookie` values that end a session.
pub fn clear_cookies(secure: bool) -> [String; 2] {
    let secure = if secure { "; Secure" } else { "" };
    [
        format!("{ACCESS_COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{secure}"),
        format!("{CSRF_COOKIE}=; Path=/; SameSite=Strict; Max-Age=0{secure}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"), HeaderValue::from_str(v).expect("value"));
        }
        map
    }

    #[test]
    fn the_cookie_stands_for_the_bearer_credential() {
        let session = encode_credential("alice-key-0123456789");
        let cookie = format!("other=1; {ACCESS_COOKIE}={session}; {CSRF_COOKIE}=abc");
        let got = cookie_headers(true, &Method::GET, &headers(&[("cookie", &cookie)])).expect("accepted").expect("a credential");
        assert_eq!(got.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()), Some("Bearer alice-key-0123456789"));
        // A request's own credential wins, and auth off reads no cookie.
        assert!(cookie_headers(true, &Method::POST, &headers(&[("cookie", &cookie), ("x-api-key", "k")])).expect("ok").is_none());
        assert!(cookie_headers(false, &Method::POST, &headers(&[("cookie", &cookie)])).expect("ok").is_none());
    }

    #[test]
    fn state_changing_requests_must_echo_the_csrf_cookie() {
        let session = encode_credential("alice-key-0123456789");
        let cookie = format!("{ACCESS_COOKIE}={session}; {CSRF_COOKIE}=abc");
        let refused = cookie_headers(true, &Method::POST, &headers(&[("cookie", &cookie)]));
        assert!(matches!(refused, Err(ref e) if e.status == StatusCode::FORBIDDEN), "{refused:?}");
        let wrong = cookie_headers(true, &Method::DELETE, &headers(&[("cookie", &cookie), (CSRF_HEADER, "abd")]));
        assert!(matches!(wrong, Err(ref e) if e.status == StatusCode::FORBIDDEN));
        let good = cookie_headers(true, &Method::PUT, &headers(&[("cookie", &cookie), (CSRF_HEADER, "abc")]));
        assert!(matches!(good, Ok(Some(_))));
        // No CSRF cookie at all: nothing to compare with.
        let bare = format!("{ACCESS_COOKIE}={session}");
        assert!(cookie_headers(true, &Method::PATCH, &headers(&[("cookie", &bare), (CSRF_HEADER, "")])).is_err());
    }

    #[test]
    fn a_cookie_that_is_not_ours_is_refused() {
        let refused = cookie_headers(true, &Method::GET, &headers(&[("cookie", "access_token=%%%")]));
        assert!(matches!(refused, Err(ref e) if e.status == StatusCode::UNAUTHORIZED));
    }
}
