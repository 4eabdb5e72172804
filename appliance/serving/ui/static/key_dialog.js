// Asks for the API key when the server answers 401 (server.api_key is set): a modal dialog with a
// password field. Resolves to the key, or null when the user cancels.

import { byId } from "./dom.js";

export function askKey(reason, hadKey) {
  const dialog = byId("key-dialog");
  const form = byId("key-form");
  const input = byId("key-input");
  byId("key-reason").textContent = hadKey ? `The key was refused: ${reason}` : reason;
  input.value = "";
  return new Promise((resolve) => {
    const finish = (key) => {
      form.removeEventListener("submit", onSubmit);
      byId("key-cancel").removeEventListener("click", onCancel);
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
    byId("key-cancel").addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    input.focus();
  });
}
