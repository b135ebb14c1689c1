"""A certificate authority made for one network-on session, so the gateway can terminate TLS for the
hosts that carry secrets (`NetworkPolicy.secrets`) and only that session trusts it.

It lives in the parent's memory: its private key never leaves this process (not even for the
gateway, which gets one leaf key per secret host), and the session gets the certificate alone, in a
bundle with this machine's own trusted authorities (`bundle`). EC P-256 keys: making one costs about
a millisecond, so a session's authority and its leaves are made when it opens or its rules change.
"""

from __future__ import annotations

import datetime
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=30)
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)
BUNDLE_MAX = 8 * 1024 * 1024


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


class SessionAuthority:
    """One session's CA: `leaf(host)` gives the certificate chain and key the gateway presents."""

    def __init__(self) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        tag = os.urandom(6).hex()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kodeagent egress session {tag}")])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.certificate_pem = _pem(self.certificate)

    def leaf(self, host: str) -> str:
        """PEM of a fresh key and a certificate for `host` (then the CA's), for the gateway."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return (_pem(certificate) + self.certificate_pem + key_pem).decode("ascii")

    def bundle(self) -> bytes:
        """This machine's trusted authorities and the session's own: what the session verifies with."""
        return system_bundle() + b"\n" + self.certificate_pem


def system_bundle() -> bytes:
    """The PEM bundle of authorities this machine trusts (empty when none is found)."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile, *SYSTEM_BUNDLES):
        if path and os.path.isfile(path):
            with open(path, "rb") as found:
                return found.read(BUNDLE_MAX)
    return b""
