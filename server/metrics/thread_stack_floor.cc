// civetweb, the HTTP server under prometheus-cpp's exposer, starts each of its
// threads with a fixed 100 KiB stack (pthread_attr_setstacksize(0x19000)).
// glibc carves a thread's static TLS out of its stack, and in a binary linked
// with CUDA that TLS alone is larger (cuBLASLt holds 94 KiB of it), so every
// civetweb thread fails to start ("Cannot create threads", EINVAL) and
// /metrics cannot be served. This definition, linked into the executable,
// takes precedence over glibc's for every caller in the process and raises a
// requested stack below kStackFloorBytes to that floor; larger requests pass
// unchanged. Thread-safe.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace {

constexpr size_t kStackFloorBytes = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize GlibcSetStackSize() {
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_bytes) {
  const SetStackSize glibc = GlibcSetStackSize();
  // Only a static link has no next definition; say so rather than crash.
  if (glibc == nullptr) return ENOSYS;
  return glibc(attr, std::max(stack_bytes, kStackFloorBytes));
}
