//! Certificates are generated per test (rcgen) into a temporary directory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::*;
use crate::auth::AuthConfig;
use crate::config::ServerConfig;
use crate::{Authenticator, ServiceSet};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A CA that issues leaf certificates (serverAuth + clientAuth) into a directory.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        let ca_pem = params.self_signed(&key)?.pem();
        Ok(Self { dir: tempfile::tempdir()?, ca_pem, issuer: Issuer::new(params, key) })
    }

    /// A new leaf for `names` (DNS names or IP addresses): (certificate PEM, key PEM).
    fn leaf(&self, names: &[&str]) -> Result<(String, String), Box<dyn std::error::Error>> {
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        Ok((params.signed_by(&key, &self.issuer)?.pem(), key.serialize_pem()))
    }

    fn write(&self, name: &str, contents: &str) -> Result<PathBuf, std::io::Error> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents)?;
        Ok(path)
    }

    /// Writes a fresh leaf as `server.pem` / `server-key.pem` and returns the server settings.
    fn server(&self, names: &[&str]) -> Result<ServerTlsConfig, Box<dyn std::error::Error>> {
        let (cert, key) = self.leaf(names)?;
        Ok(ServerTlsConfig {
            cert: self.write("server.pem", &cert)?,
            key: self.write("server-key.pem", &key)?,
            ..ServerTlsConfig::default()
        })
    }
}

fn message(result: Result<Option<ServerTls>, TlsError>) -> String {
    result.err().map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn errors_name_the_setting_and_the_file() -> TestResult {
    let pki = Pki::new("errors")?;
    let good = pki.server(&["localhost"])?;
    let load = |config: &ServerTlsConfig| message(ServerTls::load(config, Duration::ZERO, None));

    let missing = ServerTlsConfig { cert: pki.dir.path().join("nope.pem"), ..good.clone() };
    let text = load(&missing);
    assert!(text.starts_with("cannot read server.tls.cert file ") && text.contains("nope.pem") && text.contains("\nhint: "), "{text}");

    // The key file given as the certificate: PEM, but no certificate in it.
    let swapped = ServerTlsConfig { cert: good.key.clone(), ..good.clone() };
    let text = load(&swapped);
    assert!(
        text.contains("server.tls.cert file") && text.contains("server-key.pem") && text.contains("holds no PEM certificate"),
        "{text}"
    );

    let garbage = pki.write("garbage.pem", "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n")?;
    let text = load(&ServerTlsConfig { cert: garbage, ..good.clone() });
    assert!(text.contains("server.tls.cert file") && text.contains("garbage.pem") && text.contains("not valid PEM"), "{text}");

    let text = load(&ServerTlsConfig { key: good.cert.clone(), ..good.clone() });
    assert!(text.contains("server.tls.key file") && text.contains("holds no PEM private key"), "{text}");

    let (_, other_key) = pki.leaf(&["localhost"])?;
    let other_key = pki.write("other-key.pem", &other_key)?;
    let text = load(&ServerTlsConfig { key: other_key, ..good.clone() });
    assert!(
        text.contains("server.tls.key")
            && text.contains("other-key.pem")
            && text.contains("does not belong to the certificate in server.tls.cert"),
        "{text}"
    );

    let text = load(&ServerTlsConfig { client_ca: pki.dir.path().join("no-ca.pem"), ..good.clone() });
    assert!(text.contains("server.tls.client_ca file") && text.contains("no-ca.pem"), "{text}");

    let client = ClientTlsConfig { ca: pki.dir.path().join("missing-ca.pem"), ..ClientTlsConfig::default() };
    let text = ClientTls::load(&client, &Fields::Flags, Duration::ZERO, None).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.starts_with("cannot read --ca file ") && text.contains("missing-ca.pem"), "{text}");
    let client = ClientTlsConfig { cert: good.cert.clone(), key: good.cert.clone(), ..ClientTlsConfig::default() };
    let fields = Fields::Yaml("clients.models.tls".to_owned());
    let text = ClientTls::load(&client, &fields, Duration::ZERO, None).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("clients.models.tls.key file") && text.contains("holds no PEM private key"), "{text}");

    assert!(ServerTls::load(&good, Duration::ZERO, None)?.is_some());
    assert!(ServerTls::load(&ServerTlsConfig::default(), Duration::ZERO, None)?.is_none(), "no cert: plaintext");
    Ok(())
}

async fn eventually(what: &str, condition: impl Fn() -> bool) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_changed_certificate_is_reloaded_and_a_broken_pair_keeps_the_previous_one() -> TestResult {
    let pki = Pki::new("reload")?;
    let config = pki.server(&["localhost"])?;
    let shutdown = CancellationToken::new();
    let tls = ServerTls::load(&config, Duration::from_millis(20), Some(&shutdown))?.ok_or("TLS off")?;
    let first = tls.current_leaf();

    let (cert, key) = pki.leaf(&["localhost"])?;
    std::fs::write(&config.key, &key)?;
    std::fs::write(&config.cert, &cert)?;
    eventually("the new certificate", || tls.current_leaf() != first).await?;
    let second = tls.current_leaf();

    // Halfway through a rotation: a new certificate next to the old key. Refused; the pair in force stays.
    let (cert, _) = pki.leaf(&["localhost"])?;
    std::fs::write(&config.cert, &cert)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(tls.current_leaf(), second, "a certificate without its key must not be used");
    shutdown.cancel();
    Ok(())
}

/// Serves health (and nothing else) through the kit's server over `tls`; returns the address.
async fn serve(tls: ServerTls, shutdown: &CancellationToken) -> Result<std::net::SocketAddr, Box<dyn std::error::Error>> {
    let config = ServerConfig { listen: ([127, 0, 0, 1], 0).into(), shutdown_grace_secs: 0, ..ServerConfig::default() };
    let auth = Authenticator::new(&AuthConfig::default())?;
    let listener = crate::server::bind(&config, &auth).await?;
    let addr = listener.local_addr()?;
    let set = ServiceSet::new(&config);
    let shutdown = shutdown.clone();
    tokio::spawn(async move { crate::server::serve_with_tls(listener, set, &config, auth, Some(tls), shutdown).await });
    Ok(addr)
}

async fn health(client: &ClientTls, addr: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?.connect_timeout(Duration::from_secs(5));
    let channel = client.connect(endpoint).await?;
    HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await?;
    Ok(())
}

#[tokio::test]
async fn own_server_clients_trust_exactly_the_served_certificate_across_reloads() -> TestResult {
    let pki = Pki::new("own")?;
    // A name that is not the loopback address: the in-process client checks no name.
    let config = pki.server(&["antler.example.com"])?;
    let shutdown = CancellationToken::new();
    let tls = ServerTls::load(&config, Duration::from_millis(20), Some(&shutdown))?.ok_or("TLS off")?;
    let addr = serve(tls.clone(), &shutdown).await?;
    let fields = Fields::Yaml("clients.models.tls".to_owned());
    let own = ClientTls::for_own_server(&ClientTlsConfig::default(), &fields, &tls, Duration::ZERO, None)?;
    health(&own, addr).await?;

    // A client pinned to another server's certificate (same CA, same name) is refused.
    let other_pki = Pki::new("own-other")?;
    let other = ServerTls::load(&other_pki.server(&["antler.example.com"])?, Duration::ZERO, None)?.ok_or("TLS off")?;
    let stranger = ClientTls::for_own_server(&ClientTlsConfig::default(), &fields, &other, Duration::ZERO, None)?;
    assert!(health(&stranger, addr).await.is_err(), "a client pinned to another certificate connected");

    // After a rotation the pinned client follows its server.
    let before = tls.current_leaf();
    let (cert, key) = pki.leaf(&["antler.example.com"])?;
    std::fs::write(&config.key, &key)?;
    std::fs::write(&config.cert, &cert)?;
    eventually("the rotated certificate", || tls.current_leaf() != before).await?;
    health(&own, addr).await?;

    // A CA-verified client checks the name: the certificate's name passes, the loopback address does not.
    let ca = pki.write("ca.pem", &pki.ca_pem)?;
    let by_ca = ClientTls::load(&ClientTlsConfig { ca: ca.clone(), ..ClientTlsConfig::default() }, &fields, Duration::ZERO, None)?;
    assert!(health(&by_ca, addr).await.is_err(), "the certificate does not name 127.0.0.1");
    let named = ClientTlsConfig { ca, server_name: "antler.example.com".to_owned(), ..ClientTlsConfig::default() };
    health(&ClientTls::load(&named, &fields, Duration::ZERO, None)?, addr).await?;
    shutdown.cancel();
    Ok(())
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_from_the_client_ca() -> TestResult {
    let pki = Pki::new("mtls")?;
    let clients_pki = Pki::new("mtls-clients")?;
    let config = ServerTlsConfig { client_ca: pki.write("client-ca.pem", &clients_pki.ca_pem)?, ..pki.server(&["127.0.0.1"])? };
    let shutdown = CancellationToken::new();
    let tls = ServerTls::load(&config, Duration::ZERO, None)?.ok_or("TLS off")?;
    assert!(tls.mutual());
    let addr = serve(tls.clone(), &shutdown).await?;
    let ca = pki.write("ca.pem", &pki.ca_pem)?;
    let fields = Fields::Flags;
    let anonymous = ClientTls::load(&ClientTlsConfig { ca: ca.clone(), ..ClientTlsConfig::default() }, &fields, Duration::ZERO, None)?;
    assert!(health(&anonymous, addr).await.is_err(), "a client without a certificate was served");

    let (cert, key) = pki.leaf(&["wrong-issuer"])?;
    let wrong = ClientTlsConfig {
        ca: ca.clone(),
        cert: pki.write("wrong.pem", &cert)?,
        key: pki.write("wrong-key.pem", &key)?,
        ..ClientTlsConfig::default()
    };
    assert!(
        health(&ClientTls::load(&wrong, &fields, Duration::ZERO, None)?, addr).await.is_err(),
        "a certificate from another CA was accepted"
    );

    let (cert, key) = clients_pki.leaf(&["runs"])?;
    let right =
        ClientTlsConfig { ca, cert: pki.write("runs.pem", &cert)?, key: pki.write("runs-key.pem", &key)?, ..ClientTlsConfig::default() };
    health(&ClientTls::load(&right, &fields, Duration::ZERO, None)?, addr).await?;
    shutdown.cancel();
    Ok(())
}
