"""Admission of submitted jobs (DESIGN.md, "JobSpec"): decode, validate, normalise.

Pure logic: no bus. `Admission.admit` turns the bytes of one `jobs.submit`
message into a `Job`, or raises `Reject` with a reason that names the field.
It keeps the set of live job ids (accepted and not yet finished) so that a
second submission of a live id is refused, and, once the cluster inventory is
known, refuses jobs that no set of nodes could ever hold. Given the cluster file's
priority classes, a `priority_class` that names none of them is refused.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection

import msgspec

from shared.messages import JOB_ID_PATTERN, Job, JobSpec, NodeStatus
from shared.reject import Reject

__all__ = ["Admission", "Inventory", "accepted_bytes", "decode_spec", "normalise"]

_DECODER = msgspec.json.Decoder(JobSpec)
_JOB_ID = re.compile(JOB_ID_PATTERN)
_LOOSE = msgspec.json.Decoder()


def decode_spec(value: bytes | None) -> JobSpec:
    """The JobSpec in `value`; Reject naming the field (or the syntax error) otherwise.

    JSON is UTF-8 (RFC 8259): a message that is not, anywhere, is refused before it is
    parsed. `null` in an optional field means the field is absent (its default)."""
    if not value:
        raise Reject("empty message: expected a JobSpec JSON object", kind="not_json")
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Reject(
            f"not a JSON JobSpec: invalid UTF-8 at byte {exc.start}", kind="not_json"
        ) from None
    try:
        return _DECODER.decode(value)
    except msgspec.ValidationError as exc:
        spec = _without_nulls(value)
        if spec is not None:
            return spec
        raise Reject(f"invalid JobSpec: {exc}", key=_guess_job_id(value), kind="invalid") from None
    except msgspec.DecodeError as exc:
        raise Reject(f"not a JSON JobSpec: {exc}", kind="not_json") from None
    except RecursionError:
        raise Reject("not a JSON JobSpec: nested too deeply", kind="not_json") from None


def _without_nulls(value: bytes) -> JobSpec | None:
    """The spec with its `null` fields (and the offload spec's) taken as absent, if that
    makes it valid; None otherwise (the first error then stands)."""
    try:
        obj = _LOOSE.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or (None not in obj.values() and not _has_null_offload(obj)):
        return None
    obj = {k: v for k, v in obj.items() if v is not None}
    if isinstance(obj.get("offload"), dict):
        obj["offload"] = {k: v for k, v in obj["offload"].items() if v is not None}
    try:
        return msgspec.convert(obj, JobSpec)
    except (msgspec.ValidationError, RecursionError):
        return None


def _has_null_offload(obj: dict[str, object]) -> bool:
    off = obj.get("offload")
    return isinstance(off, dict) and None in off.values()


def _guess_job_id(value: bytes) -> str:
    """The job_id of an invalid spec, when it has a usable one (to file the rejection)."""
    try:
        obj = _LOOSE.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return ""
    jid = obj.get("job_id") if isinstance(obj, dict) else None
    return jid if isinstance(jid, str) and _JOB_ID.match(jid) else ""


class Inventory:
    """GPUs per type in the cluster, from `cluster.nodes`; empty until a node reports."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[str, int]] = {}  # node_id -> (gpu_type, gpus)
        self._by_type: dict[str, int] = {}
        self._max_node: dict[str, int] = {}

    @property
    def known(self) -> bool:
        return bool(self._nodes)

    def update(self, status: NodeStatus) -> None:
        if self._nodes.get(status.node_id) == (status.gpu_type, status.gpus):
            return
        self._nodes[status.node_id] = (status.gpu_type, status.gpus)
        self._by_type = {}
        self._max_node = {}
        for t, g in self._nodes.values():
            self._by_type[t] = self._by_type.get(t, 0) + g
            self._max_node[t] = max(self._max_node.get(t, 0), g)

    def why_unfit(self, spec: JobSpec) -> str | None:
        """Why no set of nodes could ever hold the job, or None if some could."""
        if not self.known:
            return None
        types = [t for t in (spec.gpu_types or list(self._by_type)) if t in self._by_type]
        if not types:
            return (
                f"gpu_types {spec.gpu_types} names no GPU type of this cluster "
                f"(it has {sorted(self._by_type)})"
            )
        capacity = sum(self._by_type[t] for t in types)
        if spec.num_gpus > capacity:
            return (
                f"num_gpus={spec.num_gpus} exceeds the {capacity} GPUs of allowed types "
                f"{sorted(types)} in the whole cluster"
            )
        return None


class Admission:
    """Validation and the live-job set of the arrival service.

    A job id is live while it has been accepted more often than it has ended;
    counting (rather than a set) keeps the read-back after a restart right
    whatever order the accepted and ended records come back in.
    """

    def __init__(self, classes: Collection[str] | None = None) -> None:
        # the cluster's priority classes (None: not known here, any name passes)
        self.classes = None if classes is None else sorted(classes)
        self._accepted: dict[str, int] = {}
        self._ended: dict[str, int] = {}
        self._end_events: set[str] = set()  # positions of the end events already counted
        self.inventory = Inventory()

    def is_live(self, job_id: str) -> bool:
        return self._accepted.get(job_id, 0) > self._ended.get(job_id, 0)

    @property
    def live_count(self) -> int:
        return sum(1 for j in self._accepted if self.is_live(j))

    def admit(self, value: bytes | None, timestamp_s: float) -> Job:
        """Accept one submitted message (the job becomes live) or raise Reject."""
        return _JOB_DECODER.decode(self.admit_bytes(value, timestamp_s)[1])

    def admit_bytes(self, value: bytes | None, timestamp_s: float) -> tuple[str, bytes]:
        """`admit`, answering (job_id, the accepted Job's JSON): the service's fast path."""
        spec = decode_spec(value)
        if spec.gpu_milli < 1000 and spec.num_gpus != 1:
            raise Reject(
                f"gpu_milli={spec.gpu_milli} (a share of one GPU) needs num_gpus=1, "
                f"got num_gpus={spec.num_gpus}",
                key=spec.job_id,
            )
        known = self.classes
        if known is not None and spec.priority_class and spec.priority_class not in known:
            raise Reject(
                f"priority_class {spec.priority_class!r} is not a priority class of this "
                f"cluster (it has {', '.join(known) if known else 'none'})",
                key=spec.job_id,
                kind="unknown_class",
            )
        if self.is_live(spec.job_id):
            raise Reject(
                f"job_id {spec.job_id!r} duplicates a live job", key=spec.job_id, kind="duplicate"
            )
        unfit = self.inventory.why_unfit(spec)
        if unfit is not None:
            raise Reject(unfit, key=spec.job_id, kind="unfit")
        self.accepted(spec.job_id)
        return spec.job_id, accepted_bytes(spec, timestamp_s)

    def accepted(self, job_id: str) -> None:
        """A job was accepted (now, or before a restart: read back from `jobs.accepted`)."""
        self._accepted[job_id] = self._accepted.get(job_id, 0) + 1

    def ended(self, job_id: str, event_source: str) -> None:
        """A job finished or failed: its id may be submitted again. `event_source` names
        the event's position on the bus, so an event seen twice counts once."""
        if event_source in self._end_events:
            return
        self._end_events.add(event_source)
        self._ended[job_id] = self._ended.get(job_id, 0) + 1


def normalise(spec: JobSpec, timestamp_s: float) -> Job:
    """The accepted form: submit time set (from the message's own timestamp, so a
    redelivered message gets the same one), GPU types without repeats."""
    return _JOB_DECODER.decode(accepted_bytes(msgspec.structs.replace(spec), timestamp_s))


def accepted_bytes(spec: JobSpec, timestamp_s: float) -> bytes:
    """`normalise(spec, timestamp_s)` as it goes on the wire: every field of the Job,
    defaults included (a consumer never has to know them). A record without a
    timestamp (-1: older clients) is stamped with the time it is admitted."""
    if spec.submit_time is not None:
        submit_time = spec.submit_time
    else:
        submit_time = timestamp_s if timestamp_s >= 0 else time.time()
    gpu_types = spec.gpu_types
    if gpu_types and len(set(gpu_types)) != len(gpu_types):
        gpu_types = list(dict.fromkeys(gpu_types))
    return _ENCODER.encode(
        Job(
            spec.job_id,
            spec.num_gpus,
            submit_time,
            spec.user,
            spec.vc,
            gpu_types,
            spec.gpu_milli,
            spec.model,
            spec.command,
            spec.duration_hint_s,
            spec.weight,
            spec.offload,
            spec.project,
            spec.app,
            spec.time_limit_s,
            spec.priority_class,
        )
    )


_JOB_DECODER = msgspec.json.Decoder(Job)
_ENCODER = msgspec.json.Encoder()
