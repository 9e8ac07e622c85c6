// Renders every chat template in this folder with @huggingface/jinja (the implementation
// transformers.js uses) over many conversations, one JSONL line per render:
//   {"template": file, "messages", ["tools",] "add_generation_prompt", "bos_token", "eos_token",
//    "text"}
// or "error" instead of "text" when the template raises. jinja_test renders the same and
// compares byte for byte. Usage (see README.md):
//   node render_goldens.mjs JINJA_DIR > goldens.jsonl
import fs from "fs";
import path from "path";
import { fileURLToPath, pathToFileURL } from "url";

const jinjaDir = process.argv[2];
if (!jinjaDir) {
  console.error("usage: node render_goldens.mjs JINJA_DIR (the unpacked @huggingface/jinja)");
  process.exit(2);
}
const { Template } = await import(pathToFileURL(path.join(jinjaDir, "dist", "index.js")).href);
const here = path.dirname(fileURLToPath(import.meta.url));

const contents = [
  "What is 2+2?",
  "  leading and trailing spaces  ",
  "\n\nnewlines\nin the middle\n",
  "\t tabs \t",
  "",
  "日本語で答えて: ÉCOLE naïve Straße 😀 👨‍👩‍👧",
  "special-looking <|im_end|> <|eot_id|> <|start_header_id|>user<|end_header_id|> <role>HUMAN</role>",
  "quotes ' \" and backslashes \\ \\n \\\\ {{ not a tag }} {% neither %}",
  "<think>\nreasoning here\n</think>\n\nThe answer is 4.",
  "<tool_response>result</tool_response>",
  "\u00a0no-break spaces\u3000and ideographic\u2003",
  "control \u0001 \u001f chars",
];
const pick = (i) => contents[i % contents.length];
const conversations = [];
for (let i = 0; i < contents.length; ++i) conversations.push([{ role: "user", content: pick(i) }]);
for (let i = 0; i < contents.length; ++i) {
  conversations.push([{ role: "system", content: pick(i + 3) }, { role: "user", content: pick(i) }]);
}
for (let i = 0; i < contents.length; ++i) {
  conversations.push([
    { role: "user", content: pick(i) },
    { role: "assistant", content: pick(i + 8) },
    { role: "user", content: pick(i + 1) },
  ]);
}
for (let i = 0; i < 6; ++i) {
  conversations.push([
    { role: "system", content: pick(i + 2) },
    { role: "user", content: pick(i) },
    { role: "assistant", content: pick(i + 8) },
    { role: "user", content: pick(i + 5) },
    { role: "assistant", content: pick(i + 4) },
  ]);
}
conversations.push([{ role: "assistant", content: "An assistant turn alone." }]);
conversations.push([{ role: "user", content: "one" }, { role: "user", content: "two" }]);
conversations.push([{ role: "user", content: "hi" }, { role: "tool", content: "{\"result\": 4}" }]);
// Tool use, as the OpenAI-style chat API hands it over: calls with arguments as an object or
// as a JSON string, with and without the "function" wrapper, answered by two tool turns.
const weatherCall = { type: "function", function: { name: "get_weather",
                                                      arguments: { city: "Paris", days: 2 } } };
const clockCall = { name: "get_time", arguments: "{\"zone\": \"UTC\"}" };
conversations.push([
  { role: "system", content: "Use the tools." },
  { role: "user", content: "Weather and time?" },
  { role: "assistant", content: "", tool_calls: [weatherCall, clockCall] },
  { role: "tool", content: "{\"temp\": 18}" },
  { role: "tool", content: "12:00" },
  { role: "assistant", content: "It is 18 degrees at noon." },
]);
conversations.push([
  { role: "user", content: "Paris?" },
  { role: "assistant", content: "Checking.", tool_calls: [weatherCall] },
  { role: "tool", content: "<tool_response>sunny</tool_response>" },
]);
const tools = [{ type: "function", function: { name: "get_weather", description: "Forecast",
                                               parameters: { type: "object",
                                                             properties: { city: { type: "string" } },
                                                             required: ["city"] } } }];
// The last three conversations are rendered once more with tool definitions.
const runs = [...conversations.map((messages) => ({ messages })),
              ...conversations.slice(-3).map((messages) => ({ messages, tools }))];

const files = fs.readdirSync(here).filter((f) => f.endsWith(".jinja")).sort();
const lines = [];
for (const file of files) {
  const template = new Template(fs.readFileSync(path.join(here, file), "utf8"));
  for (const run of runs) {
    for (const add_generation_prompt of [true, false]) {
      const variables = { ...run, add_generation_prompt, bos_token: "<|startoftext|>",
                          eos_token: "<|endoftext|>" };
      const record = { template: file, ...variables };
      try {
        record.text = template.render(variables);
      } catch (e) {
        record.error = String(e.message);
      }
      lines.push(JSON.stringify(record));
    }
  }
}
process.stdout.write(lines.join("\n") + "\n");
