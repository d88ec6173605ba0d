// Live updates: the API's event stream (GET /events/stream, server-sent events) read with
// fetch, so the token goes in the Authorization header — never in the URL, where an
// EventSource would have to put it and the server's access log would keep it. On a dropped
// connection it reconnects (Last-Event-ID: no event is missed or shown twice; after an absence
// longer than the server replays, from now, with a redraw); when the stream
// is refused (the event log is off: 409; too many streams: 429; a server without it: 404) the
// dashboard falls back to polling, and tries the stream again later.

import { API_BASE, getToken } from "./api.js";

const POLL_SECONDS = 10;
const RETRY_MIN = 1000;
const RETRY_MAX = 30000;

/** Parse server-sent events out of a text stream: calls onMessage({id, event, data}). */
export function sseParser(onMessage) {
  let buffer = "";
  let fields = {};
  return (chunk) => {
    buffer += chunk;
    let cut;
    while ((cut = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, cut);
      buffer = buffer.slice(cut + (buffer.startsWith("\r\n", cut) ? 2 : 1));
      if (line === "") {
        if (fields.data !== undefined || fields.event !== undefined) onMessage(fields);
        fields = {};
      } else if (!line.startsWith(":")) {
        const at = line.indexOf(":");
        const name = at < 0 ? line : line.slice(0, at);
        const value = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
        fields[name] = name === "data" && fields.data !== undefined ? `${fields.data}\n${value}` : value;
      }
    }
  };
}

/**
 * Follow the event stream. onEvent(event) gets each event (its JSON); onState(state, detail)
 * gets "connecting", "live", "reconnecting" or "polling" (detail: why); onPoll() is called every
 * POLL_SECONDS while polling; onUnauthorized() when the token is refused. Returns stop().
 */
export function startLive({ onEvent, onState, onPoll, onUnauthorized }) {
  let stopped = false;
  let lastId = null;
  let controller = null;
  let retryDelay = RETRY_MIN;
  let pollTimer = null;
  let retryTimer = null;

  function poll(reason, retryInSeconds) {
    onState("polling", reason);
    if (pollTimer === null) pollTimer = setInterval(() => onPoll(), POLL_SECONDS * 1000);
    if (retryInSeconds) retryTimer = setTimeout(connect, retryInSeconds * 1000);
  }

  function stopPolling() {
    if (pollTimer !== null) clearInterval(pollTimer);
    pollTimer = null;
  }

  async function connect() {
    if (stopped) return;
    retryTimer = null;
    controller = new AbortController();
    const headers = { Accept: "text/event-stream", Authorization: `Bearer ${getToken() ?? ""}` };
    if (lastId) headers["Last-Event-ID"] = lastId;
    onState(lastId ? "reconnecting" : "connecting");
    let response;
    try {
      response = await fetch(new URL("events/stream", API_BASE), { headers, cache: "no-store", signal: controller.signal });
    } catch {
      return retry();
    }
    if (response.status === 401) return onUnauthorized();
    if (response.status === 422 && lastId) {
      // away longer than the server replays (or an id it no longer takes): go on from now; the
      // redraw when the stream is live shows what changed meanwhile
      lastId = null;
      return connect();
    }
    if (!response.ok) {
      let detail = response.statusText;
      try {
        detail = (await response.json()).detail ?? detail;
      } catch {
        // not JSON: the status says enough
      }
      if (response.status === 429) return poll(`stream refused: ${detail}`, Number(response.headers.get("Retry-After")) || 30);
      if (response.status === 409) return poll("the store's event log is off", 0);
      if (response.status >= 500) return retry();
      return poll(`stream unavailable (HTTP ${response.status})`, 300);
    }
    stopPolling();
    retryDelay = RETRY_MIN;
    onState("live");
    onPoll(); // whatever happened while the stream was down
    const parse = sseParser((message) => {
      if (message.id) lastId = message.id;
      if (message.event === "error") return;
      try {
        onEvent(JSON.parse(message.data));
      } catch {
        // a message that is not an event: nothing to show
      }
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        parse(decoder.decode(value, { stream: true }));
      }
    } catch {
      // the connection dropped (or stop() aborted it)
    }
    retry();
  }

  function retry() {
    if (stopped) return;
    onState("reconnecting");
    retryTimer = setTimeout(connect, retryDelay);
    retryDelay = Math.min(retryDelay * 2, RETRY_MAX);
  }

  connect();
  return function stop() {
    stopped = true;
    stopPolling();
    if (retryTimer !== null) clearTimeout(retryTimer);
    controller?.abort();
  };
}
