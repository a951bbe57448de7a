"""With --auth_token_file, every Tandem RPC needs the bearer token; health does
not. Optional TLS serves the same API over an encrypted channel."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc

import junit_runner
from repo_files import free_port
from tandem_stubs import metadata, synthetic_spec, tandem_service_pb2, tandem_service_pb2_grpc
from tandemd_fixture import Tandemd

TANDEMD = TANDEM = None
TOKEN = "e2e-token-0123456789abcdef"


class AuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        token_file = os.path.join(cls.dir, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(token_file, 0o600)
        cls.daemon = Tandemd(TANDEMD, extra_flags=["--auth_token_file=" + token_file]).start()
        cls.channel = grpc.insecure_channel(cls.daemon.address)
        cls.client = tandem_service_pb2_grpc.TandemStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def calls(self):
        return [
            lambda md: self.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10, metadata=md),
            lambda md: self.client.ListJobs(tandem_service_pb2.ListJobsRequest(), timeout=10, metadata=md),
            lambda md: self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec()),
                                             timeout=30, metadata=md),
            lambda md: self.client.GetJob(tandem_service_pb2.GetJobRequest(job_id="job-000001"), timeout=10,
                                          metadata=md),
            lambda md: self.client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id="job-000001"),
                                             timeout=10, metadata=md),
            lambda md: list(self.client.WatchJob(tandem_service_pb2.WatchJobRequest(job_id="job-000001"),
                                                 timeout=10, metadata=md)),
            lambda md: self.client.PlanModel(tandem_service_pb2.PlanModelRequest(), timeout=10, metadata=md),
            lambda md: self.client.ProfileModel(tandem_service_pb2.ProfileModelRequest(), timeout=10,
                                                metadata=md),
        ]

    def test_without_token_or_with_a_wrong_one_every_rpc_is_unauthenticated(self):
        for i, call in enumerate(self.calls()):
            for md in (None, metadata("wrong-token"), (("authorization", "Basic " + TOKEN),)):
                with self.subTest(call=i, metadata=md):
                    with self.assertRaises(grpc.RpcError) as e:
                        call(md)
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)

    def test_with_the_token_calls_succeed(self):
        node = self.client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10, metadata=metadata(TOKEN))
        self.assertTrue(node.accepting_jobs)
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec()), timeout=30,
                                    metadata=metadata(TOKEN)).job
        self.assertTrue(job.id.startswith("job-"))
        result = subprocess.run([TANDEM, "--server=" + self.daemon.address, "--token=" + TOKEN, "status",
                                 job.id], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        result = subprocess.run([TANDEM, "--server=" + self.daemon.address, "status", job.id],
                                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("UNAUTHENTICATED", result.stderr)

    def test_health_needs_no_token(self):
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")

    def test_server_reflection_does_not_answer_without_the_token(self):
        # ServerReflectionRequest{list_services: ""}: with a token required,
        # reflection (which cannot check it) is not served at all.
        info = self.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        with self.assertRaises(grpc.RpcError) as caught:
            list(info(iter([b"\x3a\x00"]), timeout=10))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertIn("server reflection off", self.daemon.logs())


class TlsTest(unittest.TestCase):
    def test_tls_serves_the_api(self):
        # tools/install-deps.sh installs openssl with the test packages: missing
        # is a broken set-up, not a reason to skip.
        self.assertIsNotNone(shutil.which("openssl"), "openssl is not installed: run tools/install-deps.sh")
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
                        cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
        daemon = Tandemd(TANDEMD, extra_flags=["--tls_cert=" + cert, "--tls_key=" + key]).start()
        try:
            creds = grpc.ssl_channel_credentials(root_certificates=open(cert, "rb").read())
            with grpc.secure_channel(daemon.address, creds) as channel:
                client = tandem_service_pb2_grpc.TandemStub(channel)
                self.assertTrue(client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10).accepting_jobs)
            with grpc.insecure_channel(daemon.address) as plain:
                with self.assertRaises(grpc.RpcError):
                    tandem_service_pb2_grpc.TandemStub(plain).GetNode(tandem_service_pb2.GetNodeRequest(),
                                                                      timeout=5)
            # The CLI reaches it given the roots to check its certificate
            # against, and not over plaintext.
            cli = [TANDEM, "--server=" + daemon.address, "node"]
            ok = subprocess.run(cli[:1] + ["--tls_ca=" + cert] + cli[1:], capture_output=True,
                                text=True, timeout=60)
            self.assertEqual(ok.returncode, 0, ok.stderr)
            self.assertIn("hostname", ok.stdout)
            plain_cli = subprocess.run(cli, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(plain_cli.returncode, 0)
        finally:
            self.assertEqual(daemon.stop(), 0, daemon.logs())
            daemon.cleanup()
            shutil.rmtree(d, ignore_errors=True)

    def test_unreadable_peer_tls_roots_stop_the_daemon(self):
        # Empty roots would make gRPC trust the system's for the peers: tandemd
        # refuses to start instead, naming the flag.
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
                        cert, "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
        result = subprocess.run(
            [TANDEMD, "--state_dir=" + os.path.join(d, "state"), "--listen=127.0.0.1:%d" % free_port(),
             "--metrics_listen=", "--peers=127.0.0.1:1", "--tls_cert=" + cert, "--tls_key=" + key,
             "--peer_ca_file=" + os.path.join(d, "missing-ca.pem")],
            capture_output=True, text=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--peer_ca_file: cannot read", result.stderr)


if __name__ == "__main__":
    TANDEMD, TANDEM = sys.argv.pop(1), sys.argv.pop(1)
    junit_runner.main()
