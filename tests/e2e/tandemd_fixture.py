"""Starts a real tandemd on loopback for end-to-end tests, and stops it.

Run with /usr/bin/python3 (Debian's grpcio). The daemon listens on port 0 and
reports its gRPC and metrics ports through files, so tests never race for ports.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time


class Tandemd:
    def __init__(self, binary, extra_flags=(), state_dir=None, data_root="/usr/share",
                 metrics=False, prefix=()):
        self.binary = binary
        # Runs the daemon under this command, e.g. ["ip", "netns", "exec", NS]
        # (which execs it, so the process is tandemd's own).
        self.prefix = list(prefix)
        self.extra_flags = list(extra_flags)
        self.workdir = tempfile.mkdtemp(prefix="tandemd-test-", dir=os.environ.get("TEST_TMPDIR"))
        self.state_dir = state_dir or os.path.join(self.workdir, "state")
        self.data_root = data_root
        self.metrics = metrics
        self.port_file = os.path.join(self.workdir, "port")
        self.metrics_port_file = os.path.join(self.workdir, "metrics_port")
        self.log_path = os.path.join(self.workdir, "tandemd.log")
        self.proc = None
        self.port = None
        self.metrics_port = None

    def start(self, timeout_seconds=60):
        for f in (self.port_file, self.metrics_port_file):
            if os.path.exists(f):
                os.remove(f)
        self.log = open(self.log_path, "ab")
        flags = ["--listen=127.0.0.1:0", "--port_file=" + self.port_file,
                 "--state_dir=" + self.state_dir, "--data_root=" + self.data_root]
        if self.metrics:
            flags += ["--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + self.metrics_port_file]
        else:
            flags += ["--metrics_listen="]
        self.proc = subprocess.Popen(self.prefix + [self.binary] + flags + self.extra_flags,
                                     stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("tandemd exited with %d:\n%s" % (self.proc.returncode, self.logs()))
            if os.path.exists(self.port_file) and (
                    not self.metrics or os.path.exists(self.metrics_port_file)):
                self.port = int(open(self.port_file).read())
                if self.metrics:
                    self.metrics_port = int(open(self.metrics_port_file).read())
                return self
            time.sleep(0.05)
        raise RuntimeError("tandemd did not start in %ds:\n%s" % (timeout_seconds, self.logs()))

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def stop(self, sig=signal.SIGTERM, timeout_seconds=120):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout_seconds)
        self.proc = None
        self.log.close()
        return code

    def kill9(self):
        return self.stop(signal.SIGKILL)

    def logs(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""

    def cleanup(self):
        shutil.rmtree(self.workdir, ignore_errors=True)
