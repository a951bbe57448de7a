"""Starts a real tandemd on loopback for end-to-end tests, and stops it.

Run with /usr/bin/python3 (Debian's grpcio). The daemon listens on port 0 and
reports its port through --port_file, so tests never race for ports.
"""
import os
import signal
import subprocess
import tempfile
import time


class Tandemd:
    def __init__(self, binary, extra_flags=(), state_dir=None):
        self.binary = binary
        self.extra_flags = list(extra_flags)
        self.workdir = tempfile.mkdtemp(prefix="tandemd-test-")
        self.state_dir = state_dir or os.path.join(self.workdir, "state")
        self.port_file = os.path.join(self.workdir, "port")
        self.log_path = os.path.join(self.workdir, "tandemd.log")
        self.proc = None
        self.port = None

    def start(self, timeout_seconds=30):
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--listen=127.0.0.1:0", "--port_file=" + self.port_file,
             "--metrics_listen=", "--state_dir=" + self.state_dir] + self.extra_flags,
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("tandemd exited with %d:\n%s" % (self.proc.returncode, self.logs()))
            if os.path.exists(self.port_file):
                self.port = int(open(self.port_file).read())
                return self
            time.sleep(0.05)
        raise RuntimeError("tandemd did not start in %ds:\n%s" % (timeout_seconds, self.logs()))

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def stop(self, sig=signal.SIGTERM, timeout_seconds=30):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout_seconds)
        self.proc = None
        self.log.close()
        return code

    def logs(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""
