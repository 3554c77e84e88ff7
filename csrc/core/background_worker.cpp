#include "core/background_worker.h"

#include <unistd.h>

#include <utility>

namespace grape::core {

BackgroundWorker::~BackgroundWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (!thread_.joinable()) return;
  // A forked child holds the handle of a thread that exists only in its parent.
  if (owner_process_ == static_cast<long>(getpid())) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

void BackgroundWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    ++pending_;
    if (!thread_.joinable()) {
      owner_process_ = static_cast<long>(getpid());
      thread_ = std::thread([this] { run(); });
    }
  }
  wake_.notify_one();
}

void BackgroundWorker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return pending_ == 0; });
}

size_t BackgroundWorker::pending() const {
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
