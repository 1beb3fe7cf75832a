"""Certificates made at test time with ``cryptography`` (installed by ``scripts/setup``): a CA, and leaf
certificates it issues for servers and clients alike (serverAuth + clientAuth). Used by ``test_tls.py``, the
chart's wiring test with TLS on, and ``scripts/helm-check`` (which needs real files for ``antler config check``).

As a program: ``python pki.py DIR NAME...`` writes ``DIR/ca.crt``, ``DIR/tls.crt`` and ``DIR/tls.key`` (the
files of a kubernetes.io/tls Secret as cert-manager writes it) for the DNS names given.
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Ca:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))


def new_ca(name: str) -> Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _validity(
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return Ca(name, key, builder.sign(key, hashes.SHA256()))


def issue(ca: Ca, common_name: str, dns: list[str], ips: list[str]) -> tuple[bytes, bytes]:
    """A leaf certificate usable by servers and clients: (certificate PEM, PKCS#8 key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = _validity(builder).sign(ca.key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_secret_files(directory: Path, dns: list[str], ips: list[str] = ()) -> dict[str, str]:
    """A CA and one leaf for `dns`/`ips`, as the keys of a kubernetes.io/tls Secret (also written to `directory`)."""
    ca = new_ca("antler test CA")
    cert, key = issue(ca, dns[0] if dns else "antler", dns, list(ips))
    files = {"ca.crt": ca.pem.decode(), "tls.crt": cert.decode(), "tls.key": key.decode()}
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return files


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: pki.py DIR DNS-NAME...")
    write_secret_files(Path(sys.argv[1]), sys.argv[2:])
