"""Publish one job to rltune with a stock Kafka client (kafka-python) and follow it to its end."""

import json
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

broker = sys.argv[1] if len(sys.argv) > 1 else "localhost:9092"
job = {"job_id": f"hello-{time.time_ns()}", "num_gpus": 1, "command": ["echo", "hello, GPU"]}
answers = KafkaConsumer(bootstrap_servers=broker)  # no group: from the topics' ends, read below
answers.assign([TopicPartition(f"rltune.jobs.{t}", 0) for t in ("events", "rejected")])
start = [answers.position(tp) for tp in answers.assignment()]  # (fixed before publishing)
KafkaProducer(bootstrap_servers=broker).send("rltune.jobs.submit", json.dumps(job).encode()).get(30)
for ev in (json.loads(m.value) for m in answers):
    if ev["job_id"] == job["job_id"]:
        kind = ev.get("kind", "rejected")  # (a Rejection has a reason, no kind)
        print(kind, *ev.get("node_ids", []), ev.get("detail") or ev.get("reason", ""))
        if kind in ("finished", "failed", "cancelled", "rejected"):
            sys.exit(kind != "finished")
