"""The admission webhooks of JobSet and Kueue as the test planes register them: a CA made for the run
and a serving certificate for 127.0.0.1, the shipped webhook configurations pointed at loopback URLs,
and the check that a registered path has its handler."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def webhook_configurations(root: Path, ca_pem: bytes, ports: dict[str, int], kueue_groups: set[str]) -> list[dict[str, Any]]:
    """The shipped webhook configurations (root/webhooks/{kueue,jobset}.yaml), with loopback URLs instead
    of Service references. `ports`: `kueue-webhook` and `jobset-webhook`. Only those of Kueue's webhooks
    whose API groups are all in `kueue_groups` are kept: a `failurePolicy: Fail` webhook for an
    integration Kueue does not serve would refuse every write of that kind."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for owner in ("kueue", "jobset"):
        for doc in yaml.safe_load_all((root / "webhooks" / f"{owner}.yaml").read_text()):
            if not doc:
                continue
            hooks = []
            for hook in doc["webhooks"]:
                groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
                if owner == "kueue" and not groups <= kueue_groups:
                    continue
                if owner == "jobset" and "" in groups:
                    # As JobSet's own kustomize patch does: its Pod webhooks only see the Pods of JobSets.
                    hook["objectSelector"] = {"matchExpressions": [{"key": JOBSET_NAME_LABEL, "operator": "Exists"}]}
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{ports[f'{owner}-webhook']}{path}", "caBundle": bundle}
                hook["timeoutSeconds"] = 10
                hooks.append(hook)
            doc["metadata"] = {"name": f"{owner}-{doc['metadata']['name']}"}
            doc["webhooks"] = hooks
            out.append(doc)
    return out


def webhook_served(url: str, ca_pem: bytes) -> bool:
    """Whether a webhook path has its handler: any answer but 404 (an empty review is refused, not unknown)."""
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST")
    context = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        with urllib.request.urlopen(request, context=context, timeout=2):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code != 404
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def serving_pki() -> tuple[bytes, bytes, bytes]:
    """A CA and a serving certificate it signs, for 127.0.0.1 and localhost (the managers' webhooks)."""
    # cryptography is a test extra (as in credentials.py): imported where a plane is made, not with the package.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kuberl-test-webhook-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kuberl-test-webhooks")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem
