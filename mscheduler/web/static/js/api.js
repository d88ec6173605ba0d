// The JSON API client: every request carries the token kept in this tab's sessionStorage.
// The dashboard lives at <root>/ui/ and the API at <root>/api/v1/, so both work when the app
// is mounted under a prefix of another app.

const TOKEN_KEY = "mscheduler.token";
export const API_BASE = new URL("../api/v1/", document.baseURI);

export class ApiError extends Error {
  constructor(status, error, detail, field = null) {
    super(detail);
    this.status = status;
    this.error = error;
    this.detail = detail;
    this.field = field; // a 422's field at fault (params.order_id), where the API names one
  }

  /** A sentence for people (401 and 403 said plainly). */
  describe() {
    if (this.status === 401) return "The token was refused (unknown or missing): log in again.";
    if (this.status === 403) return `Refused: ${this.detail}.`;
    if (this.status === 0) return this.detail;
    return `${this.detail} (HTTP ${this.status}, ${this.error})`;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** The path of a task's resource: each segment of the key percent-encoded, the slashes kept
 *  (the API's route takes the rest of the path as the key). A browser resolves "." and ".."
 *  segments (encoded or not) before sending, so such a key would name another task: refused. */
export function taskPath(key, suffix = "") {
  const segments = key.split("/");
  if (segments.some((s) => s === "." || s === "..")) {
    throw new ApiError(0, "unaddressable", `A key with a "." or ".." segment cannot be used in a URL: use the CLI for ${JSON.stringify(key)}.`);
  }
  return "tasks/" + segments.map(encodeURIComponent).join("/") + suffix;
}

/** Call the API; resolves to the parsed JSON (null for 204), rejects with an ApiError. */
export async function api(path, { method = "GET", query = {}, body } = {}) {
  const url = new URL(path, API_BASE);
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  const headers = { Accept: "application/json", Authorization: `Bearer ${getToken() ?? ""}` };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (exc) {
    throw new ApiError(0, "network", `The server did not answer (${exc.message}).`);
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data && typeof data.error === "string" ? data.error : "http_error";
    const detail = data && typeof data.detail === "string" ? data.detail : response.statusText;
    const field = data && typeof data.field === "string" ? data.field : null;
    throw new ApiError(response.status, error, detail, field);
  }
  return data;
}
