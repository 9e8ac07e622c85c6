// Generations sharing one model, decoded by step-level continuous batching.
//
// One stepping thread runs every generation. Before each step it admits queued jobs in
// order while they fit: at most --parallel generations running, and their caches within the
// KV budget (a job that does not fit waits, and the jobs behind it wait too, so a large one
// is not passed over for ever). It then runs the next step of the running generations in one
// batched forward (StepBatch): at most --max-batch sequences and --max-batch-rows input rows,
// though one sequence always runs, however many rows it needs. The running generations left
// out of a step go first at the next one, so with --max-batch 1 the steps of the running
// generations take turns one forward at a time. After the forward each job's callback
// settles its text, queues its stream events and decides whether to go on; jobs join and
// leave between steps. A sequence's tokens do not depend on what it is batched with, so
// every answer is the one a request alone gets. The forward spreads over -t threads.
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

// One generation, shared by the HTTP thread that waits for it and the thread that steps it.
struct GenerationJob {
  std::vector<int> prompt;  // [P]
  DecodeOptions options;    // gen_length may exceed max_tokens (rounded up to a block)
  int64_t cache_bytes = 0;  // what its sequence holds while it runs (SequenceCacheBytes)
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

struct SchedulerLimits {
  int running = 1;              // generations admitted at once (--parallel)
  int max_batch = 1;            // sequences in one forward (--max-batch)
  int64_t max_batch_rows = 0;   // input rows of one forward (--max-batch-rows); 0: no bound
  int64_t kv_budget_bytes = 1;  // caches of the running generations (--kv-budget)
  int queue = 0;                // jobs waiting beyond the free running places (--queue)
  int threads = 0;              // OpenMP threads of the forward (<= 0: all cores)
};

class Scheduler {
 public:
  Scheduler(const Model& model, const TextCodec& codec, Metrics& metrics, SchedulerLimits limits);
  ~Scheduler();  // cancels running jobs, fails queued ones, joins the stepping thread

  // Admits all of `jobs` or none (false: the queue is full). Each job's cache_bytes must fit
  // the KV budget (Fits).
  bool Submit(const std::vector<std::shared_ptr<GenerationJob>>& jobs);
  // Whether a generation holding `cache_bytes` can ever run within the KV budget.
  bool Fits(int64_t cache_bytes) const;
  int QueueDepth() const;
  const SchedulerLimits& limits() const { return limits_; }

 private:
  void StepLoop();
  // Takes the jobs that fit now from the front of the queue; mutex_ held.
  std::vector<std::shared_ptr<GenerationJob>> Admit();
  // Frees the job's place and cache, then hands the client its outcome.
  void Finish(GenerationJob& job, JobOutcome outcome);

  const Model& model_;
  const TextCodec& codec_;
  Metrics& metrics_;
  const SchedulerLimits limits_;
  mutable std::mutex mutex_;
  std::condition_variable queue_changed_;
  std::deque<std::shared_ptr<GenerationJob>> queue_;  // guarded by mutex_
  bool stopping_ = false;                             // guarded by mutex_
  int running_ = 0;                                   // guarded by mutex_: admitted, not finished
  int64_t kv_bytes_ = 0;  // guarded by mutex_: the caches of the running jobs
  std::thread stepper_;
};

}  // namespace polestar
