// A fast local OpenAI-shaped upstream for benchmarks: Node's built-in http module.
// Usage: node fast_upstream.js PORT   (prints "ready" once listening)
// POST with "stream":true in the body gets an SSE stream of 8 chunks, else one JSON body.
"use strict";
const http = require("http");

const port = Number(process.argv[2] || 9200);
const completion = JSON.stringify({
  id: "chatcmpl-bench", object: "chat.completion", created: 0, model: "bench",
  choices: [{ index: 0, message: { role: "assistant", content: "hello from the fast upstream" },
              finish_reason: "stop" }],
  usage: { prompt_tokens: 5, completion_tokens: 6, total_tokens: 11 },
});
const chunks = [];
for (let i = 0; i < 8; i++) {
  chunks.push("data: " + JSON.stringify({
    id: "chatcmpl-bench", object: "chat.completion.chunk", created: 0, model: "bench",
    choices: [{ index: 0, delta: { content: "tok" + i }, finish_reason: null }],
  }) + "\n\n");
}

function stream(res, i) {
  // One chunk per event-loop turn, so a proxy sees separate writes as from a real model.
  if (i < chunks.length) {
    res.write(chunks[i]);
    setImmediate(stream, res, i + 1);
  } else {
    res.end("data: [DONE]\n\n");
  }
}

const server = http.createServer((req, res) => {
  const parts = [];
  req.on("data", (c) => parts.push(c));
  req.on("end", () => {
    const body = Buffer.concat(parts).toString();
    if (body.includes('"stream":true') || body.includes('"stream": true')) {
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      stream(res, 0);
    } else {
      res.writeHead(200, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(completion),
      });
      res.end(completion);
    }
  });
});
server.keepAliveTimeout = 120000;
server.headersTimeout = 121000;
server.listen(port, "127.0.0.1", () => console.log("ready"));
