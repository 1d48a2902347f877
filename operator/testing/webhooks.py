"""The admission webhooks of JobSet and Kueue as the test planes register them: a CA made for the run
and a serving certificate for 127.0.0.1, the shipped webhook configurations pointed at loopback URLs,
and the check that a registered path has its handler."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .credentials import certificate_authority, serving_certificate

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
    """A CA and a serving certificate it signs, for 127.0.0.1 and localhost (the managers' webhooks):
    (CA certificate, server certificate, server key), PEM."""
    ca_key, ca = certificate_authority("kuberl-test-webhook-ca")
    server = serving_certificate(ca_key, ca, "kuberl-test-webhooks", ["localhost"], ["127.0.0.1"])
    return ca.cert_pem, server.cert_pem, server.key_pem
