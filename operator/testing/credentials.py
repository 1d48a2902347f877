"""Credentials of a test cluster: its PKI (CA, API server certificate, service-account keys) and
kubeconfigs. Short-lived (7 days), made fresh for every control plane, never reused."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from pathlib import Path


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


def make_pki(directory: Path, address: str, service_cidr: str) -> dict[str, Path]:
    """A CA, the apiserver's serving certificate (for `address`, loopback and the first address of
    `service_cidr`, the in-cluster `kubernetes` service), and the service-account signing key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kuberl-test-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    first_service_ip = next(ipaddress.ip_network(service_cidr).hosts())
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in names]
                + [x509.IPAddress(ipaddress.ip_address(a)) for a in sorted({"127.0.0.1", address})]
                + [x509.IPAddress(first_service_ip)]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    files = {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "apiserver.crt": server_cert.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": key_pem(server_key),
        "sa.key": key_pem(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = directory / name
        paths[name].write_bytes(data)
        paths[name].chmod(0o600)
    return paths
