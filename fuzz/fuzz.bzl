"""Fuzz targets that are regression tests in the default build."""

load("//tools:tandem.bzl", "TANDEM_COPTS", "TANDEM_LINKOPTS")

def tandem_fuzz_test(name, srcs, deps, corpus):
    """A libFuzzer target, `name`, whose corpus is `corpus/<corpus>/`.

    In the default (GCC) build it links fuzz/replay_main.cc and `bazel test`
    runs every corpus input through it once. With --config=fuzz (clang, see
    tools/fuzz.sh) it links libFuzzer, and the same test command replays the
    corpus (-runs=0); tools/fuzz.sh runs it to fuzz.
    """
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = TANDEM_COPTS,
        linkopts = TANDEM_LINKOPTS + select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        data = native.glob(["corpus/%s/**" % corpus]),
        args = ["-runs=0", "fuzz/corpus/%s" % corpus],
        size = "small",
    )
