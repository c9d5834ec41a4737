// The chat page of `lightspeed serve`: streams replies from /v1/chat/completions (server-sent events),
// keeps the conversation in this browser (localStorage, so a reload loses nothing) and shows the speed
// of each reply. No framework, no network beyond this server: it works offline.
"use strict";

const STORE = "lightspeed-chat";
const $ = (id) => document.getElementById(id);
const ui = {
  messages: $("messages"), input: $("input"), send: $("send"), stop: $("stop"), stats: $("stats"),
  model: $("model"), system: $("system"), temperature: $("temperature"), maxTokens: $("max-tokens"),
  apiKey: $("api-key"), settings: $("settings"), toggle: $("toggle-settings"), newChat: $("new-chat"),
  form: $("composer"),
};

// state.messages holds the conversation as the API takes it: [{role, content}, ...]
const state = { messages: [], model: null, busy: false, abort: null };

function save() {
  const settings = { system: ui.system.value, temperature: ui.temperature.value, maxTokens: ui.maxTokens.value };
  try {
    localStorage.setItem(STORE, JSON.stringify({ messages: state.messages, settings }));
  } catch (e) { /* storage full or disabled: the conversation still lives in the page */ }
}

function restore() {
  let saved = null;
  try { saved = JSON.parse(localStorage.getItem(STORE) || "null"); } catch (e) { saved = null; }
  if (!saved) return;
  if (Array.isArray(saved.messages)) {
    state.messages = saved.messages.filter((m) => m && typeof m.content === "string"
                                                   && (m.role === "user" || m.role === "assistant"));
  }
  const s = saved.settings || {};
  if (typeof s.system === "string") ui.system.value = s.system;
  if (s.temperature !== undefined) ui.temperature.value = s.temperature;
  if (s.maxTokens !== undefined) ui.maxTokens.value = s.maxTokens;
}

// One message bubble; text goes in through textContent only, so model output is never parsed as HTML.
function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "content";
  body.textContent = text;
  div.append(label, body);
  ui.messages.append(div);
  ui.messages.scrollTop = ui.messages.scrollHeight;
  return body;
}

function render() {
  ui.messages.replaceChildren();
  for (const m of state.messages) bubble(m.role, m.content);
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = ui.apiKey.value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON */ }
  return "HTTP " + resp.status;
}

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) { ui.model.textContent = await errorText(resp); return; }
    const body = await resp.json();
    state.model = body.data && body.data.length ? body.data[0].id : null;
    ui.model.textContent = state.model || "no model";
  } catch (e) {
    ui.model.textContent = "server unreachable";
  }
}

function setBusy(busy) {
  state.busy = busy;
  ui.send.disabled = busy;
  ui.stop.disabled = !busy;
}

// Reads a server-sent-event stream; calls onData with each JSON payload until [DONE].
async function readEvents(resp, onData) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

function speed(tokens, started, first, ended) {
  const parts = [tokens + " tokens"];
  if (first !== null) {
    parts.push("first token " + Math.round(first - started) + " ms");
    if (tokens > 1 && ended > first) parts.push(((tokens - 1) * 1000 / (ended - first)).toFixed(1) + " tokens/s");
  }
  return parts.join(" · ");
}

async function send(text) {
  if (state.busy) return;
  state.messages.push({ role: "user", content: text });
  bubble("user", text);
  save();
  const history = [];
  if (ui.system.value.trim()) history.push({ role: "system", content: ui.system.value });
  history.push(...state.messages);
  const body = {
    model: state.model || undefined, messages: history, stream: true, stream_options: { include_usage: true },
    temperature: Number(ui.temperature.value), max_tokens: Number(ui.maxTokens.value),
  };
  const out = bubble("assistant", "");
  const reply = { role: "assistant", content: "" };
  let tokens = 0, usageTokens = null, first = null, finish = null, failure = null;
  const started = performance.now();
  state.abort = new AbortController();
  setBusy(true);
  ui.stats.textContent = "…";
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.abort.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    await readEvents(resp, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || "server error");
      if (chunk.usage) usageTokens = chunk.usage.completion_tokens;
      for (const choice of chunk.choices || []) {
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          if (first === null) first = performance.now();
          tokens += 1;
          reply.content += piece;
          out.textContent = reply.content;
          ui.messages.scrollTop = ui.messages.scrollHeight;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      ui.stats.textContent = speed(usageTokens ?? tokens, started, first, performance.now());
    });
    const n = usageTokens ?? tokens;
    ui.stats.textContent = speed(n, started, first, performance.now()) + (finish ? " · " + finish : "");
  } catch (e) {
    failure = e.name === "AbortError" ? null : e.message;
    ui.stats.textContent = (failure ? "error" : "stopped") + " · "
      + speed(usageTokens ?? tokens, started, first, performance.now());
  } finally {
    if (reply.content) {
      // what arrived is kept, even after a stop or an error
      state.messages.push(reply);
      if (failure) bubble("error", failure);
    } else {
      // nothing arrived: the turn is taken back and its text returns to the input, so nothing typed is lost
      out.parentElement.remove();
      state.messages.pop();
      if (ui.messages.lastChild) ui.messages.lastChild.remove();
      if (!ui.input.value) ui.input.value = text;
      if (failure) bubble("error", failure);
    }
    save();
    state.abort = null;
    setBusy(false);
  }
}

ui.form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = ui.input.value;
  if (!text.trim() || state.busy) return;
  ui.input.value = "";
  send(text);
});
ui.input.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    ui.form.requestSubmit();
  }
});
ui.stop.addEventListener("click", () => { if (state.abort) state.abort.abort(); });
ui.newChat.addEventListener("click", () => {
  if (state.abort) state.abort.abort();
  state.messages = [];
  render();
  ui.stats.textContent = "";
  save();
});
ui.toggle.addEventListener("click", () => {
  ui.settings.hidden = !ui.settings.hidden;
  ui.toggle.setAttribute("aria-expanded", String(!ui.settings.hidden));
});
for (const el of [ui.system, ui.temperature, ui.maxTokens]) el.addEventListener("change", save);
ui.apiKey.addEventListener("change", loadModel);

restore();
render();
loadModel();
