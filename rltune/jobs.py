"""`rltune jobs`: the jobs the system knows now, listed as Slurm's `squeue` lists them.

Built by reading the public topics from the beginning (`jobs.accepted`,
`jobs.rejected`, `jobs.events`, and `sched.priorities` for queue positions), so
it works from any machine that reaches the broker and needs no service of its
own. A job's state follows its last event: PENDING once accepted (again after a
preemption or a refused placement), RUNNING once started, then FINISHED,
FAILED or CANCELLED; REJECTED when the arrival service refused it. The queue
position is the job's rank among the still-pending jobs of the latest round
that ranked it (`-`: no round has ranked it yet).

By default only pending and running jobs are listed (as `squeue` does), with a
count of the rest; `--all` lists every job, `--json` writes them as JSON.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import msgspec
from aiokafka.errors import KafkaError

from rltune.common import add_bus_args, bus_settings, run_async, unreachable, write_json
from shared.config import BusSettings
from shared.messages import Job, JobEvent, PriorityBatch, Rejection
from shared.topics import Topics
from shared.wire import Record

__all__ = ["JobRow", "JobsTable", "register", "run"]

ACTIVE = ("PENDING", "RUNNING")
_STATE_OF = {
    "started": "RUNNING",
    "finished": "FINISHED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "preempted": "PENDING",
    "rejected_placement": "PENDING",
}


@dataclass
class JobRow:
    job_id: str
    state: str
    user: str = ""
    num_gpus: int = 0
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    nodes: list[str] = field(default_factory=list)
    position: int | None = None  # 1 = next, among the pending jobs of the latest round
    exit_code: int | None = None
    detail: str = ""
    command: list[str] = field(default_factory=list)


class JobsTable:
    """Fed the records of the four topics (any interleaving of topics, each in its own
    order), `rows()` lists the jobs: records are kept by topic and applied jobs first,
    then rejections, events and rounds, so an event read before its job's accepted
    record still counts."""

    def __init__(self, topics: Topics) -> None:
        self.t = topics
        self.topics = [
            topics.jobs_accepted,
            topics.jobs_rejected,
            topics.jobs_events,
            topics.sched_priorities,
        ]
        self.jobs: dict[str, JobRow] = {}
        self.ranked: tuple[float, list[str]] | None = None  # the latest round: time, order
        self._records: dict[str, list[Record]] = {t: [] for t in self.topics}
        self._applied = True
        self._job = msgspec.json.Decoder(Job)
        self._event = msgspec.json.Decoder(JobEvent)
        self._batch = msgspec.json.Decoder(PriorityBatch)
        self._rejection = msgspec.json.Decoder(Rejection)

    def add(self, rec: Record) -> None:
        if rec.topic in self._records:
            self._records[rec.topic].append(rec)
            self._applied = False

    def _apply_all(self) -> None:
        if self._applied:
            return
        self._applied = True
        self.jobs, self.ranked = {}, None
        for topic in self.topics:
            for rec in self._records[topic]:
                self._apply(rec)

    def _apply(self, rec: Record) -> None:
        try:
            if rec.topic == self.t.jobs_accepted:
                self._accepted(self._job.decode(rec.value or b""))
            elif rec.topic == self.t.jobs_rejected:
                r = self._rejection.decode(rec.value or b"")
                if r.job_id and r.job_id not in self.jobs:  # (not a later duplicate's)
                    self.jobs[r.job_id] = JobRow(r.job_id, "REJECTED", detail=r.reason)
            elif rec.topic == self.t.jobs_events:
                self._event_of(self._event.decode(rec.value or b""))
            elif rec.topic == self.t.sched_priorities:
                b = self._batch.decode(rec.value or b"")
                if self.ranked is None or b.time >= self.ranked[0]:
                    self.ranked = (b.time, [j for j, _ in b.jobs])
        except msgspec.MsgspecError:
            return  # (its consumers dead-letter it)

    def _accepted(self, job: Job) -> None:
        old = self.jobs.get(job.job_id)
        if old is not None and old.state in ACTIVE:
            return  # a redelivery
        self.jobs[job.job_id] = JobRow(
            job.job_id,
            "PENDING",
            user=job.user,
            num_gpus=job.num_gpus,
            submit=job.submit_time,
            command=list(job.command),
        )

    def _event_of(self, ev: JobEvent) -> None:
        row = self.jobs.get(ev.job_id)
        if row is None or row.state not in ACTIVE:
            return  # unknown, or ended already (a redelivered event)
        state = _STATE_OF.get(ev.kind)
        if state is None:
            return
        if ev.kind == "rejected_placement" and row.state == "RUNNING":
            return  # a refused move: it runs on where it was
        if state == "RUNNING" and row.state == "RUNNING":  # another node of the same job
            row.nodes += [n for n in ev.node_ids if n not in row.nodes]
            return
        row.state = state
        if state == "RUNNING":
            row.start = row.start if row.start is not None else ev.time
            row.nodes = list(ev.node_ids)
        elif state != "PENDING":
            row.end = ev.time
            row.exit_code = ev.exit_code
            row.detail = ev.detail
            row.nodes = row.nodes or list(ev.node_ids)

    def rows(self, everything: bool = False) -> list[JobRow]:
        """The jobs in submission order (pending and running only, unless `everything`),
        each pending one with its queue position."""
        self._apply_all()
        order = self.ranked[1] if self.ranked else []
        pending = [j for j in order if j in self.jobs and self.jobs[j].state == "PENDING"]
        for i, j in enumerate(pending, start=1):
            self.jobs[j].position = i
        rows = [r for r in self.jobs.values() if everything or r.state in ACTIVE]
        return sorted(rows, key=lambda r: (r.submit is None, r.submit or 0.0))

    def counts(self) -> dict[str, int]:
        self._apply_all()
        out: dict[str, int] = {}
        for r in self.jobs.values():
            out[r.state] = out.get(r.state, 0) + 1
        return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="the jobs the system knows now, as squeue lists them")
    p.add_argument("--all", action="store_true", help="ended and rejected jobs too")
    p.add_argument("--json", default=None, metavar="OUT", help="write the rows as JSON ('-')")
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = bus_settings(args)
    table = JobsTable(settings.topics)
    run_async(_read(settings, table))
    rows = table.rows(args.all)
    if args.json:
        write_json([asdict(r) for r in rows], args.json)
        if args.json == "-":
            return 0
    sys.stdout.write(render(rows, table.counts(), args.all))
    return 0


async def _read(settings: BusSettings, table: JobsTable) -> None:
    from shared.wire import read_back

    try:
        await read_back(settings, table.topics, table.add)
    except (KafkaError, OSError) as exc:
        raise unreachable(settings, exc) from None


def render(rows: list[JobRow], counts: dict[str, int], everything: bool) -> str:
    head = ("JOBID", "STATE", "POS", "GPUS", "USER", "SUBMIT", "START", "END", "NODES", "INFO")
    lines = [head]
    for r in rows:
        info = " | ".join(r.detail.splitlines()) if r.detail else " ".join(r.command)
        lines.append(
            (
                r.job_id,
                r.state,
                str(r.position) if r.position is not None else "-",
                str(r.num_gpus) if r.num_gpus else "-",
                r.user or "-",
                _when(r.submit),
                _when(r.start),
                _when(r.end),
                ",".join(r.nodes) or "-",
                info[:80] or "-",
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = "".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in lines
    )
    rest = {s: n for s, n in sorted(counts.items()) if s not in ACTIVE}
    if rest and not everything:
        text += ", ".join(f"{n} {s.lower()}" for s, n in rest.items())
        text += " not listed (--all lists them)\n"
    return text


def _when(t: float | None) -> str:
    """A time: the local clock for a wall-clock time, else cluster seconds (a replay)."""
    if t is None:
        return "-"
    if t > 1e8:
        return datetime.fromtimestamp(t, UTC).astimezone().strftime("%m-%d %H:%M:%S")
    return f"t={t:.0f}s"
