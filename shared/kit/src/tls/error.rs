//! What can be wrong with the TLS files; a leaf, so the configuration's error type can wrap it.

use std::path::PathBuf;

/// What can be wrong with the certificate and key files. Each error names the setting and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {field} file {}: {source}\nhint: check that the file exists and that this process may read it", path.display())]
    Read { field: String, path: PathBuf, source: std::io::Error },
    #[error("{field} file {} holds no PEM {what}\nhint: {hint}", path.display())]
    NoPem { field: String, path: PathBuf, what: &'static str, hint: &'static str },
    #[error("{field} file {} is not valid PEM: {message}\nhint: the file must hold base64 blocks between -----BEGIN …----- and -----END …----- lines", path.display())]
    BadPem { field: String, path: PathBuf, message: String },
    #[error("{field} file {} cannot be used: {message}", path.display())]
    Rejected { field: String, path: PathBuf, message: String },
    #[error(
        "the private key in {key_field} ({}) does not belong to the certificate in {cert_field} ({})\nhint: give the key the certificate was issued for (when rotating, replace both files)",
        key.display(),
        cert.display()
    )]
    KeyMismatch { key_field: String, key: PathBuf, cert_field: String, cert: PathBuf },
    #[error("{field}: {message}")]
    Setup { field: String, message: String },
}
