"""The deployment files (`compose/`, `k8s/`) against the code they deploy: service
names `rltune service` knows, the topic list of `shared/topics.py`, the DESIGN
environment variables, the Prometheus metric names, and the Kubernetes and
Strimzi schemas. No Docker engine or cluster is needed; `docker compose config`
runs where a Docker client with the compose plugin is installed."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rltune.service import SERVICES, available
from services.telemetry import prom as telemetry_prom
from shared import acl, prom
from shared.fairshare import ledger_topics
from shared.topics import Topics

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
K8S = ROOT / "k8s"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
GPU_OVERLAY = COMPOSE / "docker-compose.gpu.yml"
REPLAY_OVERLAY = COMPOSE / "docker-compose.replay.yml"
ACL_OVERLAY = COMPOSE / "docker-compose.acl.yml"
DESIGN_ENV = {"RLTUNE_BOOTSTRAP_SERVERS", "RLTUNE_TOPIC_PREFIX"}
METRICS_PORT = "9100"
STRIMZI_API = "kafka.strimzi.io/v1"


def _load_all(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _compose() -> dict[str, Any]:
    return _load_all(COMPOSE_FILE)[0]


def _k8s_docs() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(K8S.rglob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in _load_all(path)
    ]


def _rltune_compose_services() -> dict[str, dict[str, Any]]:
    """Compose services that run `rltune service NAME`."""
    return {
        name: svc
        for name, svc in _compose()["services"].items()
        if list(svc.get("command", []))[:1] == ["service"]
    }


def _workloads() -> list[dict[str, Any]]:
    return [d for d in _k8s_docs() if d["kind"] in ("Deployment", "DaemonSet")]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def _env_names_read_by_code() -> set[str]:
    names: set[str] = set()
    for pkg in ("rltune", "shared", "services", "offload_agent"):
        for path in (ROOT / pkg).rglob("*.py"):
            names |= set(re.findall(r"[\"'](RLTUNE_[A-Z0-9_]+)[\"']", path.read_text()))
    return names


# ---- every file parses ------------------------------------------------------------


def test_every_manifest_parses() -> None:
    files = sorted(COMPOSE.rglob("*.yml")) + sorted(K8S.rglob("*.yaml"))
    assert COMPOSE_FILE in files and (K8S / "kustomization.yaml") in files
    for path in files:
        docs = _load_all(path)
        assert docs and all(isinstance(d, dict) for d in docs), path
    for path in sorted(COMPOSE.rglob("*.json")):
        assert isinstance(json.loads(path.read_text()), dict), path


# ---- services ----------------------------------------------------------------------


def test_compose_services_are_rltune_services() -> None:
    services = _rltune_compose_services()
    assert services, "no `rltune service NAME` container in docker-compose.yml"
    for key, svc in services.items():
        cmd = [str(c) for c in svc["command"]]
        assert cmd[1] in SERVICES, f"compose service {key!r} runs unknown {cmd[1]!r}"
        assert key == cmd[1], f"compose service {key!r} should be named after {cmd[1]!r}"
        assert cmd[cmd.index("--prometheus-port") + 1] == METRICS_PORT
        assert svc["restart"] == "unless-stopped" and "healthcheck" in svc
        assert svc["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"


def test_compose_and_k8s_run_every_available_service() -> None:
    """DESIGN: compose and k8s run every service. A service whose module exists
    (`rltune service` can start it) needs a compose block, a Prometheus target and a
    k8s manifest: copy those of `arrival`."""
    have = set(available())
    in_compose = set(_rltune_compose_services())
    in_k8s = {str(_containers(w)[0]["args"][1]) for w in _workloads()}
    assert have <= in_compose, f"missing from docker-compose.yml: {sorted(have - in_compose)}"
    assert have <= in_k8s, f"missing from k8s/services/: {sorted(have - in_k8s)}"


def test_k8s_workloads_run_rltune_services() -> None:
    workloads = _workloads()
    kinds = {str(_containers(w)[0]["args"][1]): w["kind"] for w in workloads}
    for w in workloads:
        (container,) = _containers(w)
        args = [str(a) for a in container["args"]]
        assert args[0] == "service" and args[1] in SERVICES, (w["metadata"]["name"], args)
        assert args[args.index("--prometheus-port") + 1] == METRICS_PORT
        assert {"configMapRef": {"name": "rltune-bus"}} in container["envFrom"]
        assert container["ports"] == [{"name": "metrics", "containerPort": int(METRICS_PORT)}]
        assert "livenessProbe" in container
    assert kinds.get("offload-agent") == "DaemonSet"
    assert all(kind == "Deployment" for name, kind in kinds.items() if name != "offload-agent")


def test_every_k8s_workload_has_a_metrics_service() -> None:
    docs = _k8s_docs()
    selectors = [d["spec"]["selector"] for d in docs if d["kind"] == "Service"]
    for w in _workloads():
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert any(sel.items() <= labels.items() for sel in selectors), w["metadata"]["name"]


def test_offload_agent_daemonset_targets_gpu_nodes() -> None:
    (ds,) = [d for d in _k8s_docs() if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    (container,) = pod["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert str(gpus) == pod["nodeSelector"]["nvidia.com/gpu.count"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["nvme-swap"] == "/var/lib/rltune/swap" and "nvme-swap" in host
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RLTUNE_SWAP_DIR"] == mounts["nvme-swap"]  # jobs swap on the mounted NVMe


def test_compose_offload_agent_swaps_on_its_volume() -> None:
    """Each agent container swaps on a volume of its own (the image's VOLUME, owned by
    the image's user): two agents never share, and so never delete, a job's swap
    directory; the GPU overlay's host directory is chowned to that user first."""
    agent = _compose()["services"]["offload-agent"]
    swap = agent["environment"]["RLTUNE_SWAP_DIR"]
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    assert f'VOLUME ["{swap}"]' in dockerfile
    assert f"mkdir -p /app {swap}" in dockerfile and "chown -R rltune:rltune" in dockerfile
    assert not any(str(v).split(":")[-1] == swap for v in agent.get("volumes", []))
    gpu = _load_all(GPU_OVERLAY)[0]["services"]
    (bind,) = gpu["offload-agent"]["volumes"]
    assert bind["target"] == swap and gpu["offload-agent-swap-owner"]["volumes"] == [bind]
    owner = gpu["offload-agent-swap-owner"]
    assert owner["entrypoint"] == ["chown", "10001:10001", swap]
    assert "ARG UID=10001" in dockerfile
    wait = gpu["offload-agent"]["depends_on"]["offload-agent-swap-owner"]
    assert wait["condition"] == "service_completed_successfully"


def test_compose_agents_advertise_emulated_gpus_and_the_gpu_overlay_real_ones() -> None:
    agent = _compose()["services"]["offload-agent"]
    env = agent["environment"]
    assert env["RLTUNE_NODE_EMULATE"] == "1" and env["RLTUNE_NODE_GPUS"] == "${RLTUNE_NODE_GPUS:-4}"
    assert "RLTUNE_NODE_ID" not in env  # each replica is a node named by its hostname
    assert agent["deploy"]["replicas"] == "${RLTUNE_AGENTS:-2}"
    gpu = _load_all(GPU_OVERLAY)[0]["services"]["offload-agent"]
    assert gpu["environment"]["RLTUNE_NODE_EMULATE"] == "0"
    assert gpu["environment"]["RLTUNE_NODE_GPUS"] == ""
    assert gpu["deploy"]["replicas"] == 1


def test_compose_binds_host_ports_to_loopback_and_grafana_has_no_default_admin() -> None:
    services = _compose()["services"]
    published = [p for svc in services.values() for p in svc.get("ports", [])]
    assert published and all(str(p).startswith("${") and "127.0.0.1}:" in p for p in published)
    kafka = services["kafka"]
    assert kafka["ports"] == ["${KAFKA_HOST_ADDRESS:-127.0.0.1}:${KAFKA_HOST_PORT:-29092}:9092"]
    # the host listener is the port compose publishes, never `rltune up`'s 9092
    assert (
        "HOST://localhost:${KAFKA_HOST_PORT:-29092}"
        in (kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"])
    )
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in grafana


def _arg(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_the_cluster_file_is_the_same_for_scoring_placement_and_cluster_sim() -> None:
    """Live (compose's default, k8s's): scoring and placement take the cluster from the
    nodes that report; with the replay overlay (and in k8s, cluster-sim's file), the
    three get the same file."""
    base = _compose()["services"]
    replay = _load_all(REPLAY_OVERLAY)[0]["services"]
    assert _arg(base["scoring"]["command"], "--cluster") is None
    assert _arg(base["placement"]["command"], "--cluster") is None
    assert base["cluster-sim"]["profiles"] == ["replay"]
    sim = _arg(base["cluster-sim"]["command"], "--cluster")
    assert _arg(replay["scoring"]["command"], "--cluster") == sim
    assert _arg(replay["placement"]["command"], "--cluster") == sim
    assert replay["offload-agent"]["deploy"]["replicas"] == 0
    assert _arg(replay["arrival"]["command"], "--user-jobs") == "reject"
    k8s = {str(_containers(w)[0]["args"][1]): _containers(w)[0]["args"] for w in _workloads()}
    assert _arg(k8s["scoring"], "--cluster") is None and _arg(k8s["placement"], "--cluster") is None
    assert sim is not None and sim.endswith(str(_arg(k8s["cluster-sim"], "--cluster")) + "}")


def test_prometheus_scrapes_every_compose_service() -> None:
    (cfg,) = _load_all(COMPOSE / "prometheus" / "prometheus.yml")
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "rltune"]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:{METRICS_PORT}" for name in _rltune_compose_services()}


# ---- topics ------------------------------------------------------------------------


def test_compose_topic_init_creates_exactly_the_topics() -> None:
    init = _compose()["services"]["kafka-init"]
    prefix = Topics().prefix
    assert init["environment"]["RLTUNE_TOPIC_PREFIX"] == f"${{RLTUNE_TOPIC_PREFIX:-{prefix}}}"
    created = [prefix + suffix for suffix in init["command"]]
    assert sorted(created) == sorted(Topics().all() + ledger_topics(prefix))
    assert len(created) == len(set(created))
    kafka_env = _compose()["services"]["kafka"]["environment"]
    assert str(kafka_env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"


def test_strimzi_topics_are_exactly_the_topics() -> None:
    topics = [d for d in _k8s_docs() if d["kind"] == "KafkaTopic"]
    names = [d["spec"].get("topicName", d["metadata"]["name"]) for d in topics]
    assert sorted(names) == sorted(Topics().all() + ledger_topics(Topics().prefix))
    assert len(names) == len(set(names))


# ---- environment -------------------------------------------------------------------


def test_env_var_names_are_the_design_ones() -> None:
    """Bus settings use exactly the DESIGN names; any other RLTUNE_* variable must be
    one the code reads."""
    allowed = DESIGN_ENV | _env_names_read_by_code()
    used: set[str] = set()
    for svc in _rltune_compose_services().values():
        env = svc["environment"]
        assert env.keys() >= DESIGN_ENV
        assert env["RLTUNE_BOOTSTRAP_SERVERS"] == "kafka:19092"
        used |= set(env)
    advertised = _compose()["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "//kafka:19092" in advertised
    (bus,) = [d for d in _k8s_docs() if d["kind"] == "ConfigMap"]
    assert set(bus["data"]) >= DESIGN_ENV
    used |= set(bus["data"])
    for w in _workloads():
        used |= {e["name"] for c in _containers(w) for e in c.get("env", [])}
    rltune_vars = {name for name in used if name.startswith("RLTUNE_")}
    assert rltune_vars <= allowed, f"not DESIGN and not read by the code: {rltune_vars - allowed}"


def test_k8s_bus_points_at_the_strimzi_scram_listener() -> None:
    """Services reach Kafka on the listener that authenticates them (SCRAM over TLS,
    the cluster CA mounted) and the simple authorizer holds them to their ACLs."""
    docs = _k8s_docs()
    (kafka,) = [d for d in docs if d["kind"] == "Kafka"]
    (bus,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (scram,) = kafka["spec"]["kafka"]["listeners"]
    assert scram["tls"] and scram["authentication"] == {"type": "scram-sha-512"}
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple"}
    assert "userOperator" in kafka["spec"]["entityOperator"]
    name = kafka["metadata"]["name"]
    assert bus["data"]["RLTUNE_BOOTSTRAP_SERVERS"] == f"{name}-kafka-bootstrap:{scram['port']}"
    assert bus["data"]["RLTUNE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert bus["data"]["RLTUNE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert bus["data"]["RLTUNE_TOPIC_PREFIX"] == Topics().prefix
    for d in docs:
        if d["kind"] in ("KafkaNodePool", "KafkaTopic", "KafkaUser"):
            assert d["metadata"]["labels"]["strimzi.io/cluster"] == name


def test_k8s_users_are_the_acl_table_and_each_service_logs_in_as_its_own() -> None:
    """k8s/users.yaml is exactly what shared/acl.py renders, and every workload logs in
    as the principal of the service it runs, with the password from that user's
    Secret and the CA file the ConfigMap names mounted."""
    docs = _k8s_docs()
    users = [d for d in docs if d["kind"] == "KafkaUser"]
    assert users == acl.kafka_users(Topics())
    names = {u["metadata"]["name"] for u in users}
    (bus,) = [d for d in docs if d["kind"] == "ConfigMap"]
    ca_dir = str(Path(bus["data"]["RLTUNE_KAFKA_SSL_CAFILE"]).parent)
    for w in _workloads():
        (c,) = [c for c in _containers(w) if list(c.get("args", []))[:1] == ["service"]]
        env = {e["name"]: e for e in c["env"]}
        user = env["RLTUNE_KAFKA_SASL_USERNAME"]["value"]
        assert user == f"rltune-{c['args'][1]}" and user in names
        ref = env["RLTUNE_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": user, "key": "password"}
        assert ca_dir in [m["mountPath"] for m in c["volumeMounts"]]


# ---- Prometheus metric names -------------------------------------------------------


def _metric_names() -> set[str]:
    names: set[str] = set()
    bus = (prom.MESSAGES, prom.REJECTED, prom.QUEUE_WAIT, prom.SOLVE_SECONDS, prom.UP)
    for collector in (*bus, *telemetry_prom.COLLECTORS):
        for family in collector.describe():
            names |= {family.name + s for s in ("", "_total", "_bucket", "_count", "_sum")}
    return names


def test_grafana_dashboard_panels_use_defined_metrics() -> None:
    dash = json.loads((COMPOSE / "grafana" / "dashboards" / "rltune.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\brltune_[a-z_]+", e)}
    assert used <= _metric_names(), used - _metric_names()
    for wanted in (
        "rltune_messages_total",
        "rltune_rejected_total",
        "rltune_queue_wait_seconds_bucket",
        "rltune_placement_solve_seconds_bucket",
    ):
        assert wanted in used
    (ds_file,) = _load_all(COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (ds,) = ds_file["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    assert all(p["datasource"]["uid"] == ds["uid"] for p in dash["panels"])


# ---- Dockerfile --------------------------------------------------------------------


def test_dockerfile_installs_like_make_install() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert 'ARG TORCH_SPEC="torch==2.13.0"' in text
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
    assert "pip install -r requirements.lock" in text
    assert "-r requirements-dev.lock" not in text  # no test or bench tools in the image
    assert "pip install --no-deps --no-build-isolation ." in text
    assert re.search(r"^USER rltune$", text, re.M)
    assert 'ENTRYPOINT ["rltune"]' in text
    lock = (ROOT / "requirements.lock").read_text().split()
    assert "torch==2.13.0" in lock


# ---- schemas -----------------------------------------------------------------------


def _k8s_validators() -> dict[str, jsonschema.Draft7Validator]:
    doc = json.loads((Path(__file__).with_name("k8s_schema.json")).read_text())
    out = {}
    for key, schema in doc["kinds"].items():
        full = dict(schema, **{"$defs": doc["$defs"]})
        out[key] = jsonschema.Draft7Validator(full)
    return out


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_MAP = {"type": "object", "additionalProperties": _STR}
_ANY_OBJ = {"type": "object"}
_CONFIG = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
_QUANTITIES = {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}
_RESOURCES = _obj({"requests": _QUANTITIES, "limits": _QUANTITIES, "claims": {"type": "array"}})
_META = _obj({"name": _STR, "namespace": _STR, "labels": _MAP, "annotations": _MAP}, ("name",))
_VOLUME_PROPS = {
    "id": {"type": "integer", "minimum": 0},
    "type": {"enum": ["ephemeral", "persistent-claim"]},
    "size": _STR,
    "sizeLimit": _STR,
    "class": _STR,
    "deleteClaim": {"type": "boolean"},
    "kraftMetadata": {"enum": ["shared"]},
    "selector": _MAP,
}


def _cr(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _obj(
        {
            "apiVersion": {"const": STRIMZI_API},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


# The Strimzi fields these manifests may use, as the v1 CRDs define them (strict: a
# misspelt field fails here, where the API server would silently prune it).
STRIMZI_SCHEMAS = {
    "KafkaTopic": _cr(
        "KafkaTopic",
        _obj(
            {
                "topicName": _STR,
                "partitions": {"type": "integer", "minimum": 1},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
                "config": _CONFIG,
            }
        ),
    ),
    "KafkaUser": _cr(
        "KafkaUser",
        _obj(
            {
                "authentication": _obj(
                    {"type": {"enum": ["scram-sha-512", "tls", "tls-external"]}}, ("type",)
                ),
                "authorization": _obj(
                    {
                        "type": {"enum": ["simple"]},
                        "acls": {
                            "type": "array",
                            "items": _obj(
                                {
                                    "resource": _obj(
                                        {
                                            "type": {
                                                "enum": [
                                                    "topic",
                                                    "group",
                                                    "cluster",
                                                    "transactionalId",
                                                ]
                                            },
                                            "name": _STR,
                                            "patternType": {"enum": ["literal", "prefix"]},
                                        },
                                        ("type",),
                                    ),
                                    "type": {"enum": ["allow", "deny"]},
                                    "host": _STR,
                                    "operations": {
                                        "type": "array",
                                        "items": {
                                            "enum": [
                                                "Read",
                                                "Write",
                                                "Create",
                                                "Delete",
                                                "Alter",
                                                "Describe",
                                                "ClusterAction",
                                                "AlterConfigs",
                                                "DescribeConfigs",
                                                "IdempotentWrite",
                                                "All",
                                            ]
                                        },
                                    },
                                },
                                ("resource", "operations"),
                            ),
                        },
                    },
                    ("type", "acls"),
                ),
            },
            ("authentication", "authorization"),
        ),
    ),
    "KafkaNodePool": _cr(
        "KafkaNodePool",
        _obj(
            {
                "replicas": {"type": "integer", "minimum": 0},
                "roles": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"enum": ["controller", "broker"]},
                    "uniqueItems": True,
                },
                "storage": _obj(
                    {
                        **_VOLUME_PROPS,
                        "type": {"enum": ["ephemeral", "persistent-claim", "jbod"]},
                        "volumes": {"type": "array", "items": _obj(_VOLUME_PROPS, ("type",))},
                    },
                    ("type",),
                ),
                "resources": _RESOURCES,
                "jvmOptions": _ANY_OBJ,
                "template": _ANY_OBJ,
            },
            ("replicas", "roles", "storage"),
        ),
    ),
    "Kafka": _cr(
        "Kafka",
        _obj(
            {
                "kafka": _obj(
                    {
                        "version": _STR,
                        "metadataVersion": _STR,
                        "listeners": {
                            "type": "array",
                            "minItems": 1,
                            "items": _obj(
                                {
                                    "name": {"type": "string", "pattern": "^[a-z0-9]{1,11}$"},
                                    "port": {"type": "integer", "minimum": 9092},
                                    "type": {
                                        "enum": [
                                            "internal",
                                            "route",
                                            "loadbalancer",
                                            "nodeport",
                                            "ingress",
                                            "cluster-ip",
                                        ]
                                    },
                                    "tls": {"type": "boolean"},
                                    "authentication": _ANY_OBJ,
                                    "configuration": _ANY_OBJ,
                                },
                                ("name", "port", "type", "tls"),
                            ),
                        },
                        "config": _CONFIG,
                        "authorization": _ANY_OBJ,
                        "rack": _ANY_OBJ,
                        "logging": _ANY_OBJ,
                        "metricsConfig": _ANY_OBJ,
                        "template": _ANY_OBJ,
                    },
                    ("listeners",),
                ),
                "entityOperator": _obj(
                    {"topicOperator": _ANY_OBJ, "userOperator": _ANY_OBJ, "template": _ANY_OBJ}
                ),
                "cruiseControl": _ANY_OBJ,
                "kafkaExporter": _ANY_OBJ,
            },
            ("kafka",),
        ),
    ),
}


def _validator_for(doc: dict[str, Any], k8s: dict[str, Any]) -> Any:
    if doc["apiVersion"] == STRIMZI_API:
        return jsonschema.Draft7Validator(STRIMZI_SCHEMAS[doc["kind"]])
    key = f"{doc['apiVersion']}/{doc['kind']}"
    assert key in k8s, f"no schema for {key}: add it to tests/deploy/make_k8s_schema.py KINDS"
    return k8s[key]


def test_k8s_resources_validate_against_schemas() -> None:
    k8s = _k8s_validators()
    for doc in _k8s_docs():
        errors = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in _validator_for(doc, k8s).iter_errors(doc)
        ]
        assert not errors, f"{doc['kind']}/{doc['metadata']['name']}: {errors}"


def test_schema_check_rejects_a_misspelt_field() -> None:
    k8s = _k8s_validators()
    docs = _k8s_docs()
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rltune-arrival"
    ]
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert not k8s["apps/v1/Deployment"].is_valid(bad)
    (topic, *_) = [d for d in docs if d["kind"] == "KafkaTopic"]
    bad = copy.deepcopy(topic)
    bad["spec"]["partition"] = 1
    assert not _validator_for(bad, k8s).is_valid(bad)


def test_kustomization_lists_every_manifest_and_image() -> None:
    (kust,) = _load_all(K8S / "kustomization.yaml")
    listed = {K8S / r for r in kust["resources"]}
    on_disk = {p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == on_disk
    images = {i["name"] for i in kust["images"]}
    for w in _workloads():
        pod = w["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["image"] in images, c["image"]


# ---- docker compose config ---------------------------------------------------------


def _compose_cli() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=20)
        if probe.returncode == 0 and "v2" in probe.stdout + probe.stderr:
            return cmd
    return None


@pytest.mark.parametrize(
    "files",
    [
        [COMPOSE_FILE],
        [COMPOSE_FILE, GPU_OVERLAY],
        [COMPOSE_FILE, REPLAY_OVERLAY],
        [COMPOSE_FILE, ACL_OVERLAY],
    ],
    ids=["cpu", "gpu", "replay", "acl"],
)
def test_docker_compose_config_is_valid(files: list[Path]) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 client here (`docker compose` or `docker-compose`)")
    args = [a for f in files for a in ("-f", str(f))]
    env = {**os.environ, "GRAFANA_ADMIN_PASSWORD": "not-admin"}  # (it has no default)
    run = subprocess.run(
        [*cli, *args, "config", "-q"], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0, run.stderr


def _check_compose(*files: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with the Compose Specification's own JSON schema, which it
    vendors (`--builtin-schema vendor.compose-spec`): a third-party check of every key
    and value type that needs no Docker client."""
    exe = Path(sys.executable).with_name("check-jsonschema")
    cmd = [str(exe), "--builtin-schema", "vendor.compose-spec", *map(str, files)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_compose_files_match_the_compose_specification_schema() -> None:
    run = _check_compose(COMPOSE_FILE, GPU_OVERLAY, REPLAY_OVERLAY, ACL_OVERLAY)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("break_it", "named"),
    [
        (lambda d: d["services"]["scoring"].update(restart_policy="always"), "restart_policy"),
        (lambda d: d["services"]["scoring"].update(depends_on=5), "depends_on"),
        (lambda d: d["services"]["scoring"].update(healthcheck={"every": "5s"}), "every"),
    ],
    ids=["unknown-key", "wrong-type", "unknown-nested-key"],
)
def test_the_compose_schema_check_refuses_a_broken_file(
    tmp_path: Path, break_it: Any, named: str
) -> None:
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    break_it(doc)
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(yaml.safe_dump(doc))
    run = _check_compose(bad)
    assert run.returncode != 0
    assert named in run.stdout + run.stderr


def _kustomize_cli() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def test_kustomize_build_renders_valid_resources() -> None:
    cli = _kustomize_cli()
    if cli is None:
        pytest.skip("neither kustomize nor kubectl is installed here")
    run = subprocess.run([*cli, str(K8S)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    docs = [d for d in yaml.safe_load_all(run.stdout) if d]
    assert len(docs) == len(_k8s_docs())
    k8s = _k8s_validators()
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "rltune", doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rltune"
        assert _validator_for(doc, k8s).is_valid(doc), doc["metadata"]["name"]


# ---- probes, rollouts, bind address ------------------------------------------------


def test_k8s_probes_are_liveness_and_readiness() -> None:
    """Liveness (/healthz: the consume loop turns) restarts a stuck pod; readiness
    (/readyz: connected, assigned, turning) is what a rollout and a dashboard wait on."""
    for w in _workloads():
        for c in _containers(w):
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            args = list(c["args"])
            assert args[args.index("--prometheus-address") + 1] == "0.0.0.0"


def test_k8s_deployments_never_overlap() -> None:
    """A RollingUpdate runs the old and the new pod at once; Recreate does not."""
    deployments = [w for w in _workloads() if w["kind"] == "Deployment"]
    assert deployments
    for d in deployments:
        assert d["spec"]["strategy"] == {"type": "Recreate"}, d["metadata"]["name"]


def test_compose_healthcheck_is_readiness_on_every_interface() -> None:
    for name, svc in _rltune_compose_services().items():
        assert "/readyz" in " ".join(svc["healthcheck"]["test"]), name
        assert svc["environment"]["RLTUNE_PROMETHEUS_ADDRESS"] == "0.0.0.0", name
