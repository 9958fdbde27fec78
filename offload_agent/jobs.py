"""Running the jobs placed on this host: the executor side of the host agent.

The agent learns each job's command from `jobs.accepted` and, when a
`PlacementBatch` gives GPUs of this node to a job, starts the command with
`CUDA_VISIBLE_DEVICES` set to them (plus `RLTUNE_JOB_ID`, the agent's
socket, so the 10Cache engine inside can find its agent,
`RLTUNE_SWAP_DIR`, the job's own directory under the node's swap root,
`RLTUNE_NODE_ID`, this node, and `RLTUNE_JOB_NODES`, every node the job was
given, comma-separated, as Slurm's SLURM_JOB_NODELIST: a job on several nodes
runs its command on each, and each process can tell its place from these).
When the job's process on another node fails, the one here is stopped
(`stop_sibling`): a gang runs together or not at all. Such a job has one status,
decided by all its nodes: a process that fails makes it `failed` at once (the detail
names the node and the exit code), and one that exits 0 is only this node's share
(`NodeExit`, on `jobs.exits`): the job is `finished` when every node's has exited 0
(`record_exit`, which says when the record read is the one that completes the set).
A job with a
`time_limit_s` (Slurm's `--time`) is stopped when it has run that long
(`time_up`, called by the agent's timer): `failed`, "time limit of N s reached". It
answers with a `started` event, or `failed` when the command cannot start (not found,
not executable: the reason in `detail`); `finished` (exit code 0) / `failed` follow
when the process exits, with `exit_code` set and, with `logs` set, the last lines the
command wrote on stderr in `detail` (its stdout and stderr are kept in
`logs`/<job>.out and .err). A placement can arrive before the
job's accepted record (they are different topics): it waits, and the job
starts when its command is learned. A job already started here is not started
again (redelivered placements). A job killed before it started here (`forbid`: a
`KillRequest` for a job not running here, or a `failed` event read back at start
for a job that never started) is never started: a placement of it is answered
`failed` and takes no GPU, so a kill that races the job's placement still stops it.

The runner knows which of the node's GPUs its running jobs hold (`busy`): an
assignment naming a GPU that is held, or that the node does not have, is
answered with `rejected_placement` (the job goes back to the queue) and starts
nothing, so no GPU is ever given twice, whatever view placement had. A re-placement
move (`PlacementBatch.moves`) is refused by the agent of the move's first new node
(`rejected_placement`, detail `MOVE_REFUSED`): the agent cannot checkpoint and restart
a running process, and placement then keeps the job where it runs.

A preemption (`preempt`, a `KillRequest` with `requeue`) stops the job as a kill
does, but its exit is reported `preempted` ("preempted (reason); exit code N"): the
job is not over, it goes back to the queue, and a later placement starts its
command again (here or elsewhere); a placement of the round that started the
stopped run, delivered again, does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from offload_agent.nvme import SWAP_DIR_ENV, job_swap_dir
from shared.messages import Job, JobEvent, NodeExit, PlacementBatch

__all__ = ["FORBIDDEN_KEPT", "JobRunner", "Started"]

STDERR_TAIL_LINES = 5  # of a failed command's stderr, in its event's detail
STDERR_TAIL_BYTES = 4096
FORBIDDEN_KEPT = 10_000  # jobs killed before they started here, remembered (the newest)
# a host agent does not checkpoint and restart a running training process, so it refuses
# every MoveOrder (PlacementBatch.moves) whose new place begins on its node: placement
# puts the job back where it runs (services/placement/moves.py)
MOVE_REFUSED = "move: not applied on hosts (no checkpoint and restart of a running process)"

Launch = Callable[..., subprocess.Popen[bytes]]
log = logging.getLogger("rltune.offload_agent")


@dataclass(frozen=True, slots=True)
class Started:
    job_id: str
    process: subprocess.Popen[bytes]


@dataclass
class JobRunner:
    node_id: str
    launch: Launch
    env: Mapping[str, str] = field(default_factory=dict)
    swap_root: Path | None = None  # each job gets swap_root/<job> as RLTUNE_SWAP_DIR
    commands: dict[str, list[str]] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    waiting: dict[str, list[int]] = field(default_factory=dict)  # placed, command unknown
    gpus: int | None = None  # GPUs this node has (None: not known, any index is accepted)
    busy: dict[int, str] = field(default_factory=dict)  # GPU index -> the job holding it
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killing: dict[str, str] = field(default_factory=dict)  # job -> why it is being killed
    forbidden: OrderedDict[str, str] = field(default_factory=OrderedDict)  # never start: why
    logs: Path | None = None  # each job's stdout / stderr go to logs/<job>.out / .err
    nodes: dict[str, list[str]] = field(default_factory=dict)  # job -> every node it was given
    stopping: dict[str, str] = field(default_factory=dict)  # job -> why (a sibling failed)
    limits: dict[str, float] = field(default_factory=dict)  # job -> its time_limit_s
    preempting: dict[str, str] = field(default_factory=dict)  # job -> why (a preemption)
    round_of: dict[str, int] = field(default_factory=dict)  # job -> round that started it
    # job -> round of its run that was preempted: only a later round starts it again
    requeued: dict[str, int] = field(default_factory=dict)
    # job of several nodes -> node -> the time its process there exited 0 (jobs.exits)
    exits: OrderedDict[str, dict[str, float]] = field(default_factory=OrderedDict)

    def learn(self, job: Job, now: float) -> tuple[list[JobEvent], list[Started]]:
        """Remember a job's command; start it if it was already placed here. A job
        accepted without one has nothing to run here: placed here, it is `failed`."""
        self.commands[job.job_id] = list(job.command)
        if job.time_limit_s:  # (JobSpec's requested wall time)
            self.limits[job.job_id] = job.time_limit_s
        gpus = self.waiting.pop(job.job_id, None)
        if gpus is None:
            return [], []
        return self._start_all([(job.job_id, gpus)], now)

    def place(self, batch: PlacementBatch, now: float) -> tuple[list[JobEvent], list[Started]]:
        """Start this node's share of every assignment; the events to publish now."""
        todo = []
        refused: list[JobEvent] = []
        given: dict[str, list[str]] = {}
        for a in batch.assignments:
            given.setdefault(a.job_id, []).append(a.node_id)
        for a in batch.assignments:
            if a.node_id != self.node_id or a.job_id in self.started:
                continue
            if batch.round_id <= self.requeued.get(a.job_id, -1):
                continue  # the placement of a run since preempted, delivered again
            self.nodes[a.job_id] = given[a.job_id]
            self.round_of[a.job_id] = batch.round_id
            if a.job_id in self.forbidden:
                self.started.add(a.job_id)  # (a redelivery is not answered twice)
                refused.append(self._killed_before_start(a.job_id, now))
                continue
            why = self.conflict(a.job_id, a.gpu_indices)
            if why is not None:
                refused.append(JobEvent(a.job_id, "rejected_placement", now, [self.node_id], why))
                continue
            for g in a.gpu_indices:
                self.busy[g] = a.job_id
            if a.job_id not in self.commands:
                self.waiting[a.job_id] = list(a.gpu_indices)
                continue
            todo.append((a.job_id, list(a.gpu_indices)))
        for mv in batch.moves:  # answered by the first node of the new place
            if mv.assignments and mv.assignments[0].node_id == self.node_id:
                refused.append(
                    JobEvent(mv.job_id, "rejected_placement", now, [self.node_id], MOVE_REFUSED)
                )
        events, procs = self._start_all(todo, now)
        return refused + events, procs

    def forbid(self, job_id: str, reason: str, now: float) -> list[JobEvent]:
        """A job killed before it started here: never start it. If it was placed here
        and waits for its command, it is answered `failed` now and its GPUs freed."""
        if job_id in self.started:
            return []
        self.forbidden[job_id] = reason
        self.forbidden.move_to_end(job_id)
        while len(self.forbidden) > FORBIDDEN_KEPT:
            self.forbidden.popitem(last=False)
        if self.waiting.pop(job_id, None) is None:
            return []
        self.free(job_id)
        self.started.add(job_id)
        return [self._killed_before_start(job_id, now)]

    def _killed_before_start(self, job_id: str, now: float) -> JobEvent:
        why = self.forbidden[job_id]
        detail = f"killed before it started{f' ({why})' if why else ''}"
        return JobEvent(job_id, "failed", now, [self.node_id], detail)

    def conflict(self, job_id: str, gpus: Sequence[int]) -> str | None:
        """Why `job_id` cannot have `gpus` of this node, or None if it can."""
        if len(set(gpus)) != len(gpus):
            return f"GPU indices {list(gpus)} repeat"
        for g in gpus:
            if g < 0 or (self.gpus is not None and g >= self.gpus):
                return f"node {self.node_id} has no GPU {g} (it has {self.gpus})"
            holder = self.busy.get(g)
            if holder is not None and holder != job_id:
                return f"GPU {g} of {self.node_id} is held by {holder}"
        return None

    def free(self, job_id: str) -> None:
        """`job_id` ended or could not start: its GPUs are free again."""
        for g in [g for g, j in self.busy.items() if j == job_id]:
            del self.busy[g]

    def _start_all(
        self, todo: list[tuple[str, list[int]]], now: float
    ) -> tuple[list[JobEvent], list[Started]]:
        events: list[JobEvent] = []
        procs: list[Started] = []
        for job_id, gpus in todo:
            self.started.add(job_id)
            event, proc = self._start(job_id, gpus, now)
            events.append(event)
            if proc is not None:
                self.running[job_id] = proc
                procs.append(Started(job_id, proc))
        return events, procs

    def _start(
        self, job_id: str, gpus: Sequence[int], now: float
    ) -> tuple[JobEvent, subprocess.Popen[bytes] | None]:
        command = self.commands[job_id]
        if not command:
            self.free(job_id)
            why = "no command to run: its JobSpec has no `command`"
            return JobEvent(job_id, "failed", now, [self.node_id], why), None
        nodes = ",".join(self.nodes.get(job_id) or [self.node_id])
        env = {
            **self.env,
            "RLTUNE_JOB_ID": job_id,
            "RLTUNE_NODE_ID": self.node_id,
            "RLTUNE_JOB_NODES": nodes,
        }
        if self.swap_root is not None:
            env[SWAP_DIR_ENV] = str(job_swap_dir(self.swap_root, job_id))
        try:
            with self._outputs(job_id) as outputs:
                proc = self.launch(command, gpus, env=env, **outputs)
        except OSError as exc:
            self.free(job_id)
            why = f"cannot start {command[0]!r}: {exc.strerror or exc}"
            return JobEvent(job_id, "failed", now, [self.node_id], why), None
        gpu_list = ",".join(map(str, gpus))
        return JobEvent(
            job_id, "started", now, [self.node_id], f"pid {proc.pid} gpus {gpu_list}"
        ), proc

    @contextlib.contextmanager
    def _outputs(self, job_id: str) -> Iterator[dict[str, IO[bytes]]]:
        """A job's stdout / stderr files, open while it is launched ({} without `logs`,
        or when they cannot be written: the job then writes where the agent does)."""
        if self.logs is None:
            yield {}
            return
        out, err = self.log_paths(job_id)
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            stdout, stderr = open(out, "ab"), open(err, "wb")  # noqa: SIM115 - closed below
        except OSError as exc:
            log.warning("job %s: no log files in %s (%s)", job_id, self.logs, exc)
            yield {}
            return
        with stdout, stderr:
            yield {"stdout": stdout, "stderr": stderr}

    def log_paths(self, job_id: str) -> tuple[Path, Path]:
        """Where a job's stdout and stderr go (with `logs` set)."""
        assert self.logs is not None
        name = re.sub(r"[^A-Za-z0-9._-]", "_", job_id).lstrip(".") or "_"
        return self.logs / f"{name}.out", self.logs / f"{name}.err"

    def stderr_tail(self, job_id: str) -> str:
        """The last lines a job wrote on stderr ("" without `logs`, or none written)."""
        if self.logs is None:
            return ""
        try:
            with open(self.log_paths(job_id)[1], "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - STDERR_TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def remove_swap(self, job_id: str) -> None:
        """Delete an ended job's swap directory (blocking: run it off the event loop).

        A process killed mid-training never runs its own cleanup; without this
        its swap files would fill the node's NVMe one crashed job at a time."""
        if self.swap_root is not None:
            shutil.rmtree(job_swap_dir(self.swap_root, job_id), ignore_errors=True)

    def kill(self, job_id: str, reason: str, sig: int = signal.SIGTERM) -> bool:
        """Signal a job running here (its whole process group); False if it does not
        run here. Its exit is then reported as `failed`, killed on request."""
        proc = self.running.get(job_id)
        if proc is None or proc.poll() is not None:
            return False
        self.killing.setdefault(job_id, reason)
        try:
            os.killpg(proc.pid, sig)  # launched in a session of its own
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)  # not a group leader: the process alone
        return True

    def time_up(self, job_id: str) -> bool:
        """The job's time limit is reached: stop it (True if it ran here)."""
        if job_id in self.killing or job_id in self.stopping or not self.kill(job_id, ""):
            return False
        self.killing.pop(job_id, None)
        self.stopping[job_id] = f"time limit of {self.limits.get(job_id, 0):g} s reached"
        return True

    def preempt(self, job_id: str, reason: str) -> bool:
        """Stop a job running here to requeue it (SIGTERM to its group; True if it ran
        here). Its exit is then `preempted`, and a later placement starts it again."""
        if job_id in self.killing or job_id in self.stopping or job_id in self.preempting:
            return False
        if not self.kill(job_id, ""):
            return False
        self.killing.pop(job_id, None)
        self.preempting[job_id] = reason
        return True

    def stop_sibling(self, event: JobEvent) -> bool:
        """`event` says the job's process on another node failed: stop the one running
        here (SIGTERM to its group; True if there was one). Its exit is then `failed`,
        "stopped: its process on <node> failed"."""
        if event.kind != "failed" or self.node_id in event.node_ids:
            return False
        if event.job_id in self.killing or event.job_id in self.stopping:
            return False  # (already on its way out)
        if not self.kill(event.job_id, ""):
            return False
        self.killing.pop(event.job_id, None)
        where = ", ".join(event.node_ids) or "another node"
        self.stopping[event.job_id] = f"its process on {where} failed"
        return True

    def exited(self, job_id: str, returncode: int, now: float) -> JobEvent | NodeExit:
        """The event of a job's process that exited with `returncode` (negative: killed
        by that signal); a failed one's detail ends with its last stderr lines. On a
        job given several nodes, an exit 0 is this node's share alone (`NodeExit`)
        and a failure's detail names this node."""
        self.free(job_id)
        self.running.pop(job_id, None)
        nodes = self.nodes.pop(job_id, None) or [self.node_id]
        gang = len(set(nodes)) > 1
        detail = f"exit code {returncode}" + (f" on {self.node_id}" if gang else "")
        node = [self.node_id]
        self.limits.pop(job_id, None)
        if job_id in self.preempting:
            why = self.preempting.pop(job_id)
            self.killing.pop(job_id, None)  # (the SIGKILL that may have followed)
            self.started.discard(job_id)  # a later placement runs it again
            self.requeued[job_id] = self.round_of.pop(job_id, -1)
            detail = f"preempted{f' ({why})' if why else ''}; {detail}"
            return JobEvent(job_id, "preempted", now, node, detail, exit_code=returncode)
        self.round_of.pop(job_id, None)
        if job_id in self.stopping:
            why = self.stopping.pop(job_id)
            self.killing.pop(job_id, None)  # (the SIGKILL that may have followed)
            return JobEvent(
                job_id, "failed", now, node, f"stopped: {why}; {detail}", exit_code=returncode
            )
        if job_id in self.killing:
            why = self.killing.pop(job_id)
            detail = f"killed on request{f' ({why})' if why else ''}; {detail}"
            return JobEvent(job_id, "failed", now, node, detail, exit_code=returncode)
        if returncode == 0 and gang:
            return NodeExit(job_id, self.node_id, list(dict.fromkeys(nodes)), now)
        if returncode == 0:
            return JobEvent(job_id, "finished", now, node, detail, exit_code=0)
        tail = self.stderr_tail(job_id)
        detail += f"; stderr:\n{tail}" if tail else ""
        return JobEvent(job_id, "failed", now, node, detail, exit_code=returncode)

    def record_exit(self, ex: NodeExit) -> JobEvent | None:
        """Note that `ex.node_id`'s process of `ex.job_id` exited 0. When that record is
        this node's own and completes the set (every node of the job has exited 0),
        the job's `finished` event: exactly one agent, the last to exit in the topic's
        order, publishes it, whatever order the records arrive in."""
        done = self.exits.setdefault(ex.job_id, {})
        done[ex.node_id] = ex.time
        self.exits.move_to_end(ex.job_id)
        while len(self.exits) > FORBIDDEN_KEPT:
            self.exits.popitem(last=False)
        if ex.node_id != self.node_id or not set(ex.nodes) <= set(done):
            return None
        detail = f"exit code 0 on every node ({', '.join(ex.nodes)})"
        return JobEvent(ex.job_id, "finished", ex.time, list(ex.nodes), detail, exit_code=0)
