// Encode throughput of the tokenizer on one core, on Tiny Shakespeare (one 1.1 MB text) and
// on GSM8K questions (many short texts, as prompts arrive).
//
// tokenizer_bench [--tokenizers DIR] [--shared DIR] [--repeat N] [names...]
// DIR holds one folder per tokenizer (default: the test data that
// scripts/fetch-test-tokenizers.sh writes into the build tree); names default to qwen3 llama3.
// Prints a table, then one JSON object per row.
//
// "cold" is the first pass over a corpus with an empty pre-token cache; "warm" the median of
// the following passes. Decode is the ids of the corpus back to text. Rates divide by the
// thread's CPU time, so that other load on the machine does not count; "warm wall" is the
// median warm pass in elapsed time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point begin) {
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

double CpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) polestar::Fail(path, ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct Corpus {
  std::string name;
  std::vector<std::string> texts;
  size_t bytes = 0;
};

struct Row {
  std::string tokenizer, corpus;
  double load_s, cold_mbps, warm_mbps, warm_wall_mbps, decode_mbps;
  size_t bytes, tokens;
};

Row Measure(const polestar::Tokenizer& tokenizer, const std::string& name, double load_s,
            const Corpus& corpus, int repeat) {
  std::vector<double> cpu, wall;  // seconds per pass over the corpus
  std::vector<std::vector<int>> ids(corpus.texts.size());
  for (int pass = 0; pass < 1 + repeat; ++pass) {
    const auto begin = Clock::now();
    const double cpu_begin = CpuSeconds();
    for (size_t i = 0; i < corpus.texts.size(); ++i) ids[i] = tokenizer.Encode(corpus.texts[i]);
    cpu.push_back(CpuSeconds() - cpu_begin);
    wall.push_back(Seconds(begin));
  }
  size_t tokens = 0;
  for (const auto& list : ids) tokens += list.size();
  const double cpu_begin = CpuSeconds();
  size_t decoded = 0;
  for (const auto& list : ids) decoded += tokenizer.Decode(list).size();
  const double decode_s = CpuSeconds() - cpu_begin;
  const double mb = double(corpus.bytes) / 1e6;
  return {name,
          corpus.name,
          load_s,
          mb / cpu[0],
          mb / Median({cpu.begin() + 1, cpu.end()}),
          mb / Median({wall.begin() + 1, wall.end()}),
          double(decoded) / 1e6 / decode_s,
          corpus.bytes,
          tokens};
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizers_dir = POLESTAR_TOKENIZER_DATA, shared = POLESTAR_SHARED_DEFAULT;
  int repeat = 5;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokenizers" && i + 1 < argc) {
      tokenizers_dir = argv[++i];
    } else if (arg == "--shared" && i + 1 < argc) {
      shared = argv[++i];
    } else if (arg == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (arg.starts_with("-")) {
      std::fprintf(stderr, "usage: %s [--tokenizers DIR] [--shared DIR] [--repeat N] [names...]\n",
                   argv[0]);
      return 2;
    } else {
      names.push_back(arg);
    }
  }
  if (names.empty()) names = {"qwen3", "llama3"};
  try {
    std::vector<Corpus> corpora(2);
    corpora[0].name = "tinyshakespeare";
    corpora[0].texts = {ReadFile(shared + "/data/tinyshakespeare_input.txt")};
    corpora[1].name = "gsm8k_questions";
    std::istringstream lines(ReadFile(shared + "/data/gsm8k_test.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) corpora[1].texts.push_back(nlohmann::json::parse(line).at("question"));
    }
    for (Corpus& corpus : corpora) {
      for (const std::string& text : corpus.texts) corpus.bytes += text.size();
    }
    std::vector<Row> rows;
    for (const std::string& name : names) {
      const auto begin = Clock::now();
      const auto tokenizer = polestar::Tokenizer::Load(tokenizers_dir + "/" + name);
      const double load_s = Seconds(begin);
      for (const Corpus& corpus : corpora)
        rows.push_back(Measure(*tokenizer, name, load_s, corpus, repeat));
    }
    std::printf("%-9s %-16s %7s %9s %8s %10s %10s %10s %9s\n", "tokenizer", "corpus", "load s",
                "bytes", "tokens", "cold MB/s", "warm MB/s", "wall MB/s", "dec MB/s");
    for (const Row& r : rows) {
      std::printf("%-9s %-16s %7.2f %9zu %8zu %10.2f %10.2f %10.2f %9.1f\n", r.tokenizer.c_str(),
                  r.corpus.c_str(), r.load_s, r.bytes, r.tokens, r.cold_mbps, r.warm_mbps,
                  r.warm_wall_mbps, r.decode_mbps);
    }
    for (const Row& r : rows) {
      const nlohmann::json row = {{"bench", "tokenizer_encode"},
                                  {"tokenizer", r.tokenizer},
                                  {"corpus", r.corpus},
                                  {"threads", 1},
                                  {"load_s", r.load_s},
                                  {"bytes", r.bytes},
                                  {"tokens", r.tokens},
                                  {"encode_cold_mb_per_s", r.cold_mbps},
                                  {"encode_warm_mb_per_s", r.warm_mbps},
                                  {"encode_warm_wall_mb_per_s", r.warm_wall_mbps},
                                  {"decode_mb_per_s", r.decode_mbps}};
      std::printf("%s\n", row.dump().c_str());
    }
  } catch (const polestar::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
