"""Replica-kill benchmark: three runs replicas on PostgreSQL, started from the Helm chart's own manifests.

A program that prints figures (not a test: nothing here asserts a timing). It renders ``mode: split`` with
``runs.replicas=3`` and the ``script`` agent, starts every replica as a local process exactly as
``test_chart_wiring.py`` does (``chart_local.LocalCluster``: the container's args and env, the ConfigMap, the
Services mapped to loopback pod addresses), on a PostgreSQL database of its own, then:

Phase 1 (takeover): admits BENCH_RUNS (10,000) runs as fast as the three replicas take them (CreateRun spread
over the replicas, at most BENCH_IN_FLIGHT in flight; RESOURCE_EXHAUSTED is retried after its retry-after),
each a short script: custom "before", checkpoint, sleep BENCH_STEP_MS, custom "effect", checkpoint, say.
At the half-way admission it stops one replica with SIGSTOP (its whole process group: from that instant it
writes nothing and renews nothing), reads from the store what it holds (its RUNNING / FINALIZING runs and the
PENDING runs it admitted), then SIGKILLs it, and keeps going on the other two. The kill time is the SIGSTOP.
(An earlier version read the store while the victim still ran and killed it afterwards: with 20 ms steps
most of the runs it read as RUNNING finished on the victim before it died and never needed another attempt,
which is why only 5 of 28 had one.) It prints admissions/s, completed runs/s, how long EVERY one of the
killed replica's RUNNING runs took to resume elsewhere (the METADATA event of its next attempt, from the
store, minus the kill time) and how long its PENDING runs took to start elsewhere (started_at minus the kill
time); goal for both: lease + grace + sweep interval + 1 s. Then it proves from the store that every run
ended exactly once (one terminal status, one END event), that no run's side effects ran twice (the script
agent journals its `custom` steps in `tool_effects`: each effect's custom event at most once, and exactly once
where the journal says it was emitted), and that no run's event seqs have a gap.

Phase 2 (held runs): a fresh database and cluster, BENCH_HELD (10,000) runs that sleep for minutes, with
runs.max_concurrent_runs high enough that all are RUNNING at once; prints the RSS of each replica and the
database connections in use (pg_stat_activity), then stops.

Run (after ``cargo build -p antler --bin antler`` and ``scripts/helm-check`` once for helm):
    ANTLER_BIN=…/antler ANTLER_TOOLS=… python integration-tests/bench/replica_kill.py
Environment: BENCH_RUNS (10000), BENCH_HELD (10000), BENCH_IN_FLIGHT (128), BENCH_STEP_MS (20),
BENCH_LEASE_SECS (6), BENCH_ONLY (takeover,held).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grpc
import grpc_tools
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
import chart_local  # noqa: E402

REPO = HERE.parents[1]
ANTLER_BIN = Path(os.environ.get("ANTLER_BIN", REPO / "target" / "debug" / "antler"))
RUNS = int(os.environ.get("BENCH_RUNS", 10_000))
HELD = int(os.environ.get("BENCH_HELD", 10_000))
IN_FLIGHT = int(os.environ.get("BENCH_IN_FLIGHT", 128))
STEP_MS = int(os.environ.get("BENCH_STEP_MS", 20))
LEASE = int(os.environ.get("BENCH_LEASE_SECS", 6))
GRACE, SWEEP = 1, 1
ONLY = os.environ.get("BENCH_ONLY", "takeover,held").split(",")


def stubs() -> object:
    out = Path(tempfile.mkdtemp(prefix="antler-bench-stubs-"))
    proto = REPO / "proto"
    protos = sorted(str(p.relative_to(proto)) for p in proto.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto}", f"-I{well_known}",
                    f"--python_out={out}", f"--grpc_python_out={out}", *protos], check=True, cwd=proto)
    sys.path.insert(0, str(out))

    class pb:
        run = importlib.import_module("antler.runs.v1.run_pb2")
        event = importlib.import_module("antler.runs.v1.event_pb2")
        svc = importlib.import_module("antler.runs.v1.run_service_pb2")
        grpc = importlib.import_module("antler.runs.v1.run_service_pb2_grpc")
        common = importlib.import_module("antler.common.v1.common_pb2")
    return pb


def start_cluster(root: Path, database: str, runs_config: dict) -> chart_local.LocalCluster:
    values = {
        "runs": {"replicas": 3},
        "database": {"existingSecret": "bench-db"},
        "config": {"runs": {"agent": "script", **runs_config}, "server": {"log": {"filter": "warn,antler_runs=info"}}},
    }
    (root / "values.yaml").write_text(yaml.safe_dump(values))
    docs = chart_local.render("antler", "bench", [root / "values.yaml"])
    c = chart_local.LocalCluster(docs, "bench", root / "pods", ANTLER_BIN,
                                 external_secrets={"bench-db": {"database-url": f"postgres://postgres@127.0.0.1:5432/{database}"}},
                                 ip_prefix=f"127.{random.randint(32, 250)}.{random.randint(1, 250)}")
    c.up()
    return c


def worker_id(pod: chart_local.Pod) -> str:
    for line in (pod.root / "stdout.log").read_text(errors="replace").splitlines() + \
            (pod.root / "stderr.log").read_text(errors="replace").splitlines():
        if "runs worker starting" in line:
            return json.loads(line)["worker_id"]
    raise RuntimeError(f"no worker_id in {pod.name}'s log")


def spread(values: list[float]) -> str:
    """p50 / p99 / max of seconds, or '-' for none."""
    if not values:
        return "-"
    v = sorted(values)
    p99 = v[min(len(v) - 1, max(0, int(len(v) * 0.99 + 0.5) - 1))]
    return f"p50 {statistics.median(v):.2f} s, p99 {p99:.2f} s, max {v[-1]:.2f} s"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Admitter:
    """CreateRun as fast as the replicas take it: futures, at most IN_FLIGHT outstanding."""

    def __init__(self, pb, addresses: list[str], key: str) -> None:
        self.pb = pb
        self.stubs = {a: pb.grpc.RunServiceStub(grpc.insecure_channel(a)) for a in addresses}
        self.live = list(addresses)
        self.md = [("authorization", f"Bearer {key}")]
        self.slots = threading.Semaphore(IN_FLIGHT)
        self.lock = threading.Lock()
        self.admitted: list[str] = []
        self.retries = 0
        self.errors: dict[str, int] = {}

    def drop(self, address: str) -> None:
        with self.lock:
            self.live.remove(address)

    def submit(self, text: str, i: int) -> None:
        self.slots.acquire()
        self._send(text, i, 0)

    def _send(self, text: str, i: int, attempt: int) -> None:
        with self.lock:
            address = self.live[(i + attempt) % len(self.live)]
        req = self.pb.svc.CreateRunRequest(
            input=[self.pb.common.Message(role=self.pb.common.ROLE_USER,
                                          content=[self.pb.common.ContentPart(text=self.pb.common.TextPart(text=text))])],
            idempotency_key=f"bench-{i}")  # a retried CreateRun never admits a second run
        fut = self.stubs[address].CreateRun.future(req, metadata=self.md, timeout=60)

        def done(f) -> None:
            try:
                run = f.result().run
                with self.lock:
                    self.admitted.append(run.run_id)
                self.slots.release()
            except grpc.RpcError as e:
                code = e.code().name
                with self.lock:
                    self.errors[code] = self.errors.get(code, 0) + 1
                    self.retries += 1
                if code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED") and attempt < 50:
                    threading.Timer(0.2 if code != "RESOURCE_EXHAUSTED" else 1.0, self._send, (text, i, attempt + 1)).start()
                else:
                    print(f"  CreateRun {i} failed for good: {code} {e.details()}", flush=True)
                    self.slots.release()
        fut.add_done_callback(done)

    def wait(self, n: int, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.admitted) < n and time.monotonic() < deadline:
            time.sleep(0.05)


def q(sql: str, db: str) -> list[list[str]]:
    out = chart_local.psql(sql, db)
    return [row.split("|") for row in out.splitlines() if row]


def takeover(pb) -> None:
    db = f"antler_bench_{uuid.uuid4().hex[:10]}"
    chart_local.psql(f"CREATE DATABASE {db}")
    root = Path(tempfile.mkdtemp(prefix="antler-bench-"))
    root.chmod(0o711)
    c = None
    try:
        c = start_cluster(root, db, {"lease_secs": LEASE, "lease_grace_secs": GRACE, "sweep_interval_secs": SWEEP,
                                     "max_concurrent_runs": 64, "max_pending_runs": 100_000})
        runs = c.pods_of("antler")
        victim = runs[2]
        victim_worker = worker_id(victim)
        key = c.secrets["antler"]["api-key"]
        script = json.dumps({"script": [{"custom": "before"}, {"checkpoint": True}, {"sleep_ms": STEP_MS},
                                        {"custom": "effect"}, {"checkpoint": True}, {"say": "done"}]})
        adm = Admitter(pb, [p.address for p in runs], key)
        print(f"phase 1: {RUNS} runs ({STEP_MS} ms step), 3 runs replicas, lease {LEASE} s + grace {GRACE} s, sweep {SWEEP} s, "
              f"{IN_FLIGHT} CreateRun in flight; SIGKILL {victim.name} at {RUNS // 2} admissions", flush=True)
        t0 = time.monotonic()
        kill_wall_ms = None
        held_by_victim: list[str] = []
        finalizing_on_victim: list[str] = []
        lease_of: dict[str, int] = {}
        pending_on_victim: list[str] = []
        for i in range(RUNS):
            if i == RUNS // 2:
                adm.wait(i)
                # Frozen first, so what the store says it holds is what it holds when it dies.
                kill_wall_ms = int(time.time() * 1000)
                os.killpg(victim.proc.pid, signal.SIGSTOP)
                # Its RUNNING runs (leases it will never renew) and FINALIZING ones (a survivor adds the closing).
                held = q(f"SELECT run_id, status, lease_expires_at FROM runs WHERE owner_worker_id = '{victim_worker}' "
                         "AND status IN ('running', 'finalizing')", db)
                held_by_victim = [r[0] for r in held if r[1] == "running"]
                finalizing_on_victim = [r[0] for r in held if r[1] == "finalizing"]
                lease_of = {r[0]: int(r[2]) for r in held if r[2]}
                # And the PENDING runs it had admitted (an admission names its replica as owner until it starts them).
                pending_on_victim = [r[0] for r in q(f"SELECT run_id FROM runs WHERE owner_worker_id = '{victim_worker}' AND status = 'pending'", db)]
                pending_total = int(q("SELECT count(*) FROM runs WHERE status = 'pending'", db)[0][0])
                c.kill(victim)
                adm.drop(victim.address)
                print(f"  stopped and killed {victim.name} after {time.monotonic() - t0:.1f} s, holding {len(held_by_victim)} RUNNING runs, "
                      f"{len(finalizing_on_victim)} FINALIZING runs and {len(pending_on_victim)} PENDING runs it had admitted "
                      f"({pending_total} PENDING in all)", flush=True)
            adm.submit(script, i)
        adm.wait(RUNS)
        t_admit = time.monotonic() - t0
        print(f"  admitted {len(adm.admitted)} in {t_admit:.1f} s: {len(adm.admitted) / t_admit:.0f} admissions/s "
              f"(retried calls: {adm.retries}, by code: {adm.errors})", flush=True)
        terminal = "('success','error','interrupted','timeout')"
        while True:
            done = int(q(f"SELECT count(*) FROM runs WHERE status IN {terminal}", db)[0][0])
            if done >= len(adm.admitted) or time.monotonic() - t0 > 900:
                break
            time.sleep(0.5)
        t_done = time.monotonic() - t0
        print(f"  {done} runs terminal after {t_done:.1f} s: {done / t_done:.0f} completed runs/s (from the first CreateRun)", flush=True)

        goal = LEASE + GRACE + SWEEP + 1
        # Resume times: the METADATA event (kind 1) of each later attempt of the victim's runs, minus the kill.
        rows = q("SELECT e.run_id, e.created_at, encode(e.payload, 'hex') FROM run_events e WHERE e.kind = 1", db)
        first_start: dict[str, dict[int, int]] = {}
        for run_id, created, payload in rows:
            ev = pb.event.RunEvent.FromString(bytes.fromhex(payload))
            first_start.setdefault(run_id, {}).setdefault(ev.metadata.attempt, int(created))
        delays, after_lease, not_resumed = [], [], []
        for r in held_by_victim:
            later = [t for a, t in first_start.get(r, {}).items() if a >= 2 and t >= kill_wall_ms]
            if later:
                delays.append((min(later) - kill_wall_ms) / 1000)
                if r in lease_of:
                    # How long after the run became claimable (its lease + the grace) a survivor claimed it.
                    after_lease.append((min(later) - lease_of[r]) / 1000 - GRACE)
            else:
                not_resumed.append(r)
        print(f"  the victim's {len(held_by_victim)} RUNNING runs resumed elsewhere: {len(delays)}; "
              f"delay after the kill {spread(delays)} (goal <= lease + grace + sweep + 1 = {goal} s; over it: "
              f"{sum(1 for d in delays if d > goal)}); after their lease + grace: {spread(after_lease)}", flush=True)
        if finalizing_on_victim:
            ids = ",".join(f"'{r}'" for r in finalizing_on_victim)
            closed = [(int(r[0]) - kill_wall_ms) / 1000 for r in q(f"SELECT finished_at FROM runs WHERE run_id IN ({ids}) AND finished_at IS NOT NULL", db)]
            print(f"  the victim's {len(finalizing_on_victim)} FINALIZING runs closed by a survivor (no new attempt): {len(closed)}; "
                  f"after the kill {spread(closed)}", flush=True)
        if not_resumed:
            ids = ",".join(f"'{r}'" for r in not_resumed)
            how = q(f"SELECT status, stop_reason, attempt, count(*) FROM runs WHERE run_id IN ({ids}) GROUP BY 1, 2, 3", db)
            print(f"  of those, without a later attempt: {len(not_resumed)} (status, stop_reason, attempt, runs: {how})", flush=True)
        if pending_on_victim:
            ids = ",".join(f"'{r}'" for r in pending_on_victim)
            starts = [(int(r[0]) - kill_wall_ms) / 1000 for r in q(f"SELECT started_at FROM runs WHERE run_id IN ({ids}) AND started_at IS NOT NULL", db)]
            # The first one shows when the survivors saw the victim dead (heartbeat + grace + sweep); the rest
            # then start as fast as the survivors' free slots allow, before their own PENDING runs.
            print(f"  the victim's {len(pending_on_victim)} PENDING runs started elsewhere: {len(starts)}; after the kill "
                  f"first {min(starts, default=0):.2f} s, {spread(starts)} (over the goal: {sum(1 for d in starts if d > goal)})", flush=True)
        # All runs admitted before the kill that started late (the survivors' own queue).
        pending_late = q(f"SELECT count(*), max(started_at - {kill_wall_ms}) FROM runs WHERE created_at < {kill_wall_ms} "
                         f"AND started_at > {kill_wall_ms} + {goal * 1000}", db)[0]
        print(f"  runs admitted before the kill (by any replica) that first started more than {goal} s after it: {pending_late[0]} "
              f"(latest {int(pending_late[1] or 0) / 1000:.1f} s after the kill)", flush=True)

        # Proof from the store.
        statuses = q("SELECT status || coalesce(':' || error_code, ''), count(*) FROM runs GROUP BY 1 ORDER BY 1", db)
        ends = q("SELECT count(*) FROM (SELECT run_id FROM run_events WHERE kind = 14 GROUP BY run_id HAVING count(*) <> 1) x", db)[0][0]
        no_end = q("SELECT count(*) FROM runs r WHERE NOT EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = r.run_id AND e.kind = 14)", db)[0][0]
        gaps = q("SELECT count(*) FROM (SELECT r.run_id FROM runs r JOIN run_events e USING (run_id) GROUP BY r.run_id, r.last_seq "
                 "HAVING count(*) <> max(e.seq) OR max(e.seq) <> r.last_seq OR min(e.seq) <> 1) x", db)[0][0]
        # Side effects: each `custom` step's event (name "script", the step's value) against its journal row.
        events: dict[tuple[str, str], int] = {}
        unknown_notes = 0
        for run_id, payload in q("SELECT run_id, encode(payload, 'hex') FROM run_events WHERE kind = 8", db):
            custom = pb.event.RunEvent.FromString(bytes.fromhex(payload)).custom
            if custom.name == "script":
                key = (run_id, custom.data.string_value)
                events[key] = events.get(key, 0) + 1
            elif custom.name == "script_effect_unknown":
                unknown_notes += 1
        journal = q("SELECT run_id, tool_call_id, attempt, coalesce(result, '<none>') FROM tool_effects", db)
        step_of = {"script-step-0": "before", "script-step-3": "effect"}
        twice = sum(1 for n in events.values() if n > 1)
        by_result: dict[str, int] = {}
        mismatch = 0
        for run_id, key, _attempt, result in journal:
            kind = "emitted" if result == "emitted" else "unknown" if result.startswith("outcome unknown") else result
            by_result[kind] = by_result.get(kind, 0) + 1
            seen = events.get((run_id, step_of.get(key, "?")), 0)
            # Emitted: exactly one event. Unknown (died between intent and result): at most one, never redone.
            if (kind == "emitted" and seen != 1) or (kind != "emitted" and seen > 1):
                mismatch += 1
        effects_missing = sum(1 for r in adm.admitted if (r, "effect") not in events)
        attempts = q("SELECT attempt, count(*) FROM runs GROUP BY attempt ORDER BY attempt", db)
        print(f"  store: statuses {dict((s, int(n)) for s, n in statuses)}; attempts {dict((int(a), int(n)) for a, n in attempts)}", flush=True)
        print(f"  store: runs without exactly one END event: {ends} (with none: {no_end}); runs with a seq gap or "
              f"last_seq mismatch: {gaps}", flush=True)
        print(f"  store: side effects (custom steps) recorded twice: {twice}; journal rows {len(journal)} by result {by_result}, "
              f"rows whose events disagree with them: {mismatch}; runs with no 'effect' event: {effects_missing}; "
              f"'outcome unknown' notes: {unknown_notes}", flush=True)
    finally:
        if c is not None:
            c.down()
        chart_local.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(root, ignore_errors=True)


def held(pb) -> None:
    db = f"antler_bench_{uuid.uuid4().hex[:10]}"
    chart_local.psql(f"CREATE DATABASE {db}")
    root = Path(tempfile.mkdtemp(prefix="antler-bench-"))
    root.chmod(0o711)
    c = None
    try:
        per_replica = HELD // 3 + 100
        c = start_cluster(root, db, {"max_concurrent_runs": per_replica, "max_pending_runs": HELD * 2})
        runs = c.pods_of("antler")
        base = {p.name: rss_mib(p.proc.pid) for p in runs}
        adm = Admitter(pb, [p.address for p in runs], c.secrets["antler"]["api-key"])
        script = json.dumps({"script": [{"say": "holding"}, {"sleep_ms": 1_800_000}]})
        print(f"phase 2: {HELD} runs sleeping 30 min, runs.max_concurrent_runs {per_replica} per replica", flush=True)
        t0 = time.monotonic()
        for i in range(HELD):
            adm.submit(script, i)
        adm.wait(HELD)
        while True:
            running = int(q("SELECT count(*) FROM runs WHERE status = 'running'", db)[0][0])
            if running >= HELD or time.monotonic() - t0 > 900:
                break
            time.sleep(1)
        print(f"  {running} RUNNING at once after {time.monotonic() - t0:.1f} s", flush=True)
        time.sleep(5)  # leases renewed at least once
        per_owner = dict(q("SELECT owner_worker_id, count(*) FROM runs WHERE status = 'running' GROUP BY owner_worker_id", db))
        conns = q(f"SELECT state, count(*) FROM pg_stat_activity WHERE datname = '{db}' GROUP BY state ORDER BY state", db)
        for p in runs:
            held_here = int(per_owner.get(worker_id(p), 0))
            now = rss_mib(p.proc.pid)
            per_run = (now - base[p.name]) * 1024 / held_here if held_here else 0
            print(f"  {p.name}: {held_here} RUNNING, RSS {now:.0f} MiB (idle {base[p.name]:.0f} MiB, {per_run:.0f} KiB per held run)", flush=True)
        print(f"  PostgreSQL connections to the database: {dict((s or 'none', int(n)) for s, n in conns)} "
              f"(runs.database.max_connections {16} per replica)", flush=True)
    finally:
        if c is not None:
            c.down()
        chart_local.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if not ANTLER_BIN.is_file():
        sys.exit(f"no antler binary at {ANTLER_BIN} (set ANTLER_BIN)")
    print(f"antler: {ANTLER_BIN}", flush=True)
    pb = stubs()
    if "takeover" in ONLY:
        takeover(pb)
    if "held" in ONLY:
        held(pb)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
