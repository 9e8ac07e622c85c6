// Load test of `polestar serve` over loopback, continuous batching against one sequence per
// forward. For each client count it starts the server as a child process twice, alternately:
// with --max-batch 1 (the running requests take turns, one forward per step: the server
// before continuous batching) and with --max-batch B, both with the same --parallel; sends a
// fixed number of requests from N concurrent keep-alive clients; and reports requests/s,
// completion tokens/s, latency percentiles and the server's resident memory. Prints one JSON
// line per run, a summary JSON line with the speedups, and a table.
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string polestar = POLESTAR_BINARY;
  std::string model;
  std::vector<int> clients = {1, 4, 8, 16};
  int requests = 0;  // per run; 0: 32 per client, at least 256
  int rounds = 1;    // A/B alternations per client count
  int max_batch = 8;
  int parallel = 0;  // 0: --max-batch
  int queue = 64;
  int threads = 0;
  int max_tokens = 32;
  int block_length = 8;
  std::string policy = "fast-dllm-dual";
  double threshold = 0;  // one token per step: the forwards, not HTTP, bound the load
  bool stream = false;
};

struct Request {
  std::string path;
  json body;  // without the decoding fields
};

struct RunResult {
  int clients = 0, max_batch = 0, requests = 0;
  int64_t errors = 0, completion_tokens = 0;
  double seconds = 0;
  std::vector<double> latencies_ms;
  long rss_first_kb = 0, rss_peak_kb = 0, rss_last_kb = 0;
  double RequestsPerSecond() const { return requests / seconds; }
};

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

long ResidentKb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      long kb = 0;
      status >> kb;
      return kb;
    }
  }
  return 0;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = size_t(std::min<double>(values.size() - 1, p / 100 * double(values.size())));
  return values[index];
}

// The trained probe: its test prompts as completions. A model with a tokenizer (the bundled
// polestar-tiny): test items of the task suite as chat turns. Otherwise ids as text.
std::vector<Request> Requests(const Args& a) {
  std::vector<Request> requests;
  const std::string reference = a.model + "/reference.json";
  if (std::filesystem::exists(reference)) {
    const json cases = json::parse(std::ifstream(reference));
    for (const json& p : cases["prompts"])
      requests.push_back({"/v1/completions", {{"prompt", p["prompt"]}}});
  } else if (std::filesystem::exists(a.model + "/tokenizer.json")) {
    for (const char* task : {"add", "sub", "copy", "reverse", "sort", "word"}) {
      const std::string command = a.polestar + " tasks --split test --n 8 --json --task " + task;
      FILE* pipe = popen(command.c_str(), "r");
      char line[4096];
      while (pipe && std::fgets(line, sizeof(line), pipe)) {
        const json item = json::parse(line);
        requests.push_back({"/v1/chat/completions",
                            {{"messages", {{{"role", "user"}, {"content", item["prompt"]}}}}}});
      }
      if (pipe) pclose(pipe);
    }
  }
  if (requests.empty()) requests.push_back({"/v1/completions", {{"prompt", "1 2 3 4 5 6 7 8"}}});
  return requests;
}

RunResult RunOnce(const Args& a, const std::vector<Request>& requests, int clients, int max_batch) {
  RunResult run;
  run.clients = clients;
  run.max_batch = max_batch;
  run.requests = a.requests > 0 ? a.requests : std::max(256, 32 * clients);
  const int port = FreeLoopbackPort();
  const pid_t server = fork();
  if (server == 0) {
    const std::vector<std::string> args = {
        a.polestar,    "serve",
        "-m",          a.model,
        "--host",      "127.0.0.1",
        "--port",      std::to_string(port),
        "--max-batch", std::to_string(max_batch),
        "--parallel",  std::to_string(a.parallel > 0 ? a.parallel : a.max_batch),
        "--queue",     std::to_string(a.queue),
        "-t",          std::to_string(a.threads)};
    std::vector<char*> argv_child;
    for (const std::string& s : args) argv_child.push_back(const_cast<char*>(s.c_str()));
    argv_child.push_back(nullptr);
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
    freopen("/dev/null", "w", stderr);
    execv(a.polestar.c_str(), argv_child.data());
    _exit(127);
  }
  auto stop_server = [&] {
    kill(server, SIGTERM);
    waitpid(server, nullptr, 0);
  };

  httplib::Client probe("127.0.0.1", port);
  const auto load_deadline = Clock::now() + std::chrono::seconds(60);
  while (true) {
    auto health = probe.Get("/health");
    if (health && health->status == 200) break;
    if (Clock::now() > load_deadline) {
      std::fprintf(stderr, "server_load: the server did not become ready\n");
      stop_server();
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  std::atomic<int> next{0};
  std::atomic<bool> sampling{true};
  std::mutex mutex;
  const auto started = Clock::now();
  run.rss_first_kb = ResidentKb(server);
  std::thread sampler([&] {
    while (sampling) {
      run.rss_peak_kb = std::max(run.rss_peak_kb, ResidentKb(server));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_tcp_nodelay(true);
      client.set_keep_alive(true);
      client.set_read_timeout(std::chrono::seconds(300));
      for (int i; (i = next++) < run.requests;) {
        const Request& request = requests[size_t(i) % requests.size()];
        json body = request.body;
        body["max_tokens"] = a.max_tokens;
        body["block_length"] = a.block_length;
        body["policy"] = a.policy;
        body["stream"] = a.stream;
        if (a.threshold > 0) body["threshold"] = a.threshold;
        if (a.stream) body["stream_options"] = {{"include_usage", true}};
        const auto sent = Clock::now();
        auto result = client.Post(request.path, body.dump(), "application/json");
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
        int64_t tokens = 0;
        bool ok = result && result->status == 200;
        if (ok && !a.stream) {
          tokens = json::parse(result->body)["usage"]["completion_tokens"].get<int64_t>();
        } else if (ok) {
          const size_t at = result->body.rfind("\"completion_tokens\":");
          ok = at != std::string::npos && result->body.find("data: [DONE]") != std::string::npos;
          if (ok) tokens = std::stoll(result->body.substr(at + 20));
        }
        std::lock_guard lock(mutex);
        run.latencies_ms.push_back(ms);
        run.completion_tokens += tokens;
        run.errors += ok ? 0 : 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  run.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  sampling = false;
  sampler.join();
  run.rss_last_kb = ResidentKb(server);
  run.rss_peak_kb = std::max(run.rss_peak_kb, run.rss_last_kb);
  stop_server();
  return run;
}

json RunJson(const Args& a, const RunResult& run) {
  return {{"bench", "server_load"},
          {"model", a.model},
          {"policy", a.policy},
          {"threshold", a.threshold},
          {"max_tokens", a.max_tokens},
          {"stream", a.stream},
          {"clients", run.clients},
          {"max_batch", run.max_batch},
          {"parallel", a.parallel > 0 ? a.parallel : a.max_batch},
          {"threads", a.threads},
          {"cores", std::thread::hardware_concurrency()},
          {"requests", run.requests},
          {"errors", run.errors},
          {"seconds", run.seconds},
          {"requests_per_second", run.RequestsPerSecond()},
          {"completion_tokens_per_second", double(run.completion_tokens) / run.seconds},
          {"latency_ms",
           {{"p50", Percentile(run.latencies_ms, 50)},
            {"p90", Percentile(run.latencies_ms, 90)},
            {"p99", Percentile(run.latencies_ms, 99)},
            {"max", Percentile(run.latencies_ms, 100)}}},
          {"rss_mb",
           {{"first", run.rss_first_kb / 1024.0},
            {"peak", run.rss_peak_kb / 1024.0},
            {"last", run.rss_last_kb / 1024.0}}}};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"server_load: load test of polestar serve over loopback"};
  app.add_option("-m,--model", a.model,
                 "model folder (default: models/polestar-tiny, else the probe fixture)");
  app.add_option("--polestar", a.polestar, "the polestar binary")->capture_default_str();
  app.add_option("-c,--clients", a.clients, "concurrent clients, one run per count")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("-n,--requests", a.requests, "requests per run (0: 32 per client, at least 256)")
      ->capture_default_str();
  app.add_option("--rounds", a.rounds, "runs of each mode per client count, alternating")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-batch", a.max_batch, "server --max-batch of the batched runs")
      ->check(CLI::Range(2, 256))
      ->capture_default_str();
  app.add_option("--parallel", a.parallel, "server --parallel of every run (0: --max-batch)")
      ->capture_default_str();
  app.add_option("--queue", a.queue, "server --queue")->capture_default_str();
  app.add_option("-t,--threads", a.threads, "server threads per forward (0: all)")
      ->capture_default_str();
  app.add_option("--max-tokens", a.max_tokens, "max_tokens of each request")->capture_default_str();
  app.add_option("--block-length", a.block_length, "block_length of each request")
      ->capture_default_str();
  app.add_option("--policy", a.policy, "decoding policy")->capture_default_str();
  app.add_option("--threshold", a.threshold, "commit threshold (<= 0: fixed count)")
      ->capture_default_str();
  app.add_flag("--stream", a.stream, "stream the answers (SSE)");
  CLI11_PARSE(app, argc, argv);
  if (a.model.empty()) {
    a.model = std::filesystem::exists(POLESTAR_SOURCE_DIR "/models/polestar-tiny/config.json")
                  ? POLESTAR_SOURCE_DIR "/models/polestar-tiny"
                  : POLESTAR_SOURCE_DIR "/../shared/fixtures/llada-probe";
  }
  const std::vector<Request> requests = Requests(a);

  // Per client count and mode, the run with the most requests per second of its rounds.
  std::map<std::pair<int, int>, RunResult> best;
  int64_t errors = 0;
  for (int clients : a.clients) {
    for (int round = 0; round < a.rounds; ++round) {
      for (int max_batch : {1, a.max_batch}) {
        const RunResult run = RunOnce(a, requests, clients, max_batch);
        std::printf("%s\n", RunJson(a, run).dump().c_str());
        std::fflush(stdout);
        errors += run.errors;
        RunResult& kept = best[{clients, max_batch}];
        if (kept.seconds == 0 || run.RequestsPerSecond() > kept.RequestsPerSecond()) kept = run;
      }
    }
  }
  json speedups = json::object();
  for (int clients : a.clients) {
    speedups[std::to_string(clients)] =
        best[{clients, a.max_batch}].RequestsPerSecond() / best[{clients, 1}].RequestsPerSecond();
  }
  std::printf("%s\n\n", json({{"bench", "server_load_summary"},
                              {"max_batch", a.max_batch},
                              {"rounds", a.rounds},
                              {"speedup_requests_per_second", speedups}})
                            .dump()
                            .c_str());
  std::printf(
      "| clients | --max-batch | requests | errors | req/s | speedup | tok/s | p50 ms | p99 ms | "
      "peak RSS MB |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int clients : a.clients) {
    for (int max_batch : {1, a.max_batch}) {
      const RunResult& run = best[{clients, max_batch}];
      std::printf("| %d | %d | %d | %lld | %.1f | %.2fx | %.1f | %.1f | %.1f | %.1f |\n", clients,
                  max_batch, run.requests, static_cast<long long>(run.errors),
                  run.RequestsPerSecond(),
                  run.RequestsPerSecond() / best[{clients, 1}].RequestsPerSecond(),
                  double(run.completion_tokens) / run.seconds, Percentile(run.latencies_ms, 50),
                  Percentile(run.latencies_ms, 99), run.rss_peak_kb / 1024.0);
    }
  }
  return errors == 0 ? 0 : 1;
}
