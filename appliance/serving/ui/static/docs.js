// The API docs page: this server's OpenAPI document (openapi.json) as a list of its routes, each with its
// request body and answers, and the schemas they name. Made from this server alone, so it works offline.

import { byId, el } from "./dom.js";

const REF = "#/components/schemas/";

// A schema as indented JSON, each {"$ref": ...} named as a link to that schema below.
function schemaView(schema) {
  const text = JSON.stringify(schema, null, 2);
  const parts = [];
  let last = 0;
  for (const match of text.matchAll(/"#\/components\/schemas\/([^"]+)"/g)) {
    parts.push(text.slice(last, match.index), el("a", { href: `#schema-${match[1]}`, text: match[0] }));
    last = match.index + match[0].length;
  }
  parts.push(text.slice(last));
  return el("pre", {}, ...parts);
}

function contentViews(content) {
  return Object.entries(content ?? {}).map(([type, media]) =>
    el("div", {}, el("p", { text: type }), media.schema ? schemaView(media.schema) : null),
  );
}

function operationView(path, method, operation) {
  const parts = [el("h3", {}, el("span", { class: "method", text: method }), el("code", { text: path }))];
  if (operation.summary) parts.push(el("p", { text: operation.summary }));
  for (const parameter of operation.parameters ?? []) {
    parts.push(el("p", { text: `${parameter.in} parameter ${parameter.name}${parameter.required ? " (required)" : ""}` }));
  }
  if (operation.requestBody) {
    parts.push(el("details", {}, el("summary", { text: "Request body" }), ...contentViews(operation.requestBody.content)));
  }
  for (const [code, answer] of Object.entries(operation.responses ?? {})) {
    parts.push(
      el("details", {}, el("summary", { text: `${code}: ${answer.description ?? ""}` }), ...contentViews(answer.content)),
    );
  }
  return el("article", { class: "operation" }, ...parts);
}

async function main() {
  let document_;
  try {
    const response = await fetch("openapi.json");
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    document_ = await response.json();
  } catch (error) {
    byId("summary").textContent = `Could not read openapi.json: ${error.message}`;
    return;
  }
  const paths = Object.entries(document_.paths ?? {}).sort(([a], [b]) => a.localeCompare(b));
  byId("summary").textContent = `${document_.info?.title ?? "API"}: ${paths.length} routes, from openapi.json (OpenAPI ${document_.openapi}).`;
  byId("operations").replaceChildren(
    ...paths.flatMap(([path, item]) => Object.entries(item).map(([method, operation]) => operationView(path, method, operation))),
  );
  const schemas = Object.entries(document_.components?.schemas ?? {}).sort(([a], [b]) => a.localeCompare(b));
  byId("schemas").replaceChildren(
    ...schemas.map(([name, schema]) => el("details", { id: `schema-${name}` }, el("summary", { text: name }), schemaView(schema))),
  );
}

main();
