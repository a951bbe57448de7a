#include "runtime/core/thread_pool.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"

namespace tandem {

ThreadPool::ThreadPool(int threads, std::string name) : name_(std::move(name)) {
  if (threads < 1) threads = 1;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void ThreadPool::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ThreadPool* p)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->queue_.empty() && p->running_ == 0; },
      this));
}

void ThreadPool::WorkerLoop(int index) {
  // Linux thread names are at most 15 characters.
  pthread_setname_np(pthread_self(), absl::StrCat(name_, "/", index).substr(0, 15).c_str());
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // Stopping with nothing left to run.
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace tandem
