"""Python client for tandemd's gRPC API (tandem.v1.Tandem).

    from tandem_client import TandemClient

    with TandemClient("127.0.0.1:50051") as client:
        job = client.submit("clients/examples/fmnist-mlp.yaml")
        state = client.watch(job.id, lambda event: print(event.sequence))

Runs on Debian's python3-grpcio and python3-protobuf (/usr/bin/python3); the
message and stub modules are generated at build time (see _stubs.py) and
re-exported here as job_pb2, node_pb2, plan_pb2, profile_pb2 and
tandem_service_pb2.
"""
from tandem_client._stubs import job_pb2, node_pb2, plan_pb2, profile_pb2, tandem_service_pb2
from tandem_client.client import TERMINAL_STATES, TandemClient, TandemError, load_job_spec

__all__ = [
    "TandemClient",
    "TandemError",
    "TERMINAL_STATES",
    "load_job_spec",
    "job_pb2",
    "node_pb2",
    "plan_pb2",
    "profile_pb2",
    "tandem_service_pb2",
]
