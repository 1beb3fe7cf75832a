"""A Python grpcio client reaches ``antler up`` over TLS and mTLS with the CA, and nothing else gets in.

Certificates are generated per module with ``cryptography`` (installed by ``scripts/setup``): one CA, a server
certificate for ``localhost`` and ``127.0.0.1``, a client certificate from the same CA, and a second, unrelated CA
(``pki.py``).

* TLS: a secure channel trusting the CA gets SERVING from ``grpc.health.v1.Health/Check`` and answers a real
  RPC (``ModelService.ListModels``, through stubs generated from ``proto/``); an insecure channel and a channel
  trusting the other CA are refused (UNAVAILABLE, no answer).
* mTLS (``server.tls.client_ca``): without a client certificate the call is refused; with one it is served.

Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``).
Run: ``python -m pytest -q integration-tests/python/test_tls.py``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc
import grpc_tools
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import antler_up
from pki import Ca, issue, new_ca

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
RPC_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Ca
    other_ca: Ca
    ca_path: Path
    server_cert: Path
    server_key: Path
    client_cert: bytes
    client_key: bytes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, other = new_ca("antler python test CA"), new_ca("someone else's CA")
    server_cert, server_key = issue(ca, "antler", ["localhost"], ["127.0.0.1"])
    client_cert, client_key = issue(ca, "python-client", [], [])
    paths = {name: root / name for name in ("ca.pem", "server.pem", "server-key.pem")}
    paths["ca.pem"].write_bytes(ca.pem)
    paths["server.pem"].write_bytes(server_cert)
    paths["server-key.pem"].write_bytes(server_key)
    return Pki(ca, other, paths["ca.pem"], paths["server.pem"], paths["server-key.pem"], client_cert, client_key)


# --------------------------------------------------------------------------------------------------
# Servers and stubs
# --------------------------------------------------------------------------------------------------


def _start(request: pytest.FixtureRequest, root: Path, config: str) -> str:
    """Starts ``antler up`` with ``config`` on a free loopback port; returns its address."""
    return antler_up.start(request, root, config, antler_up.listen_address).ready


def _tls_yaml(pki: Pki, mutual: bool) -> str:
    yaml = f"server:\n  tls:\n    cert: {pki.server_cert}\n    key: {pki.server_key}\n"
    if mutual:
        yaml += f"    client_ca: {pki.ca_path}\n"
    return yaml


@pytest.fixture(scope="module")
def tls_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> str:
    return _start(request, tmp_path_factory.mktemp("antler-tls"), _tls_yaml(pki, mutual=False))


@pytest.fixture(scope="module")
def mtls_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> str:
    return _start(request, tmp_path_factory.mktemp("antler-mtls"), _tls_yaml(pki, mutual=True))


@pytest.fixture(scope="module")
def model_stubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, object]]:
    """The models service's generated messages and stubs (compiled from proto/ with grpcio-tools)."""
    out = tmp_path_factory.mktemp("tls-stubs")
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}", *protos]
    result = subprocess.run(cmd, cwd=PROTO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"protoc failed ({result.returncode}):\n{result.stderr}"
    sys.path.insert(0, str(out))
    import importlib

    importlib.invalidate_caches()
    # The module path follows the proto package (proto/antler/models/v1/models.proto).
    messages = importlib.import_module("antler.models.v1.models_pb2")
    services = importlib.import_module("antler.models.v1.models_pb2_grpc")
    yield messages, services
    sys.path.remove(str(out))


def _health(channel: grpc.Channel) -> int:
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
        return reply.status


def _refused(channel: grpc.Channel) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        _health(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    return refused.value


# --------------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------------


def test_the_ca_gets_served(tls_server: str, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.pem)
    assert _health(grpc.secure_channel(tls_server, credentials)) == health_pb2.HealthCheckResponse.SERVING


def test_the_certificate_name_localhost_works_too(tls_server: str, pki: Pki) -> None:
    port = tls_server.rsplit(":", 1)[1]
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.pem)
    assert _health(grpc.secure_channel(f"localhost:{port}", credentials)) == health_pb2.HealthCheckResponse.SERVING


def test_a_real_rpc_over_tls(tls_server: str, pki: Pki, model_stubs: tuple[object, object]) -> None:
    messages, services = model_stubs
    with grpc.secure_channel(tls_server, grpc.ssl_channel_credentials(root_certificates=pki.ca.pem)) as channel:
        reply = services.ModelServiceStub(channel).ListModels(messages.ListModelsRequest(), timeout=RPC_TIMEOUT_S)  # type: ignore[attr-defined]
    assert reply.default_model_name == "demo", reply


def test_plaintext_is_refused(tls_server: str) -> None:
    _refused(grpc.insecure_channel(tls_server))


def test_another_ca_is_refused(tls_server: str, pki: Pki) -> None:
    _refused(grpc.secure_channel(tls_server, grpc.ssl_channel_credentials(root_certificates=pki.other_ca.pem)))


# --------------------------------------------------------------------------------------------------
# mTLS
# --------------------------------------------------------------------------------------------------


def test_mtls_without_a_client_certificate_is_refused(mtls_server: str, pki: Pki) -> None:
    _refused(grpc.secure_channel(mtls_server, grpc.ssl_channel_credentials(root_certificates=pki.ca.pem)))


def test_mtls_with_a_client_certificate_is_served(mtls_server: str, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.pem, private_key=pki.client_key, certificate_chain=pki.client_cert
    )
    assert _health(grpc.secure_channel(mtls_server, credentials)) == health_pb2.HealthCheckResponse.SERVING
