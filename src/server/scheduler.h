// Generations on a fixed set of worker threads sharing one model.
//
// Concurrency: --parallel workers each run one generation at a time, and their denoising
// steps are interleaved fairly: a forward pass holds a compute slot, slots are granted in
// request order, and a worker hands its slot on after every step. A forward already spreads
// over all cores with OpenMP, so by default there is one slot: running two forwards at once
// would only make them compete. With -t T there are cores / T slots (at most --parallel),
// so forwards on disjoint cores run side by side. Interleaving by step gives every running
// request steady progress (a short request is not stuck behind a long one), and text
// decoding, event formatting and socket writes of one request overlap the next request's
// forward. Requests are not batched into one forward.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "decode/options.h"
#include "model/model.h"
#include "server/metrics.h"
#include "server/text_codec.h"

namespace polestar {

using Clock = std::chrono::steady_clock;

// What a finished generation produced.
struct JobOutcome {
  enum class Status { kDone, kCancelled, kTimedOut, kFailed };
  Status status = Status::kDone;
  std::string error;          // kFailed: why
  std::string text;           // the answer, cut at EOS / stop string / max_tokens
  std::string finish_reason;  // "stop" (EOS or stop string) or "length"
  int completion_tokens = 0;  // tokens behind `text`
  int nfe = 0;
  int committed = 0;         // canvas positions committed
  double seconds = 0;        // generation wall time
  double queue_seconds = 0;  // admitted -> started
};

// One generation, shared by the HTTP thread that waits for it and the worker that runs it.
struct GenerationJob {
  std::vector<int> prompt;  // [P]
  DecodeOptions options;    // gen_length may exceed max_tokens (rounded up to a block)
  int max_tokens = 0;
  std::vector<std::string> stop;
  bool stop_early = true;      // end once the answer is complete
  bool stream_text = false;    // queue text deltas as events
  bool stream_canvas = false;  // queue a canvas event per step
  Clock::time_point admitted = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();
  std::atomic<bool> cancel{false};  // set by the HTTP side: the client went away

  struct Event {
    enum class Kind { kText, kCanvas } kind;
    std::string data;  // kText: the delta; kCanvas: a JSON object
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Event> events;  // guarded by mutex
  bool finished = false;     // guarded by mutex
  JobOutcome outcome;        // guarded by mutex; complete once finished

  // Waits until the job finished or `until`; returns finished.
  bool WaitFinished(Clock::time_point until);
};

// A semaphore of `slots` granted in request order, so waiting workers take turns step by
// step.
class FairTurn {
 public:
  explicit FairTurn(int slots) : slots_(slots) {}
  void Acquire();
  void Release();

 private:
  const int slots_;
  std::mutex mutex_;
  std::condition_variable turn_changed_;
  uint64_t next_ticket_ = 0, admitted_ = 0;  // tickets handed out / let in
  int active_ = 0;                           // slots in use
};

class Scheduler {
 public:
  // `threads`: OpenMP threads for each forward (<= 0: all cores).
  Scheduler(const Model& model, const TextCodec& codec, Metrics& metrics, int workers,
            int queue_capacity, int threads);
  ~Scheduler();  // cancels running jobs, fails queued ones, joins the workers

  // Admits all of `jobs` or none (false: the queue is full).
  bool Submit(const std::vector<std::shared_ptr<GenerationJob>>& jobs);
  int QueueDepth() const;

 private:
  void WorkerLoop();
  void Run(const std::shared_ptr<GenerationJob>& job);  // always ends by finishing the job

  const Model& model_;
  const TextCodec& codec_;
  Metrics& metrics_;
  const size_t queue_capacity_;
  const int threads_;
  FairTurn turn_;
  mutable std::mutex mutex_;
  std::condition_variable queue_changed_;
  std::deque<std::shared_ptr<GenerationJob>> queue_;     // guarded by mutex_
  bool stopping_ = false;                                // guarded by mutex_
  std::vector<std::shared_ptr<GenerationJob>> running_;  // guarded by mutex_
  std::vector<std::thread> workers_;
};

}  // namespace polestar
