// A server's refusal of a scene, said in the person's terms. The API names the request's field a file
// travelled in (`body` for one file, `files[1]` for a multi-date model's second date); the page names the
// file the person chose. A refusal (4xx) is about their input, so its status code tells them nothing; a
// server failure (5xx) keeps it, for a report.
export function sceneProblem({ status, message, param }, names) {
  const file = chosenFile(param, names);
  const named = file !== undefined && message.startsWith(`${param}: `);
  const text = named ? `${file}: ${message.slice(param.length + 2)}` : message;
  return status >= 400 && status < 500 ? text : `${status}: ${text}`;
}

// The name of the chosen file an error's `param` stands for; undefined for any other field (a URL, a date).
function chosenFile(param, names) {
  if (param === "body") return names.length === 1 ? names[0] : undefined;
  const index = /^files\[(\d+)\]$/.exec(param ?? "");
  return index ? names[Number(index[1])] : undefined;
}
