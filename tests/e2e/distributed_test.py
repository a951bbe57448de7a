"""Distributed jobs across tandemd daemons on loopback (docs/distributed.md).

Two and four daemons, each the others' --peers: a job with
distributed.replicas N submitted to one of them runs a rank on each, over
Gloo, and its losses are one replica's for the first 20 steps, replicated and
ZeRO-partitioned on the CPU engine, and with each rank running a hybrid plan on
its daemon's emulated accelerator. Hostile specs and lost ranks end with a clear status and
hold nothing.
"""
import os
import signal
import subprocess
import sys
import time
import unittest

import junit_runner
from repo_files import free_ports
from google.protobuf import text_format
from tandem_stubs import (FASHION, all_healthy, checkpoint_pb2, job_pb2, plan_pb2, spec_from_dict, stub,
                          tandem_service_pb2, wait_for_state)
from tandemd_fixture import Tandemd

TANDEMD = None
STEPS = 20


def start_cluster(n, extra=None):
    """n daemons, each listing the others as peers; extra[i]: more flags for i."""
    ports = free_ports(n)
    addresses = ["127.0.0.1:%d" % p for p in ports]
    daemons = []
    for i in range(n):
        flags = ["--listen=" + addresses[i], "--job_threads=1", "--max_running_jobs=4",
                 "--peers=" + ",".join(a for j, a in enumerate(addresses) if j != i)]
        daemons.append(Tandemd(TANDEMD, extra_flags=flags + list((extra or {}).get(i, []))).start())
    clients = [stub(d.address)[1] for d in daemons]
    # Every daemon sees every other healthy before the tests submit.
    deadline = time.time() + 60
    for c in clients:
        while True:
            node = c.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
            if len(node.peers) == n - 1 and all(p.healthy for p in node.peers):
                break
            if time.time() > deadline:
                raise AssertionError("peers not healthy: %s" % node.peers)
            time.sleep(0.2)
    return daemons, clients


def stop_cluster(daemons):
    for d in daemons:
        d.stop()
        d.cleanup()


def gpt_spec(replicas=1, sharding=None, steps=STEPS, **distributed):
    """A small GPT with dropout, AdamW and clipping: what makes shares differ
    from one batch if anything is wrong (dropout masks, the norm, the mean)."""
    d = {
        "model": {"gpt": {"n_layer": 2, "n_head": 2, "d_model": 32, "context": 16,
                          "dropout": 0.1}},
        "data": {"synthetic": {"sample_shape": [16], "num_classes": 24, "tokens": True,
                               "train_samples": 512}},
        "optimizer": {"kind": "OPTIMIZER_KIND_ADAMW", "learning_rate": 0.003,
                      "max_grad_norm": 1.0},
        "training": {"batch_size": 16, "steps": steps, "seed": 7, "log_interval_steps": 1},
        # Ranks are compared with one replica to fp32 rounding.
        "precision": "PRECISION_FP32",
    }
    if replicas > 1:
        d["distributed"] = dict(replicas=replicas, **distributed)
        if sharding:
            d["distributed"]["sharding"] = sharding
    return spec_from_dict(d)


def fmnist_spec(**distributed):
    """5 steps of the mlp on Fashion-MNIST as a 2-rank job: rank 1 loads the
    dataset (about a second) before it joins."""
    return spec_from_dict({
        "model": {"mlp": {}},
        "data": {"idx": {"train_images": FASHION + "train-images-idx3-ubyte.gz",
                         "train_labels": FASHION + "train-labels-idx1-ubyte.gz"}},
        "training": {"batch_size": 32, "steps": 5},
        "precision": "PRECISION_FP32",
        "distributed": dict(replicas=2, **distributed),
    })


def emulated(spec, strategy):
    """`spec` on each daemon's emulated accelerator under `strategy`."""
    spec.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
    spec.placement.strategy = plan_pb2.Strategy.Value(strategy)
    spec.resources.accelerator_memory_bytes = 256 << 20
    return spec


def step_losses(client, job_id):
    events = client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id=job_id), timeout=120)
    return {e.step.step: e.step.loss for e in events if e.HasField("step")}


def run(client, spec, timeout=600):
    job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60).job
    return wait_for_state(client, job.id, [job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
                                           job_pb2.JOB_STATE_CANCELLED], timeout=timeout)


def wait_for_step(client, job_id, step, timeout=300):
    """Until the job's progress reaches `step`; fails at once if it ends first."""
    deadline = time.time() + timeout
    while True:
        job = client.GetJob(tandem_service_pb2.GetJobRequest(job_id=job_id), timeout=10)
        if job.progress.step >= step:
            return
        if job.state in (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
                         job_pb2.JOB_STATE_CANCELLED):
            raise AssertionError("%s ended %s before step %d: %s" % (
                job_id, job_pb2.JobState.Name(job.state), step, job.reason))
        if time.time() > deadline:
            raise AssertionError("%s not at step %d in %d s" % (job_id, step, timeout))
        time.sleep(0.02)


def host_reserved(client):
    node = client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
    return sum(d.memory_reserved_bytes for d in node.devices if d.kind == 1)


class ParityMixin:
    def check_parity(self, replicas):
        reference = run(self.clients[0], gpt_spec())
        self.assertEqual(reference.state, job_pb2.JOB_STATE_SUCCEEDED, reference.reason)
        want = step_losses(self.clients[0], reference.id)
        self.assertEqual(sorted(want), list(range(1, STEPS + 1)))
        for sharding in ("OPTIMIZER_SHARDING_REPLICATED", "OPTIMIZER_SHARDING_PARTITIONED"):
            job = run(self.clients[0], gpt_spec(replicas, sharding))
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED,
                             job.reason + "".join(d.logs()[-3000:] for d in self.daemons))
            got = step_losses(self.clients[0], job.id)
            worst = max(abs(got[s] - want[s]) for s in want)
            print("%d ranks %s: loss %.5f -> %.5f, one replica %.5f -> %.5f, worst difference "
                  "%.2e" % (replicas, sharding, got[1], got[STEPS], want[1], want[STEPS], worst))
            for s in want:
                self.assertAlmostEqual(got[s], want[s], delta=1e-4, msg="step %d" % s)
            d = job.metrics.distributed
            self.assertEqual(d.ranks, replicas)
            self.assertEqual(len(d.nodes), replicas)
            self.assertEqual(d.nodes[0], "self")
            self.assertEqual(job_pb2.OptimizerSharding.Name(d.sharding), sharding)
            self.assertGreater(d.collective_bytes, 0)
            self.assertEqual(job.distributed_reason, "asked for")
        self.check_nothing_held()

    def check_nothing_held(self):
        # Nothing is held anywhere once the jobs are over (the other ranks
        # end just after rank 0: their last checkpoint).
        deadline = time.time() + 60
        for c in self.clients:
            while host_reserved(c) != 0:
                self.assertLess(time.time(), deadline)
                time.sleep(0.2)

    def check_hybrid_parity(self, replicas, strategy, sharding="OPTIMIZER_SHARDING_REPLICATED"):
        """Each rank runs `strategy`'s plan for its share on its daemon's
        emulated accelerator; one replica is the same job on one daemon.
        PARTITIONED: the ranks cut the state their plans keep on the host."""
        reference = run(self.clients[0], emulated(gpt_spec(), strategy))
        self.assertEqual(reference.state, job_pb2.JOB_STATE_SUCCEEDED, reference.reason)
        want = step_losses(self.clients[0], reference.id)
        job = run(self.clients[0], emulated(gpt_spec(replicas, sharding), strategy))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED,
                         job.reason + "".join(d.logs()[-3000:] for d in self.daemons))
        got = step_losses(self.clients[0], job.id)
        worst = max(abs(got[s] - want[s]) for s in want)
        d = job.metrics.distributed
        print("%d ranks, each %s on an emulated accelerator, %s: %d buckets, rank 0 keeps %d "
              "floats of optimizer state per moment, loss %.5f -> %.5f, one replica %.5f -> "
              "%.5f, worst difference %.2e" % (
                  replicas, strategy, sharding, d.buckets, d.optimizer_elements, got[1],
                  got[STEPS], want[1], want[STEPS], worst))
        for s in want:
            self.assertAlmostEqual(got[s], want[s], delta=1e-4, msg="step %d" % s)
        self.assertEqual(d.ranks, replicas)
        self.assertEqual(job_pb2.OptimizerSharding.Name(d.sharding), sharding)
        self.assertGreaterEqual(d.buckets, 1)
        self.assertGreater(d.collective_bytes, 0)
        self.check_nothing_held()
        return job


class TwoDaemonsTest(unittest.TestCase, ParityMixin):
    def start_pair(self, second_data_root="/usr/share", accelerators=1):
        """Two more daemons, each the other's peer, both healthy, each with
        `accelerators` emulated accelerators; stopped after the test. Returns
        them, a client of the first, and the second's address."""
        a, b = ["127.0.0.1:%d" % p for p in free_ports(2)]
        more = ["--job_threads=1", "--emulated_accelerators=%d" % accelerators]
        first = Tandemd(TANDEMD, extra_flags=["--listen=" + a, "--peers=" + b] + more).start()
        self.addCleanup(first.cleanup)
        self.addCleanup(first.stop)
        second = Tandemd(TANDEMD, data_root=second_data_root, extra_flags=[
            "--listen=" + b, "--peers=" + a] + more).start()
        self.addCleanup(second.cleanup)
        self.addCleanup(second.stop)
        client = stub(first.address)[1]
        deadline = time.time() + 30
        while not all_healthy(client.GetNode(
                tandem_service_pb2.GetNodeRequest(), timeout=10).peers):
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        return first, second, client, b
    @classmethod
    def setUpClass(cls):
        cls.daemons, cls.clients = start_cluster(2)

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.daemons)

    def test_two_ranks_train_as_one_replica(self):
        self.check_parity(2)

    def test_two_ranks_with_emulated_accelerators_run_zero_offload_as_one_replica(self):
        first = self.check_hybrid_parity(2, "STRATEGY_ZERO_OFFLOAD")
        # Its rank 0 measured the collectives in its plan check's window: the
        # next job of 2 ranks here is predicted with them at submission.
        spec = emulated(gpt_spec(2, "OPTIMIZER_SHARDING_REPLICATED", steps=1),
                        "STRATEGY_ZERO_OFFLOAD")
        again = self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec),
                                          timeout=60).job
        source = again.plan_history[0].cost_source
        print("first job predicted %.2f ms (%s); the next %.2f ms (%s)" % (
            first.plan_history[0].predicted_step_seconds * 1e3,
            first.plan_history[0].cost_source.split("; as one of ")[-1],
            again.plan_history[0].predicted_step_seconds * 1e3, source.split("; as one of ")[-1]))
        self.assertIn("as one of 2 ranks, its collectives as job %s's rank 0 measured them: " %
                      first.id, source)
        self.assertRegex(source, r"\d+ ALL_REDUCE at [0-9.]+ GB/s")
        ended = wait_for_state(self.clients[0], again.id, [
            job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED])
        self.assertEqual(ended.state, job_pb2.JOB_STATE_SUCCEEDED, ended.reason)

    def test_two_ranks_run_zero_offload_with_partitioned_host_state_as_one_replica(self):
        job = self.check_hybrid_parity(2, "STRATEGY_ZERO_OFFLOAD",
                                       "OPTIMIZER_SHARDING_PARTITIONED")
        # The job's plan is the rank plan, for a rank's share of the batch,
        # and the coordinator's own rank reserved at submission what that plan
        # keeps: its half of Adam's state, as the same job replicated shows.
        self.assertEqual(job.plan.batch_size, 8)
        replicated = run(self.clients[0], emulated(gpt_spec(2, "OPTIMIZER_SHARDING_REPLICATED",
                                                            steps=1), "STRATEGY_ZERO_OFFLOAD"))
        self.assertEqual(replicated.state, job_pb2.JOB_STATE_SUCCEEDED, replicated.reason)
        params = job.metrics.distributed.optimizer_elements * 2  # rank 0 keeps half
        saved = replicated.reserved_host_bytes - job.reserved_host_bytes
        print("rank 0 reserved %d bytes partitioned, %d replicated" % (
            job.reserved_host_bytes, replicated.reserved_host_bytes))
        # Adam's two moments, halved; a float per moment and layer more at most.
        self.assertGreaterEqual(saved, 2 * 4 * (params // 2 - len(job.plan.layers)))
        self.assertLessEqual(saved, 2 * 4 * (params // 2))

    def test_auto_sharding_partitions_adam_and_says_why(self):
        job = run(self.clients[0], gpt_spec(2, steps=3))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.reason)
        self.assertEqual(job.resolved_spec.distributed.sharding,
                         job_pb2.OPTIMIZER_SHARDING_PARTITIONED)
        self.assertIn("each rank keeps 1/2", job.distributed_reason)

    def test_cancel_stops_every_rank_at_the_same_step(self):
        from tandem.v1 import cluster_pb2, cluster_pb2_grpc
        spec = gpt_spec(2, steps=100000)
        job = self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec),
                                        timeout=60).job
        wait_for_step(self.clients[0], job.id, 3)
        self.clients[0].CancelJob(tandem_service_pb2.CancelJobRequest(job_id=job.id,
                                                                      reason="e2e"), timeout=30)
        done = wait_for_state(self.clients[0], job.id, [job_pb2.JOB_STATE_CANCELLED,
                                                        job_pb2.JOB_STATE_FAILED], timeout=120)
        self.assertEqual(done.state, job_pb2.JOB_STATE_CANCELLED, done.reason)
        self.assertGreater(done.checkpoint_step, 0)
        channel = stub(self.daemons[1].address)[0]
        ranks = cluster_pb2_grpc.ClusterStub(channel)
        deadline = time.time() + 60
        while True:
            rank = ranks.GetRank(cluster_pb2.GetRankRequest(job_id=job.id), timeout=10)
            if rank.state != job_pb2.JOB_STATE_RUNNING:
                break
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)
        channel.close()
        print("cancelled at step %d; rank 1: %s at step %d (%s)" % (
            done.checkpoint_step, job_pb2.JobState.Name(rank.state), rank.step, rank.reason))
        self.assertEqual(rank.state, job_pb2.JOB_STATE_CANCELLED, rank.reason)
        self.assertEqual(rank.step, done.checkpoint_step)

    def test_more_replicas_than_nodes_is_refused_at_submission(self):
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=gpt_spec(3)),
                                      timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("3 ranks need 2 other healthy tandemd nodes", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(
                spec=gpt_spec(2, nodes=["127.0.0.1:1"])), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("distributed.nodes[0]: 127.0.0.1:1 is not a peer", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            spec = gpt_spec(2)
            spec.placement.accelerator = job_pb2.ACCELERATOR_KIND_CUDA
            self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.distributed.replicas", e.exception.details())
        self.assertIn("NCCL", e.exception.details())
        self.assertEqual(host_reserved(self.clients[0]), 0)

    def test_a_rank_whose_node_never_comes_back_fails_the_job_in_bounded_time(self):
        # A second pair of daemons; rank 1's is killed (-9) mid-run and never
        # restarted: the coordinator keeps trying for fault_wait_seconds,
        # waiting for the node that holds rank 1's checkpoint partition.
        first, second, client, b = self.start_pair()
        spec = gpt_spec(2, "OPTIMIZER_SHARDING_PARTITIONED", steps=100000,
                        collective_timeout_seconds=5, fault_wait_seconds=6)
        spec.training.checkpoint_interval_steps = 5
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60).job
        wait_for_step(client, job.id, 12)
        second.kill9()
        start = time.time()
        done = wait_for_state(client, job.id, [job_pb2.JOB_STATE_FAILED,
                                               job_pb2.JOB_STATE_SUCCEEDED], timeout=240)
        took = time.time() - start
        print("rank 1's daemon killed for good: the job FAILED after %.1f s: %s" % (
            took, done.reason))
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertGreaterEqual(took, 5)
        # Bounded: StartRank's 30 s deadline, the fault wait and the retry
        # delay take about 40 s on an idle machine; twice that on a loaded one.
        self.assertLess(took, 120)
        self.assertIn("could not restart within distributed.fault_wait_seconds (6 s)",
                      done.reason)
        self.assertIn("rank 1's partition of the checkpoint at step", done.reason)
        self.assertIn("is on %s, which is not a healthy peer now" % b, done.reason)
        # The first run's end named the collective that lost the rank.
        reasons = [e.state_change.reason for e in client.WatchJob(
            tandem_service_pb2.WatchJobRequest(job_id=job.id), timeout=30)
            if e.HasField("state_change")]
        self.assertTrue(any("a rank was lost" in r and (
            "all-reduce" in r or "reduce-scatter" in r or "all-gather" in r)
            for r in reasons), reasons)
        self.assertEqual(host_reserved(client), 0)

    def test_a_rank_killed_mid_training_resumes_from_the_checkpoint_and_succeeds(self):
        self.check_kill_and_resume(lambda spec: spec, "OPTIMIZER_SHARDING_PARTITIONED",
                                   "CPU-engine ranks")

    def test_a_plan_rank_killed_mid_training_resumes_from_the_checkpoint_and_succeeds(self):
        # Partitioned: each rank's host keeps half of zero_offload's Adam state.
        self.check_kill_and_resume(lambda spec: emulated(spec, "STRATEGY_ZERO_OFFLOAD"),
                                   "OPTIMIZER_SHARDING_PARTITIONED",
                                   "ranks running zero_offload on emulated accelerators")

    def test_two_plan_ranks_per_node_killed_with_their_node_resume_and_succeed(self):
        # 4 ranks on 2 daemons of 2 emulated accelerators: the second daemon's
        # two ranks die together and come back on their accelerators.
        self.check_kill_and_resume(lambda spec: emulated(spec, "STRATEGY_ZERO_OFFLOAD"),
                                   "OPTIMIZER_SHARDING_PARTITIONED",
                                   "4 ranks running zero_offload, 2 per node", replicas=4)

    def check_kill_and_resume(self, place, sharding, what, replicas=2):
        # Rank 1's daemon is killed (-9) mid-run and started again on the same
        # port and state: every rank restarts from rank 0's latest checkpoint,
        # and the job's losses are still one replica's (the CPU engine's).
        first, second, client, b = self.start_pair(accelerators=replicas // 2)
        steps = 300
        reference = run(client, gpt_spec(steps=steps))
        want = step_losses(client, reference.id)
        spec = place(gpt_spec(replicas, sharding, steps=steps, collective_timeout_seconds=5,
                              fault_wait_seconds=60))
        spec.training.checkpoint_interval_steps = 40
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60).job
        wait_for_step(client, job.id, 100)
        second.kill9()
        killed = time.time()
        time.sleep(1)
        second.start()
        done = wait_for_state(client, job.id, [job_pb2.JOB_STATE_FAILED,
                                               job_pb2.JOB_STATE_SUCCEEDED], timeout=300)
        events = list(client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id=job.id),
                                      timeout=60))
        resumed = [e.log.message for e in events if e.HasField("log") and
                   "resumed from checkpoint" in e.log.message]
        got = {e.step.step: e.step.loss for e in events if e.HasField("step")}
        worst = max(abs(got[s] - want[s]) for s in want)
        print("%s: the second daemon killed at step >= 100 and restarted: %s after %.1f s, %d "
              "attempts, %s; worst loss difference to one replica over %d steps %.2e" % (
                  what, job_pb2.JobState.Name(done.state), time.time() - killed, done.attempts,
                  resumed, steps, worst))
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertGreaterEqual(done.attempts, 2)
        self.assertTrue(resumed)
        self.assertEqual(sorted(got), list(range(1, steps + 1)))
        self.assertLess(worst, 1e-4)
        # Nothing held once the ranks are over (a rank besides rank 0 on the
        # first daemon ends just after it: its last checkpoint).
        deadline = time.time() + 60
        while host_reserved(client) != 0:
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        if sharding == "OPTIMIZER_SHARDING_PARTITIONED" and replicas == 2:
            self.check_partitions(first, second, job.id, b)
        if replicas == 4:
            nodes = list(done.metrics.distributed.nodes)
            print("ranks on %s" % nodes)
            self.assertEqual(nodes, ["self", first.address, b, b])

    def check_partitions(self, first, second, job_id, b):
        # Rank 0's daemon committed manifests naming rank 1's partition on the
        # second daemon, whose state directory holds that very file.
        mine = os.path.join(first.state_dir, "jobs", job_id, "checkpoints")
        # Under the coordinator's address (job ids are each daemon's own).
        theirs = os.path.join(second.state_dir, "ranks", first.address.replace(":", "_"), job_id,
                              "rank-1")
        manifests = sorted(n for n in os.listdir(mine) if n.endswith(".manifest"))
        self.assertTrue(manifests, os.listdir(mine))
        with open(os.path.join(mine, manifests[-1])) as f:
            manifest = text_format.Parse(f.read(), checkpoint_pb2.CheckpointManifest())
        self.assertEqual([p.node for p in manifest.partitions], ["self", b])
        part = manifest.partitions[1]
        size = os.path.getsize(os.path.join(theirs, part.file))
        whole = os.path.getsize(os.path.join(mine, manifest.partitions[0].file))
        print("partitioned checkpoint at step %d: rank 0's file %d bytes (weights, buffers, its "
              "half of the Adam state), rank 1's on %s %d bytes" % (
                  manifest.step, whole, b, size))
        self.assertEqual(size, part.bytes)
        # Rank 0: P floats of weights and P of its two half-moments; rank 1: P.
        self.assertLess(size, 0.6 * whole)

    def test_daemons_talk_with_the_clients_token_and_a_wrong_one_is_refused(self):
        # Two daemons with one --auth_token_file, a third with another token:
        # the first two are healthy peers and run a 2-rank job; the third is
        # unhealthy to them (UNAUTHENTICATED) and they to it.
        tokens = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "tokens-%d" % os.getpid())
        os.makedirs(tokens, exist_ok=True)
        good, bad = os.path.join(tokens, "good"), os.path.join(tokens, "bad")
        for path, token in ((good, "cluster-token-0123456789"), (bad, "another-token-9876543210")):
            with open(path, "w") as f:
                f.write(token + "\n")
            os.chmod(path, 0o600)
        addresses = ["127.0.0.1:%d" % p for p in free_ports(3)]
        daemons = []
        for i, token in enumerate((good, good, bad)):
            d = Tandemd(TANDEMD, extra_flags=[
                "--listen=" + addresses[i], "--job_threads=1", "--auth_token_file=" + token,
                "--peers=" + ",".join(a for j, a in enumerate(addresses) if j != i)]).start()
            self.addCleanup(d.cleanup)
            self.addCleanup(d.stop)
            daemons.append(d)
        client = stub(daemons[0].address)[1]
        md = (("authorization", "Bearer cluster-token-0123456789"),)
        deadline = time.time() + 30
        while True:
            peers = {p.address: p for p in client.GetNode(
                tandem_service_pb2.GetNodeRequest(), timeout=10, metadata=md).peers}
            # (Connection refused until the third daemon has started.)
            if peers[addresses[1]].healthy and "code 16" in peers[addresses[2]].reason:
                break
            self.assertLess(time.time(), deadline, peers)
            time.sleep(0.2)
        self.assertFalse(peers[addresses[2]].healthy)  # UNAUTHENTICATED: code 16
        spec = gpt_spec(2, steps=5, nodes=[addresses[1]])
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60,
                               metadata=md).job
        done = wait_for_state(client, job.id, [job_pb2.JOB_STATE_SUCCEEDED,
                                               job_pb2.JOB_STATE_FAILED], token=md[0][1][7:])
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertEqual(list(done.metrics.distributed.nodes), ["self", addresses[1]])

    def test_a_node_that_refuses_its_rank_fails_the_run_saying_why_and_holds_nothing(self):
        # Rank 1's daemon cannot open the dataset (its --data_root does not
        # hold it): it refuses the rank, and the run ends saying so.
        first, second, client, b = self.start_pair(second_data_root="/tmp")
        spec = fmnist_spec(rendezvous_timeout_seconds=4)
        start = time.time()
        done = run(client, spec, timeout=120)
        print("a node that refuses its rank: %s after %.1f s: %s" % (
            job_pb2.JobState.Name(done.state), time.time() - start, done.reason))
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("rank 1 on node %s could not start" % b, done.reason)
        self.assertIn("outside the data root /tmp", done.reason)
        self.assertEqual(host_reserved(client), 0)
        self.assertEqual(host_reserved(stub(second.address)[1]), 0)


    def test_a_rendezvous_that_never_completes_fails_the_run_in_bounded_time(self):
        # Rank 1's daemon is frozen (SIGSTOP) once it has accepted the rank,
        # while the rank loads its data: it never joins.
        from tandem.v1 import cluster_pb2, cluster_pb2_grpc
        first, second, client, b = self.start_pair()
        channel = stub(second.address)[0]
        ranks = cluster_pb2_grpc.ClusterStub(channel)
        spec = fmnist_spec(rendezvous_timeout_seconds=4, fault_wait_seconds=3)
        job = client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=60).job
        deadline = time.time() + 60
        while True:
            try:
                ranks.GetRank(cluster_pb2.GetRankRequest(job_id=job.id), timeout=5)
                break
            except Exception:  # NOT_FOUND until the coordinator starts it
                self.assertLess(time.time(), deadline)
                time.sleep(0.01)
        second.proc.send_signal(signal.SIGSTOP)
        start = time.time()
        done = wait_for_state(client, job.id, [job_pb2.JOB_STATE_FAILED,
                                               job_pb2.JOB_STATE_SUCCEEDED], timeout=120)
        took = time.time() - start
        second.proc.send_signal(signal.SIGCONT)
        print("a rendezvous that never completes: %s after %.1f s: %s" % (
            job_pb2.JobState.Name(done.state), took, done.reason))
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("could not restart within distributed.fault_wait_seconds", done.reason)
        self.assertLess(took, 60)
        reasons = [e.state_change.reason for e in client.WatchJob(
            tandem_service_pb2.WatchJobRequest(job_id=job.id), timeout=30)
            if e.HasField("state_change")]
        # GetRank answers once the peer has registered the rank, which can be
        # before its StartRank answer reaches the coordinator: frozen then, the
        # run fails on StartRank's own deadline instead. Either way the reason
        # names rank 1's node.
        self.assertTrue(any(("the ranks did not join" in r and "rank 1 on " + b in r) or
                            ("rank 1 on node %s could not start: Deadline Exceeded" % b) in r
                            for r in reasons), reasons)
        self.assertEqual(host_reserved(client), 0)
        # The frozen daemon, thawed, ends its rank (stopped, or its own
        # rendezvous timing out) and gives its memory back.
        deadline = time.time() + 60
        while host_reserved(stub(second.address)[1]) != 0:
            self.assertLess(time.time(), deadline)
            time.sleep(0.2)
        channel.close()


def free_subnet_octet(seed):
    """The third octet of a 10.77.X.0/24 that no interface here holds yet,
    starting from one chosen by `seed`."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                           text=True).stdout
    for i in range(250):
        octet = (seed + i) % 250
        if ("10.77.%d." % octet) not in shown:
            return octet
    return seed % 250


class NetworkNamespacesTest(unittest.TestCase):
    """Two daemons, each in its own network namespace, joined by veth pairs to a
    bridge in the test's namespace (which reaches both): the ranks' Gloo
    traffic crosses real interfaces, not loopback."""

    @classmethod
    def setUpClass(cls):
        tag = "%d" % (os.getpid() % 100000)
        cls.bridge = "tdbr" + tag
        cls.namespaces = ["tdns%s%s" % (tag, c) for c in "ab"]
        cls.made = []
        # A subnet of its own: two runs of this test at once (bazel
        # --runs_per_test) with one subnet would route to each other's daemons.
        subnet = "10.77.%d" % free_subnet_octet(os.getpid())
        commands = [["ip", "link", "add", cls.bridge, "type", "bridge"],
                    ["ip", "addr", "add", subnet + ".254/24", "dev", cls.bridge],
                    ["ip", "link", "set", cls.bridge, "up"]]
        cls.addresses = []
        for i, ns in enumerate(cls.namespaces):
            host, inside = "tdv%s%d" % (tag, i), "tdp%s%d" % (tag, i)
            ip = "%s.%d" % (subnet, i + 1)
            cls.addresses.append(ip)
            commands += [["ip", "netns", "add", ns],
                         ["ip", "link", "add", host, "type", "veth", "peer", "name", inside],
                         ["ip", "link", "set", inside, "netns", ns],
                         ["ip", "link", "set", host, "master", cls.bridge],
                         ["ip", "link", "set", host, "up"],
                         ["ip", "netns", "exec", ns, "ip", "addr", "add", ip + "/24", "dev", inside],
                         ["ip", "netns", "exec", ns, "ip", "link", "set", inside, "up"],
                         ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
        for c in commands:
            r = subprocess.run(c, capture_output=True, text=True)
            if r.returncode != 0:
                cls.cleanup_network()
                raise unittest.SkipTest("this machine refuses network namespaces (%s: %s)" % (
                    " ".join(c), r.stderr.strip()))
            cls.made.append(c)
        port = 50151
        peers = ["%s:%d" % (a, port) for a in cls.addresses]
        cls.daemons = []
        for i, ns in enumerate(cls.namespaces):
            cls.daemons.append(Tandemd(TANDEMD, prefix=["ip", "netns", "exec", ns], extra_flags=[
                "--listen=%s" % peers[i], "--job_threads=1",
                "--peers=" + ",".join(p for j, p in enumerate(peers) if j != i)]))
        try:
            for d in cls.daemons:
                d.start()
            cls.clients = [stub(p)[1] for p in peers]
            deadline = time.time() + 60
            while not all_healthy(cls.clients[0].GetNode(
                    tandem_service_pb2.GetNodeRequest(), timeout=10).peers):
                assert time.time() < deadline, "the other namespace's peer never became healthy"
                time.sleep(0.2)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def cleanup_network(cls):
        for ns in cls.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", cls.bridge], capture_output=True)

    @classmethod
    def tearDownClass(cls):
        for d in getattr(cls, "daemons", []):
            if d.proc is not None:
                d.stop()
            d.cleanup()
        cls.cleanup_network()

    def test_two_ranks_in_two_namespaces_train_as_one_replica(self):
        node = self.clients[0].GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        self.assertEqual([p.address for p in node.peers], ["%s:50151" % self.addresses[1]])
        reference = run(self.clients[0], gpt_spec())
        want = step_losses(self.clients[0], reference.id)
        job = run(self.clients[0], gpt_spec(2, "OPTIMIZER_SHARDING_PARTITIONED"))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.reason)
        got = step_losses(self.clients[0], job.id)
        worst = max(abs(got[s] - want[s]) for s in want)
        print("2 ranks in 2 network namespaces over veth: worst difference %.2e over %d steps; "
              "nodes %s" % (worst, len(want), list(job.metrics.distributed.nodes)))
        self.assertLess(worst, 1e-4)
        self.assertEqual(list(job.metrics.distributed.nodes),
                         ["self", "%s:50151" % self.addresses[1]])
        # The same with each rank running ZeRO-Offload's plan on its
        # namespace's emulated accelerator.
        job = run(self.clients[0], emulated(gpt_spec(2), "STRATEGY_ZERO_OFFLOAD"))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.reason)
        got = step_losses(self.clients[0], job.id)
        worst = max(abs(got[s] - want[s]) for s in want)
        print("2 ranks with emulated accelerators (zero_offload) in 2 network namespaces: worst "
              "difference %.2e from the CPU engine's one replica" % worst)
        self.assertLess(worst, 1e-4)


class FourDaemonsTest(unittest.TestCase, ParityMixin):
    @classmethod
    def setUpClass(cls):
        cls.daemons, cls.clients = start_cluster(4)

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.daemons)

    def test_four_ranks_train_as_one_replica(self):
        self.check_parity(4)

    def test_four_ranks_with_emulated_accelerators_run_reuse_distance_as_one_replica(self):
        self.check_hybrid_parity(4, "STRATEGY_REUSE_DISTANCE", "OPTIMIZER_SHARDING_PARTITIONED")

    def test_two_coordinators_jobs_of_one_id_run_their_ranks_on_one_peer(self):
        """Job ids are each daemon's own: daemons 1 and 2 (which no other test
        submits to) each coordinate a job-000001 whose rank 1 runs on daemon
        3, side by side; each coordinator's cancel stops its own rank alone."""
        from tandem.v1 import cluster_pb2, cluster_pb2_grpc
        peer = self.daemons[3].address
        coordinators = [self.daemons[1].address, self.daemons[2].address]
        clients = [self.clients[1], self.clients[2]]
        jobs = [c.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=gpt_spec(
                    2, "OPTIMIZER_SHARDING_PARTITIONED", steps=100000, nodes=[peer])),
                    timeout=60).job for c in clients]
        self.assertEqual(jobs[0].id, jobs[1].id, "the test needs one id twice")
        for c, job in zip(clients, jobs):
            wait_for_step(c, job.id, 3)
        channel = stub(peer)[0]
        self.addCleanup(channel.close)
        ranks = cluster_pb2_grpc.ClusterStub(channel)

        def rank_of(coordinator):
            return ranks.GetRank(cluster_pb2.GetRankRequest(
                job_id=jobs[0].id, rank=1, coordinator=coordinator), timeout=10)

        for coordinator in coordinators:
            self.assertEqual(rank_of(coordinator).state, job_pb2.JOB_STATE_RUNNING)
        clients[0].CancelJob(tandem_service_pb2.CancelJobRequest(job_id=jobs[0].id), timeout=30)
        done = wait_for_state(clients[0], jobs[0].id, [job_pb2.JOB_STATE_CANCELLED,
                                                        job_pb2.JOB_STATE_FAILED], timeout=120)
        self.assertEqual(done.state, job_pb2.JOB_STATE_CANCELLED, done.reason)
        deadline = time.time() + 60
        while rank_of(coordinators[0]).state == job_pb2.JOB_STATE_RUNNING:
            self.assertLess(time.time(), deadline)
            time.sleep(0.1)
        # The other coordinator's rank of the same id trains on.
        other = clients[1].GetJob(tandem_service_pb2.GetJobRequest(job_id=jobs[1].id), timeout=10)
        self.assertEqual(other.state, job_pb2.JOB_STATE_RUNNING, other.reason)
        wait_for_step(clients[1], jobs[1].id, other.progress.step + 3)
        self.assertEqual(rank_of(coordinators[1]).state, job_pb2.JOB_STATE_RUNNING)
        print("two job %s ranks on one peer: the first cancelled at step %d (its rank %s), the "
              "second still running at step %d" % (
                  jobs[0].id, done.checkpoint_step,
                  job_pb2.JobState.Name(rank_of(coordinators[0]).state),
                  rank_of(coordinators[1]).step))
        clients[1].CancelJob(tandem_service_pb2.CancelJobRequest(job_id=jobs[1].id), timeout=30)
        done = wait_for_state(clients[1], jobs[1].id, [job_pb2.JOB_STATE_CANCELLED,
                                                        job_pb2.JOB_STATE_FAILED], timeout=120)
        self.assertEqual(done.state, job_pb2.JOB_STATE_CANCELLED, done.reason)
        self.check_nothing_held()


class TwoDaemonsTwoAcceleratorsTest(unittest.TestCase, ParityMixin):
    """Two daemons with two emulated accelerators each: a job with an
    accelerator runs one rank per accelerator, two on each node."""

    @classmethod
    def setUpClass(cls):
        two = ["--emulated_accelerators=2"]
        cls.daemons, cls.clients = start_cluster(2, {0: two, 1: two})

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.daemons)

    def test_four_ranks_on_two_nodes_run_zero_offload_as_one_replica(self):
        job = self.check_hybrid_parity(4, "STRATEGY_ZERO_OFFLOAD",
                                       "OPTIMIZER_SHARDING_PARTITIONED")
        nodes = list(job.metrics.distributed.nodes)
        print("4 ranks on 2 nodes of 2 emulated accelerators: ranks on %s" % nodes)
        self.assertEqual(nodes, ["self", self.daemons[0].address, self.daemons[1].address,
                                 self.daemons[1].address])

    def test_more_ranks_than_accelerators_is_refused_and_a_cpu_job_keeps_one_per_node(self):
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(
                spec=emulated(gpt_spec(5), "STRATEGY_ZERO_OFFLOAD")), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("5 ranks need 5 accelerators (one rank per accelerator); this node has 2 "
                      "and its healthy peers 2", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=gpt_spec(3)),
                                      timeout=30)
        self.assertIn("3 ranks need 2 other healthy tandemd nodes", e.exception.details())
        # A rank started on an accelerator the node does not have: UNAVAILABLE,
        # since a coordinator places ranks by the node's offer at its last
        # health check, and its next run places them by the offer then.
        from tandem.v1 import cluster_pb2, cluster_pb2_grpc
        channel = stub(self.daemons[1].address)[0]
        request = cluster_pb2.StartRankRequest(
            job_id="no-such-accelerator", attempt=1, rank=1, ranks=2,
            coordinator=self.daemons[0].address, hostname="127.0.0.1", accelerator_index=2,
            spec=emulated(gpt_spec(2), "STRATEGY_ZERO_OFFLOAD"))
        with self.assertRaises(grpc.RpcError) as e:
            cluster_pb2_grpc.ClusterStub(channel).StartRank(request, timeout=30)
        channel.close()
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("accelerator_index: 2 is not one of this daemon's 2 emulated accelerators",
                      e.exception.details())
        self.assertEqual(host_reserved(self.clients[0]), 0)
        self.assertEqual(host_reserved(self.clients[1]), 0)


class OneDaemonTwoAcceleratorsTest(unittest.TestCase, ParityMixin):
    """One daemon with two emulated accelerators and no --peers: a cluster of
    its own, whose jobs with an accelerator run a rank on each."""

    @classmethod
    def setUpClass(cls):
        cls.daemons, cls.clients = start_cluster(1, {0: ["--emulated_accelerators=2"]})

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.daemons)

    def test_two_ranks_on_one_node_run_reuse_distance_as_one_replica(self):
        job = self.check_hybrid_parity(2, "STRATEGY_REUSE_DISTANCE",
                                       "OPTIMIZER_SHARDING_PARTITIONED")
        self.assertEqual(list(job.metrics.distributed.nodes), ["self", self.daemons[0].address])

    def test_a_cpu_job_still_needs_a_node_per_rank(self):
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            self.clients[0].SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=gpt_spec(2)),
                                      timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("2 ranks need 1 other healthy tandemd node", e.exception.details())


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
