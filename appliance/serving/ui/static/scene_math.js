// Arithmetic on a scene's summary (the `result` of GET v1/scenes/{id}, docs/serving.md): the scene pixel
// under a point of the picture, its map coordinates and lon/lat, its class from the mask preview's
// colour, and the headline figures. Pure functions of their arguments.

export const rgb = ([r, g, b]) => `rgb(${r}, ${g}, ${b})`;
const clamp = (value, low, high) => Math.min(high, Math.max(low, value));

// The scene pixel under a point given as fractions (0..1) of the picture's width and height: the
// previews are the scene scaled down, so the same fractions hold in the scene's pixel grid.
export function scenePixel(summary, fx, fy) {
  return {
    col: clamp(Math.floor(fx * summary.width), 0, summary.width - 1),
    row: clamp(Math.floor(fy * summary.height), 0, summary.height - 1),
  };
}

// The map coordinates (in the scene's CRS) of a pixel's centre; rasterio's affine order:
// x = a*col + b*row + c, y = d*col + e*row + f.
export function mapXY([a, b, c, d, e, f], col, row) {
  const x = col + 0.5;
  const y = row + 0.5;
  return { x: a * x + b * y + c, y: d * x + e * y + f };
}

// Lon/lat of a pixel's centre, bilinear between the n x n points of `lonlat_grid` (point [i][j] at
// row i*H/(n-1), col j*W/(n-1)). Longitudes are unwrapped around the cell's first corner, so a cell
// across the antimeridian interpolates the short way.
export function lonLat(summary, col, row) {
  const { width, height, lonlat_grid: grid } = summary;
  const last = grid.size - 1;
  const gi = clamp(((row + 0.5) / height) * last, 0, last);
  const gj = clamp(((col + 0.5) / width) * last, 0, last);
  const i = Math.min(Math.floor(gi), last - 1);
  const j = Math.min(Math.floor(gj), last - 1);
  const ti = gi - i;
  const tj = gj - j;
  const mix = (m, unwrap) => {
    const base = m[i][j];
    const at = (r, c) => (unwrap ? base + ((((m[r][c] - base + 540) % 360) + 360) % 360) - 180 : m[r][c]);
    const top = at(i, j) * (1 - tj) + at(i, j + 1) * tj;
    const bottom = at(i + 1, j) * (1 - tj) + at(i + 1, j + 1) * tj;
    return top * (1 - ti) + bottom * ti;
  };
  const lon = mix(grid.lon, true);
  return { lon: ((((lon + 180) % 360) + 360) % 360) - 180, lat: mix(grid.lat, false) };
}

// The class whose mask.png colour is nearest [r, g, b, a]: alpha 0 is class 0 (drawn transparent);
// {index: null, name: "no data"} for the nodata colour.
export function classOfColour(summary, [r, g, b, a]) {
  const classes = summary.classes;
  if (a === 0) return classes.find((entry) => entry.index === 0) ?? null;
  const candidates = [
    ...classes.filter((entry) => entry.index !== 0),
    { index: null, name: "no data", colour: summary.nodata_colour },
  ];
  let best = null;
  let bestDistance = Infinity;
  for (const candidate of candidates) {
    const [cr, cg, cb] = candidate.colour;
    const distance = (cr - r) ** 2 + (cg - g) ** 2 + (cb - b) ** 2;
    if (distance < bestDistance) [best, bestDistance] = [candidate, distance];
  }
  return best;
}

// The headline figures: the class named "water" (a flood map's), else every class but 0 (background:
// a burn scar, the crops).
export function headlineFigures(summary) {
  const named = summary.classes.filter((entry) => entry.name.toLowerCase() === "water");
  const picked = named.length ? named : summary.classes.filter((entry) => entry.index !== 0);
  const pixels = picked.reduce((sum, entry) => sum + entry.pixels, 0);
  const areas = picked.map((entry) => entry.area_km2);
  return {
    names: picked.map((entry) => entry.name),
    pixels,
    share: summary.valid_pixels ? pixels / summary.valid_pixels : 0,
    area_km2: areas.some((area) => area === null || area === undefined) ? null : areas.reduce((s, a) => s + a, 0),
  };
}

// A pixel's size along its columns and rows, in the CRS's units.
export function pixelSize([a, b, , d, e]) {
  return { x: Math.hypot(a, d), y: Math.hypot(b, e) };
}
