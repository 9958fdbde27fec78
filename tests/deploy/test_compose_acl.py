"""compose/docker-compose.acl.yml (SASL/SCRAM and ACLs on Apache Kafka) merged over
compose/docker-compose.yml as `docker compose -f ... -f ...` merges them, checked
without a Docker engine or a Kafka: the broker's settings as the apache/kafka image
turns its environment into server.properties, each service's login, and the ACL
lines of compose/kafka-acls.sh read back the way kafka-acls.sh reads its flags,
against shared/acl.py's table (the one k8s/users.yaml renders) and DESIGN.md's
topic table."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from shared import acl
from shared.config import KafkaSecurity
from shared.topics import Topics
from tests.integration.test_compose_wiring import resolve
from tests.shared.test_acl import _design_rows

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
BASE = COMPOSE / "docker-compose.yml"
OVERLAY = COMPOSE / "docker-compose.acl.yml"
RENDERED = COMPOSE / "kafka-acls.sh"
T = Topics()
HOST_ENV = {"GRAFANA_ADMIN_PASSWORD": "x"}


def merge(base: Any, over: Any, key: str = "") -> Any:
    """Compose's merge of a second file into the first, for the keys these files use:
    mappings merge key by key; `volumes` merge by mount target and `secrets` append;
    any other sequence or scalar of the second file replaces the first's (`command`,
    `entrypoint`, `healthcheck.test`)."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if key == "volumes" and isinstance(base, list):
        targets = {str(v).split(":")[1]: v for v in base}
        targets |= {str(v).split(":")[1]: v for v in over}
        return list(targets.values())
    if key == "secrets" and isinstance(base, list):
        return base + [s for s in over if s not in base]
    return over


def _merged() -> dict[str, Any]:
    base = yaml.safe_load(BASE.read_text())
    over = yaml.safe_load(OVERLAY.read_text())
    return resolve(merge(base, over), HOST_ENV)


def server_properties(env: dict[str, Any]) -> dict[str, str]:
    """The apache/kafka image's rule (docker/resources/utility, ConvertKey): KAFKA_X_Y
    is `x.y`, `__` is `_`, `___` is `-`; KAFKA_OPTS and the other JVM variables are
    not properties."""
    skip = {"KAFKA_VERSION", "KAFKA_OPTS", "KAFKA_HEAP_OPTS", "KAFKA_JMX_OPTS", "KAFKA_LOG4J_OPTS"}
    out = {}
    for k, v in env.items():
        if not k.startswith("KAFKA_") or k in skip:
            continue
        name = re.sub("_", ".", k[len("KAFKA_") :])  # then the runs of dots back
        name = name.replace("...", "-").replace("..", "_").lower()
        out[name] = str(v)
    return out


def _rltune_services(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in doc["services"].items()
        if [str(c) for c in s.get("command", [])][:1] == ["service"]
    }


# ---- the broker ----------------------------------------------------------------------


def test_the_broker_authenticates_every_client_and_authorizes_with_acls() -> None:
    kafka = _merged()["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    props = server_properties(kafka["environment"])
    assert props["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert props["allow.everyone.if.no.acl.found"] == "false"
    # the admin, and the controller listener's anonymous principal (KRaft authorizes
    # the broker's registration there), which only the container's loopback reaches
    assert props["super.users"].split(";") == ["User:admin", "User:ANONYMOUS"]
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    protocol = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
    controllers = set(props["controller.listener.names"].split(","))
    for spec in props["listeners"].split(",") + props["advertised.listeners"].split(","):
        name, where = spec.split("://")
        if name in controllers:  # plaintext, anonymous: bound to loopback alone
            assert where.startswith("127.0.0.1:") and spec in props["listeners"], spec
        else:  # every listener a client reaches logs it in
            assert protocol[name].startswith("SASL_"), spec
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert [p for p, proto in protocol.items() if not proto.startswith("SASL_")] == ["CONTROLLER"]
    assert props["inter.broker.listener.name"] in protocol
    # the admin's password: from the secret into a JAAS file named by KAFKA_OPTS
    assert (
        "java.security.auth.login.config=/tmp/kafka_server_jaas.conf"
        in (kafka["environment"]["KAFKA_OPTS"])
    )
    script = kafka["command"][-1]
    assert "cat /run/secrets/kafka-admin" in script and "kafka-admin" in kafka["secrets"]
    assert 'add-scram "SCRAM-SHA-512=[name=admin,' in script
    assert script.rstrip().endswith("exec /etc/kafka/docker/run")  # the image's own start
    assert "--command-config /tmp/admin.properties" in kafka["healthcheck"]["test"][1]
    # still bound to loopback, and on a volume of its own (not the plaintext store)
    assert all(str(p).startswith("127.0.0.1:") for p in kafka["ports"])
    assert kafka["volumes"] == ["kafka-acl-data:/var/lib/kafka/data"]


def test_the_kafka_command_is_valid_shell_with_compose_dollars_unescaped() -> None:
    """`$$` in the file is one `$` in the container; what bash is given parses."""
    doc = _merged()["services"]
    for name in ("kafka", "kafka-acls"):
        script = doc[name]["command"][-1].replace("$$", "$")
        run = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        assert run.returncode == 0, (name, run.stderr)


# ---- who logs in as whom -------------------------------------------------------------


def test_every_service_logs_in_as_its_own_user_with_a_password_from_a_file(
    tmp_path: Path,
) -> None:
    doc = _merged()
    declared = doc["secrets"]
    services = _rltune_services(doc)
    assert set(services) >= {"arrival", "scoring", "placement", "telemetry", "profiler"}
    assert {"cluster-sim", "offload-agent"} <= set(services)
    users = set()
    for name, svc in services.items():
        env = {str(k): str(v) for k, v in svc["environment"].items()}
        user = env["RLTUNE_KAFKA_SASL_USERNAME"]
        assert user == acl.principal_name(name), name
        assert env["RLTUNE_KAFKA_SASL_PASSWORD_FILE"] == f"/run/secrets/{user}"
        assert "RLTUNE_KAFKA_SASL_PASSWORD" not in env  # never a literal
        assert svc["secrets"] == [user] and declared[user]["file"] == f"./secrets/{user}"
        # what the service makes of it: the mounted file read as its password
        secret = tmp_path / user
        secret.write_text("s3cret\n")
        env["RLTUNE_KAFKA_SASL_PASSWORD_FILE"] = str(secret)
        sec = KafkaSecurity.from_env(env)
        assert (sec.protocol, sec.mechanism, sec.username, sec.password) == (
            "SASL_PLAINTEXT",
            "SCRAM-SHA-512",
            user,
            "s3cret",
        )
        users.add(user)
    # the services' users are acl.py's principals, less `user` (people, on the host)
    assert users == {acl.principal_name(p) for p in acl.PRINCIPALS if p != "user"}
    init = doc["services"]["kafka-init"]
    assert init["environment"]["RLTUNE_KAFKA_SASL_USERNAME"] == "admin"
    # its probe logs in too (a SASL listener drops an anonymous one)
    assert "wait_for_broker(bus.bootstrap, 120, bus.security)" in init["entrypoint"][-1]
    assert init["depends_on"]["kafka-acls"]["condition"] == "service_completed_successfully"
    for n, svc in doc["services"].items():  # no password anywhere in the files
        for k, v in (svc.get("environment") or {}).items():
            assert not (k.endswith("PASSWORD") and "RLTUNE" in k), (n, k, v)


def test_the_acl_step_creates_every_user_it_has_a_secret_for() -> None:
    doc = _merged()
    step = doc["services"]["kafka-acls"]
    assert step["image"] == doc["services"]["kafka"]["image"]
    assert step["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "./kafka-acls.sh:/etc/rltune/kafka-acls.sh:ro" in step["volumes"]
    created = [ln.split()[1] for ln in RENDERED.read_text().splitlines() if ln.startswith("user ")]
    assert sorted(created) == sorted(acl.principal_name(p) for p in acl.PRINCIPALS)
    assert set(step["secrets"]) == {"kafka-admin", *created}
    assert set(doc["secrets"]) == {"kafka-admin", *created}


# ---- the ACLs ------------------------------------------------------------------------

Binding = tuple[str, str, str, str, str]  # principal, resource type, name, pattern, op


def rendered_bindings(text: str) -> set[Binding]:
    """compose/kafka-acls.sh's `acl` lines read as kafka-acls.sh reads its flags: every
    `--operation` on every `--topic` / `--group` of the line, one pattern type."""
    out: set[Binding] = set()
    for cmd in text.replace("\\\n", " ").splitlines():
        words = shlex.split(cmd, comments=True)
        if not words or words[0] != "acl":
            continue
        flags: dict[str, list[str]] = {}
        for flag, value in zip(words[1::2], words[2::2], strict=True):
            flags.setdefault(flag, []).append(value)
        assert set(flags) <= {
            "--allow-principal", "--operation", "--resource-pattern-type", "--topic", "--group",
        }, cmd  # fmt: skip
        ((principal,),) = [flags["--allow-principal"]]
        ((pattern,),) = [flags["--resource-pattern-type"]]
        for kind in ("topic", "group"):
            for name in flags.get(f"--{kind}", []):
                for op in flags["--operation"]:
                    out.add((principal, kind, name, pattern, op))
    return out


def _strimzi_bindings() -> set[Binding]:
    out: set[Binding] = set()
    for user in acl.kafka_users(T):
        principal = "User:" + user["metadata"]["name"]
        for a in user["spec"]["authorization"]["acls"]:
            r = a["resource"]
            pattern = {"literal": "literal", "prefix": "prefixed"}[r["patternType"]]
            for op in a["operations"]:
                out.add((principal, r["type"], r["name"], pattern, op))
    return out


def test_the_rendered_file_is_what_shared_acl_renders() -> None:
    assert RENDERED.read_text() == acl.compose_acls(T), (
        "compose/kafka-acls.sh drifted from shared/acl.py: "
        "python -m shared.acl compose > compose/kafka-acls.sh"
    )


def test_compose_acls_are_the_k8s_users_acls() -> None:
    assert rendered_bindings(RENDERED.read_text()) == _strimzi_bindings()


def _writers(bindings: set[Binding], topic: str) -> set[str]:
    return {
        p.removeprefix("User:rltune-")
        for p, kind, name, pattern, op in bindings
        if kind == "topic" and op == "Write" and name == topic
    }


def test_compose_acls_follow_designs_topic_table() -> None:
    bindings = rendered_bindings(RENDERED.read_text())
    # no wildcard or prefix ever grants a topic: each topic ACL names one topic
    assert all(
        pattern == "literal" and name != "*" for _, k, name, pattern, _ in bindings if k == "topic"
    )
    readers = {
        (p.removeprefix("User:rltune-"), name)
        for p, k, name, _, op in bindings
        if k == "topic" and op == "Read"
    }
    for topic, producers, consumers in _design_rows():
        name = T.name(topic)
        assert set(producers) <= _writers(bindings, name), topic
        assert {(c, name) for c in consumers} <= readers, topic
    for internal in ("sched.priorities", "sched.placements", "offload.plans", "rl.rewards"):
        design = {t: set(p) for t, p, _ in _design_rows()}[internal]
        assert _writers(bindings, T.name(internal)) == design, internal


def test_users_write_only_jobs_submit_and_kill_and_never_placements() -> None:
    bindings = rendered_bindings(RENDERED.read_text())
    user = acl.principal_name("user")
    written = {n for p, k, n, _, op in bindings if p == f"User:{user}" and op == "Write"}
    assert written == {T.jobs_submit, T.jobs_kill}
    assert _writers(bindings, T.sched_placements) == {"placement"}
    assert not [
        b
        for b in bindings
        if b[0] == f"User:{user}"
        and b[2] == T.sched_placements
        and b[4] != "Read"
        and b[4] != "Describe"
    ]


def test_the_reader_sees_what_a_line_grants() -> None:
    """The parser the checks above rest on, on a line written by hand."""
    line = (
        "acl --allow-principal User:u --operation Write --operation Describe \\\n"
        "    --resource-pattern-type literal --topic a --topic b\n"
    )
    assert rendered_bindings(line) == {
        ("User:u", "topic", t, "literal", op) for t in "ab" for op in ("Write", "Describe")
    }


# ---- files ---------------------------------------------------------------------------


def test_the_overlay_matches_the_compose_specification_schema() -> None:
    exe = Path(sys.executable).with_name("check-jsonschema")
    run = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.compose-spec", str(OVERLAY)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_make_secrets_writes_one_password_per_user_and_keeps_them(tmp_path: Path) -> None:
    for f in ("make-secrets.sh", "docker-compose.acl.yml"):
        shutil.copy(COMPOSE / f, tmp_path / f)
    run = subprocess.run(["sh", str(tmp_path / "make-secrets.sh")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    made = {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()}
    assert set(made) == set(yaml.safe_load(OVERLAY.read_text())["secrets"])
    assert all(re.fullmatch(r"[A-Za-z0-9]{32}", pw) for pw in made.values())
    assert len(set(made.values())) == len(made)  # each its own
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o700
    subprocess.run(["sh", str(tmp_path / "make-secrets.sh")], check=True, capture_output=True)
    assert {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()} == made
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "compose/secrets/rltune-user"]
    )
    assert ignored.returncode == 0  # never committed
