#include "backend/worker_queue.h"

#include <utility>

namespace polestar {

WorkerQueue::WorkerQueue(Around around) : around_(std::move(around)) {}

WorkerQueue::~WorkerQueue() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !job_ && !running_; });  // a job's error goes unread now
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkerQueue::Run(std::function<void()> job) {
  std::unique_lock lock(mutex_);
  Wait(lock);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  job_ = std::move(job);
  changed_.notify_all();
}

void WorkerQueue::Wait() {
  std::unique_lock lock(mutex_);
  Wait(lock);
}

void WorkerQueue::Wait(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [this] { return !job_ && !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WorkerQueue::Loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return job_ || stopping_; });
    if (stopping_ && !job_) return;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    running_ = true;
    lock.unlock();
    // Kept for the caller's next Wait: an exception leaving this thread would terminate.
    std::exception_ptr error;
    try {
      around_(job);
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // what it captured is freed on this thread, before Wait returns
    lock.lock();
    error_ = error;
    running_ = false;
    changed_.notify_all();
  }
}

}  // namespace polestar
