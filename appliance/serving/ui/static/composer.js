// Where a question is written: the text box and the images attached to it (by the file picker, by drag
// and drop anywhere on the page, or pasted), each shown as a thumbnail with its name and a remove button.
// Images travel as data URLs in the request's image_url parts.

import { el } from "./dom.js";

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class Composer {
  // onNotice(text): a short message for the user (e.g. a file that is not an image).
  constructor({ text, picker, thumbnails, dropZone, onNotice }) {
    this.text = text;
    this.thumbnails = thumbnails;
    this.onNotice = onNotice;
    this.images = []; // [{name, url}]
    picker.addEventListener("change", () => {
      this.addFiles(picker.files);
      picker.value = "";
    });
    text.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files ?? [])];
      if (files.length) {
        event.preventDefault();
        this.addFiles(files);
      }
    });
    dropZone.addEventListener("dragover", (event) => {
      event.preventDefault();
      dropZone.classList.add("dragging");
    });
    dropZone.addEventListener("dragleave", () => dropZone.classList.remove("dragging"));
    dropZone.addEventListener("drop", (event) => {
      event.preventDefault();
      dropZone.classList.remove("dragging");
      this.addFiles(event.dataTransfer.files);
    });
  }

  async addFiles(files) {
    for (const file of files) {
      if (!file.type.startsWith("image/")) {
        this.onNotice(`${file.name}: not an image, not attached`);
        continue;
      }
      this.images.push({ name: file.name, url: await readAsDataURL(file) });
    }
    this.render();
  }

  render() {
    this.thumbnails.replaceChildren(
      ...this.images.map((image, index) =>
        el(
          "figure",
          { class: "thumbnail" },
          el("img", { src: image.url, alt: image.name }),
          // The remove button sits beside the name, under the picture: the picture stays whole.
          el(
            "figcaption",
            { class: "removable" },
            el("span", { text: image.name }),
            el("button", {
              type: "button",
              class: "remove",
              "aria-label": `Remove ${image.name}`,
              text: "×",
              onclick: () => {
                this.images.splice(index, 1);
                this.render();
              },
            }),
          ),
        ),
      ),
    );
  }

  // Put a message back in the box (edit-and-resend).
  fill(message) {
    this.text.value = message.text;
    this.images = [...(message.images ?? [])].filter((image) => image.url);
    this.render();
    this.text.focus();
  }

  // What was written and attached; empties the box.
  take() {
    const message = { text: this.text.value.trim(), images: this.images };
    this.text.value = "";
    this.images = [];
    this.render();
    return message;
  }

  get empty() {
    return !this.text.value.trim() && this.images.length === 0;
  }
}
