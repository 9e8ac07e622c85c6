// Load test of `polestar serve` over loopback: starts the server as a child process, sends
// a fixed number of /v1/completions requests from N concurrent clients, and reports
// requests/s, latency percentiles, completion tokens/s and the server's resident memory
// over time. Prints one JSON line and a table; --rss-csv writes the memory samples.
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
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string polestar = POLESTAR_BINARY;
  std::string model;
  int clients = 4;
  int requests = 400;
  int parallel = 2;
  int queue = 16;
  int threads = 0;
  int max_tokens = 32;
  int block_length = 8;
  std::string policy = "fast-dllm-dual";
  double threshold = 0.9;
  bool stream = false;
  std::string rss_csv;
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

std::vector<std::string> Prompts(const std::string& model_dir) {
  const std::string reference = model_dir + "/reference.json";
  std::vector<std::string> prompts;
  if (std::filesystem::exists(reference)) {  // the trained probe: its test prompts
    const json cases = json::parse(std::ifstream(reference));
    for (const json& p : cases["prompts"]) prompts.push_back(p["prompt"]);
  } else {
    prompts.push_back("1 2 3 4 5 6 7 8");  // a model served with ids as text
  }
  return prompts;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"server_load: load test of polestar serve over loopback"};
  app.add_option("-m,--model", a.model,
                 "model folder (default: models/polestar-tiny, else the probe fixture)");
  app.add_option("--polestar", a.polestar, "the polestar binary")->capture_default_str();
  app.add_option("-c,--clients", a.clients, "concurrent clients")->capture_default_str();
  app.add_option("-n,--requests", a.requests, "requests in all")->capture_default_str();
  app.add_option("--parallel", a.parallel, "server --parallel")->capture_default_str();
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
  app.add_option("--rss-csv", a.rss_csv, "write the server's RSS samples here");
  CLI11_PARSE(app, argc, argv);
  if (a.model.empty()) {
    a.model = std::filesystem::exists(POLESTAR_SOURCE_DIR "/models/polestar-tiny/config.json")
                  ? POLESTAR_SOURCE_DIR "/models/polestar-tiny"
                  : POLESTAR_SOURCE_DIR "/../shared/fixtures/llada-probe";
  }

  const int port = FreeLoopbackPort();
  const pid_t server = fork();
  if (server == 0) {
    const std::vector<std::string> args = {a.polestar,   "serve",
                                           "-m",         a.model,
                                           "--host",     "127.0.0.1",
                                           "--port",     std::to_string(port),
                                           "--parallel", std::to_string(a.parallel),
                                           "--queue",    std::to_string(a.queue),
                                           "-t",         std::to_string(a.threads)};
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
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  const std::vector<std::string> prompts = Prompts(a.model);
  std::atomic<int> next{0};
  std::atomic<bool> sampling{true};
  std::mutex mutex;
  std::vector<double> latencies_ms;
  std::vector<std::pair<double, long>> rss;  // (seconds, kB)
  int64_t completion_tokens = 0, errors = 0;
  const auto started = Clock::now();
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(Clock::now() - started).count();
  };

  std::thread sampler([&] {
    while (sampling) {
      rss.emplace_back(seconds_since_start(), ResidentKb(server));
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    rss.emplace_back(seconds_since_start(), ResidentKb(server));
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < a.clients; ++c) {
    clients.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_tcp_nodelay(true);
      client.set_keep_alive(true);
      client.set_read_timeout(std::chrono::seconds(300));
      for (int i; (i = next++) < a.requests;) {
        json body = {{"prompt", prompts[size_t(i) % prompts.size()]},
                     {"max_tokens", a.max_tokens},
                     {"block_length", a.block_length},
                     {"policy", a.policy},
                     {"stream", a.stream}};
        if (a.threshold > 0) body["threshold"] = a.threshold;
        if (a.stream) body["stream_options"] = {{"include_usage", true}};
        const auto sent = Clock::now();
        auto result = client.Post("/v1/completions", body.dump(), "application/json");
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
        latencies_ms.push_back(ms);
        completion_tokens += tokens;
        errors += ok ? 0 : 1;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double seconds = seconds_since_start();
  sampling = false;
  sampler.join();
  stop_server();

  long rss_peak = 0;
  for (const auto& [t, kb] : rss) rss_peak = std::max(rss_peak, kb);
  const json result = {{"bench", "server_load"},
                       {"model", a.model},
                       {"policy", a.policy},
                       {"threshold", a.threshold},
                       {"max_tokens", a.max_tokens},
                       {"stream", a.stream},
                       {"clients", a.clients},
                       {"parallel", a.parallel},
                       {"threads", a.threads},
                       {"cores", std::thread::hardware_concurrency()},
                       {"requests", a.requests},
                       {"errors", errors},
                       {"seconds", seconds},
                       {"requests_per_second", a.requests / seconds},
                       {"completion_tokens_per_second", double(completion_tokens) / seconds},
                       {"latency_ms",
                        {{"p50", Percentile(latencies_ms, 50)},
                         {"p90", Percentile(latencies_ms, 90)},
                         {"p99", Percentile(latencies_ms, 99)},
                         {"max", Percentile(latencies_ms, 100)}}},
                       {"rss_mb",
                        {{"first", rss.front().second / 1024.0},
                         {"peak", rss_peak / 1024.0},
                         {"last", rss.back().second / 1024.0}}}};
  std::printf("%s\n\n", result.dump().c_str());
  std::printf(
      "| clients | parallel | requests | errors | req/s | tok/s | p50 ms | p90 ms | p99 ms | RSS "
      "MB first / peak / last |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  std::printf("| %d | %d | %d | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f |\n",
              a.clients, a.parallel, a.requests, static_cast<long long>(errors),
              a.requests / seconds, double(completion_tokens) / seconds,
              Percentile(latencies_ms, 50), Percentile(latencies_ms, 90),
              Percentile(latencies_ms, 99), rss.front().second / 1024.0, rss_peak / 1024.0,
              rss.back().second / 1024.0);
  if (!a.rss_csv.empty()) {
    std::ofstream csv(a.rss_csv);
    csv << "seconds,rss_mb\n";
    for (const auto& [t, kb] : rss) csv << t << ',' << kb / 1024.0 << '\n';
  }
  return errors == 0 ? 0 : 1;
}
