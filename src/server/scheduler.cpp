#include "server/scheduler.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "decode/generate.h"
#include "server/api.h"
#include "server/output_text.h"

namespace polestar {
namespace {

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr const char* kShuttingDown = "the server is shutting down";

// A running generation: its sequence, and its answer's text as the canvas settles. Lives on
// the stepping thread; its callback runs there, after each forward the sequence is in.
class ActiveJob {
 public:
  ActiveJob(const Model& model, const TextCodec& codec, std::shared_ptr<GenerationJob> job)
      : model_(model),
        config_(model.config()),
        codec_(codec),
        job_(std::move(job)),
        prompt_length_(int(job_->prompt.size())),
        answer_length_(std::min(job_->max_tokens, job_->options.gen_length)),
        output_(codec.NewTextStream(), job_->stop) {}

  // Creates the sequence and sends the empty canvas. False when the job ends here (cancelled,
  // past its deadline, or refused by the decoder): TakeOutcome says how.
  bool Start() {
    GenerationJob& job = *job_;
    const Clock::time_point started = Clock::now();
    outcome_.queue_seconds = SecondsBetween(job.admitted, started);
    if (job.cancel) {
      outcome_.status = JobOutcome::Status::kCancelled;
      return false;
    }
    if (started > job.deadline) {
      outcome_.status = JobOutcome::Status::kTimedOut;
      return false;
    }
    try {
      sequence_ = std::make_unique<Sequence>(model_, job.prompt, job.options,
                                             [this](const StepEvent& e) { return OnStep(e); });
    } catch (const std::exception& e) {
      outcome_.status = JobOutcome::Status::kFailed;
      outcome_.error = e.what();
      return false;
    }
    if (job.stream_canvas) {
      Publish("", DumpJson({{"nfe", 0},
                            {"prompt_tokens", prompt_length_},
                            {"gen_length", job.options.gen_length},
                            {"block_length", job.options.EffectiveBlockLength()},
                            {"answer_length", answer_length_},
                            {"masks_left", job.options.gen_length},
                            {"committed", nlohmann::json::array()}}));
    }
    return true;
  }

  GenerationJob& job() { return *job_; }
  Sequence& sequence() { return *sequence_; }

  // The outcome, once the sequence is done or Start returned false; call once.
  JobOutcome TakeOutcome() {
    if (outcome_.status != JobOutcome::Status::kDone) return std::move(outcome_);
    if (!sequence_->error().empty()) {
      outcome_.status = JobOutcome::Status::kFailed;
      outcome_.error = sequence_->error();
      return std::move(outcome_);
    }
    const GenerationResult result = sequence_->TakeResult();
    if (interrupt_ == Interrupt::kNone) Publish(Settle(result.tokens), "");
    outcome_.nfe = result.nfe;
    outcome_.seconds = result.seconds;
    outcome_.committed = committed_total_;
    if (interrupt_ == Interrupt::kCancelled) outcome_.status = JobOutcome::Status::kCancelled;
    if (interrupt_ == Interrupt::kTimedOut) outcome_.status = JobOutcome::Status::kTimedOut;
    outcome_.finish_reason = stopped_ ? "stop" : "length";
    return std::move(outcome_);
  }

 private:
  // Settles the step's text, streams it, and says whether the generation goes on.
  bool OnStep(const StepEvent& e) {
    const GenerationJob& job = *job_;
    committed_total_ += int(e.committed.size());
    const std::string delta = Settle(e.canvas);
    std::string canvas;
    if (job.stream_canvas) {
      nlohmann::json committed = nlohmann::json::array();
      for (int p : e.committed) {
        const int token = e.canvas[size_t(p)];
        // [position in the answer, the token's text, whether it ends the text]
        committed.push_back(
            {p - prompt_length_, codec_.TokenLabel(token), IsEndToken(config_, token)});
      }
      canvas = DumpJson({{"nfe", e.nfe},
                         {"block", e.block_index},
                         {"seconds", e.seconds},
                         {"masks_left", e.masks_left},
                         {"committed_total", committed_total_},
                         {"committed", std::move(committed)}});
    }
    Publish(delta, std::move(canvas));
    if (job.cancel) interrupt_ = Interrupt::kCancelled;
    if (Clock::now() > job.deadline) interrupt_ = Interrupt::kTimedOut;
    return interrupt_ == Interrupt::kNone && !(complete_ && job.stop_early);
  }

  // Moves the answer's newly settled tokens (the prefix without masks) into the text.
  std::string Settle(std::span<const int> canvas) {
    std::string delta;
    while (!complete_ && settled_ < answer_length_) {
      const int token = canvas[size_t(prompt_length_ + settled_)];
      if (token == config_.mask_id) break;
      ++settled_;
      if (IsEndToken(config_, token)) {
        stopped_ = complete_ = true;
        break;
      }
      ++outcome_.completion_tokens;
      delta += output_.Push(token);
      stopped_ = complete_ = output_.stopped();
    }
    if (!complete_ && settled_ == answer_length_) complete_ = true;
    if (complete_ && !flushed_) {
      flushed_ = true;
      delta += output_.Finish();
    }
    return delta;
  }

  void Publish(const std::string& delta, std::string canvas) {
    GenerationJob& job = *job_;
    outcome_.text += delta;
    if (!job.stream_text && !job.stream_canvas) return;
    {
      std::lock_guard lock(job.mutex);
      if (job.stream_text && !delta.empty())
        job.events.push_back({GenerationJob::Event::Kind::kText, delta});
      if (!canvas.empty())
        job.events.push_back({GenerationJob::Event::Kind::kCanvas, std::move(canvas)});
    }
    job.changed.notify_all();
  }

  const Model& model_;
  const ModelConfig& config_;
  const TextCodec& codec_;
  const std::shared_ptr<GenerationJob> job_;
  const int prompt_length_, answer_length_;
  JobOutcome outcome_;
  OutputText output_;
  int settled_ = 0;          // answer positions moved into the text
  bool complete_ = false;    // the text is final: EOS, a stop string, or max_tokens reached
  bool stopped_ = false;     // ... by EOS or a stop string
  bool flushed_ = false;     // the text stream gave up what it held back
  int committed_total_ = 0;  // canvas positions committed so far
  enum class Interrupt { kNone, kCancelled, kTimedOut } interrupt_ = Interrupt::kNone;
  std::unique_ptr<Sequence> sequence_;  // set by Start
};

}  // namespace

bool GenerationJob::WaitFinished(Clock::time_point until) {
  std::unique_lock lock(mutex);
  return changed.wait_until(lock, until, [&] { return finished; });
}

Scheduler::Scheduler(const Model& model, const TextCodec& codec, Metrics& metrics,
                     SchedulerLimits limits)
    : model_(model), codec_(codec), metrics_(metrics), limits_(limits) {
  PS_CHECK(limits_.running >= 1 && limits_.max_batch >= 1 && limits_.kv_budget_bytes > 0 &&
           limits_.queue >= 0);
  metrics_.SetKvBudget(limits_.kv_budget_bytes);
  stepper_ = std::thread([this] { StepLoop(); });
}

Scheduler::~Scheduler() {
  std::deque<std::shared_ptr<GenerationJob>> abandoned;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    abandoned.swap(queue_);
  }
  queue_changed_.notify_all();
  stepper_.join();
  for (const auto& job : abandoned) {
    std::lock_guard lock(job->mutex);
    job->outcome.status = JobOutcome::Status::kCancelled;
    job->outcome.error = kShuttingDown;
    job->finished = true;
    job->changed.notify_all();
  }
}

bool Scheduler::Fits(int64_t cache_bytes) const { return cache_bytes <= limits_.kv_budget_bytes; }

bool Scheduler::Submit(const std::vector<std::shared_ptr<GenerationJob>>& jobs) {
  for (const auto& job : jobs) PS_CHECK(Fits(job->cache_bytes));
  {
    std::lock_guard lock(mutex_);
    // Free running places take jobs at once; only the rest wait in the bounded queue.
    const size_t free = size_t(limits_.running - running_);
    if (stopping_ || queue_.size() + jobs.size() > size_t(limits_.queue) + free) return false;
    for (const auto& job : jobs) queue_.push_back(job);
  }
  queue_changed_.notify_all();
  return true;
}

int Scheduler::QueueDepth() const {
  std::lock_guard lock(mutex_);
  return int(queue_.size());
}

std::vector<std::shared_ptr<GenerationJob>> Scheduler::Admit() {
  std::vector<std::shared_ptr<GenerationJob>> admitted;
  while (!queue_.empty() && running_ < limits_.running) {
    const int64_t need = queue_.front()->cache_bytes;
    if (kv_bytes_ + need > limits_.kv_budget_bytes) break;
    kv_bytes_ += need;
    ++running_;
    admitted.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  metrics_.SetKvBytesInUse(kv_bytes_);
  metrics_.AddProcessing(int(admitted.size()));
  return admitted;
}

void Scheduler::Finish(GenerationJob& job, JobOutcome outcome) {
  // The place is free before the client hears back, so a client's next request finds it.
  {
    std::lock_guard lock(mutex_);
    --running_;
    kv_bytes_ -= job.cache_bytes;
    metrics_.SetKvBytesInUse(kv_bytes_);
  }
  metrics_.AddProcessing(-1);
  if (outcome.status == JobOutcome::Status::kDone)
    metrics_.AddGeneratedTokens(outcome.completion_tokens);
  std::lock_guard lock(job.mutex);
  job.outcome = std::move(outcome);
  job.finished = true;
  job.changed.notify_all();
}

void Scheduler::StepLoop() {
  SetThreadCount(limits_.threads);  // OpenMP's thread count is per thread: set it on this one
  // The running jobs in the order the next step considers them.
  std::vector<std::unique_ptr<ActiveJob>> active, left_out, stepped;
  std::vector<Sequence*> batch;  // this step's sequences
  for (;;) {
    std::vector<std::shared_ptr<GenerationJob>> admitted;
    {
      std::unique_lock lock(mutex_);
      queue_changed_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
      if (stopping_) break;
      admitted = Admit();
    }
    for (auto& job : admitted) {
      auto admitted_job = std::make_unique<ActiveJob>(model_, codec_, job);
      if (admitted_job->Start()) {
        active.push_back(std::move(admitted_job));
      } else {
        Finish(*job, admitted_job->TakeOutcome());
      }
    }

    batch.clear();
    int64_t rows = 0;  // input rows of the batch
    std::vector<bool> in_batch(active.size(), false);
    for (size_t i = 0; i < active.size() && batch.size() < size_t(limits_.max_batch); ++i) {
      Sequence& sequence = active[i]->sequence();
      const int64_t next_rows = sequence.NextStepRows();  // 0: done (or failed to plan)
      if (next_rows == 0) continue;
      const bool over_budget =
          limits_.max_batch_rows > 0 && rows + next_rows > limits_.max_batch_rows;
      if (!batch.empty() && over_budget) continue;
      batch.push_back(&sequence);
      in_batch[i] = true;
      rows += next_rows;
    }
    if (!batch.empty()) {
      const Clock::time_point started = Clock::now();
      try {
        StepBatch(batch);  // each sequence's callback runs in it
      } catch (const std::exception& e) {
        // A failure of the forward they shared (out of memory, say) ends these jobs, not
        // the server: each answers 500 with the reason.
        for (size_t i = 0; i < active.size(); ++i) {
          if (!in_batch[i]) continue;
          JobOutcome outcome;
          outcome.status = JobOutcome::Status::kFailed;
          outcome.error = e.what();
          Finish(active[i]->job(), std::move(outcome));
          active[i].reset();
        }
      }
      metrics_.ObserveStep(SecondsBetween(started, Clock::now()), int(batch.size()), rows);
    }

    // Done jobs leave; those the step left out go first next time, so every job gets its turn.
    left_out.clear();
    stepped.clear();
    for (size_t i = 0; i < active.size(); ++i) {
      if (!active[i]) continue;  // failed with its batch
      if (active[i]->sequence().done()) {
        Finish(active[i]->job(), active[i]->TakeOutcome());
      } else {
        (in_batch[i] ? stepped : left_out).push_back(std::move(active[i]));
      }
    }
    active.clear();
    for (auto* group : {&left_out, &stepped}) {
      for (auto& job : *group) active.push_back(std::move(job));
    }
  }
  for (const auto& job : active) {
    JobOutcome outcome;
    outcome.status = JobOutcome::Status::kCancelled;
    outcome.error = kShuttingDown;
    Finish(job->job(), std::move(outcome));
  }
}

}  // namespace polestar
