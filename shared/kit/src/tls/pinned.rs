//! Trusting exactly the certificate this process's own server presents: how `antler up`'s in-process
//! clients verify their own listener when no `clients.<service>.tls.ca` is given.
//!
//! Written by hand because rustls ships no pinning verifier. It is small on purpose: the certificate is
//! compared byte for byte with the server's current leaf (or the one before the last reload, for a
//! handshake the server began just before it), and the handshake signature is checked with rustls's own
//! functions, so the peer must hold the private key. No name is checked, so a certificate issued for
//! `antler.example.com` needs no entry for the loopback address; no chain is built, since the process
//! trusts the certificate it serves itself.

use std::sync::{Arc, Mutex};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::watch;

use super::provider;
use super::server::ServerState;

#[derive(Debug)]
pub(crate) struct OwnCertificate {
    server: watch::Receiver<Arc<ServerState>>,
    /// The last two leaves seen, newest last.
    seen: Mutex<Vec<CertificateDer<'static>>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl OwnCertificate {
    pub(crate) fn new(server: watch::Receiver<Arc<ServerState>>) -> Self {
        let first = server.borrow().chain[0].clone();
        Self { server, seen: Mutex::new(vec![first]), algorithms: provider().signature_verification_algorithms }
    }
}

impl ServerCertVerifier for OwnCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let current = self.server.borrow().chain[0].clone();
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if seen.last() != Some(&current) {
            seen.push(current);
            if seen.len() > 2 {
                seen.remove(0);
            }
        }
        if seen.iter().any(|leaf| leaf.as_ref() == end_entity.as_ref()) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
