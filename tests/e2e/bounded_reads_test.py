"""Reads bounded by the reservation (issue 13): dataset files that declare
little and hold much are refused at submission or stopped where their
declaration ends, so the daemon's memory stays under its budget. Each case
checks the status, the field named, and that the daemon still answers; the
daemon's peak RSS (VmHWM) is printed and held under the budget plus a stated
overhead."""
import os
import struct
import sys
import tempfile
import time
import unittest
import zlib

import grpc

import junit_runner
from tandem_stubs import (huge_plan_spec, job_pb2, spec_from_dict, stub, tandem_service_pb2,
                          wait_for_state)
from tandemd_fixture import Tandemd

TANDEMD = None
BUDGET = 512 << 20
# The daemon's own memory besides what jobs reserve: on the dev VM its peak is
# 363 MiB before any job (the node profile at start: triad arrays, 128 MiB of
# Adam state, memcpy buffers, all freed) and its RSS then settles near 185 MiB
# (code, oneDNN, gRPC, the store).
OVERHEAD = 320 << 20


def status_bytes(pid, field):
    """A size from /proc/<pid>/status ("VmHWM": peak RSS, "VmRSS": RSS), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no " + field)


def peak_rss(pid):
    return status_bytes(pid, "VmHWM")


def current_rss(pid):
    return status_bytes(pid, "VmRSS")


def gzip_of_zeros(path, inflated_bytes, members=1):
    """A gzip file of `members` members, each inflating to inflated_bytes /
    members zero bytes (a few hundred KiB per GiB), written without ever
    holding the inflated bytes."""
    chunk = bytes(1 << 20)
    with open(path, "wb") as out:
        per_member = inflated_bytes // members
        member = None
        for _ in range(members):
            if member is None:
                c = zlib.compressobj(1, zlib.DEFLATED, 31)
                body = b"".join(c.compress(chunk) for _ in range(per_member // len(chunk)))
                member = body + c.flush()
            out.write(member)


def text_spec(path):
    return spec_from_dict({
        "model": {"gpt": {"n_layer": 1, "n_head": 1, "d_model": 8, "context": 8}},
        "data": {"text": {"path": path}},
        "training": {"batch_size": 4, "steps": 1, "checkpoint_disabled": True},
    })


class BoundedReadsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.daemon = Tandemd(TANDEMD, data_root=cls.root,
                             extra_flags=["--host_memory_budget=%d" % BUDGET]).start()
        cls.channel, cls.client = stub(cls.daemon.address)
        cls.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        print("daemon peak RSS after start: %.1f MiB" % (peak_rss(cls.daemon.proc.pid) / 2**20))

    @classmethod
    def tearDownClass(cls):
        rss = peak_rss(cls.daemon.proc.pid)
        print("daemon peak RSS over all cases: %.1f MiB (budget %d MiB + overhead %d MiB)" % (
            rss / 2**20, BUDGET >> 20, OVERHEAD >> 20))
        cls.channel.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()
        assert rss < BUDGET + OVERHEAD, rss

    def submit_refused(self, spec):
        with self.assertRaises(grpc.RpcError) as refused:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60)
        return refused.exception

    def assert_healthy(self):
        start = time.perf_counter()
        node = self.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        self.assertTrue(node.accepting_jobs)
        self.assertLess(time.perf_counter() - start, 5)
        self.assertLess(peak_rss(self.daemon.proc.pid), BUDGET + OVERHEAD)

    def test_a_profile_is_charged_to_the_budget(self):
        """ProfileModel reserves its model's memory from --host_memory_budget
        before it measures: an MLP whose state alone (4096x4096 weights, their
        gradients and Adam's two moments, ~1 GiB) is past the 512 MiB budget is
        refused at once with the numbers, and a small profile still runs."""
        big = spec_from_dict({
            "model": {"mlp": {"hidden_sizes": [4096, 4096, 4096]}},
            "data": {"synthetic": {"sample_shape": [4096], "num_classes": 10, "train_samples": 64}},
            "training": {"batch_size": 8, "steps": 1},
        })
        start = time.perf_counter()
        with self.assertRaises(grpc.RpcError) as refused:
            self.client.ProfileModel(tandem_service_pb2.ProfileModelRequest(spec=big, iterations=1),
                                     timeout=60)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("the profile needs", refused.exception.details())
        self.assertIn("--host_memory_budget", refused.exception.details())
        self.assertLess(time.perf_counter() - start, 10)
        # The rest of the spec is ignored, as ProfileModelRequest says: no
        # steps, and a precision a job here would be refused.
        small = spec_from_dict({
            "model": {"mlp": {"hidden_sizes": [32]}},
            "data": {"synthetic": {"sample_shape": [16], "num_classes": 4, "train_samples": 64}},
            "training": {"batch_size": 8},
            "precision": "PRECISION_FP16",
        })
        answer = self.client.ProfileModel(
            tandem_service_pb2.ProfileModelRequest(spec=small, iterations=1, warmup_iterations=0),
            timeout=300)
        self.assertGreater(len(answer.profile.layers), 0)
        # The hold went back: the reservation gauge is where it was.
        node = self.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        cpu = [d for d in node.devices if d.id == "cpu"][0]
        self.assertEqual(cpu.memory_reserved_bytes, 0)
        self.assert_healthy()

    def test_a_plan_is_charged_to_the_budget(self):
        """PlanModel holds its working memory (planner::PlanningMemoryBytes,
        which grows with layers x micro-batches) from the budget while it
        solves: 4,000 layers at batch 65,536 (an estimate of ~730 MB) are
        refused at once under 512 MiB; 100 layers at the same batch (~280 MB)
        are planned, and the daemon's peak stays under budget + overhead."""
        start = time.perf_counter()
        with self.assertRaises(grpc.RpcError) as refused:
            self.client.PlanModel(tandem_service_pb2.PlanModelRequest(spec=huge_plan_spec(4000)),
                                  timeout=60)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         refused.exception.details())
        self.assertIn("the plan needs", refused.exception.details())
        print("4,000-layer plan at batch 65,536 refused in %.3f s: %s" % (
            time.perf_counter() - start, refused.exception.details()))
        start = time.perf_counter()
        answer = self.client.PlanModel(tandem_service_pb2.PlanModelRequest(spec=huge_plan_spec(100)),
                                       timeout=300)
        self.assertEqual(len(answer.plan.layers), 101)
        print("100-layer plan at batch 65,536 answered in %.1f s (micro-batch %d); "
              "daemon peak RSS %.1f MiB" % (time.perf_counter() - start,
                                            answer.plan.micro_batch_size,
                                            peak_rss(self.daemon.proc.pid) / 2**20))
        node = self.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        cpu = [d for d in node.devices if d.id == "cpu"][0]
        self.assertEqual(cpu.memory_reserved_bytes, 0)
        self.assertLess(peak_rss(self.daemon.proc.pid), BUDGET + OVERHEAD)
        self.assert_healthy()

    def test_a_chatty_job_is_bounded_in_memory_and_in_the_store(self):
        """A job that logs every step of a tiny model (thousands of events a
        second) keeps at most --job_events_kept events and its state changes
        in the store, at most EventLog's 4,096 in memory, and the daemon's RSS
        does not grow with the events it has written."""
        kept = 2000
        daemon = Tandemd(TANDEMD, data_root=self.root,
                         extra_flags=["--host_memory_budget=%d" % BUDGET,
                                      "--job_events_kept=%d" % kept]).start()
        channel, client = stub(daemon.address)
        steps = 30000
        spec = spec_from_dict({
            "model": {"mlp": {"hidden_sizes": [8]}},
            "data": {"synthetic": {"sample_shape": [8], "num_classes": 2, "train_samples": 64}},
            "training": {"batch_size": 8, "steps": steps, "log_interval_steps": 1,
                         "checkpoint_disabled": True},
        })
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60).job
        start = time.perf_counter()
        samples = []  # (seconds, VmRSS bytes)
        while True:
            samples.append((time.perf_counter() - start, current_rss(daemon.proc.pid)))
            state = client.GetJob(tandem_service_pb2.GetJobRequest(job_id=job.id), timeout=10).state
            if state in (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED):
                break
            self.assertLess(time.perf_counter() - start, 600, "the chatty job never ended")
            time.sleep(0.5)
        self.assertEqual(state, job_pb2.JOB_STATE_SUCCEEDED)
        took = time.perf_counter() - start
        events = list(client.WatchJob(tandem_service_pb2.WatchJobRequest(
            job_id=job.id, from_sequence=1, follow=False), timeout=60))
        last = events[-1].sequence
        state_changes = sum(1 for e in events if e.HasField("state_change"))
        after = current_rss(daemon.proc.pid)
        # Growth over the run: from the first quarter's highest sample to the
        # highest after it (the run's start pays for the model and threads).
        quarter = [rss for t, rss in samples if t <= took / 4] or [samples[0][1]]
        later = [rss for t, rss in samples if t > took / 4] or [samples[-1][1]]
        growth = max(later) - max(quarter)
        print("chatty job: %d steps in %.1f s, %d events written (%.0f/s), %d kept (%d state "
              "changes); daemon RSS first quarter max %.1f MiB, later max %.1f MiB (growth "
              "%.1f MiB), after the end %.1f MiB, peak %.1f MiB" % (
                  steps, took, last, last / took, len(events), state_changes,
                  max(quarter) / 2**20, max(later) / 2**20, growth / 2**20, after / 2**20,
                  peak_rss(daemon.proc.pid) / 2**20))
        self.assertGreater(last, 2 * kept, "the job was not chatty enough to test the bound")
        self.assertLessEqual(len(events), kept + state_changes)
        self.assertLess(growth, 32 << 20)
        self.assertLess(peak_rss(daemon.proc.pid), BUDGET + OVERHEAD)
        channel.close()
        self.assertEqual(daemon.stop(), 0, daemon.logs())
        daemon.cleanup()

    def test_a_gzip_that_inflates_past_the_budget_is_refused_at_submission(self):
        # 3 MiB on disk, 1.5 GiB inflated: its trailer says so, and the job
        # would have to reserve that.
        gzip_of_zeros(os.path.join(self.root, "big.txt.gz"), 1536 << 20)
        e = self.submit_refused(text_spec("big.txt.gz"))
        self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
        self.assertIn("data 1.5 GiB", e.details())
        self.assert_healthy()

    def test_a_gzip_declaring_less_than_it_holds_stops_where_its_declaration_ends(self):
        # 32 members of 64 MiB: 2 GiB inflated, but the trailer (the last
        # member's) declares 64 MiB. The job reserves 64 MiB and its read stops
        # there.
        gzip_of_zeros(os.path.join(self.root, "bomb.txt.gz"), 2 << 30, members=32)
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
            spec=text_spec("bomb.txt.gz")), timeout=60).job
        done = wait_for_state(self.client, job.id,
                              [job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_SUCCEEDED])
        print("multi-member gzip: reserved %.1f MiB, peak RSS %.1f MiB" % (
            done.reserved_host_bytes / 2**20, peak_rss(self.daemon.proc.pid) / 2**20))
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED, done)
        self.assertIn("inflates past the 67108864 bytes expected of it", done.reason)
        self.assert_healthy()

    def test_a_sparse_idx_behind_a_small_header_is_refused_unread(self):
        images = os.path.join(self.root, "sparse-images.idx")
        with open(images, "wb") as f:
            f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, 10, 28, 28) + bytes(10 * 784))
            f.truncate(2500 * 10**6)  # 2.5 GB, nearly all of it a hole
        labels = os.path.join(self.root, "labels.idx")
        with open(labels, "wb") as f:
            f.write(struct.pack(">BBBBI", 0, 0, 8, 1, 10) + bytes(10))
        start = time.perf_counter()
        e = self.submit_refused(spec_from_dict({
            "model": {"mlp": {"hidden_sizes": [16]}},
            "data": {"idx": {"train_images": "sparse-images.idx", "train_labels": "labels.idx"}},
            "training": {"batch_size": 4, "steps": 1},
        }))
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, e.details())
        self.assertIn("spec.data.idx.train_images", e.details())
        self.assertIn("holds 2500000000 bytes, but its header describes 7856", e.details())
        print("sparse 2.5 GB IDX refused in %.3f s" % (time.perf_counter() - start))
        self.assert_healthy()

    def test_a_fifo_or_a_directory_as_the_text_is_refused_at_submission(self):
        os.mkfifo(os.path.join(self.root, "pipe.txt"))
        os.mkdir(os.path.join(self.root, "dir.txt"))
        for name, kind in (("pipe.txt", "is a FIFO"), ("dir.txt", "is a directory")):
            e = self.submit_refused(text_spec(name))
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, e.details())
            self.assertIn("spec.data.text.path", e.details())
            self.assertIn(kind, e.details())
        self.assert_healthy()


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
