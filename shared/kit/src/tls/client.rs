//! The client side: a rustls client configuration rebuilt when its files change, and the tonic
//! connector that uses the current one for each new connection.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls_platform_verifier::BuilderVerifierExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use super::server::ServerState;
use super::{ClientTlsConfig, Fields, ServerTls, TlsError, alpn, is_set, pem, pinned, provider, reload};

/// Whom the client trusts.
#[derive(Clone)]
enum Trust {
    /// The CA certificates of a file.
    Ca { field: String, path: PathBuf },
    /// The operating system's roots.
    System,
    /// Exactly the certificate this process's own server presents.
    OwnServer(watch::Receiver<Arc<ServerState>>),
}

/// The certificate the client presents, if any.
#[derive(Clone)]
struct Identity {
    cert_field: String,
    cert: PathBuf,
    key_field: String,
    key: PathBuf,
}

/// TLS for one outbound channel: the current rustls configuration and the name to verify.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: watch::Receiver<Arc<rustls::ClientConfig>>,
    server_name: Option<ServerName<'static>>,
}

impl ClientTls {
    /// TLS to a server in another process (an `https://` endpoint, or `antler run --addr https://…`).
    /// `fields` names the settings in errors; the files are polled every `interval` (zero: never) until
    /// `shutdown` or until every channel made from this is gone.
    pub fn load(
        settings: &ClientTlsConfig,
        fields: &Fields,
        interval: Duration,
        shutdown: Option<&CancellationToken>,
    ) -> Result<Self, TlsError> {
        let trust = if is_set(&settings.ca) { Trust::Ca { field: fields.name("ca"), path: settings.ca.clone() } } else { Trust::System };
        Self::with(settings, fields, trust, own_identity(settings, fields), interval, shutdown)
    }

    /// TLS to this process's own server (`antler up`'s clients with an empty endpoint): see the module
    /// documentation for the defaults.
    pub fn for_own_server(
        settings: &ClientTlsConfig,
        fields: &Fields,
        server: &ServerTls,
        interval: Duration,
        shutdown: Option<&CancellationToken>,
    ) -> Result<Self, TlsError> {
        let trust = if is_set(&settings.ca) {
            Trust::Ca { field: fields.name("ca"), path: settings.ca.clone() }
        } else {
            Trust::OwnServer(server.state())
        };
        let identity = match own_identity(settings, fields) {
            Some(identity) => Some(identity),
            // The server asks every connection for a certificate, this one included: present the
            // server's own, as a one-certificate install would.
            None if server.mutual() => Some(Identity {
                cert_field: "server.tls.cert".to_owned(),
                cert: server.settings().cert.clone(),
                key_field: "server.tls.key".to_owned(),
                key: server.settings().key.clone(),
            }),
            None => None,
        };
        Self::with(settings, fields, trust, identity, interval, shutdown)
    }

    fn with(
        settings: &ClientTlsConfig,
        fields: &Fields,
        trust: Trust,
        identity: Option<Identity>,
        interval: Duration,
        shutdown: Option<&CancellationToken>,
    ) -> Result<Self, TlsError> {
        let server_name = if settings.server_name.is_empty() {
            None
        } else {
            Some(ServerName::try_from(settings.server_name.clone()).map_err(|e| TlsError::Setup {
                field: fields.name("server_name"),
                message: format!("`{}` is neither a DNS name nor an IP address: {e}", settings.server_name),
            })?)
        };
        let mut files = Vec::new();
        if let Trust::Ca { path, .. } = &trust {
            files.push(path.clone());
        }
        if let Some(identity) = &identity {
            files.extend([identity.cert.clone(), identity.key.clone()]);
        }
        let label = match fields {
            Fields::Yaml(prefix) => prefix.clone(),
            Fields::Flags => "command line".to_owned(),
        };
        let ca_field = fields.name("ca");
        let config =
            reload::load_and_watch(label, files, interval, move || build(&trust, identity.as_ref(), &ca_field), shutdown.cloned())?;
        Ok(Self { config, server_name })
    }

    /// The rustls configuration in force now (for a client that cannot follow reloads).
    pub fn current_config(&self) -> Arc<rustls::ClientConfig> {
        self.config.borrow().clone()
    }

    /// The tonic connector (TCP, then the TLS handshake with the current configuration).
    pub fn connector(&self) -> Connector {
        Connector { tls: self.clone() }
    }

    /// A lazily connecting channel to `endpoint` (whose URI should be `https://`) over TLS.
    pub fn channel(&self, endpoint: Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(self.connector())
    }

    /// A channel to `endpoint`, connected now.
    pub async fn connect(&self, endpoint: Endpoint) -> Result<Channel, tonic::transport::Error> {
        endpoint.connect_with_connector(self.connector()).await
    }
}

fn own_identity(settings: &ClientTlsConfig, fields: &Fields) -> Option<Identity> {
    is_set(&settings.cert).then(|| Identity {
        cert_field: fields.name("cert"),
        cert: settings.cert.clone(),
        key_field: fields.name("key"),
        key: settings.key.clone(),
    })
}

/// Builds the client configuration; `ca_field` names the CA setting in errors that are about trust.
fn build(trust: &Trust, identity: Option<&Identity>, ca_field: &str) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup { field: ca_field.to_owned(), message: e.to_string() })?;
    let builder = match trust {
        Trust::Ca { field, path } => builder.with_root_certificates(pem::roots(field, path)?),
        Trust::System => builder.with_platform_verifier().map_err(|e| TlsError::Setup {
            field: ca_field.to_owned(),
            message: format!(
                "is empty and the operating system's certificate store cannot be used: {e}\nhint: name the server's CA in {ca_field}"
            ),
        })?,
        Trust::OwnServer(server) => {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(pinned::OwnCertificate::new(server.clone())))
        }
    };
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = pem::certs(&id.cert_field, &id.cert)?;
            let key = pem::key(&id.key_field, &id.key)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| pem::pair_error(e, &id.cert_field, &id.cert, &id.key_field, &id.key))?
        }
    };
    config.alpn_protocols = alpn();
    Ok(config)
}

/// Connects TCP to the URI's host and port (443 when absent), then runs the TLS handshake with the
/// configuration current at that moment.
#[derive(Debug, Clone)]
pub struct Connector {
    tls: ClientTls,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.tls.config.borrow().clone();
        let server_name = self.tls.server_name.clone();
        Box::pin(async move {
            let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidInput, message);
            let host = uri.host().ok_or_else(|| invalid(format!("`{uri}` has no host")))?;
            // An IPv6 literal comes bracketed from the URI.
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = match server_name {
                Some(name) => name,
                None => ServerName::try_from(host.clone())
                    .map_err(|e| invalid(format!("`{host}` is not a name a certificate can carry: {e}")))?,
            };
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            // Without TCP_NODELAY the last frames of a streamed call wait on a delayed ACK (~40 ms).
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    }
}
