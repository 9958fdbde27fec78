"""The whole of philly-sep-oct.csv (52,849 jobs) on clusters/philly.yaml, checked
from `--jobs-out` by this repo's checker and by the independent one handed to
the project (`../shared/tools/check_jobs.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltune import main
from shared.cluster import load_cluster
from shared.metrics import summarize
from shared.sim import read_jobs_csv
from tests.paths import PHILLY, TOOLS
from tests.shared.sim.jobs_check import recompute, violations

ROOT = Path(__file__).resolve().parents[3]
TRACE = PHILLY
CHECKER = TOOLS / "check_jobs.py"
CLUSTER = ROOT / "clusters" / "philly.yaml"


def _simulate(
    tmp: Path,
    policy: str,
    tag: str,
    placer: str = "greedy",
    limit: int | None = None,
    discipline: str = "easy",
) -> tuple[Path, Path]:
    jobs, summary = tmp / f"{tag}.csv", tmp / f"{tag}.json"
    argv = ["simulate", "--trace", str(TRACE), "--format", "philly", "--cluster", str(CLUSTER)]
    argv += ["--policy", policy, "--json", str(summary), "--jobs-out", str(jobs)]
    argv += ["--discipline", discipline]
    argv += ["--placer", placer] + (["--limit", str(limit)] if limit else [])
    assert main(argv) == 0
    return jobs, summary


@pytest.fixture(scope="module")
def fifo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _simulate(tmp_path_factory.mktemp("fifo"), "fifo", "fifo", discipline="best-effort")


@pytest.mark.parametrize("policy", ["fifo", "sjf-est"])
def test_whole_philly_passes_both_checkers(
    policy: str, fifo: tuple[Path, Path], tmp_path: Path
) -> None:
    """fifo under best-effort, sjf-est under the default discipline (easy)."""
    jobs, summary = fifo if policy == "fifo" else _simulate(tmp_path, policy, policy)
    assert violations(jobs) == []  # no GPU held twice, no start before submit
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(jobs), str(summary)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    s = json.loads(summary.read_text())
    assert s["jobs"] == 52849 and s["rejected"] == {}
    # every figure but the solver timings, recomputed from the file, is equal
    again = summarize(read_jobs_csv(jobs), load_cluster(CLUSTER).total_gpus)
    for key in ("jobs", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "p99_queue_s"):
        assert again[key] == s[key], key
    for key in ("avg_bsld", "gpu_util", "makespan_s"):
        assert again[key] == pytest.approx(s[key], rel=1e-12), key
    # and by this repo's own reading of the file, from the definitions alone
    mine = recompute(jobs, load_cluster(CLUSTER).total_gpus)
    for key in ("gpu_util", "gpu_util_makespan", "max_queue_s"):
        assert s[key] == pytest.approx(mine[key], rel=1e-9), key
    for bucket, got in s["queue_by_size"].items():
        assert got == pytest.approx(mine["queue_by_size"][bucket], rel=1e-9), bucket
    assert s["priority_inversions"] == 0
    assert s["discipline"] == ("best-effort" if policy == "fifo" else "easy")


def test_milp_placer_on_a_philly_slice_passes_the_checker(tmp_path: Path) -> None:
    """The default placer (the MILP) in the simulator: the independent checker agrees,
    and the schedule is reproducible (CP-SAT stops on deterministic time, not wall time)."""
    jobs, summary = _simulate(tmp_path, "sjf-est", "milp", placer="milp", limit=2000)
    again, _ = _simulate(tmp_path, "sjf-est", "milp-again", placer="milp", limit=2000)
    assert jobs.read_bytes() == again.read_bytes()
    assert violations(jobs) == []
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(jobs), str(summary)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(summary.read_text())["jobs"] == 2000


def test_whole_philly_is_byte_identical_run_to_run(fifo: tuple[Path, Path], tmp_path: Path) -> None:
    jobs, _ = _simulate(tmp_path, "fifo", "again", discipline="best-effort")
    assert jobs.read_bytes() == fifo[0].read_bytes()


@pytest.mark.parametrize(
    ("policy", "discipline"), [("fifo", "easy"), ("sjf-est", "best-effort"), ("drf", "strict")]
)
def test_philly_slice_same_schedule_as_exhaustive_rounds(policy: str, discipline: str) -> None:
    """The round skipping and the free-GPU budget are exact: on the first 4,000 jobs,
    a full round at every event with whole windows gives the same records."""
    from services.placement.greedy import GreedyPlacer
    from services.scoring.policies import make_policy
    from shared.sim import SimConfig, load_jobs, simulate
    from shared.traces import SkipStats

    cluster = load_cluster(CLUSTER)
    jobs = load_jobs(TRACE, "philly", cluster, SkipStats(), limit=4000)
    fast_config = SimConfig(discipline=discipline)
    fast = simulate(jobs, cluster, make_policy(policy), GreedyPlacer(), fast_config)
    slow_config = SimConfig(discipline=discipline, exhaustive=True)
    slow = simulate(jobs, cluster, make_policy(policy), GreedyPlacer(), slow_config)
    assert fast.records == slow.records
    assert fast.rounds < slow.rounds


def test_queue_limits_hold_on_a_philly_slice(tmp_path: Path) -> None:
    """VC queue limits, checked by the independent checker's --limits."""
    cluster = tmp_path / "limited.yaml"
    cluster.write_text(
        CLUSTER.read_text()
        + 'queues:\n  "6214e9": {limit_gpus: 60}\n  "7f04ca": {limit_gpus: 16}\n'
    )
    jobs, summary = tmp_path / "jobs.csv", tmp_path / "summary.json"
    argv = ["simulate", "--trace", str(TRACE), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", "drf", "--limit", "10000", "--json", str(summary), "--jobs-out", str(jobs)]
    argv += ["--placer", "greedy"]
    assert main(argv) == 0
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(jobs), str(summary), "--limits", "6214e9=60,7f04ca=16"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("placer", ["greedy", "milp"])
def test_node_order_in_the_cluster_file_changes_nothing(tmp_path: Path, placer: str) -> None:
    """The node groups of the cluster file listed in reverse order (the V100 servers
    first) give the same metrics and the same GPUs by name: placement depends on types,
    speeds and free shapes, never on where a node sits in the file."""
    import yaml

    spec = yaml.safe_load(CLUSTER.read_text())
    spec["nodes"] = list(reversed(spec["nodes"]))
    flipped = tmp_path / "flipped.yaml"
    flipped.write_text(yaml.safe_dump(spec))
    runs = []
    for cluster in (CLUSTER, flipped):
        jobs, summary = tmp_path / f"{cluster.stem}.csv", tmp_path / f"{cluster.stem}.json"
        argv = ["simulate", "--trace", str(TRACE), "--format", "philly", "--cluster", str(cluster)]
        argv += ["--policy", "sjf-est", "--limit", "3000", "--placer", placer]
        argv += ["--json", str(summary), "--jobs-out", str(jobs)]
        assert main(argv) == 0
        s = json.loads(summary.read_text())
        for key in ("placement_p50_ms", "placement_p99_ms"):
            del s[key]  # wall time
        assert s.pop("settings")["cluster"] == str(cluster)  # (the file named differs)
        runs.append((s, jobs.read_bytes()))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
