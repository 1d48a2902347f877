"""The wait for JobSet's and Kueue's webhooks: a path counts as served once its handler answers, whatever
it says; an unknown path (404) or a closed port does not. A real TLS server on loopback, with the
certificate the schedulers' webhook servers use."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.operator.testing.webhooks import serving_pki, webhook_served

SERVED = "/mutate-jobset-x-k8s-io-v1alpha2-jobset"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        # As controller-runtime does for a review it cannot decode: refused, not unknown.
        self.send_response(400 if self.path == SERVED else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    ca_pem, cert_pem, key_pem = serving_pki()
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(key_pem)
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], ca_pem
    httpd.shutdown()
    httpd.server_close()


def test_a_registered_path_is_served_even_when_it_refuses_the_empty_review(server) -> None:
    port, ca_pem = server
    assert webhook_served(f"https://127.0.0.1:{port}{SERVED}", ca_pem)


def test_a_path_without_its_handler_yet_is_not_served(server) -> None:
    port, ca_pem = server
    assert not webhook_served(f"https://127.0.0.1:{port}/validate-jobset-x-k8s-io-v1alpha2-jobset", ca_pem)


def test_a_closed_port_is_not_served(server) -> None:
    from kuberl.operator.cli.ports import free_port

    _, ca_pem = server
    assert not webhook_served(f"https://127.0.0.1:{free_port()}{SERVED}", ca_pem)


def test_a_server_with_a_certificate_from_another_ca_is_not_served(server) -> None:
    port, _ = server
    other_ca, _, _ = serving_pki()
    assert not webhook_served(f"https://127.0.0.1:{port}{SERVED}", other_ca)
