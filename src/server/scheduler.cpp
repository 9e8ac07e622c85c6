#include "server/scheduler.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/parallel.h"
#include "decode/generate.h"
#include "server/api.h"
#include "server/output_text.h"

namespace polestar {
namespace {

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

bool GenerationJob::WaitFinished(Clock::time_point until) {
  std::unique_lock lock(mutex);
  return changed.wait_until(lock, until, [&] { return finished; });
}

void FairTurn::Acquire() {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = next_ticket_++;
  turn_changed_.wait(lock, [&] { return admitted_ == ticket && active_ < slots_; });
  ++admitted_;
  ++active_;
  lock.unlock();
  turn_changed_.notify_all();  // the next ticket may fit in another free slot
}

void FairTurn::Release() {
  {
    std::lock_guard lock(mutex_);
    --active_;
  }
  turn_changed_.notify_all();
}

namespace {

// Forwards that may run at once: one when each uses every core.
int ComputeSlots(int workers, int threads) {
  if (threads <= 0) return 1;
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  return std::clamp(cores / threads, 1, std::max(workers, 1));
}

}  // namespace

Scheduler::Scheduler(const Model& model, const TextCodec& codec, Metrics& metrics, int workers,
                     int queue_capacity, int threads)
    : model_(model),
      codec_(codec),
      metrics_(metrics),
      queue_capacity_(size_t(queue_capacity)),
      threads_(threads),
      turn_(ComputeSlots(workers, threads)) {
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() {
  std::deque<std::shared_ptr<GenerationJob>> abandoned;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const auto& job : running_) job->cancel = true;
    abandoned.swap(queue_);
  }
  queue_changed_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  for (const auto& job : abandoned) {
    std::lock_guard lock(job->mutex);
    job->outcome.status = JobOutcome::Status::kCancelled;
    job->outcome.error = "the server is shutting down";
    job->finished = true;
    job->changed.notify_all();
  }
}

bool Scheduler::Submit(const std::vector<std::shared_ptr<GenerationJob>>& jobs) {
  {
    std::lock_guard lock(mutex_);
    // Idle workers take jobs at once; only the rest wait in the bounded queue.
    const size_t idle = workers_.size() - running_.size();
    if (stopping_ || queue_.size() + jobs.size() > queue_capacity_ + idle) return false;
    for (const auto& job : jobs) queue_.push_back(job);
  }
  queue_changed_.notify_all();
  return true;
}

int Scheduler::QueueDepth() const {
  std::lock_guard lock(mutex_);
  return int(queue_.size());
}

void Scheduler::WorkerLoop() {
  SetThreadCount(threads_);  // OpenMP's thread count is per thread: set it on this one
  for (;;) {
    std::shared_ptr<GenerationJob> job;
    {
      std::unique_lock lock(mutex_);
      queue_changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = queue_.front();
      queue_.pop_front();
      running_.push_back(job);
    }
    metrics_.AddProcessing(1);
    Run(job);
  }
}

void Scheduler::Run(const std::shared_ptr<GenerationJob>& job_pointer) {
  GenerationJob& job = *job_pointer;
  const ModelConfig& config = model_.config();
  const Clock::time_point started = Clock::now();
  JobOutcome outcome;
  outcome.queue_seconds = SecondsBetween(job.admitted, started);
  auto finish = [&] {
    // The worker is free before the client hears back, so a client's next request finds it.
    {
      std::lock_guard lock(mutex_);
      running_.erase(std::find(running_.begin(), running_.end(), job_pointer));
    }
    metrics_.AddProcessing(-1);
    std::lock_guard lock(job.mutex);
    job.outcome = std::move(outcome);
    job.finished = true;
    job.changed.notify_all();
  };
  if (job.cancel) {
    outcome.status = JobOutcome::Status::kCancelled;
    return finish();
  }
  if (started > job.deadline) {
    outcome.status = JobOutcome::Status::kTimedOut;
    return finish();
  }

  const int prompt_length = int(job.prompt.size());
  const int answer_length = std::min(job.max_tokens, job.options.gen_length);
  OutputText output(codec_.NewTextStream(), job.stop);
  int settled = 0;          // answer positions moved into the text
  bool complete = false;    // the text is final: EOS, a stop string, or max_tokens reached
  bool stopped = false;     // ... by EOS or a stop string
  bool flushed = false;     // the text stream gave up what it held back
  int committed_total = 0;  // canvas positions committed so far

  auto publish = [&](const std::string& delta, std::string canvas) {
    outcome.text += delta;
    if (!job.stream_text && !job.stream_canvas) return;
    {
      std::lock_guard lock(job.mutex);
      if (job.stream_text && !delta.empty())
        job.events.push_back({GenerationJob::Event::Kind::kText, delta});
      if (!canvas.empty())
        job.events.push_back({GenerationJob::Event::Kind::kCanvas, std::move(canvas)});
    }
    job.changed.notify_all();
  };
  // Moves the answer's newly settled tokens (the prefix without masks) into the text.
  auto settle = [&](std::span<const int> canvas) {
    std::string delta;
    while (!complete && settled < answer_length) {
      const int token = canvas[size_t(prompt_length + settled)];
      if (token == config.mask_id) break;
      ++settled;
      if (IsEndToken(config, token)) {
        stopped = complete = true;
        break;
      }
      ++outcome.completion_tokens;
      delta += output.Push(token);
      stopped = complete = output.stopped();
    }
    if (!complete && settled == answer_length) complete = true;
    if (complete && !flushed) {
      flushed = true;
      delta += output.Finish();
    }
    return delta;
  };

  if (job.stream_canvas) {
    publish("", DumpJson({{"nfe", 0},
                          {"prompt_tokens", prompt_length},
                          {"gen_length", job.options.gen_length},
                          {"block_length", job.options.EffectiveBlockLength()},
                          {"answer_length", answer_length},
                          {"masks_left", job.options.gen_length},
                          {"committed", nlohmann::json::array()}}));
  }

  bool holding_turn = false;
  Clock::time_point step_started;
  auto acquire = [&] {
    turn_.Acquire();
    holding_turn = true;
    step_started = Clock::now();
  };
  auto release = [&] {
    if (holding_turn) turn_.Release();
    holding_turn = false;
  };
  enum class Interrupt { kNone, kCancelled, kTimedOut } interrupt = Interrupt::kNone;
  const StepCallback on_step = [&](const StepEvent& e) {
    metrics_.ObserveStep(SecondsBetween(step_started, Clock::now()));
    release();
    committed_total += int(e.committed.size());
    const std::string delta = settle(e.canvas);
    std::string canvas;
    if (job.stream_canvas) {
      nlohmann::json committed = nlohmann::json::array();
      for (int p : e.committed) {
        committed.push_back({p - prompt_length, codec_.TokenLabel(e.canvas[size_t(p)])});
      }
      canvas = DumpJson({{"nfe", e.nfe},
                         {"block", e.block_index},
                         {"seconds", e.seconds},
                         {"masks_left", e.masks_left},
                         {"committed_total", committed_total},
                         {"committed", std::move(committed)}});
    }
    publish(delta, std::move(canvas));
    if (job.cancel) interrupt = Interrupt::kCancelled;
    if (Clock::now() > job.deadline) interrupt = Interrupt::kTimedOut;
    if (interrupt != Interrupt::kNone || (complete && job.stop_early)) return false;
    acquire();
    return true;
  };

  try {
    acquire();
    const GenerationResult result = Generate(model_, job.prompt, job.options, on_step);
    release();
    if (interrupt == Interrupt::kNone) publish(settle(result.tokens), "");
    outcome.nfe = result.nfe;
    outcome.seconds = result.seconds;
    outcome.committed = committed_total;
  } catch (const std::exception& e) {
    release();
    outcome.status = JobOutcome::Status::kFailed;
    outcome.error = e.what();
    return finish();
  }
  if (interrupt == Interrupt::kCancelled) outcome.status = JobOutcome::Status::kCancelled;
  if (interrupt == Interrupt::kTimedOut) outcome.status = JobOutcome::Status::kTimedOut;
  outcome.finish_reason = stopped ? "stop" : "length";
  if (outcome.status == JobOutcome::Status::kDone)
    metrics_.AddGeneratedTokens(outcome.completion_tokens);
  finish();
}

}  // namespace polestar
