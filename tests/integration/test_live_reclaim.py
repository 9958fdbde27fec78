"""Reclaim on real processes: `rltune up` with `--queues` (its local cluster of one
host agent of four emulated GPUs) and a job of a queue with a guarantee, waiting
while a borrower holds every GPU. Scoring decides the preemption (the queue rules
of shared/tenancy.py), the host agent sends SIGTERM to the borrower's process
(which writes a marker), SIGKILL after the grace period to one that ignores it,
and reports `preempted`; the guaranteed job starts on the freed GPUs, and the
borrower goes back to the queue, runs again (a second process) and finishes. And
priority preemption: a job of a class with `preempt_lower` stops a lower job of its
own queue the same way, the stop's detail naming the priority rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import borrower_command, release_borrowers
from tests.integration.test_user_jobs import Up, _py

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(420),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # kafka-python's importlib use
]

QUEUES = """\
queues:
  prod: {guaranteed_gpus: 4}
  research: {guaranteed_gpus: 0}
priority_classes:
  train: {priority: 10, preemptible: true}
"""
GRACE_S = 4.0
MIN_RUN_S = 2.0


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[Up]:
    queues = tmp_path / "queues.yaml"
    queues.write_text(QUEUES)
    up = Up(
        tmp_path, "--hosts", "1", "--gpus", "4", "--queues", str(queues),
        "--grace", str(GRACE_S), "--min-run", str(MIN_RUN_S),
    )  # fmt: skip
    try:
        yield up
    finally:
        up.stop()
        release_borrowers(tmp_path)  # a borrower still holding outlives `up`


def _borrower(d: Path, name: str, ignores_term: bool) -> list[str]:
    return borrower_command(d, name, ignores_term, hold_s=300.0)


def _kinds(up: Up, job_id: str) -> list[str]:
    return [e["kind"] for e in up.events(job_id)]


def test_a_guaranteed_job_preempts_a_borrower_which_restarts_and_finishes(
    tenants: Up, tmp_path: Path
) -> None:
    up = tenants
    for borrower, ignores, owner in (("hog", False, "urgent"), ("stubborn", True, "urgent-2")):
        spec = {"job_id": borrower, "vc": "research", "num_gpus": 4, "priority_class": "train"}
        up.publish({**spec, "command": _borrower(tmp_path, borrower, ignores)})
        started = up.wait("started", borrower)
        # a job of prod, inside its guarantee, while research borrows every GPU
        up.publish({"job_id": owner, "vc": "prod", "num_gpus": 2, "command": _py("0")})
        stop = up.wait("preempted", borrower, timeout=60)
        assert stop["detail"].startswith(
            f"preempted (reclaim: queue prod's guarantee, for {owner}); exit code "
        ), stop
        # never inside its minimum run time; SIGKILL only after the grace period
        assert stop["time"] - started["time"] >= MIN_RUN_S
        terms = (tmp_path / f"{borrower}.term").read_text().splitlines()
        assert len(terms) == 1  # SIGTERM reached it, once
        waited = stop["time"] - float(terms[0])
        if ignores:  # killed a grace period after SIGTERM
            assert stop["exit_code"] == -9, stop
            assert waited >= GRACE_S - 0.5, waited
        else:  # it stopped on SIGTERM
            assert stop["exit_code"] == 143, stop
            assert waited < GRACE_S, waited
        first = up.wait("started", owner, timeout=60)
        assert first["time"] >= stop["time"]
        assert up.wait("ended", owner)["kind"] == "finished"
        # the borrower back in the queue: a second process, which finishes
        end = up.wait("finished", borrower, timeout=90)
        assert end["exit_code"] == 0
        assert _kinds(up, borrower) == ["started", "preempted", "started", "finished"]
        runs = (tmp_path / f"{borrower}.runs").read_text().splitlines()
        assert runs == ["0,1,2,3", "0,1,2,3"]
        restarted = [e for e in up.events(borrower) if e["kind"] == "started"][1]
        assert restarted["time"] >= stop["time"]
    # the owners ran once each, never stopped
    for owner in ("urgent", "urgent-2"):
        assert _kinds(up, owner) == ["started", "finished"]
    # arrival knows the queue file's priority classes: an unknown one is refused
    up.publish({"job_id": "odd", "num_gpus": 1, "priority_class": "nope", "command": ["true"]})
    reason = up.wait("rejected", "odd")["reason"]
    assert reason == "priority_class 'nope' is not a priority class of this cluster (it has train)"


CLASSES = """\
queues:
  prod: {limit_gpus: 4}
priority_classes:
  low: {priority: 0}
  high: {priority: 10, preempt_lower: true}
"""


def test_a_higher_class_preempts_a_lower_job_of_its_queue_which_restarts(tmp_path: Path) -> None:
    queues = tmp_path / "classes.yaml"
    queues.write_text(CLASSES)
    up = Up(
        tmp_path, "--hosts", "1", "--gpus", "4", "--queues", str(queues),
        "--grace", str(GRACE_S), "--min-run", str(MIN_RUN_S),
    )  # fmt: skip
    try:
        spec = {"job_id": "lo", "vc": "prod", "num_gpus": 4, "priority_class": "low"}
        up.publish({**spec, "command": _borrower(tmp_path, "lo", False)})
        started = up.wait("started", "lo")
        up.publish({"job_id": "hi", "vc": "prod", "num_gpus": 2, "priority_class": "high",
                    "command": _py("0")})  # fmt: skip
        stop = up.wait("preempted", "lo", timeout=60)
        assert stop["detail"].startswith("preempted (priority: class high of hi); exit code "), stop
        assert stop["time"] - started["time"] >= MIN_RUN_S
        assert stop["exit_code"] == 143, stop
        assert up.wait("started", "hi", timeout=60)["time"] >= stop["time"]
        assert up.wait("ended", "hi")["kind"] == "finished"
        assert up.wait("finished", "lo", timeout=90)["exit_code"] == 0
        assert _kinds(up, "lo") == ["started", "preempted", "started", "finished"]
        assert _kinds(up, "hi") == ["started", "finished"]
    finally:
        up.stop()
