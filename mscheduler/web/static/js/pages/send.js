// New task (admins): a form built from the JSON schema of the chosen handler's params, as the
// live workers publish it (GET handlers). A field per property: text, a number, a checkbox, a
// list of choices, or JSON for what has no simple input (lists, nested objects, unions). A
// handler without a schema takes its params as JSON. The API checks the send at the door: a
// refused field is marked where it is, with the API's words.

import { api } from "../api.js";
import { h, panel, taskHref } from "../dom.js";

const MAX_TEXT = 100000;

/** The schema a "$ref": "#/$defs/Name" points at (pydantic nests models so), else the schema. */
function resolved(schema, root) {
  const ref = schema?.$ref;
  if (typeof ref !== "string" || !ref.startsWith("#/")) return schema ?? {};
  let target = root;
  for (const part of ref.slice(2).split("/")) target = target?.[part];
  return target ?? {};
}

/** "string" | "integer" | "number" | "boolean" | "enum" | "json": the input a property gets.
 *  ``nullable``: an optional field (``X | None``) left empty is sent as null. */
function kindOf(schema, root) {
  let s = resolved(schema, root);
  let nullable = false;
  const options = s.anyOf ?? s.oneOf;
  if (Array.isArray(options)) {
    const others = options.filter((o) => resolved(o, root).type !== "null");
    nullable = others.length < options.length;
    if (others.length !== 1) return { kind: "json", nullable, schema: s };
    s = resolved(others[0], root);
  }
  if (Array.isArray(s.enum) && s.enum.every((v) => typeof v === "string")) return { kind: "enum", nullable, schema: s };
  if (["string", "integer", "number", "boolean"].includes(s.type)) return { kind: s.type, nullable, schema: s };
  return { kind: "json", nullable, schema: s };
}

function fieldInput(name, prop, root, required) {
  const { kind, nullable, schema } = kindOf(prop, root);
  const id = `param-${name}`;
  const has = prop.default !== undefined;
  let input;
  if (kind === "boolean") {
    input = h("input", { type: "checkbox", id, name });
    input.checked = prop.default === true;
  } else if (kind === "enum") {
    input = h(
      "select",
      { id, name },
      required || nullable ? null : h("option", { value: "" }, "(default)"),
      nullable ? h("option", { value: "" }, "(none)") : null,
      schema.enum.map((v) => h("option", { value: v, selected: prop.default === v }, v)),
    );
  } else if (kind === "integer" || kind === "number") {
    input = h("input", {
      type: "number",
      id,
      name,
      step: kind === "integer" ? "1" : "any",
      min: schema.minimum ?? null,
      max: schema.maximum ?? null,
      value: has && typeof prop.default === "number" ? prop.default : null,
    });
  } else if (kind === "string") {
    input = h("input", { type: "text", id, name, maxlength: schema.maxLength ?? MAX_TEXT, value: has && typeof prop.default === "string" ? prop.default : null });
  } else {
    input = h("textarea", { id, name, rows: 3, class: "mono", placeholder: "JSON" });
    if (has) input.value = JSON.stringify(prop.default);
  }
  input.dataset.kind = kind;
  if (nullable) input.dataset.nullable = "true";
  if (required) input.required = kind !== "boolean";
  const title = prop.title ?? name;
  const note = [required ? "required" : "optional", kind === "json" ? "JSON" : null, prop.description].filter(Boolean).join(" · ");
  return h(
    "label",
    { class: "field", dataset: { field: `params.${name}` } },
    h("span", {}, title, " ", h("span", { class: "hint" }, note)),
    input,
    h("span", { class: "error-line field-error" }),
  );
}

/** The params the form's fields hold: {value} or {error: [field, why]}. */
function readParams(form, schema) {
  if (!schema) {
    const text = form.querySelector("#params-json").value.trim();
    if (!text) return { value: null };
    try {
      return { value: JSON.parse(text) };
    } catch (exc) {
      return { error: ["params", `not JSON: ${exc.message}`] };
    }
  }
  const params = {};
  for (const input of form.querySelectorAll("[data-kind]")) {
    const name = input.name;
    const kind = input.dataset.kind;
    if (kind === "boolean") {
      params[name] = input.checked;
      continue;
    }
    const text = input.value.trim();
    if (text === "") {
      if (input.dataset.nullable) params[name] = null;
      continue; // left out: the model's default applies
    }
    if (kind === "integer" || kind === "number") params[name] = Number(text);
    else if (kind === "json") {
      try {
        params[name] = JSON.parse(text);
      } catch (exc) {
        return { error: [`params.${name}`, `not JSON: ${exc.message}`] };
      }
    } else params[name] = text;
  }
  return { value: params };
}

function markField(form, field, why) {
  for (const box of form.querySelectorAll(".field-error")) box.textContent = "";
  const label = [...form.querySelectorAll("[data-field]")].find((l) => field === l.dataset.field || field.startsWith(l.dataset.field + "."));
  if (label) {
    label.querySelector(".field-error").textContent = why;
    label.querySelector("input, select, textarea")?.focus();
  }
  form.querySelector("#send-error").textContent = label ? "" : why;
}

function paramsFields(handler) {
  const schema = handler?.params_schema;
  const root = schema ?? {};
  const top = resolved(schema, root);
  if (!schema || top.type !== "object" || !top.properties) {
    return [
      h(
        "label",
        { class: "field", dataset: { field: "params" } },
        h("span", {}, "Params ", h("span", { class: "hint" }, handler ? "JSON (this handler publishes no schema)" : "JSON")),
        h("textarea", { id: "params-json", rows: 6, class: "mono", placeholder: '{"order_id": 42}' }),
        h("span", { class: "error-line field-error" }),
      ),
    ];
  }
  const required = new Set(top.required ?? []);
  return Object.entries(top.properties).map(([name, prop]) => fieldInput(name, prop, root, required.has(name)));
}

/** Live updates never redraw the form (what is typed stays). */
function wantsNothing() {
  return false;
}

export async function sendPage(ctx) {
  const handlers = await api("handlers");
  if (!ctx.isAdmin) {
    return panel("New task", null, h("p", { class: "empty" }, "Sending a task needs an admin token."));
  }
  const chosen = ctx.query.get("name") ?? handlers[0]?.name ?? "";
  const handler = handlers.find((x) => x.name === chosen);
  const schemaOf = handler && handler.params_schema && resolved(handler.params_schema, handler.params_schema).properties ? handler.params_schema : null;
  const names = h(
    "select",
    {
      id: "send-name",
      name: "name",
      onchange: (event) => ctx.navigate(`#/new?name=${encodeURIComponent(event.target.value)}`),
    },
    handlers.map((x) => h("option", { value: x.name, selected: x.name === chosen }, x.name)),
  );
  const key = h("input", { type: "text", id: "send-key", name: "key", required: true, maxlength: 512, placeholder: `${chosen || "task"}-1`, autocomplete: "off" });
  const form = h(
    "form",
    {
      id: "send-form",
      class: "send-form",
      onsubmit: async (event) => {
        event.preventDefault();
        const params = readParams(form, schemaOf);
        if (params.error) return markField(form, ...params.error);
        const body = { key: key.value.trim(), name: chosen, params: params.value };
        try {
          const sent = await api("tasks", { method: "POST", body });
          const text = sent.created ? `Sent task ${body.key}.` : `Task ${body.key} exists: left as it is.`;
          ctx.navigate(taskHref(body.key), text);
        } catch (exc) {
          const field = exc.status === 422 && typeof exc.field === "string" ? exc.field : "";
          markField(form, field, exc.describe?.() ?? String(exc));
        }
      },
    },
    h("label", { class: "field", dataset: { field: "name" } }, h("span", {}, "Task name"), names, h("span", { class: "error-line field-error" })),
    h("label", { class: "field", dataset: { field: "key" } }, h("span", {}, "Key ", h("span", { class: "hint" }, "unique: a task with this key is sent once")), key, h("span", { class: "error-line field-error" })),
    paramsFields(handler),
    h("p", { class: "error-line", id: "send-error" }),
    h("div", { class: "buttons" }, h("button", { type: "submit", id: "send-submit" }, "Send")),
  );
  if (!handlers.length) {
    return panel("New task", null, h("p", { class: "empty", id: "no-handlers" }, "No live worker handles any task name: start a worker first."));
  }
  return h(
    "div",
    { id: "send" },
    panel("New task", `${handler?.workers ?? 0} live worker(s) handle ${chosen}`, form),
  );
}

sendPage.wants = wantsNothing;
