// A SideQueue whose jobs run on a worker thread of its own, one at a time, in order. The CPU
// backend's side queue is one; the CUDA backend's is one whose thread issues on a second
// stream, so a job's host work (its downloads, the host math on them) overlaps the main
// queue's too.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "backend/backend.h"

namespace polestar {

class WorkerQueue final : public SideQueue {
 public:
  // Runs a job on the worker thread: calls `job` and may prepare and finish around it (the
  // CUDA backend's switches the thread's stream, then waits for what the job issued), and may
  // release it (job = nullptr) where what it captured must be freed. What it throws, or the
  // job does, is the next Wait's.
  using Around = std::function<void(std::function<void()>& job)>;

  explicit WorkerQueue(Around around);
  ~WorkerQueue() override;
  WorkerQueue(const WorkerQueue&) = delete;
  WorkerQueue& operator=(const WorkerQueue&) = delete;

  void Run(std::function<void()> job) override;
  void Wait() override;

 private:
  void Wait(std::unique_lock<std::mutex>& lock);  // rethrows what the previous job threw
  void Loop();

  Around around_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;  // handed over, not yet taken by the thread
  bool running_ = false;       // the thread runs a job
  std::exception_ptr error_;   // what the last job threw, until a Wait rethrows it
  bool stopping_ = false;
  std::thread thread_;  // persistent: what a job's thread builds once (an OpenMP team) stays
};

}  // namespace polestar
