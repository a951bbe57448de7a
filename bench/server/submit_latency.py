#!/usr/bin/python3
"""SubmitJob latency on loopback: p50/p99/max and throughput, with one client and
with many concurrent clients, for both store durability modes (--store_sync=full
fsyncs every commit; normal survives kill -9 but not power loss). The fsync
latency of the disk, measured in the same run, bounds what `full` can reach.

A blocker job holds the whole host budget on one core meanwhile, so submitted
jobs queue instead of running: this is the latency of accepting work on a node
that is busy training. Target: p99 <= 5 ms.
  /usr/bin/python3 bench/server/submit_latency.py --tandemd bazel-bin/server/tandemd
"""
import argparse
import asyncio
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))
from tandemd_fixture import Tandemd  # noqa: E402
from tandem_stubs import (job_pb2, synthetic_spec, tandem_service_pb2,  # noqa: E402
                          tandem_service_pb2_grpc)
import grpc  # noqa: E402

BUDGET = 1 << 30


def fsync_latency(directory, n=200):
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    t = []
    for _ in range(n):
        os.write(fd, b"x" * 4096)
        s = time.perf_counter()
        os.fsync(fd)
        t.append(time.perf_counter() - s)
    os.close(fd)
    os.unlink(path)
    t.sort()
    return t[len(t) // 2], t[int(len(t) * 0.99) - 1]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


async def measure(address, clients, per_client):
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tandem_service_pb2_grpc.TandemStub(channel)
        spec = synthetic_spec(steps=1)
        latencies = []

        async def client(c):
            for i in range(per_client):
                start = time.perf_counter()
                await stub.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60)
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return latencies, time.perf_counter() - start


def run_mode(tandemd, sync, rounds):
    daemon = Tandemd(tandemd, extra_flags=["--store_sync=" + sync, "--host_memory_budget=%d" % BUDGET,
                                           "--max_running_jobs=1"]).start()
    try:
        channel = grpc.insecure_channel(daemon.address)
        stub = tandem_service_pb2_grpc.TandemStub(channel)
        blocker = synthetic_spec(steps=10 ** 9)
        blocker.resources.host_memory_bytes = BUDGET
        blocker.training.threads = 1
        stub.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=blocker), timeout=30)
        for clients, per_client in rounds:
            asyncio.run(measure(daemon.address, clients, 5))  # warm-up
            lat, wall = asyncio.run(measure(daemon.address, clients, per_client))
            print("  store_sync=%-6s %3d clients x %4d: p50 %6.2f ms  p99 %6.2f ms  max %7.2f ms  "
                  "%6.0f submits/s" % (sync, clients, per_client, 1e3 * pct(lat, 0.5), 1e3 * pct(lat, 0.99),
                                       1e3 * max(lat), len(lat) / wall), flush=True)
        channel.close()
    finally:
        daemon.stop()
        daemon.cleanup()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandemd", required=True)
    args = parser.parse_args()
    p50, p99 = fsync_latency(tempfile.gettempdir())
    print("disk fsync (4 KiB): p50 %.2f ms  p99 %.2f ms" % (1e3 * p50, 1e3 * p99))
    rounds = [(1, 300), (16, 50), (200, 5)]
    for sync in ("full", "normal"):
        run_mode(args.tandemd, sync, rounds)


if __name__ == "__main__":
    main()
