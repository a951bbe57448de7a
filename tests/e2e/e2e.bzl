"""A Python end-to-end test run by Debian's /usr/bin/python3 (see run_py_test.sh)."""

def tandem_e2e_test(name, args = [], data = [], size = "medium", **kwargs):
    native.sh_test(
        name = name,
        size = size,
        srcs = ["run_py_test.sh"],
        args = ["$(location %s.py)" % name] + args,
        data = data + [name + ".py"],
        **kwargs
    )
