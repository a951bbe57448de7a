"""kill -9 at any moment loses no acknowledged job: a running job resumes from
its checkpoint after a restart, and 20 queued jobs all still run."""
import subprocess
import sys
import time
import unittest

import junit_runner
from tandem_stubs import job_pb2, stub, synthetic_spec, tandem_service_pb2, wait_for_state
from tandemd_fixture import Tandemd

TANDEMD = None
STEPS = 40000


# Every event kept: the resume's log line must outlive 40,000 steps' progress
# events (the default keeps the newest 10,000).
def flags(budget):
    return ["--host_memory_budget=%d" % budget, "--job_events_kept=0"]


def wait_for_reason(client, job_id, text, timeout=30):
    """The job once its reason holds `text` (the last one read at the deadline)."""
    deadline = time.time() + timeout
    while True:
        job = client.GetJob(tandem_service_pb2.GetJobRequest(job_id=job_id), timeout=10)
        if text in job.reason or time.time() > deadline:
            return job
        time.sleep(0.05)


class CrashTest(unittest.TestCase):
    def test_kill9_mid_training_resumes_from_the_checkpoint_with_20_queued_jobs(self):
        # The budget fits the long job alone, so the other twenty are really
        # queued when the daemon dies.
        budget = 1 << 30
        daemon = Tandemd(TANDEMD, extra_flags=flags(budget)).start()
        channel, client = stub(daemon.address)
        # Long enough to be running still after twenty submits' fsyncs on a
        # loaded machine (about 1 s idle at 4,000 steps).
        spec = synthetic_spec(steps=STEPS, batch=32)
        spec.resources.host_memory_bytes = budget - 100 * 1024
        spec.model.mlp.hidden_sizes[:] = [64]
        spec.training.checkpoint_disabled = False
        spec.training.checkpoint_interval_steps = 50
        spec.priority = 10
        long_job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        wait_for_state(client, long_job.id, [job_pb2.JOB_STATE_RUNNING])
        # Twenty more, acknowledged while the first runs; they wait for memory.
        queued = []
        for i in range(20):
            queued.append(client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
                spec=synthetic_spec(steps=2), request_id="crash-%d" % i), timeout=30).job.id)
        # Wait until a checkpoint exists, then kill -9 mid-training.
        deadline = time.time() + 300
        while time.time() < deadline:
            job = client.GetJob(tandem_service_pb2.GetJobRequest(job_id=long_job.id), timeout=10)
            if job.checkpoint_step >= 100:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(job.checkpoint_step, 100)
        self.assertEqual(job.state, job_pb2.JOB_STATE_RUNNING)
        # The scheduler thread writes the waiting reasons after the submits.
        head = wait_for_reason(client, queued[0], "of host memory")
        self.assertEqual(head.state, job_pb2.JOB_STATE_QUEUED)
        self.assertIn("of host memory", head.reason)
        last = wait_for_reason(client, queued[-1], "waiting behind " + queued[0])
        self.assertEqual(last.state, job_pb2.JOB_STATE_QUEUED)
        self.assertIn("waiting behind " + queued[0], last.reason)
        channel.close()
        daemon.kill9()

        restarted = Tandemd(TANDEMD, state_dir=daemon.state_dir,
                            extra_flags=flags(budget)).start()
        channel, client = stub(restarted.address)
        try:
            recovered = client.GetJob(tandem_service_pb2.GetJobRequest(job_id=long_job.id), timeout=10)
            self.assertIn(recovered.state, [job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING])
            done = wait_for_state(client, long_job.id, [job_pb2.JOB_STATE_SUCCEEDED], timeout=600)
            self.assertEqual(done.attempts, 2)
            self.assertEqual(done.progress.step, STEPS)
            logs = [e.log.message for e in client.WatchJob(
                tandem_service_pb2.WatchJobRequest(job_id=long_job.id), timeout=60) if e.HasField("log")]
            resumed = [m for m in logs if "resumed from checkpoint at step" in m]
            self.assertTrue(resumed, logs)
            step = int(resumed[0].split("at step ")[1].split()[0])
            self.assertGreaterEqual(step, 100)
            # No acknowledged job was lost.
            for job_id in queued:
                self.assertEqual(wait_for_state(client, job_id, [job_pb2.JOB_STATE_SUCCEEDED],
                                                timeout=300).state, job_pb2.JOB_STATE_SUCCEEDED)
            page = client.ListJobs(tandem_service_pb2.ListJobsRequest(page_size=1000), timeout=10)
            self.assertEqual(page.total_size, 21)
        finally:
            channel.close()
            self.assertEqual(restarted.stop(), 0, restarted.logs())
            restarted.cleanup()
            daemon.cleanup()

    def test_a_daemon_that_cannot_listen_starts_no_recovered_job(self):
        daemon = Tandemd(TANDEMD).start()
        channel, client = stub(daemon.address)
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
            spec=synthetic_spec(steps=10 ** 8, batch=8)), timeout=30).job
        wait_for_state(client, job.id, [job_pb2.JOB_STATE_RUNNING])
        channel.close()
        self.assertEqual(daemon.stop(), 0, daemon.logs())  # a clean stop re-queues it
        # Its state directory, on a port another daemon holds: refused.
        holder = Tandemd(TANDEMD).start()
        try:
            refused = subprocess.run(
                [TANDEMD, "--state_dir=" + daemon.state_dir, "--listen=" + holder.address,
                 "--metrics_listen=", "--data_root=/usr/share"],
                capture_output=True, text=True, timeout=120)
        finally:
            holder.stop()
            holder.cleanup()
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("cannot listen", refused.stderr)
        restarted = Tandemd(TANDEMD, state_dir=daemon.state_dir).start()
        channel, client = stub(restarted.address)
        try:
            wait_for_state(client, job.id, [job_pb2.JOB_STATE_RUNNING])
            client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id=job.id), timeout=30)
            wait_for_state(client, job.id, [job_pb2.JOB_STATE_CANCELLED])
            runs = [e.state_change.reason for e in client.WatchJob(
                tandem_service_pb2.WatchJobRequest(job_id=job.id), timeout=60)
                if e.HasField("state_change") and e.state_change.to == job_pb2.JOB_STATE_RUNNING]
            # The first run and this one: the refused daemon ran it not at all.
            self.assertEqual(len(runs), 2, runs)
        finally:
            channel.close()
            restarted.stop()
            restarted.cleanup()
            daemon.cleanup()


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
