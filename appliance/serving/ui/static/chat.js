// The chat page for generate pipelines: a conversation with the served model through
// /v1/chat/completions, streamed (server-sent events read from fetch's body); conversations and
// settings kept in this browser.

import { makeClient, ServerError, sseData } from "./api.js";
import { Composer } from "./composer.js";
import { byId, el } from "./dom.js";
import { askKey } from "./key_dialog.js";
import { messageView, showAnswer } from "./messages.js";
import { Settings } from "./settings.js";
import { startStatus } from "./status.js";
import { loadConversations, newConversation, saveConversations } from "./store.js";

const client = makeClient(askKey);
const settings = new Settings(byId("settings-form"));
const composer = new Composer({
  text: byId("prompt"),
  picker: byId("picker"),
  thumbnails: byId("thumbnails"),
  dropZone: document.body,
  onNotice: notice,
});
const state = {
  model: null,
  conversations: loadConversations(),
  current: null,
  streaming: null, // the AbortController of the answer coming in
  editing: null, // index of the user message being edited
};

function notice(text) {
  byId("notice").textContent = text;
}

// A touch or narrow screen often has no keyboard: its placeholder names no keys (chat.html holds both).
const KEYLESS = matchMedia("(pointer: coarse), (max-width: 700px)");
const KEYED_PLACEHOLDER = byId("prompt").placeholder;
function showPlaceholder() {
  const prompt = byId("prompt");
  prompt.placeholder = KEYLESS.matches ? prompt.dataset.keylessPlaceholder : KEYED_PLACEHOLDER;
}
KEYLESS.addEventListener("change", showPlaceholder);
showPlaceholder();

function save() {
  if (!saveConversations(state.conversations)) notice("Browser storage is full: images of these conversations are not kept.");
}

// ---- the conversation ------------------------------------------------------------------------------
function render() {
  const conversation = state.current;
  const last = conversation.messages.length - 1;
  const views = conversation.messages.map((message, index) => {
    const idle = !state.streaming;
    const actions = {
      edit: message.role === "user" && idle ? () => startEdit(index) : null,
      regenerate: message.role === "assistant" && index === last && idle ? regenerate : null,
    };
    return messageView(message, message.role === "user" ? "You" : (state.model ?? "Model"), actions);
  });
  byId("messages").replaceChildren(...views.map((view) => view.node));
  renderList();
  return views[views.length - 1];
}

function renderList() {
  const items = [...state.conversations]
    .sort((a, b) => b.updated - a.updated)
    .map((conversation) =>
      el(
        "li",
        { class: conversation === state.current ? "current" : "" },
        el("button", { type: "button", class: "open", text: conversation.title, onclick: () => open(conversation) }),
        el("button", {
          type: "button",
          class: "delete",
          "aria-label": `Delete conversation ${conversation.title}`,
          text: "×",
          onclick: () => remove(conversation),
        }),
      ),
    );
  byId("conversation-list").replaceChildren(...items);
}

function open(conversation) {
  if (state.streaming) return;
  state.current = conversation;
  cancelEdit();
  render();
}

function remove(conversation) {
  if (state.streaming && conversation === state.current) return;
  state.conversations = state.conversations.filter((c) => c !== conversation);
  save();
  if (conversation === state.current) startNew();
  else renderList();
}

function startNew() {
  if (state.streaming) return;
  const empty = state.conversations.find((c) => c.messages.length === 0);
  state.current = empty ?? newConversation();
  if (!empty) state.conversations.push(state.current);
  cancelEdit();
  render();
  byId("prompt").focus();
}

// ---- sending ---------------------------------------------------------------------------------------
function apiMessages(messages) {
  const out = settings.system ? [{ role: "system", content: settings.system }] : [];
  for (const message of messages) {
    if (message.role === "user") {
      const images = message.images.filter((image) => image.url);
      out.push({
        role: "user",
        content: images.length
          ? [...images.map((image) => ({ type: "image_url", image_url: { url: image.url } })), { type: "text", text: message.text }]
          : message.text,
      });
    } else if (message.text) {
      out.push({ role: "assistant", content: message.text });
    }
  }
  return out;
}

// The request's fields from the settings, or null once the notice says which field is wrong.
function requestFields() {
  try {
    const fields = settings.requestFields();
    notice("");
    return fields;
  } catch (error) {
    notice(error.message);
    return null;
  }
}

function send() {
  if (state.streaming || composer.empty) return;
  const fields = requestFields();
  if (!fields) return;
  const conversation = state.current;
  if (state.editing !== null) conversation.messages.splice(state.editing);
  cancelEdit();
  const message = { role: "user", ...composer.take() };
  conversation.messages.push(message);
  if (conversation.title === "New conversation") {
    conversation.title = message.text.slice(0, 48) || message.images[0]?.name || "Images";
  }
  answer(fields);
}

function regenerate() {
  const messages = state.current.messages;
  if (state.streaming || messages[messages.length - 1]?.role !== "assistant") return;
  const fields = requestFields();
  if (!fields) return;
  messages.pop();
  answer(fields);
}

async function answer(fields) {
  const conversation = state.current;
  const reply = { role: "assistant", text: "", images: [], stats: null, error: null };
  const body = {
    model: state.model ?? undefined,
    messages: apiMessages(conversation.messages),
    stream: true,
    stream_options: { include_usage: true },
    ...fields,
  };
  conversation.messages.push(reply);
  conversation.updated = Date.now();
  state.streaming = new AbortController();
  showStreaming(true);
  const view = render();
  const started = performance.now();
  let first = null;
  let usage = null;
  let finish = null;
  try {
    const response = await client.request("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: state.streaming.signal,
    });
    for await (const chunk of sseData(response)) {
      if (chunk.error) {
        reply.error = chunk.error.message;
        break;
      }
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices ?? []) {
        const piece = choice.delta?.content;
        if (piece) {
          first ??= performance.now();
          reply.text += piece;
          showAnswer(view.text, reply.text);
          view.node.scrollIntoView({ block: "end" });
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
  } catch (error) {
    if (error.name === "AbortError") finish = "stopped";
    else reply.error = error instanceof ServerError ? `${error.status}: ${error.message}` : String(error.message ?? error);
  }
  const ended = performance.now();
  const out = usage?.completion_tokens ?? null;
  reply.stats = {
    ttft_s: first === null ? null : (first - started) / 1000,
    elapsed_s: (ended - started) / 1000, // sending to the last token: short answers arrive in one burst
    prompt_tokens: usage?.prompt_tokens ?? null,
    completion_tokens: out,
    finish_reason: finish,
  };
  state.streaming = null;
  showStreaming(false);
  save();
  render();
}

function stop() {
  state.streaming?.abort();
}

function showStreaming(on) {
  byId("send").hidden = on;
  byId("stop").hidden = !on;
}

// ---- edit and resend -------------------------------------------------------------------------------
function startEdit(index) {
  state.editing = index;
  composer.fill(state.current.messages[index]);
  byId("edit-banner").hidden = false;
}

function cancelEdit() {
  if (state.editing === null) return;
  state.editing = null;
  byId("edit-banner").hidden = true;
}

// ---- wiring ----------------------------------------------------------------------------------------
async function loadModel() {
  try {
    const models = await client.request("v1/models").then((r) => r.json());
    state.model = models.data[0]?.id ?? null;
    byId("model").textContent = state.model ?? "";
    render();
  } catch (error) {
    notice(`Could not read the model name: ${error.message}`);
  }
}

byId("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
byId("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  if (state.streaming) stop();
  else if (state.editing !== null) {
    cancelEdit();
    composer.take();
  }
});
byId("stop").addEventListener("click", stop);
byId("new-chat").addEventListener("click", startNew);
byId("cancel-edit").addEventListener("click", () => {
  cancelEdit();
  composer.take();
});
for (const [button, panel] of [["toggle-list", "conversations"], ["toggle-settings", "settings"]]) {
  const show = (shown) => {
    byId(panel).classList.toggle("closed", !shown);
    byId(button).setAttribute("aria-expanded", String(shown));
  };
  byId(button).addEventListener("click", () => show(byId(panel).classList.contains("closed")));
  document.querySelector(`[data-closes="${panel}"]`).addEventListener("click", () => show(false));
}

if (matchMedia("(min-width: 900px)").matches) byId("toggle-list").click(); // room for the list beside the chat

startStatus(byId("status"), client);
startNew();
loadModel();
