// The JSON API, called with the key the page was opened with (?code=...) as x-functions-key.

const pageParams = new URLSearchParams(window.location.search);
const key = pageParams.get("code");
// The page is served at <prefix>/console; the API lives at <prefix>/...
const apiBase = window.location.pathname.replace(/\/console\/?$/, "");

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

/** The URL of an API path with its query (values null/undefined/"" left out). */
export function apiUrl(path, params) {
  const url = new URL(apiBase + path, window.location.origin);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, String(value));
  }
  return url;
}

/** GET or POST an API path (`headers`: more request headers); the parsed JSON, or an ApiError saying what the API said. */
export async function api(path, { method = "GET", params, body, headers: extra } = {}) {
  const headers = { Accept: "application/json", ...extra };
  if (key) headers["x-functions-key"] = key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(apiUrl(path, params), {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, `the API cannot be reached (${error.message})`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) throw new ApiError(response.status, problemText(response, data, text), data);
  if (data === null && text) throw new ApiError(response.status, "the API answered with something that is not JSON");
  return data;
}

function problemText(response, data, text) {
  if (data && typeof data === "object") {
    const parts = [data.title, data.detail, data.error].filter((part) => typeof part === "string" && part);
    if (Array.isArray(data.errors)) {
      for (const item of data.errors) parts.push(`${item.field}: ${item.message}`);
    }
    if (parts.length) return parts.join(" — ");
  }
  return (text || response.statusText || "error").slice(0, 500);
}

// Who is looking, as GET /api/console/caller says: a viewer (ViewerRole, appService mode) may only
// read, so the console offers no action. That route reads the request alone (no Service Bus
// operation, no table request), so any view the page opens on costs only its own calls. Until the
// caller is known, nothing is offered.
let caller = null;

/** Read the caller once (the app awaits it before its first view); a failure offers no action. */
export async function loadCaller() {
  try {
    const answer = await api("/console/caller");
    caller = { by: answer.by ?? null, canAct: Boolean(answer.canAct) };
  } catch {
    caller = { by: null, canAct: false };
  }
  return caller;
}

/** Whether the caller may act (retry, cancel, terminate, suspend, resume, send an event). */
export function callerMayAct() {
  return Boolean(caller && caller.canAct);
}
