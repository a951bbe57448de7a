"""CUDA sources through nvcc genrules, against the toolkit @local_cuda detected.

tandem_cuda_library compiles each .cu with nvcc into an object file and wraps the
objects in a cc_library with the CUDA runtime linkage. When no toolkit was found
at build time it is an empty library, so dependents build unchanged; C++ code
that uses it checks TANDEM_HAVE_CUDA, which only the real library defines.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "NVCC")

# Hopper (H100/H200) natively, Ampere natively, and PTX for anything newer.
CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def tandem_cuda_library(name, srcs, hdrs = [], deps = [], extra_hdrs = [], visibility = None):
    """extra_hdrs: headers of other packages that the .cu files include (nvcc inputs)."""
    if not CUDA_AVAILABLE:
        native.cc_library(name = name, hdrs = hdrs, visibility = visibility)
        return
    objs = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs + extra_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-std=c++17 -O3 -Xcompiler -fPIC",
                " ".join(CUDA_ARCH_FLAGS),
                "-I. -I$(GENDIR)",
                "-c $(location {}) -o $@".format(src),
            ]),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps,
        linkstatic = 1,
        alwayslink = 1,
        visibility = visibility,
    )
