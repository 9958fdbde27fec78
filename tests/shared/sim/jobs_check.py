"""An independent reading of a `--jobs-out` file for the tests: every invariant the
simulator promises, checked from the CSV alone."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path


def violations(path: Path) -> list[str]:
    """What is wrong with a jobs-out file: GPUs held twice, starts before submit, ..."""
    bad: list[str] = []
    held: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if not row["start_s"]:
                continue
            sub, st, fin = float(row["submit_s"]), float(row["start_s"]), float(row["finish_s"])
            if st < sub:
                bad.append(f"{row['job_id']} starts at {st} before its submit {sub}")
            if fin < st:
                bad.append(f"{row['job_id']} finishes before it starts")
            milli = int(row["gpu_milli"])
            count = 0
            for part in row["nodes"].split(";"):
                node, idxs = part.rsplit(":", 1)
                for i in idxs.split("+"):
                    held[(node, i)] += [(st, milli), (fin, -milli)]
                    count += 1
            if count != int(row["num_gpus"]):
                bad.append(f"{row['job_id']} holds {count} GPUs, asked for {row['num_gpus']}")
    for gpu, events in held.items():
        load = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # releases first
            load += delta
            if load > 1000:
                bad.append(f"GPU {gpu} held {load} milli at once")
                break
    return bad
