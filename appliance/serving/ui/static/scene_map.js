// The result on a map that pans and zooms down to single pixels: the input's RGB tiles with the mask's
// tiles over them (their opacity set by a slider), a scale bar, and beside them, when asked, a second map
// of the mask alone (land in its class colour) that moves with the first. The tiles are the Web Mercator
// PNGs of GET v1/scenes/{id}/tiles/{layer}/{z}/{x}/{y}.png (docs/serving.md), fetched by `load` (with the
// API key as a header, never in their URL) and drawn on canvases, whose pixels give the class under the
// point read. Leaflet (vendor/leaflet-src.esm.js) pans, zooms and draws the scale bar.
//
// The point read: the pointer's while it is on a map; else the centre of the map (the arrow keys pan it).

import * as L from "./vendor/leaflet-src.esm.js";
import { rgb } from "./scene_math.js";

const TILE = 256;
const OVERZOOM = 2; // zooms past the tiles' maxzoom: a scene pixel drawn up to 4x larger still

const tileKey = ({ x, y, z }) => `${x}:${y}:${z}`;

// A GridLayer whose tiles `load(z, x, y)` gives (a Promise of a PNG blob), drawn on canvases.
const FetchedTiles = L.GridLayer.extend({
  initialize(load, options) {
    L.setOptions(this, options);
    this.load = load;
    this.drawn = new Map(); // "x:y:z" -> the canvas of a tile drawn and shown
    this.on("tileunload", (event) => this.drawn.delete(tileKey(event.coords)));
  },

  createTile(coords, done) {
    const canvas = L.DomUtil.create("canvas", "leaflet-tile");
    canvas.width = TILE;
    canvas.height = TILE;
    this.load(coords.z, coords.x, coords.y)
      .then((blob) => createImageBitmap(blob, { premultiplyAlpha: "none", colorSpaceConversion: "none" }))
      .then((bitmap) => {
        canvas.getContext("2d", { willReadFrequently: true }).drawImage(bitmap, 0, 0);
        bitmap.close();
        this.drawn.set(tileKey(coords), canvas);
        done(null, canvas);
      })
      .catch((error) => done(error, canvas));
    return canvas;
  },

  // The [r, g, b, a] of the tile pixel at `latlng` as `map` shows it; null while its tile is not drawn.
  pixelAt(map, latlng) {
    const z = Math.min(Math.round(map.getZoom()), this.options.maxNativeZoom);
    const point = map.project(latlng, z).floor();
    const canvas = this.drawn.get(tileKey({ x: Math.floor(point.x / TILE), y: Math.floor(point.y / TILE), z }));
    if (!canvas) return null;
    const x = ((point.x % TILE) + TILE) % TILE;
    const y = ((point.y % TILE) + TILE) % TILE;
    return [...canvas.getContext("2d", { willReadFrequently: true }).getImageData(x, y, 1, 1).data];
  },
});

export class SceneMap {
  // load(layer, z, x, y): a Promise of the tile's PNG blob; onPoint(latlng, rgba): the point read and the
  // mask's colour there (null while its tile loads).
  constructor(container, { load, onPoint }) {
    this.container = container;
    this.load = load;
    this.onPoint = onPoint;
    this.maps = [];
    this.masks = new Map(); // each map's mask layer
    this.pointer = null; // {map, point}: where the pointer is, on which map
    this.syncing = false;
  }

  // grid: the mask's TileJSON (bounds, maxzoom); scene: whether the scene layer is served; land: class 0's colour.
  show({ grid, scene, land }) {
    for (const map of this.maps) map.remove();
    this.container.replaceChildren();
    const [west, south, east, north] = grid.bounds;
    const bounds = L.latLngBounds([south, west], [north, east]);
    const options = { maxNativeZoom: grid.maxzoom, maxZoom: grid.maxzoom + OVERZOOM, bounds };
    const tiles = (layer, className) =>
      new FetchedTiles((z, x, y) => this.load(layer, z, x, y), { ...options, className }).on("tileload", () => this.read());
    const main = this.pane("Input with the prediction over it", false);
    const side = this.pane("Prediction", !this.container.classList.contains("split"));
    side.getContainer().style.backgroundColor = rgb(land); // class 0 is transparent in the mask's tiles
    if (scene) tiles("scene", "scene-tiles").addTo(main);
    this.overlay = tiles("mask", "mask-tiles").addTo(main);
    this.masks = new Map([[main, this.overlay], [side, tiles("mask", "mask-tiles").addTo(side)]]);
    this.maps = [main, side];
    this.markers = this.maps.map((map) => L.circleMarker(bounds.getCenter(), { radius: 6, interactive: false }).addTo(map));
    main.fitBounds(bounds);
    side.setView(main.getCenter(), main.getZoom(), { animate: false });
    this.follow(main, side);
    this.follow(side, main);
    this.read();
  }

  // A map in a captioned pane (in the page, so that it has its size), with a scale bar.
  pane(caption, hidden) {
    const box = L.DomUtil.create("div", "map-box");
    const figure = L.DomUtil.create("figure", "pane", this.container);
    figure.hidden = hidden;
    figure.append(box, Object.assign(document.createElement("figcaption"), { textContent: caption }));
    const map = L.map(box, { attributionControl: false, zoomSnap: 1 });
    L.control.scale({ imperial: false }).addTo(map);
    map.on("mousemove", (event) => {
      this.pointer = { map, point: event.containerPoint };
      this.read();
    });
    map.on("mouseout", () => {
      this.pointer = null;
      this.read();
    });
    return map;
  }

  // `to` keeps `from`'s view (the other map's moves come back here while `syncing`, and stop).
  follow(from, to) {
    from.on("move", () => {
      if (!this.syncing) {
        this.syncing = true;
        to.setView(from.getCenter(), from.getZoom(), { animate: false });
        this.syncing = false;
      }
      this.read();
    });
  }

  read() {
    const map = this.pointer?.map ?? this.maps[0];
    if (!map) return;
    const latlng = this.pointer ? map.containerPointToLatLng(this.pointer.point) : map.getCenter();
    for (const marker of this.markers) marker.setLatLng(latlng);
    this.onPoint(latlng, this.masks.get(map).pixelAt(map, latlng));
  }

  opacity(percent) {
    this.overlay?.setOpacity(percent / 100);
  }

  sideBySide(on) {
    this.container.classList.toggle("split", on);
    const [main, side] = this.maps;
    if (!side) return;
    const [centre, zoom] = [main.getCenter(), main.getZoom()];
    side.getContainer().parentElement.hidden = !on;
    this.syncing = true; // the maps' new sizes move their centres: both go back to the one shown
    for (const map of this.maps) {
      map.invalidateSize({ pan: false });
      map.setView(centre, zoom, { animate: false });
    }
    this.syncing = false;
  }

  // The map people point at (tests and the console reach it through map.js's `view`).
  get map() {
    return this.maps[0] ?? null;
  }
}
