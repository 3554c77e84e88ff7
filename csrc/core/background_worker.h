#pragma once
// A thread that runs the tasks handed to it one at a time, in order, off the caller's thread, for
// work whose result nobody waits for at once (SharedExecutables::settle). The owner calls wait()
// before it touches what a task may touch; a wait with nothing queued costs an uncontended lock.
// In a process forked from the one that started the thread, which has no such thread, tasks run
// where they are posted and wait() returns at once.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace grape::core {

class BackgroundWorker {
 public:
  BackgroundWorker() = default;
  // Runs what is queued, then ends the thread.
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  // Queues `task`; the thread starts at the first (std::system_error where it cannot, with
  // nothing queued). A task must not throw (one that does is ended there, and the worker goes on
  // with the next) and must not call wait(), which would wait for itself.
  void post(std::function<void()> task);
  // Returns once every task posted so far has run.
  void wait();
  // Tasks posted and not yet finished.
  size_t pending() const;

 private:
  void run();
  // Whether this process is a fork of the one that started the thread.
  bool forked() const;

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // a task was posted, or the worker is to end
  std::condition_variable idle_;  // the queue ran empty
  std::deque<std::function<void()>> tasks_;
  size_t pending_ = 0;
  bool stopping_ = false;
  // Held by pointer: a forked child leaves it be (a std::thread destroyed while joinable ends the
  // process).
  std::unique_ptr<std::thread> thread_;
  std::atomic<long> owner_process_{0};  // the process that started the thread; 0: none yet
};

}  // namespace grape::core
