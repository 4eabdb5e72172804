// Arithmetic on a scene's summary (the `result` of GET v1/scenes/{id}, docs/serving.md): the scene pixel
// under a lon/lat of the map, its map coordinates and lon/lat, its class from the mask tile's colour, and
// the headline figures. Pure functions of their arguments.

export const rgb = ([r, g, b]) => `rgb(${r}, ${g}, ${b})`;
const clamp = (value, low, high) => Math.min(high, Math.max(low, value));

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
  return lonLatAt(summary, col + 0.5, row + 0.5);
}

// Lon/lat at a point of the pixel grid (x columns, y rows from the scene's top-left corner); beyond the
// scene, the edge cells' interpolation carried on.
export function lonLatAt(summary, x, y) {
  const { width, height, lonlat_grid: grid } = summary;
  const last = grid.size - 1;
  const gi = (y / height) * last;
  const gj = (x / width) * last;
  const i = clamp(Math.floor(gi), 0, last - 1);
  const j = clamp(Math.floor(gj), 0, last - 1);
  const ti = gi - i;
  const tj = gj - j;
  const mix = (m, unwrap) => {
    const base = m[i][j];
    const at = (r, c) => (unwrap ? base + wrapped(m[r][c] - base) : m[r][c]);
    const top = at(i, j) * (1 - tj) + at(i, j + 1) * tj;
    const bottom = at(i + 1, j) * (1 - tj) + at(i + 1, j + 1) * tj;
    return top * (1 - ti) + bottom * ti;
  };
  return { lon: wrapped(mix(grid.lon, true)), lat: mix(grid.lat, false) };
}

// A longitude (or a difference of two) in -180..180.
const wrapped = (lon) => ((((lon + 180) % 360) + 360) % 360) - 180;

// The scene pixel {col, row} holding lon/lat, or null outside the scene: `lonLatAt` inverted by Newton's
// method from the scene's centre (the grid is near-affine across a scene: a few steps reach a thousandth
// of a pixel).
export function pixelAt(summary, lon, lat) {
  const { width, height } = summary;
  const h = Math.max(width, height) / 1000; // the step of the derivatives, in pixels
  const miss = (x, y) => {
    const at = lonLatAt(summary, x, y);
    return [wrapped(at.lon - lon), at.lat - lat];
  };
  let x = width / 2;
  let y = height / 2;
  for (let step = 0; step < 30; step += 1) {
    const [u, v] = miss(x, y);
    const [ux, vx] = miss(x + h, y);
    const [uy, vy] = miss(x, y + h);
    const [a, b, c, d] = [(ux - u) / h, (uy - u) / h, (vx - v) / h, (vy - v) / h];
    const det = a * d - b * c;
    if (!det) return null;
    const dx = (d * u - b * v) / det;
    const dy = (a * v - c * u) / det;
    x -= dx;
    y -= dy;
    if (Math.abs(dx) < 1e-4 && Math.abs(dy) < 1e-4) break;
  }
  const col = Math.floor(x);
  const row = Math.floor(y);
  return col >= 0 && col < width && row >= 0 && row < height ? { col, row } : null;
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
