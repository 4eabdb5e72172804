// The settings panel: its fields kept in localStorage, and the request fields they make. An empty number
// field is left out of the request (the server's default applies).

import { loadSettings, saveSettings } from "./store.js";

const NUMBERS = { temperature: parseFloat, top_p: parseFloat, max_tokens: (v) => parseInt(v, 10), seed: (v) => parseInt(v, 10) };
const FIELDS = ["system", "json_schema", ...Object.keys(NUMBERS)];

export class Settings {
  constructor(form) {
    this.form = form;
    const saved = loadSettings();
    for (const name of FIELDS) {
      if (saved[name] !== undefined) form.elements[name].value = saved[name];
    }
    form.addEventListener("input", () => saveSettings(this.values()));
    form.addEventListener("submit", (event) => event.preventDefault());
  }

  values() {
    return Object.fromEntries(FIELDS.map((name) => [name, this.form.elements[name].value]));
  }

  get system() {
    return this.form.elements.system.value.trim();
  }

  // The request's sampling and structured-output fields; throws Error naming a field the page cannot send.
  requestFields() {
    const fields = {};
    for (const [name, parse] of Object.entries(NUMBERS)) {
      const text = this.form.elements[name].value.trim();
      if (text !== "") fields[name] = parse(text);
    }
    const schema = this.form.elements.json_schema.value.trim();
    if (schema) {
      let parsed;
      try {
        parsed = JSON.parse(schema);
      } catch (error) {
        throw new Error(`JSON schema (settings): not valid JSON: ${error.message}`);
      }
      fields.response_format = { type: "json_schema", json_schema: { name: "answer", schema: parsed } };
    }
    return fields;
  }
}
