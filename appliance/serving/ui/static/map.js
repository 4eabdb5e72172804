// The map page for pooling pipelines. A GeoTIFF from disk (picker, or dropped anywhere on the
// page) or the URL of a GeoTIFF or STAC item goes to POST v1/scenes (with the acquisition date when the
// date field is filled: `?date=` for a file, `"date"` beside the URL); a multi-date model's page (T
// `frames` in GET v1/scenes) also has T date pickers whose files go as one form, and T date fields in
// place of the one (scene_dates.js), a stacked file taking all T dates. The page polls the scene for its
// tiles until it is done, then shows the input with the predicted mask over it on a map that zooms to
// single pixels (scene_map.js: the scene's map tiles), the headline figures (water, burn scar or crops:
// scene_math.js `headlineFigures`), a legend, the reading of the pixel pointed at, the mask and its STAC
// item to download, and the tiles' and the mask's URLs for QGIS or a web map.
// Files and tiles come through fetch (with the API key when the server has one) as blobs, never by a URL
// holding the key. The scene's id is kept in the address's fragment, so a reload finds it again while the
// server keeps it.

import { makeClient, ServerError } from "./api.js";
import { byId, el } from "./dom.js";
import { askKey } from "./key_dialog.js";
import { factsEntries, legendItems, reading, readingNodes, headlineText } from "./scene_facts.js";
import { DateInputs, datesForm } from "./scene_dates.js";
import { sceneProblem } from "./scene_problem.js";
import { SceneMap } from "./scene_map.js";
import { startStatus } from "./status.js";
import { counted } from "./words.js";

const POLL_MS = 700;
const client = makeClient(askKey);
const tile = (layer, z, x, y) => `${scenePath(state.result.id)}/tiles/${layer}/${z}/${x}/${y}.png`;
// The map shown (exported for the browser tests and the console: `view.map` is the Leaflet map).
export const view = new SceneMap(byId("viewer"), {
  load: (layer, z, x, y) => client.request(tile(layer, z, x, y)).then((response) => response.blob()),
  onPoint: showReading,
});
const state = {
  run: null, // the scene the page follows: {name, files, id, started, resumed, controller}; replaced by another
  limits: null, // GET v1/scenes: max_request_bytes, keep_s, frames
  dates: null, // a multi-date model's DateInputs
  result: null, // {id, summary}: the scene shown
};

const scenePath = (id) => `v1/scenes/${encodeURIComponent(id)}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const MIB = 2 ** 20;
const megabytes = (bytes) => `${(bytes / MIB).toFixed(bytes < 10 * MIB ? 1 : 0)} MiB`;

function notice(text) {
  byId("notice").textContent = text;
}

function messageOf(error) {
  return error instanceof ServerError ? `${error.status}: ${error.message}` : String(error?.message ?? error);
}

// What was wrong with `run`'s scene, naming the files the person chose (scene_problem.js).
function problemOf(run, error) {
  return error instanceof ServerError ? sceneProblem(error, run.files) : messageOf(error);
}

// ---- a scene's run ---------------------------------------------------------------------------------
function sendFile(file) {
  if (!file || state.run || !fits(file.name, file.size)) return;
  const date = acquisitionDate();
  if (date === undefined) return;
  const path = date ? `v1/scenes?date=${encodeURIComponent([date].flat().join(","))}` : "v1/scenes";
  const init = { headers: { "Content-Type": "image/tiff" }, body: file };
  start(file.name, [file.name], path, init, `uploading ${megabytes(file.size)}…`);
}

function sendUrl(url) {
  if (!url || state.run) return;
  const date = acquisitionDate();
  if (date === undefined) return;
  const body = JSON.stringify(date ? { url, date } : { url });
  start(url, [], "v1/scenes", { headers: { "Content-Type": "application/json" }, body }, "sending the URL…");
}

// A multi-date model's T files, in time order, as one form (the browser writes its Content-Type).
function sendDates(files) {
  const size = files.reduce((sum, file) => sum + file.size, 0);
  const name = files.map((file) => file.name).join(" + ");
  if (state.run || !fits(name, size)) return;
  const dates = acquisitionDate();
  if (dates === undefined) return;
  start(name, files.map((file) => file.name), "v1/scenes", { body: datesForm(files, dates) }, `uploading ${megabytes(size)}…`);
}

// False, once the person is told, when the upload is larger than the server takes.
function fits(name, size) {
  const limit = state.limits?.max_request_bytes;
  const over = Boolean(limit) && size > limit;
  if (over) notice(`${name}: ${megabytes(size)} is more than this server takes (${megabytes(limit)}).`);
  return !over;
}

// The date field's YYYY-MM-DD, a multi-date model's T of them, or null when none is given (the server
// then takes the scene's own); undefined, once the person is told, when only some of the T are.
function acquisitionDate() {
  if (!state.dates) return byId("date").value || null;
  try {
    return state.dates.given();
  } catch (error) {
    notice(error.message);
    return undefined;
  }
}

// `files`: the names of the files sent, in the order of the request's fields.
async function start(name, files, path, init, what) {
  const run = { name, files, id: null, started: performance.now(), controller: new AbortController() };
  begin(run, what);
  let scene;
  try {
    const response = await client.request(path, { method: "POST", ...init, signal: run.controller.signal });
    scene = await response.json();
  } catch (error) {
    if (state.run === run) {
      if (error.name === "AbortError") end("Stopped before the server had the scene.", "stopped");
      else end(problemOf(run, error));
    }
    return;
  }
  if (state.run !== run) return;
  history.replaceState(null, "", `#${encodeURIComponent(scene.id)}`);
  follow(run, scene);
}

function begin(run, what) {
  state.run = run;
  notice("");
  byId("result").hidden = true;
  byId("inputs").disabled = true;
  byId("job").hidden = false;
  byId("stop").hidden = false;
  byId("job-name").textContent = run.name;
  showState(what, null, null);
}

// Polls the scene until it is done or failed, or the page follows another.
async function follow(run, scene) {
  run.id = scene.id;
  for (;;) {
    showProgress(run, scene);
    if (scene.status === "done") return showResult(run, scene);
    if (scene.status === "failed") {
      const { code, message, param } = scene.error ?? {};
      return end(sceneProblem({ status: code ?? 500, message: message ?? "no message", param }, run.files));
    }
    await sleep(POLL_MS);
    if (state.run !== run) return;
    try {
      scene = await client.request(scenePath(run.id)).then((response) => response.json());
    } catch (error) {
      if (state.run === run) end(messageOf(error));
      return;
    }
    if (state.run !== run) return;
  }
}

function showProgress(run, scene) {
  const { status, tiles_done: done, tiles_total: total } = scene;
  if (status === "queued") showState("queued: waiting for the engine…", null, null);
  else if (status === "running" && total === null) showState("running: opening the scene…", null, null);
  else if (status === "running") showState(`running: ${done} of ${counted(total, "tile")}`, done, total);
  else if (status === "done") {
    const seconds = ((performance.now() - run.started) / 1000).toFixed(1);
    const tiles = counted(total, "tile");
    showState(run.resumed ? `done: ${tiles}` : `done: ${tiles} in ${seconds} s`, total, total);
  } else showState(status, null, null);
}

// value null: an indeterminate bar (nothing to count yet).
function showState(text, value, max) {
  byId("job-state").textContent = text;
  const bar = byId("job-progress");
  if (value === null) bar.removeAttribute("value");
  else {
    bar.max = Math.max(max, 1);
    bar.value = value;
  }
}

// The run ends, with `message` unless it ended well (an error, or why it stopped); the inputs open again.
function end(message, label = "failed") {
  state.run = null;
  byId("inputs").disabled = false;
  byId("stop").hidden = true;
  const bar = byId("job-progress");
  if (!bar.hasAttribute("value")) bar.value = 0;
  if (message) {
    byId("job-state").textContent = label;
    notice(message);
  }
}

async function stop() {
  const run = state.run;
  if (!run) return;
  if (!run.id) {
    run.controller.abort(); // still uploading: the POST's end stops it
    return;
  }
  state.run = null;
  try {
    await client.request(scenePath(run.id), { method: "DELETE" });
    forget();
    end("Stopped: the server dropped the scene.", "stopped");
  } catch (error) {
    end(messageOf(error));
  }
}

function forget() {
  history.replaceState(null, "", location.pathname + location.search);
}

// ---- the result ------------------------------------------------------------------------------------
async function showResult(run, scene) {
  // A scene sent by URL has no scene layer (its input is not kept on the server): not asked for.
  const byUrl = run.files.length === 0 && !run.resumed;
  let grids;
  try {
    grids = await Promise.all([tileJson(scene.id, "mask"), byUrl ? null : tileJson(scene.id, "scene")]);
  } catch (error) {
    if (state.run === run) end(messageOf(error));
    return;
  }
  if (state.run !== run) return;
  const [grid, sceneGrid] = grids;
  const summary = scene.result;
  state.result = { id: scene.id, summary };
  byId("headline").textContent = headlineText(summary);
  byId("legend").replaceChildren(...legendItems(summary));
  byId("facts").replaceChildren(...factsEntries(summary));
  showLinks(scene.id, sceneGrid !== null);
  byId("result").hidden = false; // before the map: Leaflet needs its size
  const land = summary.classes.find((entry) => entry.index === 0)?.colour ?? [0, 0, 0];
  view.show({ grid, scene: sceneGrid !== null, land });
  view.opacity(Number(byId("opacity").value));
  end(null);
}

// A layer's TileJSON; null for the scene layer of a scene given by URL (404: its input is not kept), as
// one opened again from the address's fragment may be.
async function tileJson(id, layer) {
  try {
    return await client.request(`${scenePath(id)}/tiles/${layer}/tilejson.json`).then((response) => response.json());
  } catch (error) {
    if (layer === "scene" && error instanceof ServerError && error.status === 404) return null;
    throw error;
  }
}

function showReading(latlng, colour) {
  const shown = state.result;
  if (shown) byId("reading").replaceChildren(...readingNodes(reading(shown.summary, latlng, colour)));
}

// The URLs a GIS takes, each with a copy button: the XYZ templates and the mask COG.
function showLinks(id, withScene) {
  const base = new URL(`${scenePath(id)}/`, location.href).href; // new URL would escape the template's braces
  const links = [
    ["Mask tiles (XYZ)", `${base}tiles/mask/{z}/{x}/{y}.png`, "link-mask-tiles"],
    ...(withScene ? [["Scene tiles (XYZ)", `${base}tiles/scene/{z}/{x}/{y}.png`, "link-scene-tiles"]] : []),
    ["Mask (COG)", `${base}mask.tif`, "link-cog"],
  ];
  byId("links").replaceChildren(
    ...links.map(([label, url, id]) => {
      const field = el("input", { id, type: "text", readonly: true, value: url, "aria-label": label });
      const copy = el("button", { type: "button", text: "Copy", "aria-label": `Copy the ${label} URL` });
      copy.addEventListener("click", () => copyText(field, copy));
      return el("div", { class: "link" }, el("label", { for: id, text: label }), el("div", { class: "link-row" }, field, copy));
    }),
  );
  byId("links-hint").textContent =
    "Where the server has an API key, send it as the header Authorization: Bearer <key> (QGIS: the XYZ " +
    "connection's HTTP headers), never in the URL. Map tiles are Web Mercator, 256 px.";
}

async function copyText(field, button) {
  field.select();
  try {
    await navigator.clipboard.writeText(field.value);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Selected: press Ctrl+C";
  }
  setTimeout(() => (button.textContent = "Copy"), 2000);
}

// Saves a file of the scene shown: fetched with the key, handed to the browser as a blob URL.
async function download(file) {
  const id = state.result?.id;
  if (!id) return;
  try {
    const response = await client.request(`${scenePath(id)}/${file}`);
    const named = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") ?? "");
    const url = URL.createObjectURL(await response.blob());
    const link = el("a", { href: url, download: named ? named[1] : `${id}.${file}` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (error) {
    notice(messageOf(error));
  }
}

// ---- wiring ----------------------------------------------------------------------------------------
byId("picker").addEventListener("change", (event) => {
  sendFile(event.target.files[0]);
  event.target.value = "";
});
byId("url-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sendUrl(byId("url").value.trim());
});
document.body.addEventListener("dragover", (event) => {
  event.preventDefault();
  if (!state.run) document.body.classList.add("dragging");
});
document.body.addEventListener("dragleave", () => document.body.classList.remove("dragging"));
document.body.addEventListener("drop", (event) => {
  event.preventDefault();
  document.body.classList.remove("dragging");
  const files = [...event.dataTransfer.files];
  if (state.dates && files.length === state.dates.frames && !state.run) {
    state.dates.fill(files);
    notice(`The ${files.length} files are in the date pickers in name order: check it, then map them.`);
    return;
  }
  if (files.length > 1) notice(`One scene at a time: ${files[0].name} is used.`);
  if (files.length) sendFile(files[0]);
  else sendUrl(event.dataTransfer.getData("text/uri-list").split("\n")[0].trim()); // a link dragged in
});
byId("stop").addEventListener("click", stop);
byId("opacity").addEventListener("input", (event) => view.opacity(Number(event.target.value)));
byId("side-by-side").addEventListener("change", (event) => view.sideBySide(event.target.checked));
byId("download-mask").addEventListener("click", () => download("mask.tif"));
byId("download-item").addEventListener("click", () => download("item.json"));

// A multi-date model: the one-file picker takes a stacked file, and the T date rows give the dates.
function showDateInputs(frames) {
  state.dates = new DateInputs(byId("dates"), frames, { onSend: sendDates });
  byId("date-row").hidden = true;
  byId("drop-text").textContent = `Drop a stacked GeoTIFF of the ${frames} dates anywhere on the page, or`;
  byId("picker-text").textContent = "Choose a stacked GeoTIFF…";
}

// One request at a time at start: a server with a key answers 401 and the page asks for the key once.
async function load() {
  try {
    state.limits = await client.request("v1/scenes").then((response) => response.json());
    const { max_request_bytes: most, keep_s: keep } = state.limits;
    byId("limits").textContent = `Up to ${megabytes(most)} a scene; results are kept on the server for ${Math.round(keep / 60)} min.`;
    if (state.limits.frames > 1) showDateInputs(state.limits.frames);
    const models = await client.request("v1/models").then((response) => response.json());
    byId("model").textContent = models.data[0]?.id ?? "";
  } catch (error) {
    notice(`Could not reach the server's scenes: ${messageOf(error)}`);
    return;
  }
  if (location.hash.length > 1) {
    const run = { name: location.hash.slice(1), files: [], id: null, resumed: true };
    run.controller = new AbortController();
    begin(run, "reading the scene…");
    try {
      run.name = decodeURIComponent(run.name);
      follow(run, await client.request(scenePath(run.name)).then((response) => response.json()));
    } catch (error) {
      forget();
      end(messageOf(error));
    }
  }
}

startStatus(byId("status"), client, { counter: "tiles_total", unit: "tiles/s" });
load();
