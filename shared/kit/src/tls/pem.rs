//! Reading PEM certificates, keys and CA bundles, with errors that name the setting and the file.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

/// The bytes of `path`, the file setting `field` names.
pub(crate) fn read(field: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { field: field.to_owned(), path: path.to_owned(), source })
}

fn bad_pem(field: &str, path: &Path, error: pem::Error) -> TlsError {
    TlsError::BadPem { field: field.to_owned(), path: path.to_owned(), message: error.to_string() }
}

/// Every certificate in the file, in order (at least one).
pub(crate) fn certs(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(field, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes).collect::<Result<Vec<_>, _>>().map_err(|e| bad_pem(field, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            field: field.to_owned(),
            path: path.to_owned(),
            what: "certificate",
            hint: "the file must hold -----BEGIN CERTIFICATE----- blocks (a chain: the leaf first, then its intermediates)",
        });
    }
    Ok(certs)
}

/// The first private key in the file.
pub(crate) fn key(field: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(field, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        pem::Error::NoItemsFound => TlsError::NoPem {
            field: field.to_owned(),
            path: path.to_owned(),
            what: "private key",
            hint: "an unencrypted PKCS#8 (BEGIN PRIVATE KEY), PKCS#1 (BEGIN RSA PRIVATE KEY) or SEC1 (BEGIN EC PRIVATE KEY) key",
        },
        other => bad_pem(field, path, other),
    })
}

/// The CA certificates of the file as trust anchors.
pub(crate) fn roots(field: &str, path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(field, path)? {
        store.add(cert).map_err(|e| TlsError::Rejected {
            field: field.to_owned(),
            path: path.to_owned(),
            message: format!("a certificate is not a usable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(store))
}

/// Maps rustls's refusal of a certificate/key pair to an error naming both files.
pub(crate) fn pair_error(error: rustls::Error, cert_field: &str, cert: &Path, key_field: &str, key: &Path) -> TlsError {
    match error {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            key_field: key_field.to_owned(),
            key: key.to_owned(),
            cert_field: cert_field.to_owned(),
            cert: cert.to_owned(),
        },
        other => {
            TlsError::Rejected { field: key_field.to_owned(), path: key.to_owned(), message: format!("the key cannot be used: {other}") }
        }
    }
}
