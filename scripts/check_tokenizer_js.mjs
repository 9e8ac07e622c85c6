// Checks that a model folder's tokenizer.json / tokenizer_config.json load in the reference
// JS tokenizer (@lenml/tokenizers, a port of transformers.js) and give the ids Polestar's
// training encoder gives. Usage (package unpacked with `npm pack @lenml/tokenizers@3.7.2`):
//   polestar tasks --task copy --n 50 --json --chat --tokenizer DIR > items.jsonl
//   node scripts/check_tokenizer_js.mjs PATH/TO/package/dist/main.mjs DIR items.jsonl
import { readFileSync } from "node:fs";

const [lib, dir, items] = process.argv.slice(2);
const { TokenizerLoader } = await import(lib);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8")),
  tokenizerConfig: JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8")),
});
let checked = 0, failed = 0;
for (const line of readFileSync(items, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const item = JSON.parse(line);
  for (const [text, ids] of [[item.prompt, item.prompt_ids], [item.answer, item.answer_ids]]) {
    const got = tokenizer.encode(text, { add_special_tokens: false });
    ++checked;
    if (JSON.stringify(got) !== JSON.stringify(ids)) {
      ++failed;
      console.log(`MISMATCH ${JSON.stringify(text)}\n  ours ${ids}\n  js   ${got}`);
    } else if (tokenizer.decode(got) !== text) {
      ++failed;
      console.log(`DECODE MISMATCH ${JSON.stringify(text)} -> ${JSON.stringify(tokenizer.decode(got))}`);
    }
  }
}
// The chat template renders LLaDA's format.
const chat = tokenizer.apply_chat_template([{ role: "user", content: "Hi" }], { tokenize: false });
const expected = "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
                 "<|start_header_id|>assistant<|end_header_id|>\n\n";
if (chat !== expected) { ++failed; console.log(`CHAT TEMPLATE ${JSON.stringify(chat)}`); }
console.log(`${checked} texts checked, ${failed} mismatches`);
process.exit(failed ? 1 : 0);
