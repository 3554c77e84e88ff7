#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/background_worker.h"

using grape::core::BackgroundWorker;

TEST(BackgroundWorker, RunsTasksInOrderOffTheCallersThread) {
  BackgroundWorker worker;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 100; ++i) {
    worker.post([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  worker.wait();
  EXPECT_EQ(worker.pending(), 0u);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(order[static_cast<size_t>(i)], i);
    EXPECT_NE(threads[static_cast<size_t>(i)], std::this_thread::get_id());
  }
}

TEST(BackgroundWorker, WaitReturnsOnlyOnceEveryPostedTaskHasRun) {
  BackgroundWorker worker;
  worker.wait();  // nothing posted: returns at once
  std::atomic<bool> release{false};
  std::atomic<int> done{0};
  worker.post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++done;
  });
  worker.post([&] { ++done; });
  EXPECT_EQ(worker.pending(), 2u);
  std::thread waiter([&] {
    worker.wait();
    EXPECT_EQ(done.load(), 2);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(done.load(), 0);  // the waiter is still blocked
  release = true;
  waiter.join();
  EXPECT_EQ(done.load(), 2);
}

TEST(BackgroundWorker, AThrowingTaskEndsAloneAndTheNextRuns) {
  BackgroundWorker worker;
  int after = 0;
  worker.post([] { throw std::runtime_error("lost"); });
  worker.post([&] { after = 1; });
  worker.wait();
  EXPECT_EQ(after, 1);
}

TEST(BackgroundWorker, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    BackgroundWorker worker;
    for (int i = 0; i < 10; ++i) {
      worker.post([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(BackgroundWorker, AForkedChildRunsTasksWhereTheyArePostedAndNeverWaits) {
  auto* worker = new BackgroundWorker;
  std::atomic<bool> release{false};
  worker->post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  // Forked while the parent's thread runs a task: the child has no such thread.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);  // a child that hangs dies of SIGALRM instead
    int ran = 0;
    worker->post([&] { ran = 1; });
    worker->wait();
    const bool ok = ran == 1 && worker->pending() == 0;
    delete worker;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << "the child hung or crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  release = true;
  delete worker;
}
