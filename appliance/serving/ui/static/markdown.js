// An answer's Markdown as elements: marked renders it, DOMPurify keeps only the tags Markdown makes.
// Raw HTML in the answer is shown as text (the model's `<script>` is characters, never an element),
// images are shown as their alt text (the page loads nothing a model names), and every code block gets
// a copy button.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";
import { el } from "./dom.js";

const MARKDOWN_TAGS = ["p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote",
  "pre", "code", "em", "strong", "del", "a", "table", "thead", "tbody", "tr", "th", "td", "input"];
const MARKDOWN_ATTRIBUTES = ["href", "title", "align", "start", "class", "type", "checked", "disabled"];

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const markdown = new Marked({
  gfm: true,
  breaks: true, // a model's line breaks stay line breaks, as in chat pages people know
  async: false,
  renderer: {
    html: ({ text }) => escapeHtml(text),
    image: ({ text }) => escapeHtml(text),
  },
});

// The copy button of one code block: the clipboard API where the page is a secure context (https,
// localhost), else the selection and the browser's copy command (plain http on a LAN address).
function copyButton(code) {
  const button = el("button", { type: "button", class: "copy", text: "Copy" });
  button.addEventListener("click", async () => {
    const text = code.textContent.replace(/\n$/, ""); // marked ends a block with a newline; the selection has none
    let copied = false;
    if (navigator.clipboard) {
      copied = await navigator.clipboard.writeText(text).then(() => true, () => false);
    } else {
      getSelection().selectAllChildren(code);
      copied = document.execCommand("copy");
      getSelection().removeAllRanges();
    }
    button.textContent = copied ? "Copied" : "Copy failed";
    setTimeout(() => (button.textContent = "Copy"), 1500);
  });
  return button;
}

export function markdownFragment(text) {
  const html = markdown.parse(text);
  const fragment = DOMPurify.sanitize(html, {
    ALLOWED_TAGS: MARKDOWN_TAGS,
    ALLOWED_ATTR: MARKDOWN_ATTRIBUTES,
    RETURN_DOM_FRAGMENT: true,
  });
  for (const link of fragment.querySelectorAll("a[href]")) {
    link.target = "_blank"; // a link never replaces the conversation
    link.rel = "noopener noreferrer";
  }
  for (const pre of fragment.querySelectorAll("pre")) {
    const block = el("div", { class: "code-block" });
    pre.replaceWith(block);
    block.append(copyButton(pre.querySelector("code") ?? pre), pre);
  }
  return fragment;
}
