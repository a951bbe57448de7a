"""The node profile (issue 15): tandemd measures its devices and links at
start-up and caches the result under its state directory, keyed by the
hardware fingerprint. A restart reuses the cache; a damaged cache, or one
measured on other hardware, is ignored with a log line and measured again,
and the daemon serves either way. GetNode reports the profile and where it
came from. Start-up times are printed."""
import os
import sys
import tempfile
import time
import unittest

import junit_runner
from tandem_stubs import stub, tandem_service_pb2
from tandem.v1 import profile_pb2
from tandemd_fixture import Tandemd

TANDEMD = None


class NodeProfileTest(unittest.TestCase):
    def start(self, state):
        begin = time.perf_counter()
        daemon = Tandemd(TANDEMD, state_dir=state).start()
        took = time.perf_counter() - begin
        channel, client = stub(daemon.address)
        node = client.GetNode(tandem_service_pb2.GetNodeRequest(), timeout=10)
        channel.close()
        self.assertEqual(daemon.stop(), 0, daemon.logs())
        return node, daemon.logs(), took

    def test_measured_once_then_cached_and_bad_caches_are_ignored(self):
        state = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cache = os.path.join(state, "node_profile.pb")

        first, logs, took = self.start(state)
        self.assertIn("node profile measured at start-up in", logs)
        self.assertTrue(first.profile_source.startswith("measured at start-up"), first.profile_source)
        cpu = [d for d in first.profile.devices if d.kind == profile_pb2.DEVICE_KIND_CPU]
        self.assertEqual(len(cpu), 1)
        self.assertGreater(cpu[0].gemm_flops_per_second, 0)
        self.assertGreater(cpu[0].memory_bandwidth_bytes_per_second, 0)
        self.assertGreater(first.profile.host_memcpy_bytes_per_second, 0)
        self.assertGreater(first.profile.host_adam_parameters_per_second, 0)
        self.assertTrue(os.path.exists(cache))
        print("first start (measures): %.2f s to serving; the profile took %.2f s: GEMM %.0f "
              "GFLOP/s, triad %.1f GB/s, memcpy %.1f GB/s, Adam %.0f M parameters/s" % (
                  took, first.profile.measure_seconds, cpu[0].gemm_flops_per_second / 1e9,
                  cpu[0].memory_bandwidth_bytes_per_second / 1e9,
                  first.profile.host_memcpy_bytes_per_second / 1e9,
                  first.profile.host_adam_parameters_per_second / 1e6))

        second, logs, took = self.start(state)
        self.assertIn("node profile cached in", logs)
        self.assertTrue(second.profile_source.startswith("cached"), second.profile_source)
        self.assertEqual(second.profile, first.profile)
        print("second start (cached): %.2f s to serving" % took)

        with open(cache, "wb") as f:
            f.write(b"\x0a\xff\xff\xff not a profile")
        third, logs, _ = self.start(state)
        self.assertIn("is damaged", logs)
        self.assertTrue(third.profile_source.startswith("measured"), third.profile_source)

        foreign = profile_pb2.NodeProfile(fingerprint="node-profile v1; cpu: another CPU (96 threads)",
                                          host_memcpy_bytes_per_second=1e15)
        foreign.devices.add(name="another CPU", kind=profile_pb2.DEVICE_KIND_CPU)
        with open(cache, "wb") as f:
            f.write(foreign.SerializeToString())
        fourth, logs, _ = self.start(state)
        self.assertIn("was measured on other hardware", logs)
        self.assertLess(fourth.profile.host_memcpy_bytes_per_second, 1e15)


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    junit_runner.main()
