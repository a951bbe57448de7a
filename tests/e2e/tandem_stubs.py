"""Tandem's generated Python stubs (from //proto:tandem_py_proto) and helpers
shared by the end-to-end tests."""
import os
import sys
import time

# The stubs live under <runfiles>/proto/tandem/v1/; their imports are
# "tandem.v1.x_pb2", so <runfiles>/proto goes on the path.
_RUNFILES = os.environ.get("TEST_SRCDIR")
for root in ([os.path.join(_RUNFILES, "tandem", "proto")] if _RUNFILES else []) + [
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bazel-bin", "proto")]:
    if os.path.isdir(os.path.join(root, "tandem", "v1")):
        sys.path.insert(0, root)
        break

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from tandem.v1 import (checkpoint_pb2, job_pb2, plan_pb2, tandem_service_pb2,  # noqa: E402,F401
                       tandem_service_pb2_grpc)

FASHION = "/usr/share/datasets/fashion-mnist/"


def stub(address, token=None):
    # As the tandem CLI (clients/cli/rpc_client.cc): a PlanModel answer with
    # every strategy's timeline can pass gRPC's default 4 MiB.
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
    return channel, tandem_service_pb2_grpc.TandemStub(channel)


def metadata(token):
    return (("authorization", "Bearer " + token),) if token else None


def spec_from_dict(d):
    return json_format.ParseDict(d, job_pb2.JobSpec())


def synthetic_spec(steps=3, batch=8, **extra):
    d = {
        "model": {"mlp": {"hidden_sizes": [16]}},
        "data": {"synthetic": {"sample_shape": [8], "num_classes": 3, "train_samples": 64,
                               "test_samples": 16}},
        "training": {"batch_size": batch, "steps": steps, "checkpoint_disabled": True},
    }
    d.update(extra)
    return spec_from_dict(d)


def huge_plan_spec(layers):
    """A chain of `layers` layers (64-wide linears and ReLUs) at batch 65,536 on
    an 8 MB emulated accelerator: what makes the planner work hardest (every
    micro-batch size down to its bound, every strategy's smallest budget)."""
    chain = [{"linear": {"out_features": 64}} if i % 2 == 0 else
             {"activation": {"activation": "ACTIVATION_RELU"}} for i in range(layers)]
    return spec_from_dict({
        "model": {"layers": {"layers": chain}},
        "data": {"synthetic": {"sample_shape": [64], "num_classes": 10}},
        "training": {"batch_size": 65536, "steps": 1},
        "placement": {"strategy": "STRATEGY_REUSE_DISTANCE",
                      "accelerator": "ACCELERATOR_KIND_EMULATED"},
        "resources": {"accelerator_memory_bytes": 8000000},
    })


def diverging_spec():
    """A job that fails while it runs, for tests of failure paths: SGD at
    learning rate 10 (the largest allowed) with momentum through eight layers
    drives the loss to NaN after 8 steps (the trainer then fails the job with
    "training diverged")."""
    return spec_from_dict({
        "model": {"mlp": {"hidden_sizes": [16] * 8}},
        "data": {"synthetic": {"sample_shape": [8], "num_classes": 3}},
        "optimizer": {"kind": "OPTIMIZER_KIND_SGD", "learning_rate": 10, "momentum": 0.99},
        "training": {"batch_size": 8, "steps": 40, "checkpoint_disabled": True},
        # In bf16 (auto on a CPU that computes it natively) it trains on.
        "precision": "PRECISION_FP32",
    })


def all_healthy(peers):
    """Whether GetNode's peers are listed and every one is healthy (a daemon
    lists its peers unhealthy until its first check of them)."""
    return len(peers) > 0 and all(p.healthy for p in peers)


def wait_for_state(client, job_id, states, timeout=300, token=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.GetJob(tandem_service_pb2.GetJobRequest(job_id=job_id), timeout=10,
                            metadata=metadata(token))
        if job.state in states:
            return job
        time.sleep(0.1)
    raise AssertionError("%s did not reach %s in %ds; last: %s" % (job_id, states, timeout, job))
