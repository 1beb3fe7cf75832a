//! TLS for the gRPC server and for the clients between services (`server.tls`, `clients.<service>.tls`),
//! through rustls.
//!
//! tonic's own `ServerTlsConfig` / `ClientTlsConfig` (its `tls-*` features) are not used: both build their
//! rustls configuration once, and certificates must be replaced without a restart (cert-manager, a rotated
//! Kubernetes Secret). So the server accepts through `serve_with_incoming` with a tokio-rustls acceptor that
//! takes the *current* rustls configuration for each new connection ([`ServerTls`]), and clients connect
//! through a connector that does the same ([`ClientTls`]). A reload gives new connections the new
//! certificates; open connections keep the ones they were made with. The files are polled (size + mtime,
//! then a content hash) like `antler.yaml` is, every `server.tls.reload_interval_ms`.
//!
//! Which clients speak TLS:
//! * an `https://` endpoint: verified against `ca` (else the operating system's roots), presenting
//!   `cert`/`key` when given (mTLS), the certificate's name checked against `server_name` (else the
//!   endpoint's host);
//! * an empty endpoint (this very process, `antler up`) when `server.tls` is on: `https://` to the
//!   loopback address. With no `ca` the client accepts exactly the certificate its own server presents
//!   (see [`pinned`]), so an all-in-one install needs no client TLS settings and no certificate name for
//!   the loopback address; with a `ca`, the usual checks apply (`server_name`, else the loopback IP). When
//!   the server asks for client certificates it presents `cert`/`key`, else the server's own pair (which
//!   the `client_ca` must then have issued, with the clientAuth usage);
//! * an `http://` endpoint: plaintext (and any `tls` setting there is a configuration error).

mod client;
pub mod error;
mod pem;
mod pinned;
mod reload;
mod server;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};

pub use client::{ClientTls, Connector};
pub use server::{ServerTls, TlsConn};

pub use error::TlsError;

use crate::config::error::{ConfigError, check_range};

/// The `server.tls` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM certificate chain the server presents, leaf first. Empty (the default): plaintext gRPC.
    pub cert: PathBuf,
    /// PEM private key of `cert`: PKCS#8, PKCS#1 (RSA) or SEC1 (EC), unencrypted.
    pub key: PathBuf,
    /// PEM CA certificates client certificates must chain to. Set: every connection must present one (mTLS).
    pub client_ca: PathBuf,
    /// Refuse to start on a non-loopback address without TLS (otherwise a warning is logged). Loopback
    /// addresses may always serve plaintext.
    pub required: bool,
    /// How often these files and every `clients.*.tls` file are checked for changes, in milliseconds
    /// (0 = never: a restart picks new certificates up).
    pub reload_interval_ms: u64,
    /// Longest TLS handshake, in milliseconds; a connection that takes longer is closed.
    pub handshake_timeout_ms: u64,
}

impl Default for ServerTlsConfig {
    fn default() -> Self {
        Self {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            client_ca: PathBuf::new(),
            required: false,
            reload_interval_ms: 5_000,
            handshake_timeout_ms: 10_000,
        }
    }
}

/// `clients.<service>.tls`: how one outbound channel checks its server and proves who it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTlsConfig {
    /// PEM CA certificates the server's certificate must chain to. Empty: the operating system's roots
    /// for an `https://` endpoint; exactly the server's own certificate for this process's own server.
    pub ca: PathBuf,
    /// PEM client certificate chain, for a server that asks for one (mTLS). Needs `key`.
    pub cert: PathBuf,
    /// PEM private key of `cert`.
    pub key: PathBuf,
    /// The name the server's certificate must carry (a DNS name or an IP address). Empty: the
    /// endpoint's host.
    pub server_name: String,
}

fn is_set(path: &Path) -> bool {
    !path.as_os_str().is_empty()
}

impl ServerTlsConfig {
    /// Whether the server serves TLS.
    pub fn enabled(&self) -> bool {
        is_set(&self.cert)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |path: &str, message: &str| Err(ConfigError::Invalid { path: path.to_owned(), message: message.to_owned() });
        match (is_set(&self.cert), is_set(&self.key)) {
            (true, false) => {
                return invalid(
                    "server.tls.key",
                    "is empty but server.tls.cert is set\nhint: give the certificate chain and its private key, or neither for plaintext",
                );
            }
            (false, true) => {
                return invalid(
                    "server.tls.cert",
                    "is empty but server.tls.key is set\nhint: give the certificate chain and its private key, or neither for plaintext",
                );
            }
            _ => {}
        }
        if is_set(&self.client_ca) && !self.enabled() {
            return invalid(
                "server.tls.client_ca",
                "needs server.tls.cert and server.tls.key: client certificates are only asked for over TLS",
            );
        }
        check_range("server.tls.reload_interval_ms", self.reload_interval_ms, 0, 3_600_000)?;
        check_range("server.tls.handshake_timeout_ms", self.handshake_timeout_ms, 1, 600_000)?;
        Ok(())
    }
}

impl ClientTlsConfig {
    /// Whether no setting is given.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Checks the settings themselves; `fields` names them in errors.
    pub fn validate(&self, fields: &Fields) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| Err(ConfigError::Invalid { path: fields.name(key), message });
        match (is_set(&self.cert), is_set(&self.key)) {
            (true, false) => {
                return invalid(
                    "key",
                    format!("is empty but {} is set\nhint: a client certificate needs its private key", fields.name("cert")),
                );
            }
            (false, true) => {
                return invalid(
                    "cert",
                    format!("is empty but {} is set\nhint: a client private key needs its certificate", fields.name("key")),
                );
            }
            _ => {}
        }
        if !self.server_name.is_empty() && ServerName::try_from(self.server_name.as_str()).is_err() {
            return invalid("server_name", format!("`{}` is neither a DNS name nor an IP address", self.server_name));
        }
        Ok(())
    }
}

/// How errors name a client setting: by its YAML path (`clients.models.tls.ca`) or as a command-line
/// flag (`--ca`, for `antler run`).
#[derive(Debug, Clone)]
pub enum Fields {
    Yaml(String),
    Flags,
}

impl Fields {
    /// The name of setting `key` (`ca`, `cert`, `key`, `server_name`).
    pub fn name(&self, key: &str) -> String {
        match self {
            Fields::Yaml(prefix) => format!("{prefix}.{key}"),
            Fields::Flags => format!("--{}", key.replace('_', "-")),
        }
    }
}

/// The crypto provider, always named explicitly: the dependency tree compiles both aws-lc-rs and ring
/// into rustls, so rustls cannot choose a process-wide default by itself.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider())).clone()
}

/// gRPC runs over HTTP/2 only; gRPC clients (grpc-go, grpcio) insist on this ALPN answer.
pub(crate) fn alpn() -> Vec<Vec<u8>> {
    vec![b"h2".to_vec()]
}

#[cfg(test)]
mod tests;
