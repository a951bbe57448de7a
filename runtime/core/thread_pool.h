// A fixed set of worker threads running queued tasks in FIFO order: the data
// loader's prefetch, the executor's CPU update workers, background I/O.
// Intra-op parallelism (inside one kernel) uses OpenMP instead, the runtime
// oneDNN itself runs on, so the two never fight over cores. Thread-safe.
#ifndef TANDEM_RUNTIME_CORE_THREAD_POOL_H_
#define TANDEM_RUNTIME_CORE_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // `threads` >= 1 workers named `name` (visible in top/perf as "name/0", ...).
  ThreadPool(int threads, std::string name);
  // Runs the tasks already queued, then joins.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  // Blocks until the queue is empty and no task is running.
  void WaitIdle();
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop(int index);

  const std::string name_;
  // std::mutex rather than absl::Mutex: Debian's Abseil is not built for
  // ThreadSanitizer, which would see neither its locking nor the conditions
  // it evaluates on the unlocking thread. queue_, running_ and stopping_ are
  // guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_THREAD_POOL_H_
