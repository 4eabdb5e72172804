// The result as text: the headline figures, the legend, the scene's facts (size, CRS, bounds), and the
// reading of the pixel pointed at. Every figure comes from the scene's summary and goes in as text.

import { el } from "./dom.js";
import { classOfColour, lonLat, mapXY, pixelAt, pixelSize, rgb, headlineFigures } from "./scene_math.js";

export const percent = (share) => `${(100 * share).toFixed(1)} %`;
const km2 = (area) => (area === null || area === undefined ? "area unknown" : `${area.toFixed(2)} km²`);
const count = (n) => n.toLocaleString("en-US");
const degrees = (value, positive, negative) => `${Math.abs(value).toFixed(5)}° ${value < 0 ? negative : positive}`;
// Latitude first, as its label says ("Lat, lon").
const latLonText = ({ lon, lat }) => `${degrees(lat, "N", "S")}, ${degrees(lon, "E", "W")}`;

// Geographic CRSs have no pixel area in square metres: their coordinates are degrees.
const geographic = (summary) => summary.pixel_area_m2 === null || summary.pixel_area_m2 === undefined;
const coordinate = (summary, value) => value.toFixed(geographic(summary) ? 6 : 1);

export function headlineText(summary) {
  const figures = headlineFigures(summary);
  const what = figures.names.map((name) => name.replaceAll("_", " ")).join(" + "); // burn_scar: "Burn scar"
  const title = `${what.charAt(0).toUpperCase()}${what.slice(1)}`;
  return `${title}: ${km2(figures.area_km2)} · ${percent(figures.share)} of the valid pixels`;
}

function swatch(colour) {
  const node = el("span", { class: "swatch", "aria-hidden": "true" });
  node.style.backgroundColor = rgb(colour);
  return node;
}

export function legendItems(summary) {
  const items = summary.classes.map((entry) =>
    el(
      "li",
      {},
      swatch(entry.colour),
      el("span", { class: "name", text: entry.index === 0 ? `${entry.name} (not coloured)` : entry.name }),
      el("span", { class: "figures", text: `${percent(entry.share)} · ${km2(entry.area_km2)}` }),
    ),
  );
  items.push(
    el(
      "li",
      {},
      swatch(summary.nodata_colour),
      el("span", { class: "name", text: "no data" }),
      el("span", { class: "figures", text: `${count(summary.nodata_pixels)} pixels` }),
    ),
  );
  return items;
}

export function factsEntries(summary) {
  const size = pixelSize(summary.transform);
  const unit = geographic(summary) ? "°" : " m";
  const [left, bottom, right, top] = summary.bounds.map((value) => coordinate(summary, value));
  const [west, south, east, north] = summary.lonlat_bounds;
  const facts = [
    ["Size", `${count(summary.width)} × ${count(summary.height)} pixels`],
    ["CRS", summary.crs],
    ["Pixel", `${+size.x.toPrecision(6)} × ${+size.y.toPrecision(6)}${unit}`],
    ["Bounds", `x ${left} to ${right}, y ${bottom} to ${top}`],
    ["Lat, lon", `${latLonText({ lon: west, lat: south })} to ${latLonText({ lon: east, lat: north })}`],
    ["Valid pixels", `${count(summary.valid_pixels)} of ${count(summary.width * summary.height)}`],
  ];
  const { acquisition_date: date, acquisition_date_source: source } = summary;
  if (date) facts.push(["Acquired", `${date} (${source})`]);
  return facts.flatMap(([term, value]) => [el("dt", { text: term }), el("dd", { text: value })]);
}

// The reading at a point of the map ({lat, lng}): {pixel, xy, latlon, class} texts. `colour`: the mask
// tile's [r, g, b, a] there, null while its tile loads.
export function reading(summary, { lat, lng }, colour) {
  const pixel = pixelAt(summary, lng, lat);
  if (!pixel) return { pixel: "outside the scene", xy: "–", latlon: latLonText({ lon: lng, lat }), class: "–" };
  const { col, row } = pixel;
  const { x, y } = mapXY(summary.transform, col, row);
  const found = colour ? classOfColour(summary, colour) : null;
  return {
    pixel: `col ${col}, row ${row}`,
    xy: `x ${coordinate(summary, x)}, y ${coordinate(summary, y)} (${summary.crs})`,
    latlon: latLonText(lonLat(summary, col, row)),
    class: colour ? (found?.name ?? "unknown") : "loading…",
  };
}

export function readingNodes(parts) {
  return [
    ["Pixel", parts.pixel, "read-pixel"],
    ["Map", parts.xy, "read-xy"],
    ["Lat, lon", parts.latlon, "read-latlon"],
    ["Class", parts.class, "read-class"],
  ].map(([label, value, id]) => el("span", { class: "part" }, `${label}: `, el("output", { id, text: value })));
}
