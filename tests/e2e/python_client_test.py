"""The Python client (clients/python/tandem_client) end to end against a real
tandemd: submit from a dict, a YAML file or a JobSpec; watch with a callback
that sees every event once, in order, across a daemon restart; cancel; plan (a described machine, and a bad field);
errors that carry the gRPC code and the server's message; auth; the example
script."""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import junit_runner
import repo_files
from tandemd_fixture import Tandemd

sys.path.insert(0, repo_files.path("clients/python"))

import grpc  # noqa: E402
from tandem_client import TandemClient, TandemError, job_pb2  # noqa: E402

TANDEMD = None

SMALL = {
    "model": {"mlp": {"hidden_sizes": [16]}},
    "data": {"synthetic": {"sample_shape": [8], "num_classes": 3, "train_samples": 64,
                           "test_samples": 16}},
    "training": {"batch_size": 8, "steps": 6, "checkpoint_disabled": True},
}


def spec(steps=6, **training):
    d = {k: dict(v) for k, v in SMALL.items()}
    d["training"] = dict(SMALL["training"], steps=steps, **training)
    return d


def wait_until(predicate, timeout=120, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class Recorder:
    """A watch callback that keeps every event."""

    def __init__(self):
        self.events = []
        self.lock = threading.Lock()

    def __call__(self, event):
        with self.lock:
            self.events.append(event)

    def sequences(self):
        with self.lock:
            return [e.sequence for e in self.events]

    def steps(self):
        with self.lock:
            return [e.step.step for e in self.events if e.HasField("step")]


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Tandemd(TANDEMD).start()
        cls.client = TandemClient(cls.daemon.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()

    def write(self, text, suffix=".yaml"):
        f = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False, dir=self.daemon.workdir)
        f.write(text)
        f.close()
        return f.name

    def test_submit_a_dict_and_watch_every_event_through_the_callback(self):
        job = self.client.submit(spec(steps=6))
        self.assertTrue(job.id.startswith("job-"))
        seen = Recorder()
        state = self.client.watch(job.id, seen)
        self.assertEqual(state, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(seen.sequences(), list(range(1, len(seen.events) + 1)))
        self.assertEqual(seen.steps(), [1, 2, 3, 4, 5, 6])
        self.assertEqual(seen.events[-1].state_change.to, job_pb2.JOB_STATE_SUCCEEDED)
        done = self.client.get(job.id)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(done.last_event_sequence, seen.events[-1].sequence)

    def test_watch_from_a_sequence_replays_only_the_rest(self):
        job = self.client.submit(spec(steps=4))
        self.client.watch(job.id, lambda e: None)
        last = self.client.get(job.id).last_event_sequence
        seen = Recorder()
        self.assertEqual(self.client.watch(job.id, seen, from_sequence=3), job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(seen.sequences(), list(range(3, last + 1)))
        # Past the last event of a finished job: no callbacks, the final state.
        after = Recorder()
        self.assertEqual(self.client.watch(job.id, after, from_sequence=last + 1),
                         job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(after.events, [])

    def test_submit_a_yaml_file_is_idempotent_on_the_request_id(self):
        path = self.write("""
display_name: python-client-yaml
model: {mlp: {hidden_sizes: [16]}}
data: {synthetic: {sample_shape: [8], num_classes: 3, train_samples: 64, test_samples: 16}}
optimizer: {kind: OPTIMIZER_KIND_SGD, learning_rate: 1e-2}
training: {batch_size: 8, steps: 2, checkpoint_disabled: true}
""")
        a = self.client.submit(path, request_id="py-client-idem")
        b = self.client.submit(path, request_id="py-client-idem")
        self.assertEqual(a.id, b.id)
        self.assertEqual(a.spec.display_name, "python-client-yaml")
        self.assertEqual(a.spec.optimizer.kind, job_pb2.OPTIMIZER_KIND_SGD)
        self.assertAlmostEqual(a.spec.optimizer.learning_rate, 0.01, places=6)
        with self.assertRaises(TandemError) as caught:
            self.client.submit(spec(steps=3), request_id="py-client-idem")
        self.assertEqual(caught.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertEqual(caught.exception.method, "SubmitJob")
        # A JobSpec message works as well as a dict or a file.
        from tandem_client import load_job_spec
        c = self.client.submit(load_job_spec(spec(steps=1)))
        self.assertEqual(self.client.watch(c.id, lambda e: None), job_pb2.JOB_STATE_SUCCEEDED)

    def test_cancel_a_running_job(self):
        job = self.client.submit(spec(steps=1000000))
        wait_until(lambda: self.client.get(job.id).state == job_pb2.JOB_STATE_RUNNING, what="RUNNING")
        self.client.cancel(job.id, reason="python client test")
        self.assertEqual(self.client.watch(job.id, lambda e: None), job_pb2.JOB_STATE_CANCELLED)
        done = self.client.get(job.id)
        self.assertIn("python client test", done.reason)
        with self.assertRaises(TandemError) as caught:
            self.client.cancel(job.id)
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertTrue(caught.exception.message)

    def test_errors_carry_the_grpc_code_and_the_servers_message(self):
        with self.assertRaises(TandemError) as caught:
            self.client.get("job-999999")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("job-999999", caught.exception.message)
        self.assertIn("NOT_FOUND", str(caught.exception))
        with self.assertRaises(TandemError) as caught:
            self.client.submit(spec(steps=1, batch_size=0))
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("training.batch_size", caught.exception.message)
        # Watching a job that does not exist is an error, not a retry loop.
        with self.assertRaises(TandemError) as caught:
            self.client.watch("job-999999", lambda e: None)
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        # A bad spec is refused before anything is sent.
        with self.assertRaises(ValueError):
            self.client.submit({"training": {"batch_sizee": 4}})

    def test_every_unary_call_has_a_deadline(self):
        # A server that accepts connections and never answers: without a
        # deadline each call would hang until the connection attempt gives up.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            address = "127.0.0.1:%d" % silent.getsockname()[1]
            with TandemClient(address, timeout_seconds=0.5, plan_timeout_seconds=0.5) as client:
                calls = {"submit": lambda: client.submit(spec()), "get": lambda: client.get("job-000001"),
                         "list": client.list, "cancel": lambda: client.cancel("job-000001"),
                         "plan": lambda: client.plan(spec()), "node": client.node}
                for name, call in calls.items():
                    start = time.monotonic()
                    with self.assertRaises(TandemError, msg=name) as caught:
                        call()
                    self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED, name)
                    self.assertLess(time.monotonic() - start, 5, name)

    def test_plan_for_a_described_machine_compares_every_strategy(self):
        hardware = repo_files.path("planner/hardware/h100_sxm_node.textproto")
        response = self.client.plan(spec(steps=10), hardware=hardware)
        self.assertGreater(len(response.plan.layers), 0)
        self.assertTrue(response.plan.feasible)
        self.assertGreater(response.plan.prediction.iteration_seconds, 0)
        self.assertEqual(len(response.alternatives), 5)
        # A bad field is named, with INVALID_ARGUMENT.
        bad = spec(steps=10)
        bad["training"]["batch_size"] = 0
        with self.assertRaises(TandemError) as caught:
            self.client.plan(bad, hardware=hardware)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.training.batch_size", caught.exception.message)

    def test_node_and_list(self):
        node = self.client.node()
        self.assertIn("cpu", [d.id for d in node.devices])
        self.assertTrue(node.accepting_jobs)
        job = self.client.submit(dict(spec(steps=1), labels={"suite": "python-client"}))
        self.client.watch(job.id, lambda e: None)
        # ListJobs reads the store, which may commit the final state just after
        # the watcher saw it.
        wait_until(lambda: self.client.list(states=["SUCCEEDED"], labels={"suite": "python-client"}),
                   timeout=30, what="the job listed as SUCCEEDED")
        listed = self.client.list(states=["SUCCEEDED"], labels={"suite": "python-client"})
        self.assertEqual([j.id for j in listed], [job.id])
        self.assertEqual(self.client.list(states=[job_pb2.JOB_STATE_QUEUED],
                                          labels={"suite": "python-client"}), [])
        self.assertLessEqual(len(self.client.list(limit=2)), 2)

    def test_the_example_script_runs_a_job_to_success(self):
        path = self.write("""
model: {mlp: {hidden_sizes: [16]}}
data: {synthetic: {sample_shape: [8], num_classes: 3, train_samples: 64, test_samples: 16}}
training: {batch_size: 8, steps: 5, checkpoint_disabled: true}
""")
        example = repo_files.path("clients/python/examples/submit_and_watch.py")
        result = subprocess.run(["/usr/bin/python3", example, "--server=" + self.daemon.address, path],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("step 5/5", result.stdout)
        self.assertIn("JOB_STATE_SUCCEEDED", result.stdout)


class WatchAcrossRestartTest(unittest.TestCase):
    def test_watch_resumes_after_the_daemon_restarts(self):
        port = repo_files.free_port()
        daemon = Tandemd(TANDEMD, extra_flags=["--listen=127.0.0.1:%d" % port]).start()
        try:
            client = TandemClient(daemon.address)
            # Long enough to still be running when the daemon stops, with
            # checkpoints to resume from.
            job = client.submit({
                "model": {"mlp": {"hidden_sizes": [256, 256]}},
                "data": {"synthetic": {"sample_shape": [256], "num_classes": 10,
                                       "train_samples": 4096, "test_samples": 64}},
                "training": {"batch_size": 64, "steps": 3000, "checkpoint_interval_steps": 100},
            })
            seen = Recorder()
            result = {}

            def watch():
                try:
                    result["state"] = client.watch(job.id, seen, reconnect_timeout_seconds=60)
                except Exception as e:  # reported by the assertions below
                    result["error"] = e

            watcher = threading.Thread(target=watch)
            watcher.start()
            wait_until(lambda: len(seen.steps()) >= 20, what="20 steps")
            self.assertEqual(daemon.stop(), 0, daemon.logs())  # SIGTERM: checkpoint, re-queue
            time.sleep(1.0)  # the watcher retries against a closed port meanwhile
            daemon.start()
            self.assertEqual(daemon.port, port)
            watcher.join(timeout=300)
            self.assertFalse(watcher.is_alive(), "watch did not return")
            self.assertNotIn("error", result)
            self.assertEqual(result["state"], job_pb2.JOB_STATE_SUCCEEDED, daemon.logs())
            # Every event once, in order, across the restart.
            self.assertEqual(seen.sequences(), list(range(1, len(seen.events) + 1)))
            done = client.get(job.id)
            self.assertGreaterEqual(done.attempts, 2)
            self.assertEqual(done.last_event_sequence, seen.events[-1].sequence)
            reasons = [e.state_change.reason for e in seen.events if e.HasField("state_change")]
            self.assertIn("resumed", reasons)
            client.close()
        finally:
            daemon.stop()
            daemon.cleanup()


class AuthTest(unittest.TestCase):
    def test_a_token_is_sent_on_every_call(self):
        workdir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        token_file = os.path.join(workdir, "token")
        with open(token_file, "w") as f:
            f.write("py-client-secret\n")
        daemon = Tandemd(TANDEMD, extra_flags=["--auth_token_file=" + token_file]).start()
        try:
            with TandemClient(daemon.address, token="py-client-secret") as client:
                job = client.submit(spec(steps=2))
                self.assertEqual(client.watch(job.id, lambda e: None), job_pb2.JOB_STATE_SUCCEEDED)
            with TandemClient(daemon.address) as anonymous:
                with self.assertRaises(TandemError) as caught:
                    anonymous.node()
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            with TandemClient(daemon.address, token="wrong") as wrong:
                with self.assertRaises(TandemError) as caught:
                    wrong.watch(job.id, lambda e: None)
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        finally:
            daemon.stop()
            daemon.cleanup()


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
