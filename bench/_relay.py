"""A plain aiokafka relay (consume one topic, publish every record unchanged to another,
commit): the same hop as a service, with no decoding, validation or bookkeeping. Run by
`bench bus` in its own process, as the arrival service is."""

from __future__ import annotations

import asyncio
import signal
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def relay(bootstrap: str, src: str, dst: str) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    c = AIOKafkaConsumer(
        src,
        bootstrap_servers=bootstrap,
        group_id=f"relay-{src}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=32 << 20,
    )
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, max_batch_size=1 << 20)
    await c.start()
    await p.start()
    try:
        while not stop.is_set():
            batch = await c.getmany(timeout_ms=200, max_records=5000)
            futs = []
            for tp, msgs in batch.items():
                b = p.create_batch()
                for m in msgs:
                    if b.append(key=m.key, value=m.value, timestamp=None) is None:
                        futs.append(await p.send_batch(b, dst, partition=tp.partition))
                        b = p.create_batch()
                        b.append(key=m.key, value=m.value, timestamp=None)
                futs.append(await p.send_batch(b, dst, partition=tp.partition))
            if futs:
                await asyncio.gather(*futs)
                await c.commit()
    finally:
        await c.stop()
        await p.stop()


if __name__ == "__main__":
    asyncio.run(relay(*sys.argv[1:4]))
