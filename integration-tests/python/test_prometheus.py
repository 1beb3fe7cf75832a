"""A real Prometheus scrapes ``antler up``: every family is there, described, from the first scrape.

Debian's ``prometheus`` package (installed by ``scripts/setup``) provides both binaries used here:

* ``prometheus`` scrapes the server's ``server.metrics.listen`` every second (its own config and TSDB in a
  temporary directory, its web API on a free loopback port); the tests read what it stored through
  ``/api/v1/query`` and ``/api/v1/metadata``: ``up`` is 1, and the families the dashboards and alerts
  need (shed requests, authentication failures, run takeovers, config reloads, facts written, …) are
  there at 0 before any traffic, each with its ``# HELP`` text.
* ``promtool check metrics`` lints a scrape (naming, HELP, counter suffixes): before traffic and after a
  run through the LangGraph edge with a replay model, when the families labelled with a model or an HTTP
  status exist too.

Also: a real reload of ``antler.yaml`` moves ``antler_config_reloads_total{outcome="applied"}`` and
``{outcome="rejected"}`` from the 0 they start at, as Prometheus sees it; and every expression of
``examples/grafana-dashboard.json`` is valid PromQL to this Prometheus.

A missing ``prometheus`` or ``promtool`` fails the tests (never a skip).
Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``).
Run: ``python -m pytest -q integration-tests/python/test_prometheus.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import antler_up

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "examples" / "grafana-dashboard.json"
WAIT_S = 60.0
METRICS_PREFIX = "metrics:"

CONFIG = """
server:
  shutdown_grace_secs: 5
  reload_interval_ms: 200
  metrics:
    listen: 127.0.0.1:0
edge:
  listen: 127.0.0.1:0
sandbox:
  provider: local
models:
  - name: quick
    provider: replay
    replay:
      after_last: cycle
      turns:
        - text: "Let me look around first."
          tool_calls:
            - {id: call_ls, name: ls, arguments: {description: list the workspace, path: /mnt/user-data/workspace}}
          usage: {input_tokens: 100, output_tokens: 20}
        - text: "Done."
          usage: {input_tokens: 150, output_tokens: 12}
"""

# Families that must read 0 before any traffic, with every label set they must have (job and instance
# aside). The first five are the ones issue #28 found reading "No data".
ZERO_AT_START: dict[str, list[dict[str, str]]] = {
    "antler_requests_shed_total": [{"kind": "client"}, {"kind": "internal"}],
    "antler_auth_failures_total": [{}],
    "antler_run_takeovers_total": [{}],
    "antler_config_reloads_total": [{"outcome": "applied"}, {"outcome": "rejected"}],
    "antler_memory_facts_written_total": [{"source": "conversation"}, {"source": "manual"}],
    "antler_tls_handshakes_total": [{"outcome": "ok"}, {"outcome": "failed"}, {"outcome": "timeout"}],
    "antler_tls_reloads_total": [{"outcome": "applied"}, {"outcome": "rejected"}],
    "antler_requests_default_deadline_total": [{}],
    "antler_requests_too_large_total": [{}],
    "antler_runs_fenced_total": [{"cause": "lease_lost"}, {"cause": "lease_expired"}, {"cause": "write_refused"}],
    "antler_runs_active": [{}],
    "antler_subagent_tasks_total": [{"status": s} for s in ("completed", "timed_out", "cancelled", "failed")],
    "antler_model_registry_reloads_total": [{"outcome": "applied"}, {"outcome": "rejected"}],
    "antler_memory_update_seconds_count": [{}],
    "antler_sandbox_live": [{}],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _wait(what: str, probe: Callable[[], Optional[Any]], logs: Callable[[], str]) -> Any:
    deadline = time.monotonic() + WAIT_S
    last: Any = None
    while time.monotonic() < deadline:
        try:
            found = probe()
        except (OSError, urllib.error.URLError) as error:
            found, last = None, error
        if found is not None:
            return found
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {WAIT_S:.0f} s (last error: {last})\n{logs()}")


@dataclass
class Stack:
    root: Path
    metrics_url: str
    edge_url: str
    prometheus_url: str
    prometheus_log: Path
    antler_stderr: Path

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}" for p in (self.prometheus_log, self.antler_stderr))

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to (fails the test on an API error)."""
        status, body = _get(f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
        answer = json.loads(body)
        assert status == 200 and answer.get("status") == "success", f"{promql}: HTTP {status} {answer}"
        return answer["data"]["result"]

    def series(self, promql: str) -> dict[frozenset, float]:
        """``promql``'s samples by their labels, without ``__name__``, ``job`` and ``instance``."""
        out = {}
        for sample in self.query(promql):
            labels = {k: v for k, v in sample["metric"].items() if k not in ("__name__", "job", "instance")}
            out[frozenset(labels.items())] = float(sample["value"][1])
        return out

    def wait_for(self, promql: str, done: Callable[[dict[frozenset, float]], bool]) -> dict[frozenset, float]:
        return _wait(f"Prometheus to see {promql}", lambda: (lambda s: s if done(s) else None)(self.series(promql)), self.logs)

    def scrape(self) -> str:
        status, body = _get(self.metrics_url)
        assert status == 200, f"GET {self.metrics_url}: {status}"
        return body.decode()


def _start_prometheus(request: pytest.FixtureRequest, root: Path, target: str) -> tuple[str, Path]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed (Debian package `prometheus`; scripts/setup installs it as root)")
    (root / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: antler\n    static_configs:\n      - targets: ['{target}']\n"
    )
    log = root / "prometheus.log"
    for _attempt in range(3):
        port = _free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=root,
            )

        def stop(proc: subprocess.Popen = proc) -> None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

        request.addfinalizer(stop)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if _get(f"{url}/-/ready", timeout=2)[0] == 200:
                    return url, log
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        stop()
        if "address already in use" not in log.read_text(errors="replace"):
            break
    pytest.fail(f"prometheus did not become ready\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> Stack:
    root = antler_up.searchable_root(request, "antler-prometheus-")

    def ready(text: str) -> Optional[tuple[str, str]]:
        metrics = [line.strip()[len(METRICS_PREFIX):].strip() for line in text.splitlines() if line.strip().startswith(METRICS_PREFIX)]
        edge = [line.split("listening on", 1)[1].strip() for line in text.splitlines() if line.startswith("langgraph api listening on")]
        return (metrics[0], edge[0]) if metrics and edge else None

    started = antler_up.start(request, root, CONFIG, ready)
    metrics_url, edge = started.ready
    target = urllib.parse.urlparse(metrics_url).netloc
    prometheus_url, log = _start_prometheus(request, root, target)
    edge_url = edge if edge.startswith("http") else f"http://{edge}"
    s = Stack(root, metrics_url, edge_url, prometheus_url, log, started.stderr)
    s.wait_for('up{job="antler"}', lambda v: v.get(frozenset()) == 1.0)
    return s


def _promtool(body: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed (Debian package `prometheus`; scripts/setup installs it as root)")
    return subprocess.run([binary, "check", "metrics"], input=body, capture_output=True, text=True, check=False)


def test_prometheus_sees_every_named_family_at_zero_with_help_before_any_traffic(stack: Stack) -> None:
    for name, label_sets in ZERO_AT_START.items():
        series = stack.wait_for(name, lambda s: len(s) > 0)
        for labels in label_sets:
            key = frozenset(labels.items())
            assert series.get(key) == 0.0, f"{name}{labels}: {series}"
        assert all(v == 0.0 for v in series.values()), f"{name}: {series}"

    status, body = _get(f"{stack.prometheus_url}/api/v1/metadata")
    assert status == 200, body
    metadata = {name: entries for name, entries in json.loads(body)["data"].items() if name.startswith("antler_")}
    for name in ZERO_AT_START:
        family = name.removesuffix("_count")
        assert family in metadata, f"no metadata for {family}: {sorted(metadata)}"
    no_help = [name for name, entries in metadata.items() if not any(e.get("help") for e in entries)]
    assert not no_help, f"families without HELP: {no_help}"
    assert len(metadata) >= 40, f"only {len(metadata)} families scraped: {sorted(metadata)}"


def test_promtool_finds_no_problem_before_and_after_traffic(stack: Stack) -> None:
    before = _promtool(stack.scrape())
    assert before.returncode == 0 and not (before.stdout + before.stderr).strip(), f"promtool: {before.stdout}{before.stderr}"

    # One lead run through the LangGraph edge with the replay model: model, agent, sandbox and edge
    # families labelled with a model name or an HTTP status exist after it.
    def post(path: str, payload: dict) -> dict:
        request = urllib.request.Request(f"{stack.edge_url}{path}", data=json.dumps(payload).encode(),
                                         headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return json.loads(response.read())

    thread = post("/threads", {})
    post(f"/threads/{thread['thread_id']}/runs/wait", {
        "assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "look around"}]},
        "config": {"configurable": {"model_name": "quick"}},
    })
    stack.wait_for('antler_model_requests_total{model="quick"}', lambda s: sum(s.values()) >= 2)
    stack.wait_for('antler_langgraph_requests_total{endpoint="wait",status="200"}', lambda s: sum(s.values()) >= 1)
    body = stack.scrape()
    for family in ("antler_model_tokens_total", "antler_langgraph_requests_total", "antler_sandbox_file_ops_total"):
        assert f"# HELP {family} " in body, f"{family} missing after traffic:\n{body}"
    after = _promtool(body)
    assert after.returncode == 0 and not (after.stdout + after.stderr).strip(), f"promtool: {after.stdout}{after.stderr}"


def test_a_real_reload_moves_the_reload_counters_from_zero(stack: Stack) -> None:
    both = lambda applied, rejected: lambda s: s.get(frozenset({("outcome", "applied")})) == applied and s.get(
        frozenset({("outcome", "rejected")})) == rejected
    stack.wait_for("antler_config_reloads_total", both(0.0, 0.0))
    stack.wait_for("antler_model_registry_reloads_total", both(0.0, 0.0))

    config = stack.root / "antler.yaml"

    def replace(text: str) -> None:
        # As a ConfigMap update does: a new file renamed over the old one.
        tmp = config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, config)

    # A valid change (a second model): applied, and the models service rebuilds its registry.
    valid = CONFIG + "  - name: second\n    provider: replay\n    replay:\n      turns:\n        - text: hello\n"
    replace(valid)
    stack.wait_for("antler_config_reloads_total", both(1.0, 0.0))
    stack.wait_for("antler_model_registry_reloads_total", both(1.0, 0.0))
    # An invalid one: rejected, and the previous configuration stays.
    replace(valid.replace("reload_interval_ms: 200", "reload_interval_ms: 200\n  concurrency_limit: 0"))
    stack.wait_for("antler_config_reloads_total", both(1.0, 1.0))
    assert "server.concurrency_limit" in stack.antler_stderr.read_text(errors="replace")


def test_every_dashboard_expression_is_valid_promql(stack: Stack) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 30, exprs
    for title, expr in exprs:
        promql = expr.replace("$job", ".*").replace("$__rate_interval", "1m")
        stack.query(promql)  # fails on a parse or evaluation error, naming the panel's expression
