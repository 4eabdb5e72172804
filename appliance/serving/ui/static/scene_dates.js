// A multi-date model's inputs on the map page (`frames` T > 1 in GET v1/scenes): T labelled file pickers,
// "Date 1" to "Date T", each with an optional acquisition-date field, and a button that sends the T files
// as one form (POST v1/scenes as multipart/form-data: parts `files` in time order, and `date=d1,...,dT`
// when the dates are given). The page's one-file picker and drop stay, for a stacked GeoTIFF of all the
// dates; the date fields give its dates, and a URL's, too.

import { el } from "./dom.js";

const TITLE = "or one GeoTIFF per date, in time order, with its acquisition date (optional):";
const DATE_TITLE = "For models with a time encoding; left empty, each file's own date is used";

export class DateInputs {
  // container: where the rows go; onSend(files): the T chosen files, in time order.
  constructor(container, frames, { onSend }) {
    this.frames = frames;
    this.pickers = [];
    this.dates = [];
    const rows = [];
    for (let i = 1; i <= frames; i += 1) {
      const picker = el("input", { type: "file", id: `date-file-${i}`, accept: ".tif,.tiff,image/tiff" });
      const date = el("input", { type: "date", id: `date-when-${i}`, title: DATE_TITLE });
      picker.addEventListener("change", () => this.update());
      this.pickers.push(picker);
      this.dates.push(date);
      rows.push(
        el(
          "div",
          { class: "date-file" },
          el("label", { for: picker.id, text: `Date ${i}` }),
          picker,
          el("label", { for: date.id, class: "visually-hidden", text: `Date ${i} acquired (optional)` }),
          date,
        ),
      );
    }
    this.send = el("button", { type: "button", id: "send-dates", class: "primary", text: `Map the ${frames} dates` });
    this.send.addEventListener("click", () => onSend(this.files()));
    container.replaceChildren(
      el("p", { class: "dates-title", text: TITLE }),
      el("div", { class: "date-rows" }, ...rows),
      this.send,
      el("p", { class: "hint", text: "The dates, when all are given, go with a stacked GeoTIFF or a URL too." }),
    );
    container.hidden = false;
    this.update();
  }

  files() {
    return this.pickers.map((picker) => picker.files[0] ?? null);
  }

  update() {
    this.send.disabled = this.files().some((file) => file === null);
  }

  // Dropped files, one per date, in name order: put in the pickers for the person to check, not sent.
  fill(files) {
    const sorted = [...files].sort((a, b) => a.name.localeCompare(b.name, "en", { numeric: true }));
    sorted.forEach((file, i) => {
      const transfer = new DataTransfer();
      transfer.items.add(file);
      this.pickers[i].files = transfer.files;
    });
    this.update();
  }

  // The dates given: null when none is, the T of them when all are; throws when only some are.
  given() {
    const values = this.dates.map((field) => field.value);
    if (values.every((value) => value === "")) return null;
    if (values.some((value) => value === "")) {
      throw new Error(`Give all ${this.frames} acquisition dates, or none (then each file's own is used).`);
    }
    return values;
  }
}

// The form of a scene's dates: parts `files`, in time order, and the dates (comma-separated) when given.
export function datesForm(files, dates) {
  const form = new FormData();
  for (const file of files) form.append("files", file, file.name);
  if (dates) form.append("date", dates.join(","));
  return form;
}
