"""Credentials of a test cluster: its PKI (CA, API server certificate, service-account keys) and
kubeconfigs. Short-lived (7 days), made fresh for every control plane, never reused."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, user: str) -> Path:
    """A kubeconfig (mode 0600: it holds a token) for `user` of the test cluster at `server`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kuberl-test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "kuberl-test", "context": {"cluster": "kuberl-test", "user": user, "namespace": "default"}}],
        "current-context": "kuberl-test",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class Signed:
    """A private key and its certificate, both PEM."""

    key_pem: bytes
    cert_pem: bytes


def certificate_authority(common_name: str) -> tuple[Any, Signed]:
    """A self-signed CA (EC P-256, valid 7 days): its key object, to sign with, and its PEM pair."""
    # cryptography is a test extra: imported where a plane is made, not with the package.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, Signed(_key_pem(key), _cert_pem(cert))


def serving_certificate(ca_key: Any, ca: Signed, common_name: str, dns_names: list[str], addresses: list[str]) -> Signed:
    """A TLS server certificate that `ca` signs, for `dns_names` and IP `addresses` (valid 7 days)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(x509.load_pem_x509_certificate(ca.cert_pem).subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Signed(_key_pem(key), _cert_pem(cert))


def make_pki(directory: Path, address: str, service_cidr: str) -> dict[str, Path]:
    """A CA, the apiserver's serving certificate (for `address`, loopback and the first address of
    `service_cidr`, the in-cluster `kubernetes` service), and the service-account signing key pair."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = certificate_authority("kuberl-test-ca")
    first_service_ip = str(next(ipaddress.ip_network(service_cidr).hosts()))
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    server = serving_certificate(ca_key, ca, "kube-apiserver", names, [*sorted({"127.0.0.1", address}), first_service_ip])
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    files = {
        "ca.crt": ca.cert_pem,
        "apiserver.crt": server.cert_pem,
        "apiserver.key": server.key_pem,
        "sa.key": _key_pem(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = directory / name
        paths[name].write_bytes(data)
        paths[name].chmod(0o600)
    return paths


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert_pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)
