// Requests to this server. URLs are relative, so the page works under any path prefix a proxy adds. With
// server.api_key set, a 401 makes the page ask for the key (askKey), kept in sessionStorage (never in a
// URL) and sent as a bearer token. A failed request throws ServerError with the server's own message and
// the field it names (`param`; null when it names none).
// `authorized` resolves at the first answer that is not a 401: the key was taken, or none is needed.

const KEY = "appliance.apiKey";

export class ServerError extends Error {
  constructor(status, message, param = null) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

// {message, param} of an error answer: OpenAI's {"error": {"message", "param"}}, else the body's text.
export async function errorOf(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    const message = body?.error?.message ?? body?.detail;
    if (message) {
      const text = typeof message === "string" ? message : JSON.stringify(message);
      return { message: text, param: body?.error?.param ?? null };
    }
  } catch {
    // not JSON: the text itself
  }
  return { message: text.trim() || `HTTP ${response.status} ${response.statusText}`, param: null };
}

export function makeClient(askKey) {
  let markAuthorized;
  const authorized = new Promise((resolve) => {
    markAuthorized = resolve;
  });

  // fetch with the key; on 401 ask for it (again, if the one given was wrong) until the user cancels.
  async function request(path, init = {}) {
    let reason = null;
    for (;;) {
      const headers = new Headers(init.headers ?? {});
      const key = sessionStorage.getItem(KEY);
      if (key) headers.set("Authorization", `Bearer ${key}`);
      const response = await fetch(path, { ...init, headers });
      if (response.status !== 401) {
        markAuthorized();
        if (!response.ok) {
          const { message, param } = await errorOf(response);
          throw new ServerError(response.status, message, param);
        }
        return response;
      }
      reason = (await errorOf(response)).message;
      const given = await askKey(reason, Boolean(key));
      if (!given) throw new ServerError(401, reason);
      sessionStorage.setItem(KEY, given);
    }
  }
  return { request, authorized };
}

// The JSON data of each server-sent event of a streamed answer, until [DONE].
export async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}
