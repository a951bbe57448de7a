"""Jobs end to end: the tandem CLI against a real tandemd on loopback."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import junit_runner
import repo_files
from tandem_stubs import (FASHION, diverging_spec, metadata, spec_from_dict, stub,
                          synthetic_spec, tandem_service_pb2, wait_for_state, job_pb2, plan_pb2)
from tandemd_fixture import Tandemd

TANDEMD = TANDEM = None


def cli(daemon, *args):
    return subprocess.run([TANDEM, "--server=" + daemon.address] + list(args), capture_output=True,
                          text=True, timeout=600)


class JobsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Tandemd(TANDEMD, extra_flags=["--emulated_accelerators=2"]).start()
        cls.channel, cls.client = stub(cls.daemon.address)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()

    def write_job(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=self.daemon.workdir)
        f.write(text)
        f.close()
        return f.name

    def test_fashion_mnist_job_submitted_by_the_cli_reaches_the_documented_accuracy(self):
        # The README's recipe (clients/examples/fmnist-mlp.yaml: the mlp preset,
        # Adam 1e-3, batch 128, shuffled, 2 epochs) and its documented target.
        with open(repo_files.path("clients/examples/fmnist-mlp.yaml")) as f:
            recipe = f.read()
        self.assertIn("epochs: 2", recipe)
        job_file = self.write_job(recipe.replace("/usr/share/datasets/fashion-mnist/", FASHION))
        result = cli(self.daemon, "submit", job_file, "--watch")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr + self.daemon.logs())
        self.assertIn("state JOB_STATE_SUCCEEDED", result.stdout)
        job_id = result.stdout.split()[1]
        status = cli(self.daemon, "--output=json", "status", job_id)
        self.assertEqual(status.returncode, 0, status.stderr)
        job = json.loads(status.stdout)
        self.assertEqual(job["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(int(job["progress"]["step"]), 2 * 469)
        # bench/README.md: mlp >= 0.85 after 2 epochs. The accuracy is in the job record.
        self.assertGreaterEqual(job["metrics"]["eval_accuracy"], 0.85)
        self.assertGreater(job["metrics"]["mean_samples_per_second"], 0)

    def test_watch_replays_from_a_sequence_number_without_gaps(self):
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=6)),
                                    timeout=30).job
        wait_for_state(self.client, job.id, [job_pb2.JOB_STATE_SUCCEEDED])
        events = list(self.client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id=job.id, from_sequence=3),
                                           timeout=30))
        self.assertEqual(events[0].sequence, 3)
        self.assertEqual([e.sequence for e in events], list(range(3, 3 + len(events))))
        self.assertEqual(events[-1].state_change.to, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(sum(1 for e in events if e.HasField("step")), 6)

    def test_cancel_a_running_job_stops_at_a_step_with_a_checkpoint(self):
        spec = synthetic_spec(steps=1000000)
        spec.training.checkpoint_disabled = False
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        wait_for_state(self.client, job.id, [job_pb2.JOB_STATE_RUNNING])
        result = cli(self.daemon, "cancel", job.id, "--reason=e2e test")
        self.assertEqual(result.returncode, 0, result.stderr)
        done = wait_for_state(self.client, job.id, [job_pb2.JOB_STATE_CANCELLED])
        self.assertIn("e2e test", done.reason)
        self.assertGreater(done.checkpoint_step, 0)
        self.assertEqual(done.checkpoint_step, done.progress.step)

    def test_a_failing_job_ends_failed_and_watch_exits_one(self):
        # Too high a learning rate for eight layers: the loss becomes NaN at
        # step 8 and the job fails there.
        spec = diverging_spec()
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        result = cli(self.daemon, "watch", job.id)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        done = wait_for_state(self.client, job.id, [job_pb2.JOB_STATE_FAILED])
        self.assertIn("training diverged", done.reason)
        # The daemon keeps serving.
        self.assertTrue(self.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10).accepting_jobs)

    def test_list_filters_by_state_and_pages(self):
        ids = [self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=1)),
                                     timeout=30).job.id for _ in range(3)]
        for i in ids:
            wait_for_state(self.client, i, [job_pb2.JOB_STATE_SUCCEEDED])
        page = self.client.ListJobs(tandem_service_pb2.ListJobsRequest(
            states=[job_pb2.JOB_STATE_SUCCEEDED], page_size=2), timeout=10)
        self.assertEqual(len(page.jobs), 2)
        self.assertTrue(page.next_page_token)
        rest = self.client.ListJobs(tandem_service_pb2.ListJobsRequest(
            states=[job_pb2.JOB_STATE_SUCCEEDED], page_size=1000, page_token=page.next_page_token),
            timeout=10)
        seen = [j.id for j in page.jobs] + [j.id for j in rest.jobs]
        self.assertEqual(len(seen), len(set(seen)))
        for i in ids:
            self.assertIn(i, seen)
        self.assertTrue(all(j.state == job_pb2.JOB_STATE_SUCCEEDED for j in list(page.jobs) + list(rest.jobs)))

    def test_a_job_on_the_emulated_accelerator_runs_under_its_plan(self):
        spec = synthetic_spec(steps=8)
        spec.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
        spec.placement.strategy = 5  # STRATEGY_REUSE_DISTANCE
        spec.resources.accelerator_memory_bytes = 8 << 20
        submitted = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        # Planned at submission: the plan and its prediction are in the record at once.
        self.assertTrue(submitted.plan.feasible)
        self.assertGreater(submitted.metrics.predicted_step_seconds, 0)
        done = wait_for_state(self.client, submitted.id, [job_pb2.JOB_STATE_SUCCEEDED])
        self.assertEqual(done.progress.step, 8)
        self.assertGreater(done.metrics.peak_accelerator_bytes, 0)
        self.assertLessEqual(done.metrics.peak_accelerator_bytes, 8 << 20)
        self.assertEqual(done.measured_timeline.source, "measured")
        self.assertGreater(len(done.measured_timeline.spans), 0)

    def test_a_pipeline_job_runs_its_stages_and_the_node_bounds_them(self):
        import grpc
        spec = synthetic_spec(steps=6)
        spec.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
        spec.placement.pipeline.stages = 2
        spec.placement.pipeline.schedule = 1  # PIPELINE_SCHEDULE_GPIPE
        spec.resources.accelerator_memory_bytes = 16 << 20
        submitted = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        self.assertEqual(len(submitted.plan.pipeline), 2)
        self.assertGreater(submitted.metrics.predicted_step_seconds, 0)
        done = wait_for_state(self.client, submitted.id, [job_pb2.JOB_STATE_SUCCEEDED])
        stages = done.metrics.pipeline_stages
        self.assertEqual([s.device for s in stages], ["emulated:0", "emulated:1"])
        for s, planned in zip(stages, done.plan.pipeline):
            self.assertEqual((s.first_layer, s.last_layer), (planned.first_layer, planned.last_layer))
            self.assertGreater(s.busy_seconds, 0)
            self.assertGreater(s.peak_bytes, 0)
            self.assertLessEqual(s.peak_bytes, 16 << 20)
        self.assertEqual({span.lane for span in done.measured_timeline.spans}, {0, 1})
        # The emulated accelerators' peer link: stage 1 pulls its inputs from
        # stage 0's device, stage 0 their gradients from stage 1's.
        self.assertEqual([s.peer_link for s in stages], [False, True])
        for s in stages:
            self.assertGreater(s.peer_copy_seconds, 0)
            self.assertLessEqual(s.peer_copy_seconds, s.copy_seconds)
        self.assertIn(plan_pb2.TIMELINE_PHASE_PEER_COPY,
                      {span.phase for span in done.measured_timeline.spans})
        status = cli(self.daemon, "status", submitted.id)
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("pipeline:  stage 1 (layers", status.stdout)
        self.assertIn("of the copies over peer links", status.stdout)
        # tandemd choosing the stages: the stored spec says what it chose, the
        # plan's note what it compared, and the job runs it.
        auto = synthetic_spec(steps=6)
        auto.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
        auto.placement.pipeline.auto_stages = True
        auto.resources.accelerator_memory_bytes = 16 << 20
        chosen = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=auto),
                                       timeout=30).job
        self.assertFalse(chosen.resolved_spec.placement.pipeline.auto_stages)
        self.assertIn(chosen.resolved_spec.placement.pipeline.stages, (0, 2))
        self.assertEqual(len(chosen.plan.pipeline), chosen.resolved_spec.placement.pipeline.stages)
        self.assertIn("placement.pipeline.auto_stages chose", chosen.plan.solver.note)
        self.assertIn("one accelerator (", chosen.plan.solver.note)
        self.assertIn("2 stages (", chosen.plan.solver.note)
        done = wait_for_state(self.client, chosen.id, [job_pb2.JOB_STATE_SUCCEEDED])
        self.assertEqual(done.progress.step, 6)
        # Continuous PipeDream: no drain between steps; its plan says so, each
        # stage's staleness is K - s - 1, and the run ends drained and evaluated.
        stream = synthetic_spec(steps=6)
        stream.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
        stream.placement.pipeline.stages = 2
        stream.placement.pipeline.schedule = 3  # PIPELINE_SCHEDULE_PIPEDREAM
        stream.placement.pipeline.continuous = True
        stream.resources.accelerator_memory_bytes = 16 << 20
        streamed = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=stream),
                                         timeout=30).job
        self.assertIn("Continuous PipeDream", streamed.plan.solver.note)
        done = wait_for_state(self.client, streamed.id, [job_pb2.JOB_STATE_SUCCEEDED])
        self.assertEqual([s.staleness for s in done.metrics.pipeline_stages], [1, 0])
        self.assertGreater(done.metrics.eval_loss, 0)
        # With vertical sync, or another schedule: refused, naming the field.
        stream.placement.pipeline.vertical_sync = True
        with self.assertRaises(grpc.RpcError) as e:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=stream), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("placement.pipeline.continuous: only PipeDream", e.exception.details())
        # More stages than this daemon's --emulated_accelerators: refused, naming both.
        spec.placement.pipeline.stages = 3
        with self.assertRaises(grpc.RpcError) as e:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("3 stages, but this node offers 2 emulated accelerators", e.exception.details())

    def test_update_rules_run_report_and_refuse_bad_parameters(self):
        import grpc
        spec = synthetic_spec(steps=24, updates={"parameter_server": {"staleness": 2, "workers": 3}})
        submitted = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        self.assertEqual(submitted.resolved_spec.updates.parameter_server.shards, 4)
        done = wait_for_state(self.client, submitted.id, [job_pb2.JOB_STATE_SUCCEEDED])
        u = done.metrics.updates
        self.assertEqual(u.rule, "parameter_server")
        self.assertEqual(u.updates, 24)
        self.assertEqual(sum(u.staleness_counts), 24)
        self.assertLessEqual(u.max_staleness, 2)
        status = cli(self.daemon, "status", submitted.id)
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("updates:   parameter_server: 24 updates, staleness mean", status.stdout)
        # A bad parameter: INVALID_ARGUMENT naming the field; the daemon goes on.
        bad = synthetic_spec(updates={"easgd": {"period": 0}})
        with self.assertRaises(grpc.RpcError) as e:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=bad), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.updates.easgd.period: must be in [1,", e.exception.details())
        swa = synthetic_spec(steps=12, updates={"swa": {"start_step": 13}})
        with self.assertRaises(grpc.RpcError) as e:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=swa), timeout=30)
        self.assertIn("spec.updates.swa.start_step: 13 is after the run's last step", e.exception.details())
        self.assertEqual(self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(
            spec=synthetic_spec()), timeout=30).job.state, job_pb2.JOB_STATE_QUEUED)

    def test_a_job_no_plan_fits_is_refused_with_the_capacity_it_needs(self):
        import grpc
        spec = synthetic_spec(steps=8)
        spec.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
        spec.placement.strategy = 2  # STRATEGY_GPU_ONLY
        spec.resources.accelerator_memory_bytes = 4096
        with self.assertRaises(grpc.RpcError) as e:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("it needs at least", e.exception.details())

    def test_plan_model_for_this_node_and_the_cli_plan(self):
        spec = synthetic_spec(steps=8)
        spec.placement.accelerator = job_pb2.ACCELERATOR_KIND_EMULATED
        spec.resources.accelerator_memory_bytes = 8 << 20
        answer = self.client.PlanModel(tandem_service_pb2.PlanModelRequest(spec=spec), timeout=60)
        self.assertTrue(answer.plan.feasible)
        self.assertEqual(len(answer.alternatives), 5)
        job_file = self.write_job("""
model: {gpt: {n_layer: 2, n_head: 2, d_model: 64, context: 32}}
data: {synthetic: {sample_shape: [32], num_classes: 256, tokens: true}}
training: {batch_size: 8, steps: 10}
placement: {strategy: STRATEGY_AUTO}
""")
        result = cli(self.daemon, "plan", job_file, "--hardware=" + repo_files.path("planner/hardware/h100_sxm_node.textproto"),
                     "--accelerator_memory=1GiB")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"^Plan: \w+, feasible")
        for strategy in ("gpu_only", "cpu_only", "zero_offload", "reuse_distance", "hetero_dp"):
            self.assertIn(strategy, result.stdout)
        result = cli(self.daemon, "plan", job_file, "--on_server", "--compare=zero_offload,reuse_distance")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        # Bad usage exits 2 (README, "Exit codes"), a request that fails 1.
        result = cli(self.daemon, "plan", job_file, "--compare=fastest")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--compare: unknown strategy 'fastest'", result.stderr)
        result = cli(self.daemon, "status")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("usage: tandem status ID", result.stderr)
        result = cli(self.daemon, "status", "job-999999")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("NOT_FOUND", result.stderr)

    def test_precision_resolves_with_its_reason_and_bf16_runs_where_the_cpu_computes_it(self):
        import grpc
        from tandem.v1 import profile_pb2
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=1)),
                                    timeout=30).job
        # Auto is bf16 where this CPU computes it natively, else fp32; the
        # reason says which and why.
        native = "bf16, computed natively here" in job.precision_reason
        self.assertEqual(job.resolved_spec.precision,
                         profile_pb2.PRECISION_BF16 if native else profile_pb2.PRECISION_FP32,
                         job.precision_reason)
        if not native:
            self.assertIn("the default (auto): fp32", job.precision_reason)

        def submit(precision, **extra):
            spec = synthetic_spec(steps=3, **extra)
            spec.precision = precision
            return self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30)

        def bf16_runs_or_is_refused(placement, reason, refusal):
            """Where the CPU computes bf16 natively the job runs and succeeds;
            elsewhere it is refused, saying why."""
            if native:
                job = submit(profile_pb2.PRECISION_BF16, **placement).job
                self.assertEqual(job.resolved_spec.precision, profile_pb2.PRECISION_BF16)
                self.assertIn(reason, job.precision_reason)
                done = wait_for_state(self.client, job.id, [job_pb2.JOB_STATE_SUCCEEDED,
                                                            job_pb2.JOB_STATE_FAILED])
                self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
                self.assertTrue(math.isfinite(done.metrics.loss) and done.metrics.loss > 0,
                                done.metrics)
            else:
                with self.assertRaises(grpc.RpcError) as e:
                    submit(profile_pb2.PRECISION_BF16, **placement)
                self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn(refusal, e.exception.details())

        cpu_only = {"placement": {"accelerator": "ACCELERATOR_KIND_NONE"}}
        bf16_runs_or_is_refused(cpu_only, "matrix products in bf16", "natively")
        # The emulated accelerator computes on the host: bf16 there needs the same CPU.
        bf16_runs_or_is_refused({"placement": {"accelerator": "ACCELERATOR_KIND_EMULATED",
                                               "strategy": "STRATEGY_REUSE_DISTANCE"},
                                 "resources": {"accelerator_memory_bytes": 64 << 20}},
                                "the emulated accelerator computes on the host",
                                "emulated accelerator")
        # fp16 is for GPUs and the emulated accelerator; the CPU engine refuses it.
        with self.assertRaises(grpc.RpcError) as e:
            submit(profile_pb2.PRECISION_FP16, **cpu_only)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertTrue(e.exception.details().startswith("spec.precision: PRECISION_FP16: "),
                        e.exception.details())
        # Loss scaling belongs to fp16 jobs alone.
        with self.assertRaises(grpc.RpcError) as e:
            submit(profile_pb2.PRECISION_FP32, training={"batch_size": 8, "steps": 2,
                                                        "loss_scaling": {"initial_scale": 1024}},
                   **cpu_only)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("training.loss_scaling", e.exception.details())
        # Planned for an H100 node: auto is bf16 there, and the report says why.
        hardware = repo_files.path("planner/hardware/h100_sxm_node.textproto")
        job_file = self.write_job("""
model: {gpt: {n_layer: 2, n_head: 2, d_model: 64, context: 32}}
data: {synthetic: {sample_shape: [32], num_classes: 256, tokens: true}}
training: {batch_size: 8, steps: 10}
""")
        result = cli(self.daemon, "--output=json", "plan", job_file, "--hardware=" + hardware,
                     "--compare=zero_offload")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        answer = json.loads(result.stdout)
        self.assertEqual(answer["precision"], "PRECISION_BF16")
        self.assertIn("computes bf16 natively", answer["precision_reason"])
        result = cli(self.daemon, "plan", job_file, "--hardware=" + hardware, "--precision=fp32",
                     "--compare=zero_offload")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("Precision fp32: asked for.", result.stdout)

    def test_profile_model_measures_every_layer_and_caches(self):
        request = tandem_service_pb2.ProfileModelRequest(spec=synthetic_spec(steps=1), iterations=2,
                                                         warmup_iterations=1)
        first = self.client.ProfileModel(request, timeout=300)
        self.assertFalse(first.cached)
        self.assertGreater(len(first.profile.layers), 0)
        self.assertTrue(all(len(layer.devices) > 0 for layer in first.profile.layers))
        again = self.client.ProfileModel(request, timeout=60)
        self.assertTrue(again.cached)
        import grpc
        bad = tandem_service_pb2.ProfileModelRequest(spec=synthetic_spec(steps=1), iterations=5000)
        with self.assertRaises(grpc.RpcError) as e:
            self.client.ProfileModel(bad, timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("iterations", e.exception.details())

    def test_submit_is_idempotent_on_the_request_id(self):
        a = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=1),
                                                                      request_id="e2e-idem"), timeout=30)
        b = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=1),
                                                                      request_id="e2e-idem"), timeout=30)
        self.assertTrue(a.created)
        self.assertFalse(b.created)
        self.assertEqual(a.job.id, b.job.id)
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=2),
                                                                      request_id="e2e-idem"), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.ALREADY_EXISTS)


if __name__ == "__main__":
    TANDEMD, TANDEM = sys.argv.pop(1), sys.argv.pop(1)
    junit_runner.main()
