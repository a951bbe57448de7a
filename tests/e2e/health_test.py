"""A gRPC client that is not ours (Debian's python3-grpcio, raw bytes, no Tandem
stubs) asks tandemd's standard health service and gets SERVING, lists its
services through server reflection, and SIGTERM exits 0."""
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

    def test_the_job_service_is_serving_when_jobs_are_accepted(self):
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        name = b"tandem.v1.Tandem"
        self.assertEqual(check(b"\x0a" + bytes([len(name)]) + name, timeout=10), SERVING)

    def test_unknown_service_is_not_found(self):
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        # HealthCheckRequest{service: "no.such.Service"}
        name = b"no.such.Service"
        with self.assertRaises(grpc.RpcError) as caught:
            check(b"\x0a" + bytes([len(name)]) + name, timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_server_reflection_lists_the_services(self):
        # grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, a
        # bidirectional stream; ServerReflectionRequest{list_services: ""} is
        # field 7 (length-delimited), empty.
        info = self.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        responses = list(info(iter([b"\x3a\x00"]), timeout=10))
        self.assertEqual(len(responses), 1)
        # ServerReflectionResponse.list_services_response is field 6; its
        # ServiceResponse names are plain strings inside it.
        for name in (b"tandem.v1.Tandem", b"grpc.health.v1.Health"):
            self.assertIn(name, responses[0])

    def test_sigterm_exits_zero(self):
        self.assertEqual(self.daemon.stop(), 0)
        self.assertIn("shutting down", self.daemon.logs())


class BadFlagsTest(unittest.TestCase):
    """A flag's bad value stops tandemd at start, naming the flag, instead of
    being taken for its default (or a port file nobody can read)."""

    def run_daemon(self, *flags):
        import os
        import subprocess
        import tempfile
        work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        return subprocess.run([TANDEMD, "--state_dir=" + os.path.join(work, "state"),
                               "--listen=127.0.0.1:0", "--metrics_listen="] + list(flags),
                              capture_output=True, text=True, timeout=120)

    def test_a_negative_budget_or_limit_is_refused(self):
        for flag, text in (("--host_memory_budget=-5", "--host_memory_budget must be >= 0"),
                           ("--max_running_jobs=-3", "--max_running_jobs must be >= -1"),
                           ("--state_min_free_bytes=-1", "--state_min_free_bytes must be >= 0")):
            result = self.run_daemon(flag)
            self.assertNotEqual(result.returncode, 0, flag)
            self.assertIn(text, result.stderr)

    def test_a_port_another_tandemd_listens_on_is_refused(self):
        daemon = Tandemd(TANDEMD).start()
        try:
            result = self.run_daemon("--listen=" + daemon.address)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("cannot listen on " + daemon.address, result.stderr)
        finally:
            daemon.stop()
            daemon.cleanup()

    def test_an_unwritable_port_file_is_refused(self):
        result = self.run_daemon("--port_file=/nonexistent-dir/port")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--port_file: cannot write", result.stderr)


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
