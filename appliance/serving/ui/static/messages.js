// One message of the conversation as an element: who speaks, the images, the text (a question as text,
// an answer as sanitised Markdown: markdown.js), the error the server gave, and under an answer its
// figures: time to first token; the answer's tokens, the time from sending to its last token and their
// rate (the one speed figure of a message); the prompt's tokens; the finish reason.

import { el } from "./dom.js";
import { markdownFragment } from "./markdown.js";
import { counted } from "./words.js";

export function statsLine(stats) {
  const parts = [];
  if (stats.ttft_s !== null) parts.push(`first token ${stats.ttft_s.toFixed(2)} s`);
  if (stats.completion_tokens !== null) {
    const seconds = stats.elapsed_s; // absent from answers kept by an older page
    const timed = seconds > 0 ? ` in ${seconds.toFixed(2)} s, ${(stats.completion_tokens / seconds).toFixed(1)} tokens/s` : "";
    parts.push(`answer ${counted(stats.completion_tokens, "token")}${timed}`);
  }
  if (stats.prompt_tokens !== null) parts.push(`prompt ${counted(stats.prompt_tokens, "token")}`);
  parts.push(`finish: ${stats.finish_reason ?? "none"}`);
  return parts.join(" · ");
}

// An answer's text, shown again as more of it streams in.
export function showAnswer(node, text) {
  node.replaceChildren(markdownFragment(text));
}

// actions: {edit, regenerate} callbacks or null; returns {node, text, stats, error} for live updates.
export function messageView(message, speaker, actions) {
  const answer = message.role === "assistant";
  const text = el("div", { class: answer ? "text markdown" : "text", text: answer ? null : message.text });
  if (answer) showAnswer(text, message.text);
  const stats = el("p", { class: "stats", text: message.stats ? statsLine(message.stats) : "" });
  const error = el("p", { class: "error", role: "alert", text: message.error ?? "", hidden: !message.error });
  const images = (message.images ?? []).map((image) =>
    el(
      "figure",
      { class: "thumbnail" },
      image.url ? el("img", { src: image.url, alt: image.name }) : null,
      el("figcaption", { text: image.url ? image.name : `${image.name} (not kept: storage full)` }),
    ),
  );
  const buttons = [];
  if (actions?.edit) buttons.push(el("button", { type: "button", text: "Edit", onclick: actions.edit }));
  if (actions?.regenerate) buttons.push(el("button", { type: "button", text: "Regenerate", onclick: actions.regenerate }));
  const node = el(
    "article",
    { class: `message ${message.role}` },
    el("h2", { class: "speaker", text: speaker }),
    images.length ? el("div", { class: "images" }, ...images) : null,
    text,
    error,
    answer ? stats : null,
    buttons.length ? el("div", { class: "actions" }, ...buttons) : null,
  );
  return { node, text, stats, error };
}
