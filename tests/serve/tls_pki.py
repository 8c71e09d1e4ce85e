"""A throwaway PKI for the upstream TLS tests: CAs, server and client certificates as PEM files.

Elliptic-curve keys (P-256) keep generation fast; everything is valid for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


class Authority:
    """A CA that writes what it signs under ``directory``."""

    def __init__(self, directory: Path, name: str):
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
        self._subject = subject
        now = datetime.datetime.now(datetime.timezone.utc)
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        self.cert = directory / f"{name}-ca.pem"
        self.cert.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, file_name: str, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), client: bool = False,
              password: bytes | None = None) -> Issued:
        """A leaf certificate for ``dns`` names and ``ips`` (a server's) or, with ``client``, a client's;
        its key encrypted with ``password`` when given."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, file_name)]))
            .issuer_name(self._subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{file_name}.pem", self.directory / f"{file_name}.key")
        issued.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        encryption = (serialization.BestAvailableEncryption(password) if password
                      else serialization.NoEncryption())
        issued.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 encryption))
        return issued


@dataclass
class Pki:
    """What the tests need: the trusted CA, a CA nobody trusts, server and client certificates."""

    ca: Authority
    rogue_ca: Authority
    client_ca: Authority
    server: Issued  # for 127.0.0.1 and localhost, signed by ``ca``
    rogue_server: Issued  # the same names, signed by ``rogue_ca``
    other_name: Issued  # for other.test only, signed by ``ca``
    client: Issued  # signed by ``client_ca``
    client_encrypted: Issued  # signed by ``client_ca``; key encrypted with ``KEY_PASSWORD``


KEY_PASSWORD = "correct horse"


def make_pki(directory: Path) -> Pki:
    ca, rogue, clients = Authority(directory, "trusted"), Authority(directory, "rogue"), Authority(directory, "clients")
    local = {"dns": ("localhost",), "ips": ("127.0.0.1",)}
    return Pki(ca=ca, rogue_ca=rogue, client_ca=clients, server=ca.issue("server", **local),
               rogue_server=rogue.issue("rogue-server", **local), other_name=ca.issue("other", dns=("other.test",)),
               client=clients.issue("client", client=True),
               client_encrypted=clients.issue("client-encrypted", client=True, password=KEY_PASSWORD.encode()))
