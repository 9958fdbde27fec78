"""compose/docker-compose.yml's wiring, checked without a Docker engine: every rltune
service it declares (and starts by default: no profile) is started here with the
command line and environment compose gives it (`${VAR:-default}` resolved as compose
resolves it, each replica of a scaled service a process of its own), with hostnames
mapped to 127.0.0.1 and the embedded broker in Kafka's place, on the topics its
`kafka-init` creates; the Kafka, Prometheus and Grafana images are left out. A job a
stock Kafka client publishes then runs on one of its agents, as after
`docker compose up`."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from shared.broker import EmbeddedBroker, free_port
from shared.fairshare import ledger_topics
from shared.topics import Topics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # kafka-python's importlib use
]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
_VAR = re.compile(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}")


def resolve(value: Any, env: dict[str, str]) -> Any:
    """`${VAR}`, `${VAR:-default}` and `${VAR:?error}` as compose interpolates them."""
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, env) for k, v in value.items()}
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise AssertionError(f"compose needs {name}: {arg}")
        return arg or ""

    return _VAR.sub(one, value)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_compose_runs_a_published_job_on_its_agents(broker: EmbeddedBroker, tmp_path: Path) -> None:
    prefix = f"compose{os.getpid()}."
    host_env = {"RLTUNE_TOPIC_PREFIX": prefix, "GRAFANA_ADMIN_PASSWORD": "x"}
    doc = resolve(yaml.safe_load(COMPOSE.read_text()), host_env)
    services = doc["services"]
    kafka_host, kafka_port = broker.bootstrap.rsplit(":", 1)
    # kafka-init, as compose runs it (its entrypoint and command), creates the topics
    init = services["kafka-init"]
    entry = [str(a) for a in init["entrypoint"]]
    assert entry[0] == "python" and init["depends_on"]["kafka"]["condition"] == "service_healthy"
    env = {str(k): str(v) for k, v in init["environment"].items()}
    assert env["RLTUNE_BOOTSTRAP_SERVERS"] == "kafka:19092"
    env["RLTUNE_BOOTSTRAP_SERVERS"] = broker.bootstrap
    made = subprocess.run(
        [sys.executable, *entry[1:], *map(str, init["command"])],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert made.returncode == 0, made.stderr
    listing = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    have = {t for t in listing.topics() if t.startswith(prefix)}
    listing.close()
    assert have == set(Topics(prefix).all() + ledger_topics(prefix))  # every topic, in one step
    procs: list[subprocess.Popen[bytes]] = []
    ports: dict[str, int] = {}
    try:
        for name, svc in services.items():
            cmd = [str(c) for c in svc.get("command", [])]
            if cmd[:1] != ["service"] or svc.get("profiles"):
                continue  # the Kafka, Prometheus and Grafana images; replay-only services
            replicas = int(svc.get("deploy", {}).get("replicas", 1))
            assert replicas >= 1, name
            for i in range(1, replicas + 1):
                env = {str(k): str(v) for k, v in svc["environment"].items()}
                host, port = env["RLTUNE_BOOTSTRAP_SERVERS"].split(":")
                assert (host, port) == ("kafka", "19092")  # Kafka's INTERNAL listener
                env["RLTUNE_BOOTSTRAP_SERVERS"] = f"{kafka_host}:{kafka_port}"
                env["RLTUNE_PROMETHEUS_ADDRESS"] = "127.0.0.1"  # (one host, not containers)
                replica = f"{name}-{i}"  # compose's container name, here its hostname
                box = tmp_path / replica  # what the container's own filesystem holds
                for key in ("RLTUNE_OFFLOAD_SOCKET", "RLTUNE_SWAP_DIR"):
                    if key in env:
                        # a Unix socket's path is at most 107 bytes: keep it out of tmp_path,
                        # which is long under pytest-xdist
                        short = key.endswith("SOCKET")
                        root = Path(tempfile.mkdtemp(prefix=replica)) if short else box
                        env[key] = str(root / env[key].lstrip("/"))
                        Path(env[key]).parent.mkdir(parents=True, exist_ok=True)
                if name == "offload-agent":
                    env["RLTUNE_NODE_ID"] = replica
                    env["RLTUNE_JOB_LOGS"] = str(box / "jobs")
                argv = list(cmd)
                ports[replica] = free_port()  # each container's 9100, here one port each
                argv[argv.index("--prometheus-port") + 1] = str(ports[replica])
                log = open(tmp_path / f"{replica}.log", "wb")  # noqa: SIM115 - the child's
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "rltune", *argv],
                        env={**os.environ, **env},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,  # the image's WORKDIR holds clusters/, models/, examples/
                    )
                )
        assert {r.rsplit("-", 1)[0] for r in ports} >= {
            "arrival", "scoring", "placement", "telemetry", "profiler", "offload-agent", "ledger",
        }  # fmt: skip
        assert sum(r.startswith("offload-agent") for r in ports) == 2  # two nodes
        deadline = time.monotonic() + 150
        while not all(_ready(p) for p in ports.values()):  # compose's healthcheck
            dead = [p.args for p in procs if p.poll() is not None]
            assert not dead, dead
            assert time.monotonic() < deadline, [r for r, p in ports.items() if not _ready(p)]
            time.sleep(1.0)

        out = tmp_path / "ran.txt"
        code = f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"
        job = {"job_id": "via-compose", "num_gpus": 3, "command": [sys.executable, "-c", code]}
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            consumer_timeout_ms=200,
            auto_offset_reset="earliest",
        )
        consumer.assign([TopicPartition(f"{prefix}jobs.events", 0)])
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        producer.send(f"{prefix}jobs.submit", json.dumps(job).encode()).get(30)
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while not any(e["kind"] in ("finished", "failed") for e in events):
            assert time.monotonic() < deadline, events
            events += [json.loads(m.value) for m in consumer]
        producer.close()
        consumer.close()
        assert [e["kind"] for e in events] == ["started", "finished"], events
        assert events[1]["exit_code"] == 0
        assert events[0]["node_ids"][0] in ("offload-agent-1", "offload-agent-2")
        gpus = out.read_text().split(",")
        assert len(gpus) == 3 and all(0 <= int(g) < 4 for g in gpus)  # RLTUNE_NODE_GPUS 4
        # the ledger's table (its changelog, which scoring --ledger reads) holds the
        # job's GPU-seconds: 3 GPUs from start to finish, decayed with the default
        # 7-day half-life H, 3 (1 - 2^(-d/H)) H / ln 2
        d = events[1]["time"] - events[0]["time"]
        half = 7 * 86400.0
        want = 3 * (1 - 2 ** (-d / half)) * half / math.log(2)
        changelog = TopicPartition(f"{prefix}ledger-usage-changelog", 0)
        rows: list[dict[str, float]] = []
        deadline = time.monotonic() + 60
        while not any(r["gpus"] == 0 and r["usage"] > 0 for r in rows):
            assert time.monotonic() < deadline, rows
            reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=500)
            reader.assign([changelog])
            reader.seek_to_beginning(changelog)
            rows = [json.loads(m.value) for m in reader]
            reader.close()
        assert rows[-1]["gpus"] == 0
        assert rows[-1]["usage"] == pytest.approx(want, rel=1e-6, abs=1e-9)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
