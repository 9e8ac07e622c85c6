// POST /v1/completions and /v1/chat/completions (and their unversioned aliases), and the
// generation they share with the diffusion stream: queueing the jobs, waiting for them while
// watching the client, and streaming Server-Sent Events.
#include <cmath>

#include "base/error.h"
#include "decode/generate.h"
#include "server/server_impl.h"

namespace polestar {
namespace {

using nlohmann::json;

constexpr auto kWaitSlice = std::chrono::milliseconds(100);  // how often a waiting handler looks up
constexpr auto kPingInterval = std::chrono::seconds(1);      // SSE comment while nothing happens

ApiError TimeoutError(double timeout_seconds) {
  return ApiError(
      504, "timeout_error",
      Cat("the request did not finish within the server's timeout of ", timeout_seconds, " s"));
}

ApiError OutcomeError(const JobOutcome& outcome, double timeout_seconds) {
  switch (outcome.status) {
    case JobOutcome::Status::kTimedOut:
      return TimeoutError(timeout_seconds);
    case JobOutcome::Status::kCancelled:
      return UnavailableError(outcome.error.empty() ? "the generation was cancelled"
                                                    : outcome.error);
    default:
      return ApiError(500, "server_error", "generation failed: " + outcome.error);
  }
}

// MB as --kv-budget counts them (2^20 bytes), to two decimals.
double Megabytes(int64_t bytes) { return std::round(double(bytes) / (1 << 20) * 100) / 100; }

// A request whose caches exceed the whole KV budget: it would wait for ever.
ApiError KvBudgetError(int64_t need, int64_t budget) {
  return ApiError(400, "invalid_request_error",
                  Cat("the request needs ", Megabytes(need),
                      " MB of cache for its prompt and max_tokens, more than the server's whole "
                      "KV budget of ",
                      Megabytes(budget), " MB (--kv-budget); shorten the prompt or max_tokens"),
                  "max_tokens", "kv_budget_exceeded");
}

std::string SseData(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

}  // namespace

void Server::Impl::Completions(const http::Request& req, http::ResponseWriter& writer) {
  PostedCompletion(req, writer, Endpoint::kCompletions);
}

void Server::Impl::ChatCompletions(const http::Request& req, http::ResponseWriter& writer) {
  PostedCompletion(req, writer, Endpoint::kChatCompletions);
}

void Server::Impl::PostedCompletion(const http::Request& req, http::ResponseWriter& writer,
                                    Endpoint endpoint) {
  const std::string label = EndpointLabel(req.path);
  json body;
  try {
    body = ParseJsonBody(req.body);
  } catch (const ApiError& e) {
    AnswerError(writer, label, e);
    return;
  }
  Completion(writer, endpoint, body, label);
}

void Server::Impl::Completion(http::ResponseWriter& writer, Endpoint endpoint, const json& body,
                              const std::string& label) {
  CompletionRequest request;
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  try {
    if (!ready) throw UnavailableError("Loading model");
    if (stopping) throw UnavailableError("the server is shutting down");
    request =
        ParseCompletionRequest(body, endpoint, options.defaults, *codec, model->config(), limits);
    const Clock::time_point now = Clock::now();
    for (const std::vector<int>& prompt : request.prompts) {
      auto job = std::make_shared<GenerationJob>();
      job->prompt = prompt;
      job->options = request.options;
      job->max_tokens = request.max_tokens;
      job->stop = request.stop;
      job->stop_early = request.stop_early;
      job->stream_text = request.stream;
      job->stream_canvas = request.stream_canvas;
      job->admitted = now;
      job->deadline = Deadline(now);
      job->cache_bytes = SequenceCacheBytes(*model, int(prompt.size()), request.options);
      // Waiting could not help: the budget is never larger than now.
      if (!scheduler->Fits(job->cache_bytes))
        throw KvBudgetError(job->cache_bytes, scheduler->limits().kv_budget_bytes);
      jobs.push_back(std::move(job));
    }
    if (!scheduler->Submit(jobs)) {
      throw ApiError(429, "rate_limit_error",
                     Cat("the server is busy (", options.parallel, " running, ",
                         scheduler->QueueDepth(), " waiting); retry later"),
                     "", "rate_limit_exceeded");
    }
  } catch (const ApiError& e) {
    AnswerError(writer, label, e);
    return;
  }
  for (const auto& prompt : request.prompts) metrics.AddPromptTokens(int64_t(prompt.size()));
  const ResponseIdentity identity = NewResponseIdentity(endpoint, options.model_id);
  if (request.stream) return Stream(writer, request, identity, *jobs.front(), label);

  // Wait, looking every slice whether the client is still there and the server still up.
  std::vector<JobOutcome> outcomes;
  for (const auto& job : jobs) {
    while (!job->WaitFinished(std::min(Clock::now() + kWaitSlice, job->deadline))) {
      const bool gone = writer.PeerHungUp();
      if (!gone && !stopping && Clock::now() < job->deadline) continue;
      for (const auto& j : jobs) j->cancel = true;
      if (gone) {  // nobody reads this answer; it is what /metrics counts
        AnswerError(writer, label, ApiError(499, "cancelled", "the client closed the connection"));
        return;
      }
      const ApiError error = stopping ? UnavailableError("the server is shutting down")
                                      : TimeoutError(options.timeout_seconds);
      AnswerError(writer, label, error);
      return;
    }
    std::lock_guard lock(job->mutex);
    outcomes.push_back(job->outcome);
  }
  for (const JobOutcome& outcome : outcomes) {
    if (outcome.status != JobOutcome::Status::kDone) {
      const ApiError error = OutcomeError(outcome, options.timeout_seconds);
      AnswerError(writer, label, error);
      return;
    }
  }
  AnswerJson(writer, label, 200, CompletionResponse(request, identity, outcomes));
}

void Server::Impl::Stream(http::ResponseWriter& writer, const CompletionRequest& request,
                          const ResponseIdentity& identity, GenerationJob& job,
                          const std::string& label) {
  // Until the stream ends as intended, a failed write means the client went away.
  int status = 499;
  auto write = [&](const std::string& text) { return writer.Write(text); };
  auto end_with_error = [&](const ApiError& error) {
    job.cancel = true;
    if (write(SseData(error.Body())) && write("data: [DONE]\n\n") && writer.End())
      status = error.status;
  };
  bool started = false;  // the first text chunk went out
  bool open = writer.BeginStream(200, "text/event-stream",
                                 {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  if (open && request.endpoint == Endpoint::kChatCompletions) {
    open = write(SseData(StreamChunk(request, identity, "", true, nullptr)));
    started = true;
  }
  while (open) {
    std::deque<GenerationJob::Event> events;
    bool finished;
    JobOutcome outcome;
    {
      std::unique_lock lock(job.mutex);
      job.changed.wait_until(lock, std::min(Clock::now() + kPingInterval, job.deadline),
                             [&] { return !job.events.empty() || job.finished || stopping; });
      events.swap(job.events);
      finished = job.finished;
      if (finished) outcome = job.outcome;
    }
    for (const GenerationJob::Event& e : events) {
      const bool text = e.kind == GenerationJob::Event::Kind::kText;
      open = text ? write(SseData(StreamChunk(request, identity, e.data, !started, nullptr)))
                  : write("event: canvas\ndata: " + e.data + "\n\n");
      started = started || text;
      if (!open) break;
    }
    if (!open) break;
    if (finished) {
      if (outcome.status != JobOutcome::Status::kDone) {
        end_with_error(OutcomeError(outcome, options.timeout_seconds));
      } else if (write(SseData(StreamChunk(request, identity, "", !started, &outcome))) &&
                 (!request.include_usage ||
                  write(SseData(UsageChunk(request, identity, outcome)))) &&
                 write("data: [DONE]\n\n") && writer.End()) {
        status = 200;
      }
      break;
    }
    if (stopping) {
      end_with_error(UnavailableError("the server is shutting down"));
      break;
    }
    if (Clock::now() >= job.deadline) {
      end_with_error(TimeoutError(options.timeout_seconds));
      break;
    }
    // Nothing new: a comment line keeps proxies patient; a hang-up is seen at once.
    open = !writer.PeerHungUp() && (!events.empty() || write(": ping\n\n"));
  }
  if (status == 499) job.cancel = true;
  metrics.CountRequest(label, status);
}

}  // namespace polestar
