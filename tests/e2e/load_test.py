"""Concurrency: 200 clients submitting at once, and 500 WatchJob streams on one
job, all served; every watcher sees every event of the job, in order."""
import asyncio
import sys
import time
import unittest

import grpc

import junit_runner
from tandem_stubs import job_pb2, synthetic_spec, tandem_service_pb2, tandem_service_pb2_grpc
from tandemd_fixture import Tandemd

TANDEMD = None


class LoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One job runs at a time; the others queue (and are cancelled), so the
        # test measures serving, not training.
        cls.daemon = Tandemd(TANDEMD, extra_flags=["--max_running_jobs=1"]).start()

    @classmethod
    def tearDownClass(cls):
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()

    def test_200_concurrent_submitting_clients(self):
        async def run():
            # 200 clients, each its own channel (connection), all at once.
            async def one(i):
                async with grpc.aio.insecure_channel(self.daemon.address) as channel:
                    client = tandem_service_pb2_grpc.TandemStub(channel)
                    spec = synthetic_spec(steps=1)
                    spec.display_name = "load-%d" % i
                    start = time.perf_counter()
                    r = await client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
                        spec=spec, request_id="load-%d" % i), timeout=60)
                    return r.job.id, time.perf_counter() - start
            return await asyncio.gather(*(one(i) for i in range(200)))

        results = asyncio.run(run())
        ids = [r[0] for r in results]
        self.assertEqual(len(set(ids)), 200)
        channel = grpc.insecure_channel(self.daemon.address)
        client = tandem_service_pb2_grpc.TandemStub(channel)
        for job_id in ids:
            try:
                client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id=job_id), timeout=30)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)  # already ended
        channel.close()
        latencies = sorted(r[1] for r in results)
        print("200 concurrent SubmitJob: p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (
            1e3 * latencies[100], 1e3 * latencies[197], 1e3 * latencies[-1]))

    def test_500_watch_streams_on_one_job(self):
        async def run():
            async with grpc.aio.insecure_channel(self.daemon.address) as channel:
                client = tandem_service_pb2_grpc.TandemStub(channel)
                spec = synthetic_spec(steps=400)
                job = (await client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30)).job

                async def watch():
                    seqs, last_state = [], None
                    async for e in client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id=job.id),
                                                   timeout=600):
                        seqs.append(e.sequence)
                        if e.HasField("state_change"):
                            last_state = e.state_change.to
                    return seqs, last_state

                # A slow watcher that stops reading must not hold anyone up.
                stalled = client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id=job.id), timeout=600)
                await stalled.read()
                results = await asyncio.gather(*(watch() for _ in range(500)))
                stalled.cancel()
                return job.id, results

        job_id, results = asyncio.run(run())
        self.assertEqual(len(results), 500)
        lengths = {len(seqs) for seqs, _ in results}
        self.assertEqual(len(lengths), 1, "watchers saw different numbers of events: %s" % lengths)
        for seqs, state in results:
            self.assertEqual(seqs, list(range(1, len(seqs) + 1)))
            self.assertEqual(state, job_pb2.JOB_STATE_SUCCEEDED)
        # 400 step events plus states, logs and evals.
        self.assertGreater(lengths.pop(), 400)


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
