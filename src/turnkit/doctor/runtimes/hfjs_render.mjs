// turnkit's @huggingface/jinja renderer: one JSON object a line on stdin, {"template": TEXT, "context": OBJECT}; one a
// line on stdout, {"text": RENDER} or {"error": MESSAGE}. argv[2] is the installed package's entry file
// (node_modules/@huggingface/jinja/dist/index.js); compiled templates are kept by text, as transformers.js keeps them.
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const { Template } = await import(pathToFileURL(process.argv[2]).href);
const compiled = new Map();
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  let reply;
  try {
    const request = JSON.parse(line);
    let template = compiled.get(request.template);
    if (template === undefined) {
      template = new Template(request.template);
      compiled.set(request.template, template);
    }
    reply = { text: template.render(request.context) };
  } catch (error) {
    reply = { error: String(error && error.message !== undefined ? error.message : error) };
  }
  process.stdout.write(JSON.stringify(reply) + "\n");
}
