"""A real Prometheus (Debian's) scrapes tandemd; PromQL returns the job's
step-time series. promtool accepts the exposition."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import grpc

import junit_runner
from tandem_stubs import job_pb2, stub, synthetic_spec, tandem_service_pb2, wait_for_state
from tandemd_fixture import Tandemd

TANDEMD = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Tandemd(TANDEMD, metrics=True).start()
        cls.channel, cls.client = stub(cls.daemon.address)
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def metrics_text(self):
        return get("http://127.0.0.1:%d/metrics" % self.daemon.metrics_port)

    def test_promtool_accepts_the_exposition(self):
        job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=synthetic_spec(steps=5)),
                                    timeout=30).job
        wait_for_state(self.client, job.id, [job_pb2.JOB_STATE_SUCCEEDED])
        text = self.metrics_text()
        for name in ("tandem_build_info", "tandem_rpc_requests_total", "tandem_rpc_duration_seconds_bucket",
                     "tandem_jobs{", "tandem_job_queue_length", "tandem_job_step_seconds",
                     "tandem_job_loss", "tandem_job_samples_per_second", "tandem_job_progress_ratio",
                     "tandem_device_memory_bytes", "tandem_process_cpu_seconds_total",
                     "tandem_process_resident_memory_bytes"):
            self.assertIn(name, text)
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertEqual(check.stdout.strip() + check.stderr.strip(), "", "promtool found problems")

    def test_prometheus_scrapes_the_job_step_time(self):
        port = free_port()
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: tandemd
    static_configs:
      - targets: ["127.0.0.1:%d"]
""" % self.daemon.metrics_port)
        prometheus = subprocess.Popen(
            ["prometheus", "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(self.dir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            spec = synthetic_spec(steps=2000)
            job = self.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
            query = 'tandem_job_step_seconds{job_id="%s"}' % job.id
            deadline, result = time.time() + 120, []
            while time.time() < deadline:
                try:
                    answer = json.loads(get("http://127.0.0.1:%d/api/v1/query?query=%s" % (
                        port, urllib.parse.quote(query))))
                    result = answer["data"]["result"]
                    if result and float(result[0]["value"][1]) > 0:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.5)
            self.assertTrue(result, "no step-time series for %s" % job.id)
            self.assertEqual(result[0]["metric"]["job"], "tandemd")
            self.assertGreater(float(result[0]["value"][1]), 0)
            # And a histogram-based rate over the series works too.
            rate = json.loads(get("http://127.0.0.1:%d/api/v1/query?query=%s" % (port, urllib.parse.quote(
                'rate(tandem_job_step_duration_seconds_count{job_id="%s"}[10s])' % job.id))))
            self.assertEqual(rate["status"], "success")
            try:
                self.client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id=job.id), timeout=10)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)  # It already ended.
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
