"""`rltune up` on this machine's GPUs, one job through it, and the figures.

Starts `rltune up` (its embedded broker, every service, and one host agent that
advertises the GPUs pynvml sees; emulated ones where there are none), reads the
inventory the agents advertise on `cluster.nodes`, submits one job with
`rltune submit --wait finished` (by default a command that prints
CUDA_VISIBLE_DEVICES, torch.cuda.device_count() and the first device's name), and
writes to OUT/agents-on-gpu.json: the inventory as advertised, the job's events in
order, what its command printed, and the times (up started -> broker -> first
NodeStatus -> submitted -> finished). Run by scripts/device/agents-on-gpu.sh.

    python scripts/device/agents_on_gpu.py --out OUT [--command CMD] [--placer NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402

from shared.broker import free_port, wait_for_broker  # noqa: E402

JOB = "gpu-probe"
PROBE = (
    "python3 -c \"import torch,os; print(os.environ['CUDA_VISIBLE_DEVICES'], "
    'torch.cuda.device_count(), torch.cuda.get_device_name(0))"'
)


async def read_topic(bootstrap: str, topic: str, until: float) -> list[dict[str, Any]]:
    """Every JSON record of `topic` (one partition) from the start, until `until`
    (monotonic) or the end of the topic once something has been read; [] if the topic
    does not exist yet (a seek on it would wait for its metadata)."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        if topic not in await c.topics():
            await asyncio.sleep(max(0.0, min(1.0, until - time.monotonic())))
            return []
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        await c.seek_to_beginning(tp)
        out: list[dict[str, Any]] = []
        while time.monotonic() < until:
            batch = await c.getmany(tp, timeout_ms=500)
            recs = batch.get(tp, [])
            out += [json.loads(r.value) for r in recs if r.value]
            if out and not recs:
                break
        return out
    finally:
        await c.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--command", default=PROBE, help="the job's command (a shell-like string)")
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--placer", default="", help="default milp, greedy without OR-Tools")
    p.add_argument("--timeout", type=float, default=240.0)
    args = p.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    placer = args.placer or ("milp" if importlib.util.find_spec("ortools") else "greedy")
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    logs = out / "logs"
    t0 = time.monotonic()
    up_cmd = [sys.executable, "-m", "rltune", "up", "--port", str(port), "--logs", str(logs)]
    up_cmd += ["--placer", placer]
    up_log = open(out / "up.log", "wb")  # noqa: SIM115 - closed below
    up = subprocess.Popen(up_cmd, stdout=up_log, stderr=subprocess.STDOUT, cwd=ROOT)
    report: dict[str, Any] = {"placer": placer, "up": up_cmd[2:], "job_id": JOB}
    try:
        asyncio.run(wait_for_broker(bootstrap, 120))
        report["broker_ready_s"] = round(time.monotonic() - t0, 2)
        nodes: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while not nodes and time.monotonic() < deadline:  # the agents' first statuses
            assert up.poll() is None, (out / "up.log").read_text()
            # (a fresh consumer each try: the topic may not exist yet on the first)
            until = min(deadline, time.monotonic() + 3)
            nodes = asyncio.run(read_topic(bootstrap, "rltune.cluster.nodes", until))
        report["first_node_status_s"] = round(time.monotonic() - t0, 2)
        latest = {n["node_id"]: n for n in nodes}
        report["inventory"] = [
            {k: n.get(k) for k in ("node_id", "gpu_type", "gpus", "free_gpus", "source")}
            | {"gpu_mem_used": n.get("gpu_mem_used"), "gpu_util": n.get("gpu_util")}
            for n in latest.values()
        ]
        submit = [sys.executable, "-m", "rltune", "submit", "--bootstrap", bootstrap]
        submit += ["--job-id", JOB, "--num-gpus", str(args.num_gpus)]
        submit += ["--command", args.command, "--wait", "finished"]
        t_sub = time.monotonic()
        sub = subprocess.run(submit, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
        t_end = time.monotonic()
        report["submit"] = {
            "argv": shlex.join(submit[2:]),
            "exit_code": sub.returncode,
            "stdout": sub.stdout.splitlines(),
            "stderr": sub.stderr.splitlines()[-20:],
        }
        report["submitted_s"] = round(t_sub - t0, 2)
        report["submit_to_end_s"] = round(t_end - t_sub, 2)
        report["up_to_end_s"] = round(t_end - t0, 2)
        events = asyncio.run(read_topic(bootstrap, "rltune.jobs.events", time.monotonic() + 20))
        mine = [e for e in events if e.get("job_id") == JOB]
        report["events"] = [
            {k: e.get(k) for k in ("kind", "time", "node_ids", "detail", "exit_code")} for e in mine
        ]
        times = {e["kind"]: e["time"] for e in reversed(mine)}  # the first of each kind
        if "started" in times and "finished" in times:
            report["started_to_finished_s"] = round(times["finished"] - times["started"], 3)
        report["job_stdout"] = [
            line
            for path in sorted((logs / "jobs").glob(f"*/{JOB}.out"))
            for line in path.read_text().splitlines()
        ]
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)  # Ctrl-C: everything stops cleanly
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        up_log.close()
        report["up_exit_code"] = up.returncode
        (out / "agents-on-gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    ok = report.get("submit", {}).get("exit_code") == 0
    kinds = [e["kind"] for e in report.get("events", [])]
    print(json.dumps({k: report.get(k) for k in ("inventory", "up_to_end_s", "job_stdout")}))
    print(f"events: {kinds}; submit --wait finished exit code {report['submit']['exit_code']}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
