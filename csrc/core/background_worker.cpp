#include "core/background_worker.h"

#include <unistd.h>

#include <utility>

namespace grape::core {

bool BackgroundWorker::forked() const {
  const long owner = owner_process_.load();
  return owner != 0 && owner != static_cast<long>(getpid());
}

BackgroundWorker::~BackgroundWorker() {
  // A forked child has the handle of a thread that exists only in its parent, and a mutex that
  // thread may have held: it touches neither.
  if (forked()) {
    (void)thread_.release();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_) thread_->join();
}

void BackgroundWorker::post(std::function<void()> task) {
  if (forked()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_) {
      thread_ = std::make_unique<std::thread>([this] { run(); });  // may throw: nothing queued yet
      owner_process_ = static_cast<long>(getpid());
    }
    tasks_.push_back(std::move(task));
    ++pending_;
  }
  wake_.notify_one();
}

void BackgroundWorker::wait() {
  if (forked()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return pending_ == 0; });
}

size_t BackgroundWorker::pending() const {
  if (forked()) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_;
}

void BackgroundWorker::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    try {
      task();
    } catch (...) {
    }
    task = nullptr;  // what the task held goes before it counts as done
    lock.lock();
    if (--pending_ == 0) idle_.notify_all();
  }
}

}  // namespace grape::core
