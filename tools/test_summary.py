#!/usr/bin/python3
"""Totals over every test case Bazel ran, in GoogleTest's style.

Reads the JUnit XML files under bazel-testlogs (GoogleTest writes one per test
binary; Bazel writes one for every other test) and prints the totals, so `make
test` ends with a test count rather than a target count. Exits 1 when any test
case failed or any target has no result.
"""
import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def current_targets():
    """Test targets that exist now (bazel-testlogs keeps results of deleted ones)."""
    try:
        out = subprocess.run(["bazel", "query", "tests(//...)", "--output=label"],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {label[2:].replace(":", "/") for label in out.split()}


def result_files(root, extras):
    """(label, path) of every result: the main logs, then extra configurations'
    (e.g. ThreadSanitizer), labelled with their directory."""
    for path in sorted(glob.glob(os.path.join(root, "**", "test.xml"), recursive=True)):
        yield os.path.relpath(os.path.dirname(path), root), path, True
    for extra in extras:
        for path in sorted(glob.glob(os.path.join(extra, "**", "test.xml"), recursive=True)):
            yield "%s (%s)" % (os.path.relpath(os.path.dirname(path), extra), extra), path, False


def main():
    root = "bazel-testlogs"
    extras = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--extra=")]
    targets = passed = failed = skipped = 0
    failures = []
    wanted = current_targets()
    for target, path, main_config in result_files(root, extras):
        if main_config and wanted is not None and target not in wanted:
            continue
        targets += 1
        try:
            tree = ET.parse(path)
        except ET.ParseError as e:
            failed += 1
            failures.append("%s (unreadable result: %s)" % (target, e))
            continue
        cases = tree.getroot().iter("testcase")
        for case in cases:
            name = "%s: %s.%s" % (target, case.get("classname", ""), case.get("name", ""))
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failures.append(name)
            elif case.find("skipped") is not None or case.get("result") == "skipped" or \
                    case.get("status") == "notrun":
                skipped += 1
            else:
                passed += 1
    total = passed + failed + skipped
    print("[==========] %d tests from %d test targets ran." % (total, targets))
    print("[  PASSED  ] %d tests." % passed)
    if skipped:
        print("[  SKIPPED ] %d tests (need a GPU or a tool this machine lacks)." % skipped)
    if failed:
        print("[  FAILED  ] %d tests, listed below:" % failed)
        for f in failures:
            print("[  FAILED  ] %s" % f)
    return 1 if failed or targets == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
