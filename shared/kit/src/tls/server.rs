//! The server side: the current rustls configuration, and the stream of TLS connections tonic serves.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::{ServerTlsConfig, TlsError, alpn, is_set, pem, provider, reload};

/// Handshakes counted by outcome (`ok`, `failed`, `timeout`).
pub const HANDSHAKES: &str = "antler_tls_handshakes_total";

/// Handshakes in progress at once. Beyond it the accept loop waits, and new connections queue in the
/// kernel's listen backlog, so slow or hostile clients cannot make the server hold unbounded state.
const MAX_HANDSHAKES: usize = 512;

/// Finished connections waiting for tonic to take them. tonic takes each at once; while it does not
/// (shutdown), finished handshakes wait here and then hold their permit.
const READY_QUEUE: usize = 64;

/// One loaded certificate set.
pub(crate) struct ServerState {
    pub config: Arc<rustls::ServerConfig>,
    /// The chain presented, leaf first (never empty).
    pub chain: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState").field("chain_len", &self.chain.len()).finish_non_exhaustive()
    }
}

/// The server's TLS: the rustls configuration for new connections, rebuilt when the files change.
#[derive(Debug, Clone)]
pub struct ServerTls {
    state: watch::Receiver<Arc<ServerState>>,
    handshake_timeout: Duration,
    settings: ServerTlsConfig,
}

impl ServerTls {
    /// Loads `server.tls` (None when it has no certificate: plaintext) and polls its files every
    /// `interval` (zero: never) until `shutdown`.
    pub fn load(config: &ServerTlsConfig, interval: Duration, shutdown: Option<&CancellationToken>) -> Result<Option<Self>, TlsError> {
        if !config.enabled() {
            return Ok(None);
        }
        let mut files = vec![config.cert.clone(), config.key.clone()];
        if is_set(&config.client_ca) {
            files.push(config.client_ca.clone());
        }
        let settings = config.clone();
        let state = reload::load_and_watch("server.tls".to_owned(), files, interval, move || build(&settings), shutdown.cloned())?;
        Ok(Some(Self { state, handshake_timeout: Duration::from_millis(config.handshake_timeout_ms), settings: config.clone() }))
    }

    /// Whether clients must present a certificate (`server.tls.client_ca`).
    pub fn mutual(&self) -> bool {
        is_set(&self.settings.client_ca)
    }

    /// The settings it was loaded from.
    pub fn settings(&self) -> &ServerTlsConfig {
        &self.settings
    }

    /// The certificate presented to new connections now (the leaf).
    pub fn current_leaf(&self) -> CertificateDer<'static> {
        self.state.borrow().chain[0].clone()
    }

    pub(crate) fn state(&self) -> watch::Receiver<Arc<ServerState>> {
        self.state.clone()
    }

    /// TLS connections accepted on `listener`, handshakes done in their own tasks (at most
    /// [`MAX_HANDSHAKES`] at once, each bounded by `server.tls.handshake_timeout_ms`). Accepting stops
    /// when `shutdown` is cancelled or the stream is dropped.
    pub fn incoming(&self, listener: TcpListener, shutdown: CancellationToken) -> ReceiverStream<Result<TlsConn, io::Error>> {
        let (tx, rx) = mpsc::channel(READY_QUEUE);
        let task = accept_loop(listener, self.state.clone(), self.handshake_timeout, tx, shutdown);
        tokio::spawn(tracing::Instrument::instrument(task, tracing::info_span!("tls_accept")));
        ReceiverStream::new(rx)
    }
}

fn build(config: &ServerTlsConfig) -> Result<ServerState, TlsError> {
    let chain = pem::certs("server.tls.cert", &config.cert)?;
    let key: PrivateKeyDer<'static> = pem::key("server.tls.key", &config.key)?;
    let setup = |field: &str, e: &dyn std::fmt::Display| TlsError::Setup { field: field.to_owned(), message: e.to_string() };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| setup("server.tls", &e))?;
    let builder = if is_set(&config.client_ca) {
        let roots = pem::roots("server.tls.client_ca", &config.client_ca)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider()).build().map_err(|e| TlsError::Rejected {
            field: "server.tls.client_ca".to_owned(),
            path: config.client_ca.clone(),
            message: e.to_string(),
        })?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut server = builder
        .with_single_cert(chain.clone(), key)
        .map_err(|e| pem::pair_error(e, "server.tls.cert", &config.cert, "server.tls.key", &config.key))?;
    server.alpn_protocols = alpn();
    Ok(ServerState { config: Arc::new(server), chain })
}

async fn accept_loop(
    listener: TcpListener,
    state: watch::Receiver<Arc<ServerState>>,
    timeout: Duration,
    ready: mpsc::Sender<Result<TlsConn, io::Error>>,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    // Dropped with this loop: no handshake outlives the listener.
    let mut handshakes = JoinSet::new();
    loop {
        while handshakes.try_join_next().is_some() {}
        let permit = tokio::select! {
            () = shutdown.cancelled() => return,
            () = ready.closed() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            () = ready.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: retrying at once would spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Without TCP_NODELAY the last frames of a streamed reply wait on a delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(state.borrow().config.clone());
        let ready = ready.clone();
        let handshake = async move {
            let _permit = permit;
            let info = TcpConnectInfo { local_addr: tcp.local_addr().ok(), remote_addr: Some(peer) };
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    metrics::counter!(HANDSHAKES, "outcome" => "ok").increment(1);
                    let _ = ready.send(Ok(TlsConn { inner: stream, info })).await;
                }
                // A client's mistake (plaintext, an unknown CA, no client certificate) or a port scan:
                // debug, not warn, so nobody can fill the log; the counter shows the rate.
                Ok(Err(error)) => {
                    metrics::counter!(HANDSHAKES, "outcome" => "failed").increment(1);
                    tracing::debug!(peer = %peer, %error, "TLS handshake failed");
                }
                Err(_) => {
                    metrics::counter!(HANDSHAKES, "outcome" => "timeout").increment(1);
                    tracing::debug!(peer = %peer, timeout_ms = timeout.as_millis() as u64, "TLS handshake timed out");
                }
            }
        };
        handshakes.spawn(tracing::Instrument::in_current_span(handshake));
    }
}

/// One accepted TLS connection. Its connect info is the TCP one, so `Request::remote_addr` and anything
/// reading [`TcpConnectInfo`] work as over plaintext.
pub struct TlsConn {
    inner: tokio_rustls::server::TlsStream<TcpStream>,
    info: TcpConnectInfo,
}

impl std::fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConn").field("peer", &self.info.remote_addr).finish_non_exhaustive()
    }
}

impl TlsConn {
    /// The peer's address.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.info.remote_addr
    }
}

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
