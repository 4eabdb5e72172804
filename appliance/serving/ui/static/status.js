// The status strip: the server's own state from /ready and /metrics, refreshed every few seconds: ready
// or draining, requests running and waiting, KV cache use, and the server's rate of one counter over the
// last interval, every request's together: tokens/s by default, tiles/s on the map page (`rate`). Both
// routes are open (probes and Prometheus need them
// so), but with server.api_key set a page shows nothing of the server's state until it was given the
// key: the strip stays empty until the page's client (api.js) has had an answer that is not a 401, so a
// page makes one API request as it loads (the chat page's /v1/models).

import { el } from "./dom.js";

const EVERY_MS = 3000;
const SERIES = /^(?:appliance_|vllm:)(num_requests_running|num_requests_waiting|kv_cache_usage_perc|generation_tokens_total|tiles_total)(?:\{[^}]*\})?\s+(\S+)$/gm;

function readMetrics(text) {
  const values = {};
  for (const [, name, value] of text.matchAll(SERIES)) values[name] = Number(value);
  return values;
}

const TOKENS = { counter: "generation_tokens_total", unit: "tokens/s" };

export async function startStatus(strip, client, rate = TOKENS) {
  let previous = null; // {tokens, at}: the counter's last reading, for its rate

  async function refresh() {
    const parts = [];
    try {
      const ready = await fetch("ready").then((r) => r.json());
      parts.push(el("span", { class: `state ${ready.status}`, text: ready.status }));
      const values = readMetrics(await fetch("metrics").then((r) => r.text()));
      parts.push(el("span", { text: `running ${values.num_requests_running ?? 0}` }));
      parts.push(el("span", { text: `waiting ${values.num_requests_waiting ?? 0}` }));
      if (values.kv_cache_usage_perc !== undefined) {
        parts.push(el("span", { text: `KV ${(100 * values.kv_cache_usage_perc).toFixed(0)}%` }));
      }
      const tokens = values[rate.counter];
      if (tokens !== undefined) {
        const now = performance.now();
        if (previous) {
          const perSecond = (tokens - previous.tokens) / ((now - previous.at) / 1000);
          // The server's rate, every request's, since the last reading: labelled so, unlike a message's.
          parts.push(el("span", {
            text: `server ${perSecond.toFixed(1)} ${rate.unit}`,
            title: `${rate.unit} the server computed over the last ${EVERY_MS / 1000} s, all requests together`,
          }));
        }
        previous = { tokens, at: now };
      }
    } catch {
      parts.length = 0;
      parts.push(el("span", { class: "state unreachable", text: "server unreachable" }));
    }
    strip.replaceChildren(...parts);
  }

  strip.replaceChildren();
  await client.authorized;
  refresh();
  setInterval(refresh, EVERY_MS);
}
