// Serves the example page and the built SDK (clients/typescript/dist at /sdk/) on one origin.
// Usage: (cd clients/typescript && npm ci && npm run build) && node examples/browser/serve.mjs [port]
// then open http://127.0.0.1:PORT/?server=http://127.0.0.1:8080&channel=news
import { once } from "node:events";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const sdk = path.resolve(here, "..", "..", "clients", "typescript", "dist");
const types = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".map": "application/json" };

/** Starts the static server; resolves to {url, close}. */
export async function startExampleServer(port = 0) {
  const srv = http.createServer((req, res) => {
    const p = new URL(req.url, "http://x").pathname;
    const file = p.startsWith("/sdk/")
      ? path.join(sdk, path.normalize(p.slice(5)))
      : path.join(here, p === "/" ? "index.html" : path.normalize(p));
    if (!file.startsWith(sdk) && !file.startsWith(here)) { res.writeHead(403); return res.end(); }
    fs.readFile(file, (err, body) => {
      if (err) { res.writeHead(404); return res.end("not found"); }
      res.writeHead(200, { "content-type": types[path.extname(file)] ?? "application/octet-stream", "cache-control": "no-store" });
      res.end(body);
    });
  });
  srv.listen(port, "127.0.0.1");
  await once(srv, "listening");
  return { url: `http://127.0.0.1:${srv.address().port}/`, close: () => new Promise((r) => srv.close(r)) };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { url } = await startExampleServer(Number(process.argv[2] ?? 8079));
  console.log(`example page: ${url}?server=http://127.0.0.1:8080&channel=news`);
}
