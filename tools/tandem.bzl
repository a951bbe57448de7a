"""Compiler flags shared by every Tandem target."""

# OpenMP is on everywhere: oneDNN runs on it, and our intra-op loops use the same
# runtime so the two never compete for the cores.
TANDEM_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",
    "-fopenmp",
]

TANDEM_LINKOPTS = ["-fopenmp"]

def tandem_cc_library(name, copts = [], linkopts = [], **kwargs):
    native.cc_library(
        name = name,
        copts = TANDEM_COPTS + copts,
        linkopts = TANDEM_LINKOPTS + linkopts,
        **kwargs
    )

def tandem_cc_binary(name, copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = TANDEM_COPTS + copts,
        linkopts = TANDEM_LINKOPTS + linkopts,
        **kwargs
    )

def tandem_cc_test(name, copts = [], linkopts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest binary; links gtest_main unless the test brings its own main."""
    native.cc_test(
        name = name,
        copts = TANDEM_COPTS + copts,
        linkopts = TANDEM_LINKOPTS + linkopts,
        deps = deps + ["//third_party/system:gmock"],
        size = size,
        **kwargs
    )
