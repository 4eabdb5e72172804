// The result's picture: the input's RGB preview with the class mask laid over it (its opacity set by a
// slider), and beside it, when asked, the prediction alone (land in its class colour). Pointing at either
// (mouse, touch, or the arrow keys while the picture has focus) marks the point on both and reports it
// as fractions (0..1) of the picture's width and height.

import { el } from "./dom.js";
import { rgb } from "./scene_math.js";

const STEPS = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };

// The RGBA pixels of a PNG blob, as drawn (no colour conversion): {width, height, data}.
export async function readPixels(blob) {
  const bitmap = await createImageBitmap(blob, { premultiplyAlpha: "none", colorSpaceConversion: "none" });
  const canvas = el("canvas", { width: bitmap.width, height: bitmap.height });
  const context = canvas.getContext("2d", { willReadFrequently: true });
  context.drawImage(bitmap, 0, 0);
  bitmap.close();
  return context.getImageData(0, 0, canvas.width, canvas.height);
}

export class SceneView {
  // onPoint(fx, fy): the point pointed at, as fractions of the picture's width and height.
  constructor(container, { onPoint }) {
    this.container = container;
    this.onPoint = onPoint;
    this.size = null; // the previews' {width, height}, for keyboard steps of one preview pixel
    this.point = null;
    this.markers = [];
    container.addEventListener("keydown", (event) => this.key(event));
  }

  // sceneUrl, maskUrl: object URLs of scene.png and mask.png; width, height: their size in pixels.
  show({ sceneUrl, maskUrl, width, height, landColour }) {
    this.size = { width, height };
    this.point = null;
    this.overlay = el("img", { src: maskUrl, alt: "", class: "overlay", width, height });
    const prediction = el("img", { src: maskUrl, alt: "The predicted classes", width, height });
    prediction.style.backgroundColor = rgb(landColour); // class 0 is transparent in mask.png
    const input = el("img", { src: sceneUrl, alt: "The scene (RGB) with the predicted classes over it", width, height });
    this.markers = [];
    this.side = this.pane("Prediction", prediction);
    this.container.replaceChildren(this.pane("Input with the prediction over it", input, this.overlay), this.side);
    this.sideBySide(this.container.classList.contains("split"));
  }

  pane(caption, ...images) {
    const marker = el("span", { class: "marker", hidden: true });
    this.markers.push(marker);
    const frame = el("div", { class: "frame" }, ...images, marker);
    // Keep the whole picture within the window's height: its width follows from its aspect ratio.
    frame.style.maxWidth = `calc(70vh * ${this.size.width / this.size.height})`;
    const at = (event) => {
      const box = images[0].getBoundingClientRect(); // the picture, inside the frame's border
      this.move((event.clientX - box.left) / box.width, (event.clientY - box.top) / box.height);
    };
    frame.addEventListener("pointermove", at);
    frame.addEventListener("pointerdown", at);
    return el("figure", { class: "pane" }, frame, el("figcaption", { text: caption }));
  }

  opacity(percent) {
    if (this.overlay) this.overlay.style.opacity = String(percent / 100);
  }

  sideBySide(on) {
    this.container.classList.toggle("split", on);
    if (this.side) this.side.hidden = !on;
  }

  move(fx, fy) {
    const inside = (value) => Math.min(Math.max(value, 0), 1 - 1e-9);
    this.point = { fx: inside(fx), fy: inside(fy) };
    for (const marker of this.markers) {
      marker.hidden = false;
      marker.style.left = `${this.point.fx * 100}%`;
      marker.style.top = `${this.point.fy * 100}%`;
    }
    this.onPoint(this.point.fx, this.point.fy);
  }

  // Arrow keys move the point by one preview pixel (Shift: ten), starting from the centre.
  key(event) {
    const step = STEPS[event.key];
    if (!step || !this.size) return;
    event.preventDefault();
    const { width, height } = this.size;
    const by = event.shiftKey ? 10 : 1;
    const from = this.point ?? { fx: 0.5, fy: 0.5 };
    const col = Math.min(width - 1, Math.max(0, Math.floor(from.fx * width) + (this.point ? step[0] * by : 0)));
    const row = Math.min(height - 1, Math.max(0, Math.floor(from.fy * height) + (this.point ? step[1] * by : 0)));
    this.move((col + 0.5) / width, (row + 0.5) / height);
  }
}
