// The page at / in headless Chromium, driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: JSON messages ended by NUL on fds 3 and 4): load it, submit a
// prompt, wait for the answer, compare it with the API's, and save screenshots of a
// half-finished and the final canvas into the build tree's test output. Skipped, saying
// so, when Chromium is not installed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "decode/policy_registry.h"
#include "io/json_file.h"
#include "model/model.h"
#include "server/codecs.h"
#include "server/server.h"
#include "test_support.h"

namespace polestar {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string FindChromium() {
  for (const char* path :
       {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

std::string DecodeBase64(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) continue;  // padding
    bits = (bits << 6) | uint32_t(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += char((bits >> count) & 0xFF);
    }
  }
  return out;
}

// A headless Chromium with one page, spoken to over the DevTools pipe.
class Browser {
 public:
  Browser(const std::string& binary, const std::string& profile_dir, const std::string& log_path) {
    int to_browser[2], from_browser[2];
    PS_CHECK(pipe(to_browser) == 0 && pipe(from_browser) == 0);
    pid_ = fork();
    PS_CHECK(pid_ >= 0);
    if (pid_ == 0) {
      // The child: fd 3 reads commands, fd 4 writes replies.
      dup2(to_browser[0], 3);
      dup2(from_browser[1], 4);
      const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(log, 1);
      dup2(log, 2);
      for (int fd = 5; fd < 1024; ++fd) close(fd);
      const std::string profile = "--user-data-dir=" + profile_dir;
      execl(binary.c_str(), binary.c_str(), "--headless", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--remote-debugging-pipe", profile.c_str(),
            "about:blank", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_browser[0]);
    close(from_browser[1]);
    write_fd_ = to_browser[1];
    read_fd_ = from_browser[0];
  }
  ~Browser() {
    if (pid_ <= 0) return;
    Call("Browser.close", json::object(), "", std::chrono::seconds(5), /*may_fail=*/true);
    close(write_fd_);
    close(read_fd_);
    for (int i = 0; i < 50 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) usleep(100000);
    if (waitpid(pid_, nullptr, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Sends one command and waits for its reply; returns "result" (events are skipped).
  json Call(const std::string& method, const json& params, const std::string& session = "",
            std::chrono::seconds limit = std::chrono::seconds(30), bool may_fail = false) {
    const int id = ++last_id_;
    json message = {{"id", id}, {"method", method}, {"params", params}};
    if (!session.empty()) message["sessionId"] = session;
    const std::string text = message.dump() + '\0';
    if (write(write_fd_, text.data(), text.size()) != ssize_t(text.size())) {
      if (may_fail) return nullptr;
      ADD_FAILURE() << "cannot write to the browser";
      return nullptr;
    }
    const auto until = Clock::now() + limit;
    for (;;) {
      const size_t end = inbox_.find('\0');
      if (end != std::string::npos) {
        const json reply = json::parse(inbox_.substr(0, end), nullptr, false);
        inbox_.erase(0, end + 1);
        if (reply.is_object() && reply.value("id", -1) == id) {
          if (reply.contains("error") && !may_fail)
            ADD_FAILURE() << method << ": " << reply["error"].dump();
          return reply.value("result", json::object());
        }
        continue;
      }
      const int left_ms =
          int(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
      pollfd p{read_fd_, POLLIN, 0};
      if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) {
        if (!may_fail) ADD_FAILURE() << method << ": no reply from the browser";
        return nullptr;
      }
      char buffer[65536];
      const ssize_t n = read(read_fd_, buffer, sizeof(buffer));
      if (n <= 0) {
        if (!may_fail) ADD_FAILURE() << method << ": the browser went away";
        return nullptr;
      }
      inbox_.append(buffer, size_t(n));
    }
  }

  // Opens a page and returns its session.
  std::string OpenPage(int width, int height) {
    const json target = Call("Target.createTarget", {{"url", "about:blank"}});
    if (!target.contains("targetId")) return "";
    const json attached =
        Call("Target.attachToTarget", {{"targetId", target["targetId"]}, {"flatten", true}});
    const std::string session = attached.value("sessionId", "");
    Call("Emulation.setDeviceMetricsOverride",
         {{"width", width}, {"height", height}, {"deviceScaleFactor", 1}, {"mobile", false}},
         session);
    return session;
  }

  json Evaluate(const std::string& session, const std::string& expression) {
    const json result = Call(
        "Runtime.evaluate",
        {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}}, session);
    if (result.contains("exceptionDetails"))
      ADD_FAILURE() << expression << ": " << result["exceptionDetails"].dump();
    return result.is_object() && result.contains("result") ? result["result"].value("value", json())
                                                           : json();
  }

  // Polls `expression` until it is true.
  bool WaitUntil(const std::string& session, const std::string& expression,
                 std::chrono::seconds limit) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      if (Evaluate(session, expression) == true) return true;
      usleep(50000);
    }
    return false;
  }

  std::string Screenshot(const std::string& session) {
    const json shot = Call("Page.captureScreenshot", {{"format", "png"}}, session);
    return DecodeBase64(shot.value("data", ""));
  }

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1, read_fd_ = -1;
  int last_id_ = 0;
  std::string inbox_;
};

TEST(ServerPage, ShowsTheDenoisingAndEndsWithTheApisAnswer) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    GTEST_SKIP()
        << "Chromium is not installed (Debian: apt-get install chromium; scripts/install-deps.sh "
           "does it): the page test needs a headless browser";
  }
  namespace fs = std::filesystem;
  const fs::path output = fs::path(POLESTAR_TEST_OUTPUT_DIR) / "server_page";
  fs::create_directories(output);
  const std::string work = testing::TempDir();

  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.threads = 1;
  options.model_id = "llada-probe";
  Server server(options);
  const int port = server.Start();
  const std::string dir = testing::FixtureDir("llada-probe");
  auto model = Model::Load(dir);
  auto codec = LoadTextCodec(dir, model->config());
  server.SetModel(std::move(model), std::move(codec));

  // The reference answer of the trained probe for this prompt (vanilla, block 8).
  const json reference = ReadJsonFile(dir + "/reference.json");
  const std::string prompt = reference["prompts"][1]["prompt"];
  const std::string answer = reference["prompts"][1]["answer"];

  Browser browser(chromium, work + "/profile", (output / "chromium.log").string());
  const std::string page = browser.OpenPage(1200, 760);
  ASSERT_FALSE(page.empty()) << "Chromium did not open a page; see " << (output / "chromium.log");
  browser.Call("Page.navigate", {{"url", "http://127.0.0.1:" + std::to_string(port) + "/"}}, page);
  ASSERT_TRUE(
      browser.WaitUntil(page,
                        "document.readyState === 'complete' && "
                        "document.getElementById('model').textContent.startsWith('llada-probe')",
                        std::chrono::seconds(20)))
      << "the page did not load or did not reach /v1/models";

  // The policy list and each policy's fields come from the server's registry.
  const json policies = browser.Evaluate(
      page, "[...document.getElementById('policy').options].map((o) => o.value).join(',')");
  EXPECT_EQ(policies, KnownPolicies(","));
  auto shown_fields = [&](const std::string& policy) {
    browser.Evaluate(page, "document.getElementById('policy').value = '" + policy +
                               "'; document.getElementById('policy').dispatchEvent("
                               "new Event('change'))");
    return browser.Evaluate(page,
                            "[...document.querySelectorAll('.knobs')].filter((e) => !e.hidden)"
                            ".map((e) => e.querySelector('input').id).join(',')");
  };
  EXPECT_EQ(shown_fields("polestar"), "tau_s,early_floor");
  EXPECT_EQ(shown_fields("elastic-cache"), "gamma,track_num");
  EXPECT_EQ(shown_fields("fast-dllm-dual"), "");

  // Fill the form as a person would, and press Generate.
  const json form = {{"mode", "completions"},
                     {"prompt", prompt},
                     {"max_tokens", "32"},
                     {"block_length", "8"},
                     {"policy", "vanilla"}};
  for (const auto& [id, value] : form.items()) {
    browser.Evaluate(page,
                     "document.getElementById(" + json(id).dump() + ").value = " + value.dump());
  }
  browser.Evaluate(page, "document.getElementById('stop_early').checked = false");
  browser.Evaluate(page, "document.getElementById('run').click()");
  ASSERT_TRUE(
      browser.WaitUntil(page, "window.polestar.phase !== 'running'", std::chrono::seconds(60)));
  const json state = browser.Evaluate(page,
                                      "({phase: polestar.phase, error: polestar.error, text: "
                                      "polestar.text, steps: polestar.steps.length,"
                                      "  output: document.getElementById('output').textContent, "
                                      "nfe: polestar.finish && polestar.finish.timings.nfe,"
                                      "  status: document.getElementById('status').textContent, "
                                      "shownNfe: document.getElementById('nfe').textContent,"
                                      "  shownTpf: document.getElementById('tpf').textContent,"
                                      "  apiTpf: polestar.finish && "
                                      "polestar.finish.timings.tpf.toFixed(2)})");
  ASSERT_EQ(state["phase"], "done") << state.dump();

  // The same request through the API, without streaming.
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(60));
  auto api = client.Post("/v1/completions",
                         json({{"prompt", prompt},
                               {"max_tokens", 32},
                               {"block_length", 8},
                               {"policy", "vanilla"},
                               {"stop_early", false}})
                             .dump(),
                         "application/json");
  ASSERT_TRUE(api && api->status == 200);
  const json api_body = json::parse(api->body);
  EXPECT_EQ(state["text"], api_body["choices"][0]["text"]);
  EXPECT_EQ(state["output"], api_body["choices"][0]["text"]);
  EXPECT_EQ(state["text"], answer);
  EXPECT_EQ(state["steps"], api_body["timings"]["nfe"]) << "one canvas frame per forward";
  EXPECT_EQ(state["shownNfe"], std::to_string(api_body["timings"]["nfe"].get<int>()));
  // TPF counts the answer's tokens before the end of text, as the API's timings do.
  char tpf[32];
  std::snprintf(tpf, sizeof(tpf), "%.2f",
                double(answer.size()) / api_body["timings"]["nfe"].get<double>());
  EXPECT_EQ(state["shownTpf"], tpf);
  EXPECT_EQ(state["apiTpf"], tpf);

  // Half-way through: masks and tokens side by side, the step's commits highlighted.
  const int half = state["steps"].get<int>() / 2;
  browser.Evaluate(page, "polestar.showStep(" + std::to_string(half) + ")");
  const json cells = browser.Evaluate(
      page,
      "({masks: document.querySelectorAll('#canvas .cell.mask').length,"
      "  tokens: document.querySelectorAll('#canvas .cell.tok, #canvas .cell.new').length,"
      "  fresh: document.querySelectorAll('#canvas .cell.new').length})");
  EXPECT_EQ(cells["masks"].get<int>() + cells["tokens"].get<int>(), 32);
  EXPECT_GT(cells["masks"].get<int>(), 0);
  EXPECT_GT(cells["tokens"].get<int>(), 0);
  EXPECT_GT(cells["fresh"].get<int>(), 0);
  const std::string half_png = browser.Screenshot(page);
  browser.Evaluate(page, "polestar.showStep(polestar.steps.length)");
  EXPECT_EQ(browser.Evaluate(page, "document.querySelectorAll('#canvas .cell.mask').length"), 0);
  // The probe pads its answer with end tokens: they start right after the answer, as end
  // chips that look nothing like masks (the legend's mask chip is a canvas mask's twin).
  const json end = browser.Evaluate(
      page,
      "(() => { const all = [...document.querySelectorAll('#canvas .cell')];"
      "  const eos = document.querySelector('#canvas .cell.eos');"
      "  const mask = document.querySelector('.legend .cell.mask');"
      "  if (!eos) return {first: -1};"
      "  const look = (e) => { const s = getComputedStyle(e);"
      "    return [s.backgroundColor, s.color, s.outlineStyle].join(' '); };"
      "  return {first: all.findIndex((c) => c.classList.contains('eos')),"
      "          eosLook: look(eos), maskLook: look(mask), text: eos.textContent,"
      "          eosAlsoMask: all.some((c) => c.classList.contains('eos') &&"
      "                                       c.classList.contains('mask'))}; })()");
  EXPECT_EQ(end["first"], int(answer.size())) << end.dump();
  EXPECT_NE(end["eosLook"], end["maskLook"]) << end.dump();
  EXPECT_EQ(end["text"], "end");
  EXPECT_EQ(end["eosAlsoMask"], false);
  const std::string done_png = browser.Screenshot(page);
  for (const auto& [name, png] :
       {std::pair{"half_finished.png", half_png}, std::pair{"finished.png", done_png}}) {
    ASSERT_GT(png.size(), 10000u) << name;
    EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << name;
    std::ofstream(output / name, std::ios::binary) << png;
  }
  std::printf("screenshots: %s\n", output.string().c_str());
}

}  // namespace
}  // namespace polestar
