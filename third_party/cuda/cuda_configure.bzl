"""Detects the CUDA toolkit at build time and describes it as @local_cuda.

The toolkit is looked up at $CUDA_PATH, else /usr/local/cuda. It counts as found
when bin/nvcc and include/cuda_runtime.h exist. The generated repository holds:

  //:defs.bzl    CUDA_AVAILABLE, NVCC, if_cuda(yes, no)
  //:cuda        headers plus cudart, cuBLAS and cuDNN linkage (empty when absent)
  //:nccl        NCCL linkage (empty when absent)
  //:cupti_headers  CUPTI headers only: CUPTI itself is dlopen'ed at run time

When the toolkit is absent every target above is an empty library, so the rest
of the tree builds unchanged and the CUDA sources are left out by if_cuda().
"""

def _find_cuda(rctx):
    path = rctx.os.environ.get("CUDA_PATH", "")
    if not path:
        path = "/usr/local/cuda"
    root = rctx.path(path)
    if not root.get_child("bin").get_child("nvcc").exists:
        return None
    if not root.get_child("include").get_child("cuda_runtime.h").exists:
        return None
    return root

def _cupti_include(root):
    for candidate in [root.get_child("extras").get_child("CUPTI").get_child("include"), root.get_child("include")]:
        if candidate.get_child("cupti.h").exists:
            return candidate
    return None

def _cuda_configure_impl(rctx):
    root = _find_cuda(rctx)
    if root == None:
        rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cuda")
cc_library(name = "nccl")
cc_library(name = "cupti_headers")
""")
        rctx.file("defs.bzl", """
CUDA_AVAILABLE = False
NVCC = ""
CUDA_ROOT = ""

def if_cuda(yes, no = []):
    return no
""")
        return

    rctx.symlink(root.get_child("include"), "include")
    cupti = _cupti_include(root)
    cupti_rule = "cc_library(name = \"cupti_headers\")"
    if cupti != None:
        rctx.symlink(cupti, "cupti_include")
        cupti_rule = """cc_library(
    name = "cupti_headers",
    hdrs = glob(["cupti_include/**/*.h"]),
    includes = ["cupti_include"],
)"""
    lib = str(root.get_child("lib64"))
    rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl"]),
    includes = ["include"],
    defines = ["TANDEM_HAVE_CUDA=1"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-lcudart",
        "-lcublas",
        "-lcudnn",
        "-ldl",
    ],
)

# NCCL, shipped with the toolkit: collectives on device memory.
cc_library(
    name = "nccl",
    deps = [":cuda"],
    linkopts = ["-L{lib}", "-lnccl"],
)

{cupti_rule}
""".format(lib = lib, cupti_rule = cupti_rule))
    rctx.file("defs.bzl", """
CUDA_AVAILABLE = True
NVCC = "{nvcc}"
CUDA_ROOT = "{root}"

def if_cuda(yes, no = []):
    return yes
""".format(nvcc = str(root.get_child("bin").get_child("nvcc")), root = str(root)))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
