"""The Helm chart's wiring, tested without a cluster.

``helm template`` renders ``mode: split`` with three runs replicas on PostgreSQL (``database.existingSecret``);
``chart_local.LocalCluster`` starts every Deployment and StatefulSet replica as a local process with the
container's args, env and mounted ConfigMap, Secrets resolved, Service DNS names mapped to the pods' loopback
addresses, and waits for each readinessProbe as declared. Then, through the pods:

* a lead-agent run through the entry-point Service (``antler``: a runs pod): the model is a replay script given
  in the chart's ``config.models`` (the shipped demo transcript: plan, write a file in the sandbox, run a command
  on it, present it), so the run crosses runs -> models and runs -> sandbox with the generated service key and
  ends SUCCESS with a satisfied delivery receipt read from the sandbox;
* a JoinRun of that run on a second runs replica, and a ListRunEvents on the third: every event, seq 1..n;
* a run blocked on a slow model, cancelled through another replica than the one it was created on, followed
  live by a JoinRun on the third, which ends INTERRUPTED;
* the store is the test's own PostgreSQL database (created and dropped here), not a SQLite file;
* the HTTP edge (``edge.enabled``): its Service leads to its own pod, which serves the LangGraph API (a run of
  the replay model through ``/threads/{id}/runs/wait``) and DeerFlow's gateway routes (the run's artifact, an
  upload's bytes back, models, memory, MCP settings) by calling the other pods with the caller's key, and answers
  the values' CORS origin;
* the rendered NetworkPolicies admit exactly those calls (ingress-labelled pods -> runs and the edge's http port,
  runs and the edge -> sandbox, models, mcp and memory, the edge -> runs, models -> sandbox) and refuse others
  (evaluated from the manifests: no CNI here).

A wrong port, Service name, env var, Secret key or a token the chart forgot fails one of these steps.

Every test runs twice: plaintext (the chart's defaults) and with ``tls.enabled`` + ``tls.mutual`` (certificates
made at test time by ``pki.py``: a CA and one certificate naming every Service, given as the kubernetes.io/tls
Secret the values name). With TLS every listener and every call between the pods is mTLS, the test's own calls
present a client certificate, the probes ask the plaintext health-only port, and plaintext or certificate-less
calls to the gRPC port are refused.

Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``), ``ANTLER_TOOLS`` or ``HELM`` (helm),
PostgreSQL on 127.0.0.1:5432 (user postgres, trust). Run: ``python -m pytest -q integration-tests/python``.
"""

from __future__ import annotations

import importlib
import os
import queue
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import grpc
import grpc_tools
import pytest
import subprocess
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chart_local  # noqa: E402
import pki  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
ANTLER_BIN = Path(os.environ.get("ANTLER_BIN", REPO / "target" / "debug" / "antler"))
NAMESPACE = "wiring"
RPC_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Generated messages and stubs of antler.runs.v1 (and what they import)."""
    out = tmp_path_factory.mktemp("wiring-stubs")
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
           f"--python_out={out}", f"--grpc_python_out={out}", *protos]
    result = subprocess.run(cmd, cwd=PROTO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    sys.path.insert(0, str(out))
    importlib.invalidate_caches()

    class Modules:
        run = importlib.import_module("antler.runs.v1.run_pb2")
        svc = importlib.import_module("antler.runs.v1.run_service_pb2")
        grpc = importlib.import_module("antler.runs.v1.run_service_pb2_grpc")
        common = importlib.import_module("antler.common.v1.common_pb2")

    yield Modules
    sys.path.remove(str(out))


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    name = f"antler_wiring_{uuid.uuid4().hex[:12]}"
    chart_local.psql(f"CREATE DATABASE {name}")
    yield name
    chart_local.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


#: The browser origin the test's values allow on the HTTP edge (edge.corsOrigins).
UI_ORIGIN = "https://deerflow.example.com"

#: Every Service of the release "antler", as its certificate must name it.
SERVICE_HOSTS = [f"{name}.{NAMESPACE}.svc" for name in ("antler", "antler-models", "antler-mcp", "antler-memory", "antler-sandbox")]


def _values(tmp: Path, tls: bool) -> Path:
    """The test's values: the chart's defaults plus 3 runs replicas on PostgreSQL and two replay models."""
    demo = yaml.safe_load((REPO / "services/models/demo/transcript.yaml").read_text())
    values: dict[str, Any] = {
        "runs": {"replicas": 3},
        # The HTTP edge: its own Deployment and Service, calling the others as its callers. Its container port is
        # not the Service's (2024), so the Service's targetPort is followed; and not 2024, which a process on this
        # machine may hold on 0.0.0.0 (the pods' loopback addresses share the host's ports).
        "edge": {"enabled": True, "port": 47024, "corsOrigins": [UI_ORIGIN]},
        "database": {"existingSecret": "wiring-db"},
        "config": {"models": {"models": [
            {"name": "scripted", "provider": "replay", "supports_thinking": True, "replay": demo},
            # Blocks in the model call long enough to be cancelled while RUNNING.
            {"name": "slow", "provider": "replay",
             "replay": {"first_byte_delay_ms": 300000, "after_last": "repeat_last", "turns": [{"text": "too late"}]}},
        ]}},
    }
    if tls:
        values["tls"] = {"enabled": True, "secretName": "wiring-tls", "mutual": True}
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module", params=["plaintext", "tls"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, database: str) -> chart_local.LocalCluster:
    if not ANTLER_BIN.is_file():
        pytest.fail(f"antler binary not found at {ANTLER_BIN} (build it, or set ANTLER_BIN)")
    # Not under pytest's 0700 temp directory: the pods run as the chart's non-root user (when we are root), and
    # bwrap needs every directory above the sandbox's data directory searchable.
    root = Path(tempfile.mkdtemp(prefix="antler-wiring-"))
    root.chmod(0o711)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    tls = request.param == "tls"
    docs = chart_local.render("antler", NAMESPACE, [_values(root, tls)])
    url = f"postgres://postgres@127.0.0.1:5432/{database}"
    secrets = {"wiring-db": {"database-url": url}}
    if tls:
        # As cert-manager would write the Secret: the CA, and one certificate for every Service name.
        secrets["wiring-tls"] = pki.write_secret_files(root / "pki", SERVICE_HOSTS)
    c = chart_local.LocalCluster(docs, NAMESPACE, root / "pods", ANTLER_BIN, external_secrets=secrets,
                                 ip_prefix=f"127.{random.randint(32, 250)}.{random.randint(1, 250)}")
    request.addfinalizer(c.down)
    try:
        c.up()
    except chart_local.WiringError as e:
        pytest.fail(str(e))
    return c


def _api_key(c: chart_local.LocalCluster) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {c.secrets['antler']['api-key']}")]


def _channel(c: chart_local.LocalCluster, address: str) -> grpc.Channel:
    """A channel to a pod as a client of the chart's Services: with TLS, trusting the Secret's CA, checking the
    entry Service's name (the pods share one certificate) and presenting the certificate (tls.mutual)."""
    tls = c.secrets.get("wiring-tls")
    if tls is None:
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(root_certificates=tls["ca.crt"].encode(), private_key=tls["tls.key"].encode(),
                                               certificate_chain=tls["tls.crt"].encode())
    return grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", SERVICE_HOSTS[0])])


def _stub(pb: Any, c: chart_local.LocalCluster, address: str) -> Any:
    return pb.grpc.RunServiceStub(_channel(c, address))


def _user(pb: Any, text: str) -> Any:
    return pb.common.Message(role=pb.common.ROLE_USER, content=[pb.common.ContentPart(text=pb.common.TextPart(text=text))])


def test_every_workload_replica_runs_and_is_ready(cluster: chart_local.LocalCluster) -> None:
    names = sorted(p.name for p in cluster.pods)
    assert names == ["antler-0", "antler-1", "antler-2", "antler-edge-0", "antler-mcp-0", "antler-memory-0", "antler-models-0",
                     "antler-sandbox-0"], names
    # Every inter-service endpoint in the rendered antler.yaml led to a pod.
    assert len(cluster.rewrites) == 5, cluster.rewrites


def test_every_pod_serves_its_metrics_where_the_chart_says(cluster: chart_local.LocalCluster) -> None:
    import urllib.request

    for pod in cluster.pods:
        assert pod.metrics, f"{pod.name}: the chart enables metrics by default"
        port = int(pod.metrics.rsplit(":", 1)[1])
        assert port == pod.container_port("metrics"), f"{pod.name}: metrics on {pod.metrics}, containerPort {pod.container_port('metrics')}"
        with urllib.request.urlopen(f"http://{pod.metrics}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert response.status == 200, f"{pod.name}: HTTP {response.status}"
        # Prometheus text with Antler's names only (a pod that did nothing yet may have no series at all).
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert all(line.startswith("antler_") for line in samples), f"{pod.name}: {text[:300]}"


def test_with_tls_only_the_health_port_speaks_plaintext(cluster: chart_local.LocalCluster, pb: Any) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    tls = "wiring-tls" in cluster.secrets
    for pod in cluster.pods:
        probe = pod.container["readinessProbe"]["grpc"]
        if not tls:
            assert not pod.health and probe["port"] == pod.container_port("grpc"), f"{pod.name}: probes ask the gRPC port"
            continue
        assert pod.health and int(pod.health.rsplit(":", 1)[1]) == pod.container_port("health") == probe["port"], \
            f"{pod.name}: health-only listener {pod.health!r}, probe {probe}"
        # The probe's view: plaintext SERVING for the component's service on the health port ...
        with grpc.insecure_channel(pod.health) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=probe["service"]), timeout=RPC_TIMEOUT_S)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, f"{pod.name}: {reply}"
            # ... and nothing but health there.
            with pytest.raises(grpc.RpcError) as other:
                pb.grpc.RunServiceStub(ch).GetRun(pb.svc.GetRunRequest(run_id="x"), metadata=_api_key(cluster), timeout=RPC_TIMEOUT_S)
            assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED, f"{pod.name}: {other.value}"
        # The gRPC port refuses plaintext, and (tls.mutual) a TLS caller without a certificate.
        ca = cluster.secrets["wiring-tls"]["ca.crt"].encode()
        for name, channel in [
            ("plaintext", grpc.insecure_channel(pod.address)),
            ("no client certificate", grpc.secure_channel(pod.address, grpc.ssl_channel_credentials(root_certificates=ca),
                                                          options=[("grpc.ssl_target_name_override", SERVICE_HOSTS[0])])),
        ]:
            with channel, pytest.raises(grpc.RpcError) as refused:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, f"{pod.name} ({name}): {refused.value}"
        with _channel(cluster, pod.address) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, f"{pod.name}: {reply}"


def test_runs_replicas_share_postgresql(cluster: chart_local.LocalCluster, database: str) -> None:
    assert chart_local.psql("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'", database) == "1"
    for pod in cluster.pods_of("antler"):
        assert not list(pod.root.rglob("runs.db")), f"{pod.name} keeps a SQLite database"


def test_lead_run_through_the_service_then_join_and_list_on_other_replicas(cluster: chart_local.LocalCluster, pb: Any) -> None:
    ingress = cluster.service_target("antler", 50051)
    assert ingress is not None, "the entry-point Service selects no runs pod"
    runs = cluster.pods_of("antler")
    reply = _stub(pb, cluster, ingress).WaitRun(pb.svc.WaitRunRequest(create=pb.svc.CreateRunRequest(
        input=[_user(pb, "Write a short hello note to /mnt/user-data/outputs/hello.md, check it, and present it.")],
        expected_outputs=["/mnt/user-data/outputs/hello.md"],
        config=pb.run.RunConfig(model_name="scripted", plan_mode=True))), metadata=_api_key(cluster), timeout=120)
    run = reply.run
    logs = "\n".join(p.logs() for p in cluster.pods)
    assert run.status == pb.run.RUN_STATUS_SUCCESS, f"{run}\n{logs}"
    assert run.delivery.satisfied and "/mnt/user-data/outputs/hello.md" in [f.path for f in run.delivery.produced], run.delivery

    # JoinRun on another replica than the one that served the run: the whole stream, from seq 1.
    joined = list(_stub(pb, cluster, runs[1].address).JoinRun(pb.svc.JoinRunRequest(run_id=run.run_id), metadata=_api_key(cluster),
                                                    timeout=RPC_TIMEOUT_S))
    seqs = [r.event.seq for r in joined if r.event.WhichOneof("kind") != "heartbeat"]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert joined[-1].event.WhichOneof("kind") == "end" and joined[-1].event.end.status == pb.run.RUN_STATUS_SUCCESS
    finished = {r.event.tool_finished.name for r in joined if r.event.WhichOneof("kind") == "tool_finished"}
    # write_file and bash ran in the sandbox pod, reached with the service key.
    assert {"write_file", "bash", "present_files"} <= finished, finished
    bash = next(r.event.tool_finished for r in joined if r.event.WhichOneof("kind") == "tool_finished" and r.event.tool_finished.name == "bash")
    assert "hello.md" in bash.result_summary, bash

    listed = _stub(pb, cluster, runs[2].address).ListRunEvents(pb.svc.ListRunEventsRequest(run_id=run.run_id, page=pb.common.PageRequest(page_size=200)),
                                                      metadata=_api_key(cluster), timeout=RPC_TIMEOUT_S)
    assert [e.seq for e in listed.events] == seqs


def test_cancel_through_another_replica_ends_a_live_join_on_a_third(cluster: chart_local.LocalCluster, pb: Any) -> None:
    a, b, c = (p.address for p in cluster.pods_of("antler"))
    md = _api_key(cluster)
    run = _stub(pb, cluster, a).CreateRun(pb.svc.CreateRunRequest(input=[_user(pb, "hello")], config=pb.run.RunConfig(model_name="slow")),
                                 metadata=md, timeout=RPC_TIMEOUT_S).run
    deadline = time.monotonic() + 60
    while True:
        status = _stub(pb, cluster, c).GetRun(pb.svc.GetRunRequest(run_id=run.run_id), metadata=md, timeout=RPC_TIMEOUT_S).run.status
        if status == pb.run.RUN_STATUS_RUNNING:
            break
        assert status == pb.run.RUN_STATUS_PENDING and time.monotonic() < deadline, pb.run.RunStatus.Name(status)
        time.sleep(0.1)

    events: queue.Queue = queue.Queue()

    def join() -> None:
        try:
            for r in _stub(pb, cluster, c).JoinRun(pb.svc.JoinRunRequest(run_id=run.run_id), metadata=md, timeout=120):
                events.put(r.event)
        except grpc.RpcError as e:  # reported to the test thread
            events.put(e)
        events.put(None)

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    first = events.get(timeout=RPC_TIMEOUT_S)
    assert not isinstance(first, grpc.RpcError), first
    assert first.WhichOneof("kind") == "metadata", first

    cancelled = _stub(pb, cluster, b).CancelRun(pb.svc.CancelRunRequest(run_id=run.run_id, wait=True), metadata=md, timeout=90)
    assert cancelled.run.status == pb.run.RUN_STATUS_INTERRUPTED, cancelled

    last = first
    while (item := events.get(timeout=90)) is not None:
        assert not isinstance(item, grpc.RpcError), item
        last = item
    joiner.join(timeout=5)
    assert last.WhichOneof("kind") == "end" and last.end.status == pb.run.RUN_STATUS_INTERRUPTED, last


def _admits(docs: list[dict], target_labels: dict, caller_labels: dict, port: str = "grpc") -> bool:
    """Whether the rendered NetworkPolicies let a pod with caller_labels (same namespace) reach target_labels."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"
                and chart_local._matches(d["spec"]["podSelector"].get("matchLabels", {}), target_labels)]
    if not policies:
        return True  # not isolated
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
                continue
            for peer in rule.get("from", [{}]):
                if chart_local._matches((peer.get("podSelector") or {}).get("matchLabels", {}), caller_labels):
                    return True
    return False


def test_network_policies_admit_exactly_the_calls_the_services_make(cluster: chart_local.LocalCluster) -> None:
    labels = {p.workload["metadata"]["name"]: p.labels for p in cluster.pods}
    ingress = {"antler.dev/ingress": "true"}
    # The calls the tests above made: a client through the ingress, runs to sandbox and models, models to sandbox.
    # mcp and memory are the runs service's too.
    allowed = [(ingress, "antler"), (labels["antler"], "antler-sandbox"), (labels["antler"], "antler-models"),
               (labels["antler"], "antler-mcp"), (labels["antler"], "antler-memory"), (labels["antler-models"], "antler-sandbox")]
    # The HTTP edge: the ingress reaches its http port; it calls every service as its callers.
    allowed += [(labels["antler-edge"], target) for target in ("antler", "antler-sandbox", "antler-models", "antler-mcp", "antler-memory")]
    for caller, target in allowed:
        assert _admits(cluster.docs, labels[target], caller), f"{caller} cannot reach {target}"
    assert _admits(cluster.docs, labels["antler-edge"], ingress, port="http"), "the ingress cannot reach the edge's http port"
    denied = [({"app": "other"}, "antler"), (labels["antler-mcp"], "antler-sandbox"), (labels["antler-memory"], "antler-sandbox"),
              (labels["antler-sandbox"], "antler-models"), (ingress, "antler-sandbox"), (labels["antler-models"], "antler")]
    denied += [({"app": "other"}, "antler-edge"), (labels["antler"], "antler-edge")]
    for caller, target in denied:
        assert not _admits(cluster.docs, labels[target], caller, port="http" if target == "antler-edge" else "grpc"), f"{caller} may reach {target}"
    assert not _admits(cluster.docs, labels["antler-edge"], ingress, port="grpc"), "the edge's gRPC port is not for the ingress"


def test_the_edge_serves_the_langgraph_api_and_the_gateway_through_its_service(cluster: chart_local.LocalCluster) -> None:
    import httpx

    target = cluster.service_target("antler-edge", 2024)
    assert target is not None, "the Service antler-edge selects no edge pod on port 2024"
    [edge] = cluster.pods_of("antler-edge")
    assert target == edge.http, f"the Service leads to {target}, the edge listens on {edge.http!r}"
    key = cluster.secrets["antler"]["api-key"]
    with httpx.Client(base_url=f"http://{target}", headers={"x-api-key": key}, timeout=120) as http:
        assert http.get("/ok").status_code == 200
        assert httpx.post(f"http://{target}/threads", json={}, timeout=30).status_code == 401, "the edge needs the API key"
        # edge -> runs -> models + sandbox: a run of the replay model, through the LangGraph API.
        thread = http.post("/threads", json={}).json()["thread_id"]
        done = http.post(f"/threads/{thread}/runs/wait", json={
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "Write a short hello note to /mnt/user-data/outputs/hello.md, check it, and present it."}]},
            "config": {"configurable": {"model_name": "scripted"}},
        })
        assert done.status_code == 200 and "__error__" not in done.json(), f"{done.text}\n{edge.logs()}"
        # edge -> sandbox: the run's artifact, and an upload's bytes back.
        note = http.get(f"/api/threads/{thread}/artifacts/mnt/user-data/outputs/hello.md")
        assert note.status_code == 200 and note.content, note.text
        blob = os.urandom(50_000)
        up = http.post(f"/api/threads/{thread}/uploads", files=[("files", ("blob.bin", blob, "application/octet-stream"))])
        assert up.status_code == 200, up.text
        assert http.get(up.json()["files"][0]["artifact_url"]).content == blob
        # edge -> models, memory, mcp: the gateway's reads.
        assert {m["name"] for m in http.get("/api/models").json()["models"]} >= {"scripted", "slow"}
        assert http.get("/api/memory").status_code == 200
        assert http.get("/api/mcp/config").status_code == 200
    # The chart's CORS origin reaches edge.cors_origins.
    preflight = httpx.options(f"http://{target}/threads", headers={"Origin": UI_ORIGIN, "Access-Control-Request-Method": "POST"}, timeout=30)
    assert preflight.headers.get("access-control-allow-origin") == UI_ORIGIN, preflight.headers
