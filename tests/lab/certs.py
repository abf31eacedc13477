"""Throwaway X.509 certificates for TLS tests (the ``cryptography`` package; EC P-256 keys,
so a whole set takes milliseconds).

    certs = make_certs(tmp_path / "tls")
    certs.ca, certs.server_cert, certs.server_key       # server: localhost + 127.0.0.1
    certs.client_cert, certs.client_key                 # a client certificate by the same CA
    certs.other_ca                                      # a CA that signed nothing here
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    @property
    def server(self) -> tuple[str, str, str]:
        """(ca, cert, key) for MariaDB(tls=...)."""
        return str(self.ca), str(self.server_cert), str(self.server_key)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "replay-proxy tests"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(days=1))
        .not_valid_after(now + _dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str, sans: list[x509.GeneralName], usage
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = _dt.datetime.now(_dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(days=1))
        .not_valid_after(now + _dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(directory: Path, server_names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Certs:
    """A CA, a server certificate for ``server_names`` (DNS names and IP addresses), a client
    certificate, and an unrelated CA; PEM files in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("replay-proxy test CA")
    sans: list[x509.GeneralName] = []
    for name in server_names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    server, server_key = _leaf(ca, ca_key, server_names[0], sans, ExtendedKeyUsageOID.SERVER_AUTH)
    client, client_key = _leaf(ca, ca_key, "app", [], ExtendedKeyUsageOID.CLIENT_AUTH)
    other, _ = _ca("some other CA")
    certs = Certs(
        d, d / "ca.pem", d / "server-cert.pem", d / "server-key.pem", d / "client-cert.pem", d / "client-key.pem", d / "other-ca.pem"
    )
    _write_cert(certs.ca, ca)
    _write_cert(certs.server_cert, server)
    _write_key(certs.server_key, server_key)
    _write_cert(certs.client_cert, client)
    _write_key(certs.client_key, client_key)
    _write_cert(certs.other_ca, other)
    return certs
