// Writes expected token ids computed by the reference implementation (@lenml/tokenizers, a
// port of the transformers.js tokenizers) for the tokenizer tests.
//
// node tokenizer-goldens.cjs LENML_DIR TOKENIZER_DIR TEXTS_JSONL SHARED_DIR OUT_JSONL
//
// Texts: the hand-written TEXTS_JSONL, GSM8K questions, MBPP code, MATH-500 problems,
// Tiny Shakespeare slices and seeded random mixes of scripts, whitespace, digits,
// apostrophes and special-token text. One output line per text:
//   {"kind": "text", "text", "ids", "decoded", "decoded_skip_special"}
// plus chat lines {"kind": "chat", "template", "messages", "text", "ids"}.
"use strict";
const fs = require("fs");
const path = require("path");

const [lenmlDir, tokenizerDir, textsPath, sharedDir, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: tokenizer-goldens.cjs LENML_DIR TOKENIZER_DIR TEXTS_JSONL SHARED_DIR OUT_JSONL");
  process.exit(2);
}
const { TokenizerLoader } = require(path.resolve(lenmlDir, "dist", "main.js"));
const readJson = (file) => JSON.parse(fs.readFileSync(path.join(tokenizerDir, file), "utf8"));
const config = readJson("tokenizer_config.json");
const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON: readJson("tokenizer.json"), tokenizerConfig: config });

const readLines = (file) => fs.readFileSync(file, "utf8").split("\n").filter((line) => line.trim());
const texts = readLines(textsPath).map((line) => JSON.parse(line).text);
const data = (name) => path.join(sharedDir, "data", name);
for (const line of readLines(data("gsm8k_test.jsonl")).slice(0, 60)) texts.push(JSON.parse(line).question);
for (const line of readLines(data("mbpp.jsonl")).slice(0, 30)) texts.push(JSON.parse(line).code);
for (const line of readLines(data("math500_test.jsonl")).slice(0, 30)) texts.push(JSON.parse(line).problem);
const shakespeare = fs.readFileSync(data("tinyshakespeare_input.txt"), "utf8");
for (let i = 0; i < 8; ++i) texts.push(shakespeare.slice(i * 3000, i * 3000 + 1500));

// Seeded random mixes (mulberry32), so every run writes the same file.
let seed = 12345;
const random = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pools = [
  ["the", "The", "hello", "World", "x", "I", "a", "naïve", "Straße", "ÉCOLE", "_id", "camelCase"],
  [" ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028",
   "\u0085", "\ufeff", "\u000b", "\u000c", "\u200b", "\u1680", "\u2003"],
  ["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'ſ", "'", "''", "’s", "n't"],
  ["0", "7", "42", "123", "2024", "3.14", "1e10", "½", "²", "٣", "１２", "Ⅻ", "⁹"],
  [".", ",", "!", "?", ";", ":", "-", "--", "...", "(", ")", "[", "]", "{", "}", "<", ">",
   "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "+", "=", "~", "`", "\"", "«", "»", "—", "…"],
  ["é", "e\u0301", "A\u030a", "Ω", "ж", "中文", "日本語", "한국어", "ไทย", "नमस्ते", "عربى",
   "עברית", "𝒳", "𠀀", "ﬁ", "ǅ", "ß"],
  ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "1️⃣", "∑", "√", "∞", "→", "★"],
  ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|begin_of_text|>",
   "<|start_header_id|>", "<think>", "</think>", "<|im_", "<|endoftext|", "<|", "|>"],
];
for (let n = 0; n < 300; ++n) {
  let text = "";
  const parts = 1 + Math.floor(random() * 24);
  for (let i = 0; i < parts; ++i) {
    const pool = pools[Math.floor(random() * pools.length)];
    text += pool[Math.floor(random() * pool.length)];
  }
  texts.push(text);
}

const out = [];
for (const text of texts) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const decode = (options) => (ids.length ? tokenizer.decode(ids, options) : "");
  out.push({ kind: "text", text, ids, decoded: decode({}),
             decoded_skip_special: decode({ skip_special_tokens: true }) });
}

// Chat templates: the tokenizer's own when it renders in the bundled Jinja, else Qwen2's
// ChatML with its default system prompt (the format Dream uses).
const qwen2Template =
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}" +
  "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}" +
  "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}" +
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const template = config.chat_template.includes("<|start_header_id|>") ? config.chat_template : qwen2Template;
const conversations = [
  [{ role: "user", content: "What is 2+2?" }],
  [{ role: "system", content: "Be brief." }, { role: "user", content: "  Name a prime.\n\n" }],
  [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello! How can I help?" },
   { role: "user", content: "Solve x^2 = 4.\t" }],
  [{ role: "user", content: "日本語で答えて <|endoftext|> please" }],
];
for (const messages of conversations) {
  const text = tokenizer.apply_chat_template(messages, { chat_template: template, tokenize: false,
                                                        add_generation_prompt: true });
  out.push({ kind: "chat", template, messages, text, ids: tokenizer.encode(text, { add_special_tokens: false }) });
}
fs.writeFileSync(outPath, out.map((record) => JSON.stringify(record)).join("\n") + "\n");
