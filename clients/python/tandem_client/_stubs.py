"""Imports Tandem's generated Python stubs (//proto:tandem_py_proto).

The stubs are generated at build time by protoc and grpc_python_plugin, into
<root>/tandem/v1/*_pb2.py; their own imports are "tandem.v1.x_pb2", so <root>
must be on sys.path. Roots tried, first match wins:

  1. $TANDEM_PROTO_PATH;
  2. the Bazel runfiles of the running target ($RUNFILES_DIR, $TEST_SRCDIR, or
     argv[0].runfiles), at <runfiles>/tandem/proto;
  3. bazel-bin/proto of the source tree this package sits in (for running the
     examples after `bazel build //proto:tandem_py_proto`);
  4. whatever is importable already (stubs installed elsewhere).
"""
import os
import sys


def _candidate_roots():
    if os.environ.get("TANDEM_PROTO_PATH"):
        yield os.environ["TANDEM_PROTO_PATH"]
    runfiles = [os.environ.get("RUNFILES_DIR"), os.environ.get("TEST_SRCDIR")]
    if sys.argv and sys.argv[0]:
        runfiles.append(os.path.abspath(sys.argv[0]) + ".runfiles")
    for r in runfiles:
        if r:
            yield os.path.join(r, "tandem", "proto")
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.normpath(os.path.join(here, "..", "..", "..", "bazel-bin", "proto"))


def _add_stub_root():
    for root in _candidate_roots():
        if os.path.isfile(os.path.join(root, "tandem", "v1", "tandem_service_pb2_grpc.py")):
            if root not in sys.path:
                sys.path.insert(0, root)
            return


_add_stub_root()

try:
    from tandem.v1 import (job_pb2, node_pb2, plan_pb2, profile_pb2,  # noqa: E402,F401
                           tandem_service_pb2, tandem_service_pb2_grpc)
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "Tandem's Python stubs were not found. Build them with "
        "`bazel build //proto:tandem_py_proto` (they land in bazel-bin/proto) or set "
        "TANDEM_PROTO_PATH to the directory holding tandem/v1/*_pb2.py: %s" % e) from e
