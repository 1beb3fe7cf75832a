"""Runs what the Helm chart renders as local processes: the chart's wiring tested without a cluster.

``render`` calls ``helm template``; ``LocalCluster`` reads the manifests and starts every Deployment and
StatefulSet replica as the binary the container names, with

* the container's ``command``/``args`` (``antler`` is ``ANTLER_BIN``; paths under a ``volumeMount``, in the
  args and in the pod's copy of the rendered antler.yaml, are mapped to a directory of the pod: ConfigMap and Secret volumes hold the rendered keys as files, emptyDirs and
  PersistentVolumeClaims are directories, a StatefulSet's volumeClaimTemplates one per pod);
* the container's ``env`` only (plus ``PATH``), ``valueFrom.secretKeyRef`` resolved from the rendered Secrets
  and the Secrets the caller says exist (``external_secrets``), so a reference the chart gets wrong fails;
* each pod on its own loopback address (127.x.y.z, like a pod IP): the pod's process listens there on the port
  its rendered antler.yaml names (``--listen`` is the one added flag: it stands for the pod's own network
  namespace, where 0.0.0.0 is that address);
* Service DNS names (``http(s)://<service>.<namespace>.svc:<port>`` in the rendered ConfigMap) replaced by
  the address Kubernetes would route to: the Service port's ``targetPort`` resolved to the ``containerPort``
  of the first pod the Service's selector matches. A name, port or selector that leads nowhere is left as it
  is (the call then fails), so a wrong port or Service name in the chart fails the caller's test. With TLS the
  certificate is still checked against the Service's DNS name: the chart renders it as the client's
  ``tls.server_name``;
* readiness as the chart declares it: the readinessProbe's gRPC port and health service name must answer
  SERVING, in plaintext as the kubelet asks (with TLS on, that is the chart's health-only port);
* the HTTP edge's ``edge.listen`` (0.0.0.0:<port>) on the pods that declare the ``http`` container port, on the
  pod's address like the gRPC listener (``Pod.http``).

Used by ``test_chart_wiring.py`` and ``integration-tests/bench/replica_kill.py``.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "antler"
LISTEN_PREFIX = " listening on "


class WiringError(AssertionError):
    """The manifests describe something that cannot run as written."""


def helm_binary() -> Path:
    """helm from $HELM or the tools directory (scripts/helm-check fetches it there)."""
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    tools = Path(os.environ.get("ANTLER_TOOLS", REPO / ".tools"))
    helm = tools / "helm" / "helm"
    if not helm.is_file():
        raise WiringError(f"no helm at {helm}: run scripts/helm-check once (it fetches helm), or set HELM")
    return helm


def render(release: str, namespace: str, values_files: list[Path] = (), sets: list[str] = ()) -> list[dict]:
    cmd = [str(helm_binary()), "template", release, str(CHART), "--namespace", namespace]
    for f in values_files:
        cmd += ["-f", str(f)]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise WiringError(f"helm template failed: {out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class Pod:
    name: str
    workload: dict
    ordinal: int
    ip: str
    root: Path
    spec: dict
    labels: dict
    proc: subprocess.Popen | None = None
    listen: str = ""
    #: host:port of the pod's Prometheus endpoint, when the chart enables it.
    metrics: str = ""
    #: host:port of the pod's plaintext health-only listener, when the chart renders one (TLS on).
    health: str = ""
    #: host:port of the HTTP edge (edge.listen) on pods that serve it: the edge's own, or the all-in-one pod.
    http: str = ""
    restarts: int = 0

    @property
    def container(self) -> dict:
        return self.spec["containers"][0]

    def container_port(self, port: int | str) -> int:
        """A port by name or number, as a Service's targetPort or a probe gives it."""
        for p in self.container.get("ports", []):
            if p.get("name") == port or p.get("containerPort") == port:
                return int(p["containerPort"])
        if isinstance(port, int):
            return port
        raise WiringError(f"pod {self.name}: no container port named {port!r}")

    @property
    def address(self) -> str:
        return self.listen

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for name in ("stdout.log", "stderr.log"):
            p = self.root / name
            if p.exists():
                parts.append(f"--- {self.name} {name} ---\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)


@dataclass
class LocalCluster:
    docs: list[dict]
    namespace: str
    root: Path
    antler_bin: Path
    external_secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    # The first three octets of the pods' loopback addresses, e.g. "127.31.7".
    ip_prefix: str = "127.31.7"
    pods: list[Pod] = field(default_factory=list)
    rewrites: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.secrets: dict[str, dict[str, str]] = {
            name: dict(data) for name, data in self.external_secrets.items()
        }
        self.configmaps: dict[str, dict[str, str]] = {}
        for d in self.docs:
            if d["kind"] == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (d.get("data") or {}).items()}
                data.update(d.get("stringData") or {})
                self.secrets[d["metadata"]["name"]] = data
            elif d["kind"] == "ConfigMap":
                self.configmaps[d["metadata"]["name"]] = dict(d.get("data") or {})
        n = 10
        for d in self.docs:
            if d["kind"] not in ("Deployment", "StatefulSet"):
                continue
            replicas = d["spec"].get("replicas", 1)
            for i in range(replicas):
                tpl = d["spec"]["template"]
                name = f"{d['metadata']['name']}-{i}"
                self.pods.append(Pod(name=name, workload=d, ordinal=i, ip=f"{self.ip_prefix}.{n}", root=self.root / name,
                                     spec=copy.deepcopy(tpl["spec"]), labels=tpl["metadata"].get("labels", {})))
                n += 1
        self._rewrite_configmaps()

    # ----------------------------------------------------------------------------------------------
    # Services
    # ----------------------------------------------------------------------------------------------

    def service(self, name: str) -> dict:
        for d in self.docs:
            if d["kind"] == "Service" and d["metadata"]["name"] == name:
                return d
        raise WiringError(f"no Service {name}")

    def service_target(self, name: str, port: int) -> str | None:
        """Where a connection to Service `name`:`port` lands: the first selected pod's address, or None."""
        try:
            svc = self.service(name)
        except WiringError:
            return None
        if svc["spec"].get("clusterIP") == "None":
            return None
        selector = svc["spec"].get("selector") or {}
        pods = [p for p in self.pods if selector and _matches(selector, p.labels)]
        spec_port = next((p for p in svc["spec"]["ports"] if int(p["port"]) == port), None)
        if not pods or spec_port is None:
            return None
        target = spec_port.get("targetPort", spec_port["port"])
        return f"{pods[0].ip}:{pods[0].container_port(target)}"

    def pods_of(self, workload: str) -> list[Pod]:
        return [p for p in self.pods if p.workload["metadata"]["name"] == workload]

    def _rewrite_configmaps(self) -> None:
        # Only endpoints (scheme, name, port): a bare Service name elsewhere (tls.server_name) stays as it is.
        pattern = re.compile(r"(https?)://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)")

        def replace(m: re.Match) -> str:
            scheme, name, ns, port = m.group(1), m.group(2), m.group(3), int(m.group(4))
            target = self.service_target(name, port) if ns == self.namespace else None
            if target is None:
                return m.group(0)  # stays unresolvable, as it would be in the cluster
            self.rewrites[m.group(0)] = f"{scheme}://{target}"
            return f"{scheme}://{target}"

        for data in self.configmaps.values():
            for key, text in data.items():
                data[key] = pattern.sub(replace, text)

    # ----------------------------------------------------------------------------------------------
    # Pods
    # ----------------------------------------------------------------------------------------------

    def _volume_dirs(self, pod: Pod) -> dict[str, Path]:
        """Volume name -> the directory standing for it."""
        dirs: dict[str, Path] = {}
        for v in pod.spec.get("volumes", []):
            d = pod.root / "volumes" / v["name"]
            if "configMap" in v:
                data = self.configmaps.get(v["configMap"]["name"])
                if data is None:
                    raise WiringError(f"pod {pod.name}: ConfigMap {v['configMap']['name']} is not rendered")
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
                items = v["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise WiringError(f"pod {pod.name}: ConfigMap {v['configMap']['name']} has no key {item['key']}")
                    (d / item["path"]).write_text(data[item["key"]])
            elif "secret" in v:
                data = self.secrets.get(v["secret"]["secretName"])
                if data is None:
                    raise WiringError(f"pod {pod.name}: Secret {v['secret']['secretName']} does not exist")
                d.mkdir(parents=True, exist_ok=True)
                for k, text in data.items():
                    (d / k).write_text(text)
            elif "emptyDir" in v:
                shutil.rmtree(d, ignore_errors=True)  # a new pod gets a new emptyDir
                d.mkdir(parents=True)
            elif "persistentVolumeClaim" in v:
                d = self.root / "pvc" / v["persistentVolumeClaim"]["claimName"]
                d.mkdir(parents=True, exist_ok=True)
            else:
                raise WiringError(f"pod {pod.name}: volume {v['name']} of an unsupported kind")
            dirs[v["name"]] = d
        for t in pod.workload["spec"].get("volumeClaimTemplates", []):
            d = self.root / "pvc" / f"{t['metadata']['name']}-{pod.name}"
            d.mkdir(parents=True, exist_ok=True)
            dirs[t["metadata"]["name"]] = d
        return dirs

    def _env(self, pod: Pod) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(pod.root)}
        for e in pod.container.get("env", []):
            if "value" in e:
                env[e["name"]] = str(e["value"])
                continue
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                raise WiringError(f"pod {pod.name}: env {e['name']} has neither value nor secretKeyRef")
            secret = self.secrets.get(ref["name"])
            if secret is None or ref["key"] not in secret:
                if ref.get("optional"):
                    continue
                raise WiringError(f"pod {pod.name}: env {e['name']} names Secret {ref['name']} key {ref['key']}, which does not exist")
            env[e["name"]] = secret[ref["key"]]
        return env

    def start(self, pod: Pod) -> None:
        pod.root.mkdir(parents=True, exist_ok=True)
        dirs = self._volume_dirs(pod)
        mounts = sorted(pod.container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
        for m in mounts:
            if m["name"] not in dirs:
                raise WiringError(f"pod {pod.name}: volumeMount {m['name']} has no volume")

        def host_path(arg: str) -> str:
            for m in mounts:
                mp = m["mountPath"].rstrip("/")
                if arg == mp or arg.startswith(mp + "/"):
                    return str(dirs[m["name"]]) + arg[len(mp):]
            return arg

        command = list(pod.container.get("command") or [])
        if command[:1] != ["antler"]:
            raise WiringError(f"pod {pod.name}: command {command} does not start the antler binary")
        args = [host_path(a) for a in pod.container.get("args", [])]
        config_path = Path(args[args.index("--config") + 1])
        # Files the config names under a mount (the TLS Secret's, at /etc/antler-tls) are where that volume is
        # here; this copy of the ConfigMap is the pod's own.
        # One pass, longest mount path first, so a mapped path is never mapped again (/tmp is a mount too).
        host_dirs = {m["mountPath"].rstrip("/"): str(dirs[m["name"]]) for m in mounts}
        alternatives = "|".join(re.escape(mp) for mp in host_dirs)
        text = re.sub(rf"(?<![\w/.-])({alternatives})/", lambda m: host_dirs[m.group(1)] + "/", config_path.read_text())
        config_path.write_text(text)
        config = yaml.safe_load(text)
        port = int(str(config["server"]["listen"]).rsplit(":", 1)[1])
        pod.listen = f"{pod.ip}:{port}"
        # The metrics endpoint's and the health-only listener's 0.0.0.0 is the pod's address too (this copy of
        # the ConfigMap is the pod's).
        metrics = str((config["server"].get("metrics") or {}).get("listen", ""))
        if metrics.startswith("0.0.0.0:"):
            pod.metrics = f"{pod.ip}:{metrics.rsplit(':', 1)[1]}"
            config_path.write_text(config_path.read_text().replace(metrics, pod.metrics))
        health = str(config["server"].get("health_listen", ""))
        if health.startswith("0.0.0.0:"):
            pod.health = f"{pod.ip}:{health.rsplit(':', 1)[1]}"
            config_path.write_text(config_path.read_text().replace(f"health_listen: {health}", f"health_listen: {pod.health}"))
        # The HTTP edge's 0.0.0.0 too, on the pods that declare its container port (the others ignore edge.listen).
        edge = str((config.get("edge") or {}).get("listen", ""))
        if edge.startswith("0.0.0.0:") and any(p.get("name") == "http" for p in pod.container.get("ports", [])):
            pod.http = f"{pod.ip}:{edge.rsplit(':', 1)[1]}"
            config_path.write_text(config_path.read_text().replace(edge, pod.http))
        argv = [str(self.antler_bin), *command[1:], *args, "--listen", pod.listen]
        ids = self._identity(pod)
        if ids:
            # As the kubelet does for fsGroup: the pod's volumes belong to its user and group.
            for path in [pod.root, *pod.root.rglob("*"), *dirs.values()]:
                os.chown(path, ids["user"], ids["group"])
        with (pod.root / "stdout.log").open("ab") as out, (pod.root / "stderr.log").open("ab") as err:
            pod.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=pod.root,
                                        env=self._env(pod), start_new_session=True, **ids)

    @staticmethod
    def _identity(pod: Pod) -> dict[str, Any]:
        """The user the container runs as (its securityContext over the pod's), applied when we are root."""
        merged = {**(pod.spec.get("securityContext") or {}), **(pod.container.get("securityContext") or {})}
        uid, gid = merged.get("runAsUser"), merged.get("runAsGroup")
        if merged.get("runAsNonRoot") and uid in (None, 0):
            raise WiringError(f"pod {pod.name}: runAsNonRoot without a non-zero runAsUser (the image's user is not known here)")
        if os.geteuid() != 0 or uid is None:
            return {}
        fs_group = (pod.spec.get("securityContext") or {}).get("fsGroup")
        return {"user": uid, "group": gid if gid is not None else uid, "extra_groups": [fs_group] if fs_group is not None else []}

    def wait_ready(self, pod: Pod, timeout_s: float = 60.0) -> None:
        """The readinessProbe as declared: gRPC health at its port and service name answers SERVING."""
        probe = pod.container["readinessProbe"]["grpc"]
        address = f"{pod.ip}:{pod.container_port(probe['port'])}"
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if pod.proc is not None and pod.proc.poll() is not None:
                raise WiringError(f"pod {pod.name} exited with {pod.proc.returncode}\n{pod.logs()}")
            try:
                with grpc.insecure_channel(address) as ch:
                    reply = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service=probe.get("service", "")), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as e:
                last = f"{e.code()}: {e.details()}"
            time.sleep(0.1)
        raise WiringError(f"pod {pod.name}: readiness probe at {address} ({probe.get('service', '')!r}) never SERVING: {last}\n{pod.logs()}")

    def up(self, timeout_s: float = 90.0) -> None:
        # Like a cluster, start everything at once; clients connect lazily, so order does not matter.
        for pod in self.pods:
            self.start(pod)
        for pod in self.pods:
            self.wait_ready(pod, timeout_s)

    def kill(self, pod: Pod, sig: int = signal.SIGKILL) -> None:
        if pod.proc is not None and pod.proc.poll() is None:
            os.killpg(pod.proc.pid, sig)
            pod.proc.wait()

    def stop(self, pod: Pod, grace_s: float = 15.0) -> None:
        if pod.proc is None or pod.proc.poll() is not None:
            return
        pod.proc.send_signal(signal.SIGTERM)
        try:
            pod.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill(pod)

    def down(self) -> None:
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.send_signal(signal.SIGTERM)
        for pod in self.pods:
            self.stop(pod)


def psql(sql: str, db: str = "test") -> str:
    """One statement on the machine's PostgreSQL (127.0.0.1:5432, user postgres, trust auth)."""
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-AtX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"psql failed: {out.stderr}")
    return out.stdout.strip()
