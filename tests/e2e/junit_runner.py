"""unittest.main() that also writes JUnit XML to $XML_OUTPUT_FILE, where Bazel
looks for per-case results, so the totals of `make test` count Python cases."""
import os
import sys
import time
import unittest
import xml.etree.ElementTree as ET


class _Recorder(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []
        self._start = 0.0

    def startTest(self, test):
        self._start = time.time()
        super().startTest(test)

    def _record(self, test, kind, detail=""):
        self.cases.append((test, kind, detail, time.time() - self._start))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def _write_xml(result, path):
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name="python", tests=str(len(result.cases)))
    for test, kind, detail, seconds in result.cases:
        case = ET.SubElement(suite, "testcase", classname=type(test).__name__,
                             # A setUpClass error is recorded against a holder
                             # with a description instead of a method.
                             name=getattr(test, "_testMethodName", str(test)),
                             time="%.3f" % seconds)
        if kind in ("failure", "error", "skipped"):
            ET.SubElement(case, kind, message=detail[:200]).text = detail
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def main():
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=2)
    program = unittest.main(testRunner=runner, exit=False, argv=sys.argv)
    path = os.environ.get("XML_OUTPUT_FILE")
    if path:
        _write_xml(program.result, path)
    sys.exit(0 if program.result.wasSuccessful() else 1)
