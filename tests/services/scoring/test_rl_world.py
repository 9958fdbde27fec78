"""Training across several traces (`--world FILE`) and episodes that reach their load.

The load check is the cause of a trainer that could not tell checkpoints apart on
ThetaGPU: its slices run at about 0.4 of the cluster, thinning can only lower
that, so every episode ran near 0.5 whatever load it asked for, no job queued
long, every order gave the same schedule and the validation gain was 0 at every
check. Each load here is recomputed in a few lines from the jobs' own fields."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from services.scoring.rl.args import Args
from services.scoring.rl.env import EpisodeConfig, EpisodeSpec, build_episode, episode_size
from services.scoring.rl.train import episode_specs, load_world
from services.scoring.rl.world import load_parts, load_world_file
from shared.cluster import load_cluster, parse_cluster
from shared.errors import UserError
from shared.sim import load_jobs
from shared.sim.load import capacity
from shared.traces import SkipStats, TraceJob
from tests.paths import ITP, KTH_SWF, THETAGPU

ROOT = Path(__file__).resolve().parents[3]
THETA_CLUSTER = ROOT / "clusters" / "thetagpu.yaml"


def _span_load(jobs: list, gpus: int) -> float:
    """GPU-seconds held within the submission span (each job from its submission, as
    if it started at once, cut at the last submission) per second of it, over the
    GPUs (one type)."""
    first, last = min(j.submit_s for j in jobs), max(j.submit_s for j in jobs)
    held = sum(j.num_gpus * min(j.duration_s or 0.0, last - j.submit_s) for j in jobs)
    return held / (last - first) / gpus


@pytest.mark.parametrize("load", [0.8, 1.2])
def test_a_quiet_thetagpu_slice_is_compressed_to_the_episode_load(load: float) -> None:
    cluster = load_cluster(THETA_CLUSTER)
    jobs = load_jobs(THETAGPU, "alcf", cluster, SkipStats())[:2000]
    cfg = EpisodeConfig(prefix=256, jobs=256)
    raw = jobs[100 : 100 + 4 * 512]
    assert _span_load(raw, cluster.total_gpus) < 0.6  # as recorded: quiet
    picked, n_prefix = build_episode(jobs, cluster, EpisodeSpec(0, 100, load, 7), cfg)
    assert n_prefix == 256 and len(picked) == 512
    assert [j.job_id for j in picked] == [j.job_id for j in raw[:512]]  # none thinned
    assert _span_load(picked, cluster.total_gpus) == pytest.approx(load, rel=1e-6)
    # the order of arrivals is kept, the gaps shrink by one factor
    gaps = [b.submit_s - a.submit_s for a, b in itertools.pairwise(raw[:512])]
    new = [b.submit_s - a.submit_s for a, b in itertools.pairwise(picked)]
    ratios = [g / n for g, n in zip(gaps, new, strict=True) if n > 1.0]
    assert min(ratios) > 1.0 and max(ratios) == pytest.approx(min(ratios), rel=1e-5)


def _world_file(tmp: Path) -> Path:
    parts = [
        {"name": "theta", "trace": str(THETAGPU), "format": "alcf",
         "cluster": str(THETA_CLUSTER), "until": "2023-04-09",
         "train": [0.0, 0.8], "val": [0.8, 1.0]},
        {"name": "kth", "trace": str(KTH_SWF), "format": "swf", "train": [0.0, 0.1]},
        {"name": "itp", "trace": str(ITP / "cluster01.csv"), "format": "itp",
         "cluster": [str(ROOT / "clusters" / f"itp-cluster0{i}.yaml") for i in (1, 2)]},
    ]  # fmt: skip
    path = tmp / "world.yaml"
    path.write_text(json.dumps(parts))
    return path


def test_world_parts_split_by_submit_order_and_never_overlap(tmp_path: Path) -> None:
    path = _world_file(tmp_path)
    train, val = load_world_file(path, "train"), load_world_file(path, "val")
    assert train.names == [
        "theta/thetagpu",
        "kth/KTH-SP2-1996-unfiltered",
        "itp/itp-cluster01",
        "itp/itp-cluster02",
    ]
    assert [c.total_gpus for c in train.clusters][1] == 100  # the SWF header's 100 nodes
    # ThetaGPU before 2023-04-09: 80% to training, the rest to validation, in order
    theta = [j for j in load_jobs(THETAGPU, "alcf", train.clusters[0], SkipStats())]
    before = [j for j in theta if j.submit_s < 1680998400.0]  # 2023-04-09 00:00 UTC
    cut = round(0.8 * len(before))
    assert [j.job_id for j in train.jobs[0]] == [j.job_id for j in before[:cut]]
    assert [j.job_id for j in val.jobs[0]] == [j.job_id for j in before[cut:]]
    assert val.names == ["theta/thetagpu"]  # the other parts name no validation range
    assert train.jobs[2] is train.jobs[3]  # one trace, two clusters


def test_episodes_draw_every_world_and_start_inside_it() -> None:
    cfg = EpisodeConfig(prefix=10, jobs=10)
    specs = episode_specs([100, 5000], cfg, 400, [3, 0])
    assert {s.cluster for s in specs} == {0, 1}
    assert max(s.start for s in specs if s.cluster == 0) < 100 - 80
    assert max(s.start for s in specs if s.cluster == 1) > 1000


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"trace": "t.csv", "format": "alcf", "cluster": "c.yaml", "train": [0, 0.8],
          "val": [0.7, 1.0]}, "overlap"),
        ({"trace": "t.csv", "format": "alcf"}, "`cluster` is required"),
        ({"trace": "t.csv", "format": "swf", "train": [0.5, 0.2]}, "`train` must be"),
        ({"trace": "t.csv", "format": "swf", "weigth": 2}, "unknown key 'weigth'"),
        ({"trace": "t.csv", "format": "swf", "weight": 0}, "`weight` must be"),
    ],
)  # fmt: skip
def test_a_bad_world_file_is_one_line_naming_the_part(
    tmp_path: Path, part: dict[str, object], message: str
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(json.dumps([part]))
    with pytest.raises(UserError, match=message) as err:
        load_parts(path)
    assert "part 1" in str(err.value) and "\n" not in str(err.value)


def test_train_takes_a_trace_or_a_world_not_both(tmp_path: Path) -> None:
    from services.scoring.rl.args import validate

    with pytest.raises(UserError, match="either --trace"):
        validate(Args(trace="x.csv", world=str(_world_file(tmp_path))))
    with pytest.raises(UserError, match="either --trace"):
        validate(Args())
    train, val = load_world(Args(world=str(_world_file(tmp_path)), jobs=64))
    assert len(train.jobs) == 4 and len(val.jobs) == 1


def test_a_field_some_training_world_lacked_is_not_needed() -> None:
    from services.scoring.rl.args import FEATURE_SETS
    from services.scoring.rl.train import world_needs
    from shared.traces import TraceJob

    feats = FEATURE_SETS["identity"]
    named = [TraceJob("a", 0.0, 10.0, 1, user="u", project="p", time_limit_s=60.0)]
    bare = [TraceJob("b", 0.0, 10.0, 1)]
    # one world with identity: every field it carries is needed (app it never had)
    assert sorted(world_needs(feats, [named])) == ["project", "time_limit_s", "user"]
    # with a world without identity beside it, none is: the network saw them all 0
    assert world_needs(feats, [named, bare]) == []
    assert world_needs(FEATURE_SETS["all"], [named]) == []


@pytest.mark.parametrize("teacher", ["best:f1,nope", "oracle", "best:"])
def test_an_unknown_teacher_is_one_line(teacher: str) -> None:
    from services.scoring.rl.args import validate

    with pytest.raises(UserError, match="--teacher") as err:
        validate(Args(trace="x.csv", teacher=teacher))
    assert "\n" not in str(err.value)


def test_validation_episodes_take_every_world_in_turn() -> None:
    specs = episode_specs([3000, 100, 5000], EpisodeConfig(), 7, [1, 2], every_world=True)
    assert [s.cluster for s in specs] == [0, 1, 2, 0, 1, 2, 0]


# 1,000 GPUs; 1-GPU jobs of 10 s, a second apart. Compressed far enough, every job of
# a slice of n is still running at its last submission, so n of them reach at most
# span load (n - 1) n / 2 / (n - 1) / 1000 = n / 2000: 512 reach 0.256, 1,024 0.512,
# 2,048 1.024 and 4,096 2.048. As recorded they hold one GPU (no thinning)
_SPARSE = parse_cluster(
    {"reference": "A100", "nodes": [{"name": "n", "count": 125, "gpu_type": "A100", "gpus": 8}]}
)
_STEADY = [TraceJob(f"j{i}", float(i), 10.0, 1) for i in range(6000)]


@pytest.mark.parametrize(
    ("load", "fill", "size"),
    [(1.0, False, 512), (0.25, True, 512), (0.5, True, 1024), (1.0, True, 2048),
     (1.2, True, 4096), (3.0, True, 4096)],
)  # fmt: skip
def test_a_sparse_slice_takes_as_many_jobs_as_its_load_needs(
    load: float, fill: bool, size: int
) -> None:
    # by hand: the first n of 512 x 2^k whose limit n / 2000 x 0.99 >= load (0.5: 1,024
    # gives 0.507), at most 8 x 512; without fill_load, 512 always
    assert capacity(_SPARSE) == 1000.0
    cfg = EpisodeConfig(prefix=256, jobs=256, fill_load=fill)
    spec = EpisodeSpec(0, 0, load, 3)
    assert episode_size(_STEADY, _SPARSE, spec, cfg) == size
    picked, n_prefix = build_episode(_STEADY, _SPARSE, spec, cfg)
    assert [j.job_id for j in picked] == [f"j{i}" for i in range(size)]  # none thinned
    assert n_prefix == 256
    reached = _span_load(picked, _SPARSE.total_gpus)
    if size / 2000 * 0.99 >= load:  # within reach: compressed to it exactly
        assert reached == pytest.approx(load, rel=1e-6)
    else:  # beyond: as far as compression goes (0.99 of the limit)
        assert reached == pytest.approx(0.99 * size / 2000, rel=1e-6)


def test_filling_stops_at_the_end_of_the_trace() -> None:
    cfg = EpisodeConfig(prefix=256, jobs=256, fill_load=True)
    spec = EpisodeSpec(0, 5000, 1.0, 3)  # 1,000 jobs left: 512, then 1,024 (past the end)
    assert episode_size(_STEADY, _SPARSE, spec, cfg) == 1024
    picked, _ = build_episode(_STEADY, _SPARSE, spec, cfg)
    assert len(picked) == 1000
