"""Every message on the bus, as msgspec Structs (DESIGN.md, "Topics").

Field names are the contract: other programs read them. New fields are only
ever appended, with defaults. Public topics carry JSON, so any Kafka client can
publish and read them; `encode` / the per-type decoders in `shared.codec` are
the one way in and out.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

__all__ = [
    "JOB_ID_PATTERN",
    "Assignment",
    "ExpectedRelease",
    "Job",
    "JobEvent",
    "JobEventKind",
    "JobSpec",
    "KillRequest",
    "MetricsSnapshot",
    "MoveOrder",
    "NodeExit",
    "NodeStatus",
    "OffloadRunning",
    "OffloadSpec",
    "OffloadStats",
    "PlacementBatch",
    "PrefetchPlan",
    "PriorityBatch",
    "Rejection",
    "Reward",
    "RoundRequest",
    "TensorProfile",
]

JOB_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}\Z"  # \Z: "$" would let a final newline in

JobId = Annotated[str, Meta(pattern=JOB_ID_PATTERN, min_length=1, max_length=128)]
NumGpus = Annotated[int, Meta(gt=0, le=1024)]
GpuMilli = Annotated[int, Meta(ge=1, le=1000)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]
Finite = Annotated[float, Meta(ge=-1e300, le=1e300)]  # rejects inf; NaN fails both bounds
ShortStr = Annotated[str, Meta(max_length=256)]
GpuTypeName = Annotated[str, Meta(min_length=1, max_length=64)]
Bytes = Annotated[int, Meta(ge=0, le=2**62)]
# internal messages (cluster.nodes, offload.stats): checked as strictly as a JobSpec
NodeId = Annotated[str, Meta(min_length=1, max_length=256)]
NodeGpus = Annotated[int, Meta(ge=0, le=1024)]
GpuIndex = Annotated[int, Meta(ge=0, lt=1024)]
Milli = Annotated[int, Meta(ge=0, le=1000)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
NonNegFinite = Annotated[float, Meta(ge=0.0, le=1e300)]
LatencyMs = Annotated[float, Meta(ge=0.0, le=86_400_000.0)]  # at most a day


class OffloadSpec(Struct):
    """What a job tells the offload engine up front (10Cache)."""

    param_bytes: Bytes = 0
    optimizer_bytes: Bytes | None = None
    activation_bytes: Bytes | None = None


class JobSpec(Struct, omit_defaults=True):
    """What a user publishes on `jobs.submit`. Unknown fields are ignored."""

    job_id: JobId
    num_gpus: NumGpus
    user: ShortStr = ""
    vc: ShortStr = ""
    gpu_types: Annotated[list[GpuTypeName], Meta(max_length=64)] = []
    gpu_milli: GpuMilli = 1000
    model: ShortStr = ""
    command: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=256)] = []
    duration_hint_s: Annotated[float, Meta(gt=0.0, le=1e9)] | None = None
    weight: Annotated[float, Meta(gt=0.0, le=1e6)] = 1.0
    offload: OffloadSpec | None = None
    submit_time: Annotated[float, Meta(ge=0.0, le=1e11)] | None = None
    # appended (issue 31): who submitted what, and the requested wall time (Slurm's
    # account, job name and --time); a policy may plan with them, never with a run time
    project: ShortStr = ""
    app: ShortStr = ""
    time_limit_s: Annotated[float, Meta(gt=0.0, le=1e9)] | None = None
    # a name of the cluster's `priority_classes` ("": none; checked where the classes are known)
    priority_class: ShortStr = ""


class Job(Struct):
    """A validated, normalised job on `jobs.accepted`, every field present (defaults
    and nulls included). Never carries true run time."""

    job_id: str
    num_gpus: int
    submit_time: float
    user: str = ""
    vc: str = ""
    gpu_types: list[str] = []
    gpu_milli: int = 1000
    model: str = ""
    command: list[str] = []
    duration_hint_s: float | None = None
    weight: float = 1.0
    offload: OffloadSpec | None = None
    # appended (issue 31): as in JobSpec
    project: str = ""
    app: str = ""
    time_limit_s: float | None = None
    priority_class: str = ""


class Rejection(Struct):
    """A message that could not be accepted: `jobs.rejected` (or a `<topic>.dlq`)."""

    job_id: str
    reason: str
    raw: str  # the bytes as received: UTF-8 text, or "base64:" + base64 when not UTF-8
    topic: str = ""
    time: float = 0.0


class NodeStatus(Struct, omit_defaults=True):
    """What one node has and has free. Checked as strictly as a JobSpec when decoded
    (a forged or broken status must not reach a placer): counts and indices in range,
    fractions in [0, 1], rates finite; a violation names the field."""

    node_id: NodeId
    gpu_type: GpuTypeName
    gpus: NodeGpus
    free_gpus: Annotated[list[GpuIndex], Meta(max_length=1024)]  # GPUs with nothing on them
    gpu_util: Fraction = 0.0
    gpu_mem_used: Fraction = 0.0
    host_mem_free: NonNegFinite = 0.0
    pcie_gbps: NonNegFinite = 0.0
    nvme_gbps: NonNegFinite = 0.0
    time: Finite = 0.0
    round_id: Annotated[int, Meta(ge=0)] | None = None
    # appended (issue 10): free milli-GPUs per GPU index (1000 = untouched), so that a
    # GPU shared by fractional jobs is seen as partly free; absent = `free_gpus` only
    free_milli: Annotated[list[Milli], Meta(max_length=1024)] | None = None
    source: ShortStr = ""  # "pynvml", "inventory" (configured, no GPU) or "simulated"

    def __post_init__(self) -> None:
        if any(g >= self.gpus for g in self.free_gpus):
            raise ValueError(
                f"free_gpus names a GPU index >= gpus ({self.gpus}) - at `$.free_gpus`"
            )
        if len(set(self.free_gpus)) != len(self.free_gpus):
            raise ValueError("free_gpus names a GPU twice - at `$.free_gpus`")
        if self.free_milli is not None and len(self.free_milli) != self.gpus:
            raise ValueError(
                f"free_milli has {len(self.free_milli)} entries for {self.gpus} GPUs"
                " - at `$.free_milli`"
            )


class PriorityBatch(Struct):
    round_id: int
    time: float
    jobs: list[tuple[str, float]]  # (job_id, score), highest priority first
    cluster_version: int = 0
    # appended (issue 10): True when the executor drives the rounds (`sched.rounds`):
    # the executor then names the window placement solves, and placement skips this batch
    driven: bool = False


RoundPhase = Literal["score", "place", "replace"]


class OffloadRunning(Struct, omit_defaults=True):
    """A running offloading job as the executor holds it: what an offload-aware placer
    needs to rebuild the executor's offload state exactly (services/placement/moves.py)."""

    job_id: str
    param_bytes: int
    num_gpus: int
    gpus: list[tuple[str, list[int]]]  # (node_id, GPU indices)
    elapsed_s: float  # run time so far, all segments
    est_run_s: float = 0.0  # the run-time estimate it started with (history)
    moved_s: float | None = None  # time since its last move (None: never moved)
    restoring: bool = False  # still restoring the checkpoint of a move: not movable now


class RoundRequest(Struct, omit_defaults=True):
    """A scheduling round the executor (cluster_sim) asks for, on `sched.rounds`.

    `score`: everything that happened since the previous round (jobs that arrived,
    started and finished, in the simulator's order, and the nodes whose `NodeStatus`
    stamped with this `round_id` precede it); scoring answers once it has seen them.
    `place`: the window (job_id, score) the simulator hands its placer this round;
    placement answers with a `PlacementBatch` of the same `round_id`.
    `replace` (`--placer NAME+offload+replace`): after a round, may a running offloading
    job move? `nodes` as for `score` (the node states stamped with this `round_id`),
    `window` the number of waiting jobs, `offloading` every running offloading job;
    placement answers with a `PlacementBatch` of the same `round_id` whose `moves` holds
    at most one `MoveOrder` (no assignments). Its own round id: scoring ignores it.
    """

    round_id: int
    time: float
    phase: RoundPhase = "score"
    window: int = 128
    arrived: list[str] = []
    started: list[str] = []
    finished: list[str] = []
    nodes: list[str] = []
    jobs: list[tuple[str, float]] = []
    estimates: list[float] = []  # place: run-time estimates of `jobs` from history (EASY)
    releases: list[ExpectedRelease] = []  # place: running jobs' GPUs and when due back
    # score: jobs a preemptive policy stopped since the last round, back in the queue
    preempted: list[str] = []
    # appended (issue 13): place (offload-aware placer) and replace: the running
    # offloading jobs, so placement's offload view is the executor's
    offloading: list[OffloadRunning] = []


class ExpectedRelease(Struct, omit_defaults=True):
    """A running job's GPUs, expected back at `time_s` (its start + its estimate from
    history, never its true run time): what EASY backfill reserves against."""

    time_s: float
    job_id: str
    gpus: list[tuple[str, list[int]]]  # (node_id, GPU indices)
    gpu_milli: int = 1000


class Assignment(Struct):
    """GPUs of one node given to one job. A multi-node job has one per node."""

    job_id: str
    node_id: str
    gpu_indices: list[int]


class MoveOrder(Struct):
    """Placement asks the executor to move a running job: checkpoint it, give back its
    GPUs and restart it on `assignments` (one per node). The executor reports the new
    segment as `started` while the job runs (node_ids of the new place; detail its GPUs
    as for any start, "node:0+1;..."), after which the job's GPUs are the new ones; it
    may refuse a move whose GPUs are not free (`rejected_placement`, detail "move: ...":
    the job keeps running where it is). `restart_s`: what the move is expected to cost
    the job (restart overhead plus the checkpoint written and read back); `saved_s`: the
    run time it is expected to save (services/placement/replace.py)."""

    job_id: str
    assignments: list[Assignment]
    restart_s: float = 0.0
    saved_s: float = 0.0


class PlacementBatch(Struct):
    round_id: int
    time: float
    assignments: list[Assignment]
    solver_ms: float = 0.0
    solver_status: str = ""
    # appended (issue 10): the placer's other figures, e.g. "head" (the window index of
    # the first job that could not start, -1 if none) and "reservation_s" (EASY)
    extra: dict[str, float] = {}
    # appended (issue 13): running jobs to move (`--placer NAME+offload+replace`)
    moves: list[MoveOrder] = []


# `cancelled`: taken out of the queue before it ever started (a kill of a waiting job)
JobEventKind = Literal[
    "started", "finished", "failed", "rejected_placement", "preempted", "cancelled"
]


class JobEvent(Struct, omit_defaults=True):
    job_id: str
    kind: JobEventKind
    time: float
    node_ids: list[str] = []
    detail: str = ""
    # appended: the process's exit status on `finished` / `failed` from a host agent
    # (negative: killed by that signal); absent when no process ran (the simulator)
    exit_code: int | None = None


class NodeExit(Struct):
    """`jobs.exits` (internal, host agents only): the process of a job given several
    nodes exited 0 on `node_id`. The job is `finished` only when every node of
    `nodes` has said so; the agent whose record completes the set (the topic keeps
    one job's records in one order for every reader) publishes that `finished`. A
    process that fails is `failed` on `jobs.events` at once, and stops the others."""

    job_id: JobId
    node_id: NodeId
    nodes: Annotated[list[NodeId], Meta(min_length=2, max_length=1024)]  # all it was given
    time: NonNegFinite


class KillRequest(Struct, omit_defaults=True):
    """`jobs.kill` (public): stop a running job. The host agent running it terminates
    its process group (SIGTERM, SIGKILL after a grace period) and reports `failed`
    with the reason. With `requeue` (a preemption: scoring's reclaim on live hosts)
    the job is not ended: its stop is reported `preempted`, it goes back to the
    queue and runs again when placed; `grace_s` is then its grace period, and
    `for_job` the waiting job the preemption makes room for (scoring reads it back
    after a restart, so it neither asks twice nor loses that job's lead)."""

    job_id: JobId
    reason: ShortStr = ""
    requeue: bool = False
    grace_s: Annotated[float, Meta(ge=0.0, le=86_400.0)] | None = None
    for_job: JobId | None = None


class MetricsSnapshot(Struct, omit_defaults=True):
    """Metric keys of DESIGN.md ("Cluster model and simulator"), per window."""

    window: str = ""
    time: float = 0.0
    jobs: int = 0
    avg_jct_s: float = 0.0
    p50_jct_s: float = 0.0
    p99_jct_s: float = 0.0
    avg_queue_s: float = 0.0
    p99_queue_s: float = 0.0
    avg_bsld: float = 0.0
    gpu_util: float = 0.0
    makespan_s: float = 0.0
    placement_p50_ms: float = 0.0
    placement_p99_ms: float = 0.0
    rejected: dict[str, int] = {}
    counters: dict[str, float] = {}  # service counters (accepted, dlq, ...) by name
    source: str = ""
    # appended: per queue (telemetry's `all` window): pending_jobs, allocated_gpus
    # (and allocated_gpus.<gpu type>), borrowed_gpus, preemptions (and
    # preemptions.<reason>), fair_share
    queues: dict[str, dict[str, float]] = {}


class Reward(Struct):
    window: str
    value: float
    parts: dict[str, float] = {}


class TensorProfile(Struct):
    """Warm-up record of one training process: tensors and their use order."""

    job_id: str
    tensors: list[tuple[str, int, str, str]]  # (tensor_id, bytes, dtype, kind)
    order: list[str]  # tensor ids in first-use order of one step (repeats allowed)
    step_ms: float = 0.0
    # appended for 10Cache planning (issue 5): the process's memory budgets, and its host
    fast_budget_bytes: Bytes = 0
    host_budget_bytes: Bytes = 0
    node_id: str = ""


class PrefetchPlan(Struct):
    """Where each tensor lives and what to prefetch, for one job (10Cache)."""

    job_id: str
    version: int
    buffers: dict[int, dict[str, int]]  # size class (bytes) -> {tier: buffer count}
    placement: dict[str, str]  # tensor_id -> tier ("gpu", "host", "nvme")
    prefetch: list[str]  # tensor ids in prefetch order
    window: int = 2
    # a streamed tensor uses the buffers of a streamed class at most this many
    # times its own size (shared/offload/planner.py: stream_classes)
    merge: float = 1.34


class OffloadStats(Struct, omit_defaults=True):
    """One training process's 10Cache figures. Range-checked when decoded, since they
    enter the reward: a hit rate in [0, 1], latencies and times finite and at most a
    day, byte counts non-negative."""

    job_id: JobId
    node_id: NodeId
    hit_rate: Fraction
    migration_ms_p50: LatencyMs = 0.0
    migration_ms_p99: LatencyMs = 0.0
    bytes_in: Bytes = 0
    bytes_out: Bytes = 0
    gpu_mem_util: NonNegFinite = 0.0
    host_mem_util: NonNegFinite = 0.0
    step_ms: LatencyMs = 0.0
    time: Finite = 0.0


def encode(msg: Struct) -> bytes:
    """JSON bytes of a message, as it goes on the wire."""
    return _ENCODER.encode(msg)


_ENCODER = msgspec.json.Encoder()
