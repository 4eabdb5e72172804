// Conversations, kept in this browser's localStorage and nowhere else. A conversation:
// {id, title, updated, messages: [{role, text, images: [{name, url}], stats, error}]}.

const LIST = "appliance.conversations";
const SETTINGS = "appliance.settings";

export function loadConversations() {
  try {
    return JSON.parse(localStorage.getItem(LIST)) ?? [];
  } catch {
    return [];
  }
}

// Saves the list; when the browser's quota is full, saves it without the images' data (names kept)
// and returns false, so the page can say so.
export function saveConversations(conversations) {
  try {
    localStorage.setItem(LIST, JSON.stringify(conversations));
    return true;
  } catch {
    const light = conversations.map((c) => ({
      ...c,
      messages: c.messages.map((m) => ({ ...m, images: (m.images ?? []).map(({ name }) => ({ name, url: "" })) })),
    }));
    try {
      localStorage.setItem(LIST, JSON.stringify(light));
    } catch {
      // nothing more can be kept
    }
    return false;
  }
}

// Not crypto.randomUUID: it exists only on https or localhost, and the page may be served over plain http.
export function newConversation() {
  return { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`, title: "New conversation", updated: Date.now(), messages: [] };
}

export function loadSettings() {
  try {
    return JSON.parse(localStorage.getItem(SETTINGS)) ?? {};
  } catch {
    return {};
  }
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}
