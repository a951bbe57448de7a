"""Storage faults (issue 13): the state directory on a small tmpfs that the
test fills. A full disk turns submits away with RESOURCE_EXHAUSTED while
running jobs go on; the first one's end is recorded in the room the store's
reserve file gives up; with that spent too, the second's is served from memory
and the daemon says at its stop that it was not recorded; a daemon restarted
on the full disk starts (read-only) and serves every acknowledged job; freed
again, it runs the second job to its end again, makes its reserve again and
takes jobs. The tmpfs lives in a private mount namespace held by a helper process
(`unshare -m`, which needs root); where that is not possible the test says so
and skips."""
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

import junit_runner
from tandem_stubs import job_pb2, stub, synthetic_spec, tandem_service_pb2, wait_for_state
from tandemd_fixture import Tandemd

TANDEMD = None
TMPFS_BYTES = 48 << 20
MIN_FREE = 8 << 20


def can_mount_tmpfs():
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare/nsenter are not installed"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "cannot mount a tmpfs in a private mount namespace: " + probe.stderr.strip()
    return None


SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"


def wait_for_health(channel, service, status, timeout=10):
    """Whether grpc.health.v1 says `status` for `service` within `timeout` s."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    request = (b"\x0a" + bytes([len(service)]) + service) if service else b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check(request, timeout=10) == status:
            return True
        time.sleep(0.1)
    print("health of %r: %r" % (service, check(request, timeout=10)))
    return False


def wait_for_log(daemon, text, timeout=10):
    deadline = time.time() + timeout
    while text not in daemon.logs():
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


class SmallDisk:
    """A tmpfs of TMPFS_BYTES at `path`, visible to processes started through
    wrapper(); the test reaches it through /proc/<holder>/root."""

    def __init__(self, path):
        self.path = path
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             "mount -t tmpfs -o size=%d tmpfs '%s' && echo ready && exec sleep 100000" % (
                 TMPFS_BYTES, path)], stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout.readline().strip() == "ready"
        self.inside = "/proc/%d/root%s" % (self.holder.pid, path)

    def wrapper(self, binary, where):
        script = os.path.join(where, "tandemd-on-small-disk")
        with open(script, "w") as f:
            f.write('#!/bin/sh\nexec nsenter -t %d -m -- "%s" "$@"\n' % (self.holder.pid, os.path.abspath(binary)))
        os.chmod(script, 0o755)
        return script

    def free_bytes(self):
        st = os.statvfs(self.inside)
        return st.f_bavail * st.f_frsize

    def fill(self):
        """Writes a filler file until the disk is full."""
        chunk = bytes(1 << 20)
        with open(os.path.join(self.inside, "filler"), "ab") as f:
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError:
                pass
        small = bytes(4096)
        try:
            with open(os.path.join(self.inside, "filler2"), "ab") as f:
                while True:
                    f.write(small)
                    f.flush()
        except OSError:
            pass

    def fill_without_store_slack(self, daemon):
        """Fills the disk with the store's write-ahead log checkpointed and
        truncated, so that the log has no room left that SQLite may write into
        again without new blocks: a full disk is then full for the store too.
        Without the truncation, a log that had grown and been checkpointed takes
        a whole job's records in its old pages. The daemon is stopped (SIGSTOP)
        from the truncation to the end of the fill: a batch of its events
        written while the fill ran out of room left frames of a failed
        transaction, room a later, smaller write reused, so whether a job's
        end fitted was down to timing."""
        db = sqlite3.connect(os.path.join(self.inside, "jobs.db"), timeout=10)
        try:
            for _ in range(100):
                daemon.proc.send_signal(signal.SIGSTOP)
                busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if not busy:
                    break
                # Stopped inside a transaction: let it finish.
                daemon.proc.send_signal(signal.SIGCONT)
                time.sleep(0.1)
            else:
                raise AssertionError("the store's write-ahead log stayed busy for 10 s")
            self.fill()
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
            db.close()

    def free(self):
        for name in ("filler", "filler2"):
            try:
                os.remove(os.path.join(self.inside, name))
            except FileNotFoundError:
                pass

    def close(self):
        self.holder.kill()
        self.holder.wait()


def long_spec():
    # About 10 s of steps on 2 cores, no checkpoints: it needs the store only.
    return synthetic_spec(steps=4000, batch=64, model={"mlp": {"hidden_sizes": [256, 256]}})


class StorageFaultsTest(unittest.TestCase):
    def setUp(self):
        why = can_mount_tmpfs()
        if why:
            self.skipTest(why)
        self.work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.state = os.path.join(self.work, "state")
        os.mkdir(self.state)
        self.disk = SmallDisk(self.state)
        self.binary = self.disk.wrapper(TANDEMD, self.work)

    def tearDown(self):
        self.disk.close()

    def start(self):
        return Tandemd(self.binary, state_dir=self.state,
                       extra_flags=["--state_min_free_bytes=%d" % MIN_FREE,
                                    # The second long job runs after the first.
                                    "--max_running_jobs=1"]).start()

    def test_a_watcher_gets_the_events_a_full_disk_holds_back(self):
        """A full disk holds a running job's events back (retried until it
        has room) while the job logs more than tandemd keeps in memory
        (4,096): a watcher from the first event gets every one, in order,
        those not written yet from the held ones. Before 2026-11-29 it
        skipped them as if lost in a crash."""
        daemon = self.start()
        channel, client = stub(daemon.address)
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
            spec=synthetic_spec(steps=10000000)), timeout=30).job

        def step():
            return client.GetJob(tandem_service_pb2.GetJobRequest(job_id=job.id),
                                 timeout=60).progress.step

        deadline = time.time() + 60
        while step() < 10:
            self.assertLess(time.time(), deadline)
            time.sleep(0.05)
        self.disk.fill_without_store_slack(daemon)
        held_from = step()
        deadline = time.time() + 120
        while step() < held_from + 6000:
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)
        self.assertTrue(wait_for_log(daemon, "cannot persist job events"), daemon.logs())
        events = list(client.WatchJob(tandem_service_pb2.WatchJobRequest(
            job_id=job.id, from_sequence=1, follow=False), timeout=120))
        sequences = [e.sequence for e in events]
        steps = [e.step.step for e in events if e.HasField("step")]
        print("disk full from step %d: the watcher got %d events (sequences %d to %d), steps "
              "%d to %d" % (held_from, len(events), sequences[0], sequences[-1], steps[0],
                            steps[-1]))
        self.assertEqual(sequences, list(range(1, len(sequences) + 1)))
        self.assertGreater(len(steps), held_from + 6000 - 1)
        self.assertEqual(steps, list(range(1, len(steps) + 1)))
        self.disk.free()
        client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id=job.id), timeout=60)
        wait_for_state(client, job.id, [job_pb2.JOB_STATE_CANCELLED], timeout=120)
        self.assertEqual(daemon.stop(), 0, daemon.logs())
        daemon.cleanup()

    def test_a_full_disk_refuses_submits_keeps_running_jobs_and_restarts(self):
        daemon = self.start()
        channel, client = stub(daemon.address)
        acknowledged = [client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
            spec=synthetic_spec(steps=2)), timeout=30).job.id]
        wait_for_state(client, acknowledged[0], [job_pb2.JOB_STATE_SUCCEEDED])
        running = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=long_spec()),
                                   timeout=30).job.id
        second = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=long_spec()),
                                  timeout=30).job.id
        acknowledged += [running, second]
        wait_for_state(client, running, [job_pb2.JOB_STATE_RUNNING])
        self.assertTrue(os.path.exists(os.path.join(self.disk.inside, "jobs.db.reserve")))

        self.disk.fill()
        print("disk filled: %d bytes free" % self.disk.free_bytes())
        with self.assertRaises(grpc.RpcError) as refused:
            client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec()), timeout=30)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("--state_min_free_bytes", refused.exception.details())
        node = client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        self.assertFalse(node.accepting_jobs)
        self.assertIn("free", node.not_accepting_reason)
        # Health: the daemon answers (""), the job service takes no jobs.
        self.assertTrue(wait_for_health(channel, b"tandem.v1.Tandem", NOT_SERVING))
        self.assertTrue(wait_for_health(channel, b"", SERVING))

        # The running job goes on and ends; the full disk refuses its end, and
        # the store releases its reserve to record it.
        done = wait_for_state(client, running, [job_pb2.JOB_STATE_SUCCEEDED,
                                                job_pb2.JOB_STATE_FAILED], timeout=300)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertTrue(wait_for_log(daemon, "released the job store's 4 MiB reserve"),
                        daemon.logs())
        self.assertNotIn("cannot record the end of %s" % running, daemon.logs())
        self.assertFalse(os.path.exists(os.path.join(self.disk.inside, "jobs.db.reserve")))

        # Full again, reserve spent: the second job's end cannot be written. It
        # is served from memory; the daemon stops and says so.
        self.disk.fill_without_store_slack(daemon)
        done = wait_for_state(client, second, [job_pb2.JOB_STATE_SUCCEEDED,
                                               job_pb2.JOB_STATE_FAILED], timeout=300)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertTrue(wait_for_log(daemon, "cannot record the end of %s yet" % second),
                        daemon.logs())
        self.assertEqual(daemon.stop(), 0, daemon.logs())
        self.assertIn("stopping with 1 state change(s) of %s not recorded (now succeeded)" % second,
                      daemon.logs())

        # Restarted on a full disk: it starts, serves every acknowledged job,
        # and refuses new ones; the second is as the store last had it.
        daemon = self.start()
        channel, client = stub(daemon.address)
        print("restart on a full disk:", [l for l in daemon.logs().splitlines() if "store" in l])
        listed = {j.id: j for j in client.ListJobs(tandem_service_pb2.ListJobsRequest(),
                                                   timeout=10).jobs}
        for job_id in acknowledged:
            self.assertIn(job_id, listed)
            if job_id != second:
                self.assertEqual(listed[job_id].state, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertIn(listed[second].state, (job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING))
        with self.assertRaises(grpc.RpcError) as refused:
            client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec()), timeout=30)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual(daemon.stop(), 0, daemon.logs())

        # Freed and restarted: the second job runs again to its end (nothing
        # acknowledged is lost), the reserve is made again, and new jobs are taken.
        self.disk.free()
        daemon = self.start()
        channel, client = stub(daemon.address)
        done = wait_for_state(client, second, [job_pb2.JOB_STATE_SUCCEEDED,
                                               job_pb2.JOB_STATE_FAILED], timeout=300)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertTrue(os.path.exists(os.path.join(self.disk.inside, "jobs.db.reserve")))
        self.disk.free()
        daemon = self.start()
        channel, client = stub(daemon.address)
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=2)),
                               timeout=30).job
        wait_for_state(client, job.id, [job_pb2.JOB_STATE_SUCCEEDED])
        self.assertTrue(client.GetNode(tandem_service_pb2.GetNodeRequest(),
                                       timeout=10).accepting_jobs)
        self.assertEqual(daemon.stop(), 0, daemon.logs())
        daemon.cleanup()


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
