// polestar serve: the OpenAI-compatible HTTP server, with a live view of the denoising at /.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>

#include "backend_flags.h"
#include "base/error.h"
#include "commands.h"
#include "decode_flags.h"
#include "server/codecs.h"
#include "server/server.h"

namespace polestar::cli {
namespace {

struct ServeArgs {
  std::string model, backend;
  ServerOptions server;
};

}  // namespace

void AddServeCommand(CLI::App& app, const DecodeOptions& defaults) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto args = std::make_shared<ServeArgs>();
  ServerOptions& s = args->server;
  cmd->add_option("-m,--model", args->model,
                  "model folder or .gguf file (default: the bundled model)");
  cmd->add_option("--host", s.host, "address to listen on (loopback by default)")
      ->capture_default_str();
  cmd->add_option("--port", s.port, "port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-batch", s.max_batch,
                  "sequences decoded in one batched forward (continuous batching; 1: running "
                  "generations take turns, one forward each)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--parallel", s.parallel,
                  "generations running at once, in the batch or waiting their turn (0: "
                  "--max-batch)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("--max-batch-rows", s.max_batch_rows,
                  "input rows of one forward, all sequences together (0: no bound); a sequence "
                  "that needs more runs alone")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--kv-budget", s.kv_budget_mb,
                  "MB (2^20 bytes) of caches the running generations may hold; a request "
                  "that does not fit waits, one that never fits is a 400 (0: half the RAM)")
      ->check(Within(0, 1e9))
      ->capture_default_str();
  cmd->add_option("--queue", s.queue, "generations waiting to run before 429")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--timeout", s.timeout_seconds,
                  "seconds a request may take, queue included (0: none)")
      ->check(Within(0, 1e9))
      ->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections,
                  "connections open at once (at most the file-descriptor limit allows); at the "
                  "bound the oldest idle or slow one makes room")
      ->check(CLI::Range(8, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "require Authorization: Bearer KEY");
  cmd->add_option("--cors", s.cors_origins,
                  "let browser pages from these origins call the API: a comma-separated list "
                  "(e.g. http://localhost:3000), or * for any (default: none; pages from other "
                  "origins are refused with 403)");
  cmd->add_option("--allowed-hosts", s.allowed_hosts,
                  "Host names accepted besides IP addresses, localhost and --host, against DNS "
                  "rebinding: a comma-separated list (.example.com takes its subdomains), or * "
                  "for any");
  cmd->add_option("-a,--alias", s.model_id,
                  "model id shown by /v1/models (default: the folder name or GGUF general.name)");
  cmd->add_option("-t,--threads", s.threads, "CPU threads per forward (0: all)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--max-prompt-tokens", s.max_prompt_tokens,
                  "longest prompt accepted (0: the context)");
  cmd->add_option("--max-tokens", s.max_tokens, "largest max_tokens accepted (0: the context)");
  AddBackendFlag(cmd, args->backend);
  s.defaults = defaults;
  AddDecodeFlags(cmd, s.defaults);
  cmd->callback([args] {
    // Ctrl-C and SIGTERM may arrive on any thread (libraries such as OpenBLAS start their
    // own threads before main), so the handler only writes to a pipe that a waiter reads.
    static int stop_pipe[2] = {-1, -1};
    if (pipe(stop_pipe) != 0) Fail("serve: cannot create a pipe");
    struct sigaction action {};
    action.sa_handler = [](int) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = write(stop_pipe[1], &byte, 1);
    };
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);

    const std::string model_path = args->model.empty() ? DefaultModelPath() : args->model;
    ChosenBackend(args->backend);  // a bad --backend is refused before the server listens
    Server server(args->server);
    const int port = server.Start();
    std::fprintf(stderr, "polestar serve: listening on http://%s:%d/ (loading %s)\n",
                 args->server.host.c_str(), port, model_path.c_str());
    std::thread signal_waiter([&] {
      char byte = 0;
      while (read(stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      if (byte == 1) std::fprintf(stderr, "polestar serve: stopping\n");
      server.Stop();
    });
    try {
      auto model = LoadModelOnBackend(model_path, args->backend);
      auto codec = LoadTextCodec(model_path, model->config());
      server.SetModel(std::move(model), std::move(codec));
    } catch (...) {
      const char byte = 2;  // not a signal: the model failed to load
      [[maybe_unused]] ssize_t n = write(stop_pipe[1], &byte, 1);
      signal_waiter.join();
      throw;
    }
    std::fprintf(stderr, "polestar serve: ready\n");
    server.Wait();
    signal_waiter.join();
  });
}

}  // namespace polestar::cli
