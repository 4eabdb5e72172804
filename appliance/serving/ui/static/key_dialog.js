// Asks for the API key when the server answers 401 (server.api_key is set): a modal dialog with a
// password field, added to the page on first use (every page shares this markup). Resolves to the key,
// or null when the user cancels.

import { byId, el } from "./dom.js";

function addDialog() {
  const form = el("form", { id: "key-form" },
    el("h2", { id: "key-title", text: "API key" }), el("p", { id: "key-reason" }),
    el("label", { for: "key-input", text: "The server's API key (kept for this tab only)" }),
    el("input", { id: "key-input", type: "password", autocomplete: "off" }),
    el("div", { class: "dialog-buttons" }, el("button", { type: "button", id: "key-cancel", text: "Cancel" }),
      el("button", { type: "submit", class: "primary", text: "Use key" })));
  const dialog = el("dialog", { id: "key-dialog", "aria-labelledby": "key-title" }, form);
  document.body.append(dialog);
  return dialog;
}

export function askKey(reason, hadKey) {
  const dialog = byId("key-dialog") ?? addDialog();
  const form = byId("key-form");
  const input = byId("key-input");
  const cancel = byId("key-cancel");
  byId("key-reason").textContent = hadKey ? `The key was refused: ${reason}` : reason;
  input.value = "";
  return new Promise((resolve) => {
    const finish = (key) => {
      form.removeEventListener("submit", onSubmit);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onCancel);
      dialog.close();
      resolve(key);
    };
    const onSubmit = (event) => {
      event.preventDefault();
      finish(input.value.trim() || null);
    };
    const onCancel = (event) => {
      event.preventDefault();
      finish(null);
    };
    form.addEventListener("submit", onSubmit);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    input.focus();
  });
}
