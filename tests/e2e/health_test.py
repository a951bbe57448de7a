"""A gRPC client that is not ours (Debian's python3-grpcio, raw bytes, no Tandem
stubs) asks tandemd's standard health service and gets SERVING; an RPC whose
issue has not landed answers UNIMPLEMENTED with a message; SIGTERM exits 0."""
import sys
import unittest

import junit_runner

import grpc

from tandemd_fixture import Tandemd

# grpc.health.v1.HealthCheckResponse{status: SERVING} is field 1 (varint) = 1.
SERVING = b"\x08\x01"


class HealthTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Tandemd(TANDEMD).start()
        self.channel = grpc.insecure_channel(self.daemon.address)

    def tearDown(self):
        self.channel.close()
        self.daemon.stop()

    def test_overall_health_is_serving(self):
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        self.assertEqual(check(b"", timeout=10), SERVING)

    def test_unknown_service_is_not_found(self):
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        # HealthCheckRequest{service: "no.such.Service"}
        name = b"no.such.Service"
        with self.assertRaises(grpc.RpcError) as caught:
            check(b"\x0a" + bytes([len(name)]) + name, timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_sigterm_exits_zero(self):
        self.assertEqual(self.daemon.stop(), 0)
        self.assertIn("shutting down", self.daemon.logs())


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
