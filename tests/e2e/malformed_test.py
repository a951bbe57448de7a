"""A corpus of malformed and hostile requests, each answered with the right
gRPC status and a message naming the field; the daemon stays healthy."""
import sys
import unittest

import grpc
from google.protobuf import json_format

import junit_runner
from tandem_stubs import FASHION, job_pb2, stub, tandem_service_pb2
from tandemd_fixture import Tandemd

TANDEMD = None
INVALID = grpc.StatusCode.INVALID_ARGUMENT

GOOD = {
    "model": {"mlp": {"hidden_sizes": [16]}},
    "data": {"synthetic": {"sample_shape": [8], "num_classes": 3, "train_samples": 64}},
    "training": {"batch_size": 8, "steps": 1},
}


def merged(base, patch):
    out = dict(base)
    for k, v in patch.items():
        out[k] = merged(base.get(k, {}), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def without(d, *path):
    out = json_format.MessageToDict(json_format.ParseDict(d, job_pb2.JobSpec()), preserving_proto_field_name=True)
    node = out
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    return out


# (name, spec as a dict or a JobSpec, expected code, text the message must contain)
CASES = [
    ("missing model", without(GOOD, "model"), INVALID, "spec.model"),
    ("missing data", without(GOOD, "data"), INVALID, "spec.data"),
    ("missing batch", merged(GOOD, {"training": {"batch_size": 0, "steps": 1}}), INVALID, "spec.training.batch_size"),
    ("missing duration", {"model": GOOD["model"], "data": GOOD["data"], "training": {"batch_size": 8}}, INVALID, "spec.training"),
    ("negative batch", merged(GOOD, {"training": {"batch_size": -4, "steps": 1}}), INVALID, "spec.training.batch_size"),
    ("absurd batch", merged(GOOD, {"training": {"batch_size": 10**9, "steps": 1}}), INVALID, "spec.training.batch_size"),
    ("negative steps", merged(GOOD, {"training": {"batch_size": 8, "steps": -1}}), INVALID, "spec.training.steps"),
    ("absurd steps", merged(GOOD, {"training": {"batch_size": 8, "steps": 10**15}}), INVALID, "spec.training.steps"),
    ("zero epochs", {"model": GOOD["model"], "data": GOOD["data"], "training": {"batch_size": 8, "epochs": -2}}, INVALID, "spec.training.epochs"),
    ("negative learning rate", merged(GOOD, {"optimizer": {"learning_rate": -0.1}}), INVALID, "spec.optimizer.learning_rate"),
    ("beta out of range", merged(GOOD, {"optimizer": {"beta2": 1.5}}), INVALID, "spec.optimizer.beta2"),
    ("unknown optimizer enum", merged(GOOD, {"optimizer": {"kind": 99}}), INVALID, "spec.optimizer.kind"),
    ("unknown strategy enum", merged(GOOD, {"placement": {"strategy": 1234}}), INVALID, "spec.placement.strategy"),
    ("unknown accelerator enum", merged(GOOD, {"placement": {"accelerator": 42}}), INVALID, "spec.placement.accelerator"),
    ("micro batch not dividing", merged(GOOD, {"placement": {"micro_batch_size": 3}}), INVALID, "spec.placement.micro_batch_size"),
    ("gpu strategy without accelerator", merged(GOOD, {"placement": {"strategy": "STRATEGY_GPU_ONLY", "accelerator": "ACCELERATOR_KIND_NONE"}}), INVALID, "spec.placement.strategy"),
    ("negative memory", merged(GOOD, {"resources": {"host_memory_bytes": -1}}), INVALID, "spec.resources.host_memory_bytes"),
    ("a reservation below the estimate (1 byte)", merged(GOOD, {"resources": {"host_memory_bytes": 1}}), INVALID, "spec.resources.host_memory_bytes"),
    ("absurd priority", merged(GOOD, {"priority": 10**6}), INVALID, "spec.priority"),
    ("oversized spec (a 1.4 MB forced plan)",
     merged(GOOD, {"placement": {"plan": {"layers": [{"name": "x" * 60}] * 20000}}}),
     INVALID, "spec.placement: the spec is"),
    ("a conv whose weight count overflows 64 bits (kernel 2^31-1)",
     dict(GOOD, model={"layers": {"layers": [
         {"conv2d": {"out_channels": 64, "kernel_size": 2**31 - 1, "padding": 2**30 - 1}},
         {"flatten": {}}, {"linear": {"out_features": 3}}]}},
         data={"synthetic": {"sample_shape": [28, 28, 1], "num_classes": 3, "train_samples": 64}}),
     INVALID, "layer 0 (conv2d): weight"),
    ("a conv output of 2^40 elements per sample",
     dict(GOOD, model={"layers": {"layers": [
         {"conv2d": {"out_channels": 2**31 - 1, "kernel_size": 1}}, {"flatten": {}}, {"linear": {"out_features": 3}}]}},
         data={"synthetic": {"sample_shape": [28, 28, 1], "num_classes": 3, "train_samples": 64}}),
     INVALID, "layer 0 (conv2d): output per sample"),
    ("a forced plan with a million update threads",
     merged(GOOD, {"placement": {"plan": {"strategy": "STRATEGY_CPU_ONLY", "micro_batch_size": 8,
                                          "host_update_threads": 10**6,
                                          "layers": [{"compute": "PLACEMENT_HOST", "update": "PLACEMENT_HOST",
                                                      "parameter_home": "PARAMETER_HOME_HOST"}] * 5}}}),
     INVALID, "spec.placement.plan.host_update_threads"),
    ("a forced plan with an unknown layer placement",
     merged(GOOD, {"placement": {"plan": {"strategy": "STRATEGY_CPU_ONLY", "micro_batch_size": 8,
                                          "layers": [{"compute": 9, "update": "PLACEMENT_HOST",
                                                      "parameter_home": "PARAMETER_HOME_HOST"}] * 5}}}),
     INVALID, "spec.placement.plan.layers[0].compute"),
    ("a forced plan with no micro-batch",
     merged(GOOD, {"placement": {"plan": {"strategy": "STRATEGY_CPU_ONLY",
                                          "layers": [{"compute": "PLACEMENT_HOST", "update": "PLACEMENT_HOST",
                                                      "parameter_home": "PARAMETER_HOME_HOST"}] * 5}}}),
     INVALID, "spec.placement.plan.micro_batch_size"),
    ("negative hidden size", merged(GOOD, {"model": {"mlp": {"hidden_sizes": [-5]}}}), INVALID, "spec.model.mlp.hidden_sizes[0]"),
    ("absurd hidden size", merged(GOOD, {"model": {"mlp": {"hidden_sizes": [2**30]}}}), INVALID, "spec.model.mlp.hidden_sizes[0]"),
    ("gpt heads do not divide", {"model": {"gpt": {"n_head": 3, "d_model": 32}}, "data": {"synthetic": {"sample_shape": [8], "num_classes": 10, "tokens": True}}, "training": {"batch_size": 2, "steps": 1}}, INVALID, "spec.model.gpt.n_head"),
    ("cnn on tokens", {"model": {"cnn": {}}, "data": {"synthetic": {"sample_shape": [8], "num_classes": 10, "tokens": True}}, "training": {"batch_size": 2, "steps": 1}}, INVALID, "spec.model.cnn"),
    ("empty layer list", {"model": {"layers": {"layers": []}}, "data": GOOD["data"], "training": GOOD["training"]}, INVALID, "spec.model"),
    ("layer without kind", {"model": {"layers": {"layers": [{"name": "x"}]}}, "data": GOOD["data"], "training": GOOD["training"]}, INVALID, "spec.model.layers.layers[0]"),
    ("negative synthetic shape", merged(GOOD, {"data": {"synthetic": {"sample_shape": [-8], "num_classes": 3}}}), INVALID, "spec.data.synthetic.sample_shape[0]"),
    ("one class", merged(GOOD, {"data": {"synthetic": {"sample_shape": [8], "num_classes": 1}}}), INVALID, "spec.data.synthetic.num_classes"),
    ("path escaping data root", {"model": {"mlp": {}}, "data": {"idx": {"train_images": "../../etc/passwd", "train_labels": "x"}}, "training": GOOD["training"]}, INVALID, "spec.data.idx.train_images"),
    ("absolute path outside data root", {"model": {"mlp": {}}, "data": {"idx": {"train_images": "/etc/shadow", "train_labels": "/etc/passwd"}}, "training": GOOD["training"]}, INVALID, "outside the data root"),
    ("missing dataset file", {"model": {"mlp": {}}, "data": {"idx": {"train_images": "datasets/nope.gz", "train_labels": "datasets/nope2.gz"}}, "training": GOOD["training"]}, INVALID, "spec.data.idx.train_images"),
    ("not an IDX file", {"model": {"mlp": {}}, "data": {"idx": {"train_images": "common-licenses/GPL-3", "train_labels": "common-licenses/GPL-3"}}, "training": GOOD["training"]}, INVALID, "not an IDX"),
    ("text path escaping", {"model": {"gpt": {}}, "data": {"text": {"path": "/proc/self/environ"}}, "training": GOOD["training"]}, INVALID, "spec.data.text.path"),
    ("huge display name", merged(GOOD, {"display_name": "x" * 100000}), INVALID, "spec.display_name"),
    ("text path a directory", {"model": {"gpt": {}}, "data": {"text": {"path": "/usr/share/common-licenses"}}, "training": GOOD["training"]}, INVALID, "spec.data.text.path: '/usr/share/common-licenses' is a directory"),
    ("test fraction out of range", {"model": {"gpt": {}}, "data": {"text": {"path": "/usr/share/common-licenses/GPL-3", "test_fraction": 1.5}}, "training": GOOD["training"]}, INVALID, "spec.data.text.test_fraction"),
    ("test fraction NaN", {"model": {"gpt": {}}, "data": {"text": {"path": "/usr/share/common-licenses/GPL-3", "test_fraction": "NaN"}}, "training": GOOD["training"]}, INVALID, "spec.data.text.test_fraction"),
    ("negative synthetic samples", merged(GOOD, {"data": {"synthetic": {"train_samples": -5}}}), INVALID, "spec.data.synthetic.train_samples"),
    ("too many labels", merged(GOOD, {"labels": {"k%d" % i: "v" for i in range(100)}}), INVALID, "spec.labels"),
    ("job larger than the node", merged(GOOD, {"model": {"mlp": {"hidden_sizes": [1048576, 1048576]}}}), grpc.StatusCode.RESOURCE_EXHAUSTED, "host memory"),
]


class MalformedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Tandemd(TANDEMD, extra_flags=["--host_memory_budget=%d" % (8 << 30)]).start()
        cls.channel, cls.client = stub(cls.daemon.address)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()

    def submit(self, spec, request_id=""):
        if isinstance(spec, dict):
            spec = json_format.ParseDict(spec, job_pb2.JobSpec())
        return self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec, request_id=request_id),
                                     timeout=30)

    def expect(self, call, code, text):
        with self.assertRaises(grpc.RpcError) as e:
            call()
        self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertIn(text, e.exception.details())

    def test_corpus(self):
        self.assertGreaterEqual(len(CASES), 30)
        for name, spec, code, text in CASES:
            with self.subTest(name):
                self.expect(lambda: self.submit(spec), code, text)

    def test_hostile_requests_beyond_the_spec(self):
        self.expect(lambda: self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(), timeout=10),
                    INVALID, "spec")
        self.expect(lambda: self.submit(GOOD, request_id="x" * 1000), INVALID, "request_id")
        self.expect(lambda: self.submit(GOOD, request_id="has space"), INVALID, "request_id")
        self.expect(lambda: self.client.GetJob(tandem_service_pb2.GetJobRequest(job_id="../../etc"), timeout=10),
                    INVALID, "job_id")
        self.expect(lambda: self.client.GetJob(tandem_service_pb2.GetJobRequest(job_id="job-999999"), timeout=10),
                    grpc.StatusCode.NOT_FOUND, "job-999999")
        # Only ids as tandemd writes them: no sign, no other padding.
        for job_id in ("job-+1", "job-1", "job- 000001"):
            self.expect(lambda: self.client.GetJob(tandem_service_pb2.GetJobRequest(job_id=job_id), timeout=10),
                        INVALID, "is not a job id")
        self.expect(lambda: self.client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id=""), timeout=10),
                    INVALID, "job_id")
        self.expect(lambda: self.client.ListJobs(tandem_service_pb2.ListJobsRequest(page_size=-1), timeout=10),
                    INVALID, "page_size")
        self.expect(lambda: self.client.ListJobs(tandem_service_pb2.ListJobsRequest(page_token="garbage"), timeout=10),
                    INVALID, "page_token")
        self.expect(lambda: self.client.ListJobs(tandem_service_pb2.ListJobsRequest(states=[77]), timeout=10),
                    INVALID, "states[0]")
        self.expect(lambda: list(self.client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id="job-424242"),
                                                      timeout=10)),
                    grpc.StatusCode.NOT_FOUND, "job-424242")
        # Larger than the receive limit (16 MiB).
        huge = json_format.ParseDict(GOOD, job_pb2.JobSpec())
        huge.display_name = "y" * (20 << 20)
        self.expect(lambda: self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=huge), timeout=30),
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "")
        # Raw bytes that are not a SubmitJobRequest: the service parses its
        # requests itself (server/wire_request.h) and says what is wrong.
        raw = self.channel.unary_unary("/tandem.v1.Tandem/SubmitJob")
        with self.assertRaises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff\xff garbage", timeout=10)
        self.assertEqual(e.exception.code(), INVALID)
        self.assertIn("not a valid tandem.v1.SubmitJobRequest", e.exception.details())
        # A string field that is not UTF-8 (Python's protobuf refuses to build
        # one, so the bytes are patched): INVALID_ARGUMENT naming the field,
        # and nothing is stored. The same for a job id, a label and a watch.
        request = tandem_service_pb2.SubmitJobRequest(spec=json_format.ParseDict(GOOD, job_pb2.JobSpec()),
                                                      request_id="utf8-probe")
        request.spec.display_name = "NAMEMARK"
        patched = request.SerializeToString().replace(b"NAMEMARK", b"\xff\xfe\xc0\x80MARK")
        self.assertNotEqual(patched, request.SerializeToString())
        with self.assertRaises(grpc.RpcError) as e:
            raw(patched, timeout=10)
        self.assertEqual(e.exception.code(), INVALID)
        self.assertEqual(e.exception.details(), "spec.display_name: is not valid UTF-8 (byte 0xff at offset 0)")
        for method, message, mark, field in (
                ("GetJob", tandem_service_pb2.GetJobRequest(job_id="job-00MARK"), b"MARK", "job_id"),
                ("CancelJob", tandem_service_pb2.CancelJobRequest(job_id="job-000001", reason="MARK"), b"MARK",
                 "reason"),
                ("ListJobs", tandem_service_pb2.ListJobsRequest(labels={"team": "MARK"}), b"MARK",
                 'labels["team"]')):
            call = self.channel.unary_unary("/tandem.v1.Tandem/" + method)
            with self.assertRaises(grpc.RpcError) as e:
                call(message.SerializeToString().replace(mark, b"\xc3(xy"), timeout=10)  # same length
            self.assertEqual(e.exception.code(), INVALID, method)
            self.assertTrue(e.exception.details().startswith(field + ": is not valid UTF-8"),
                            (method, e.exception.details()))
        watch = self.channel.unary_stream("/tandem.v1.Tandem/WatchJob")
        with self.assertRaises(grpc.RpcError) as e:
            list(watch(tandem_service_pb2.WatchJobRequest(job_id="MARK").SerializeToString().replace(
                b"MARK", b"\xe2\x82ab"), timeout=10))
        self.assertEqual(e.exception.code(), INVALID)
        self.assertIn("job_id: is not valid UTF-8", e.exception.details())
        # The status says it; the daemon's log is not the client's to fill.
        self.assertNotIn("invalid UTF-8", self.daemon.logs())
        listed = self.client.ListJobs(tandem_service_pb2.ListJobsRequest(page_size=1000), timeout=10)
        self.assertNotIn("utf8-probe", [j.request_id for j in listed.jobs])

    def test_daemon_is_healthy_afterwards(self):
        self.test_corpus()
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")
        job = self.submit(GOOD).job
        self.assertEqual(job.state, job_pb2.JOB_STATE_QUEUED)


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
