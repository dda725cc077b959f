// A form built from a JSON Schema object: one labelled control per top-level
// property (enum → select, boolean → checkbox, number/integer → number,
// string → text, anything else → a JSON text area). `read()` returns the
// object to send; the server checks it against the same schema.

import { h, field } from "./dom.js";

let counter = 0;

export function schemaForm(schema) {
  const props = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const readers = [];
  const fields = [];
  for (const [name, prop] of Object.entries(props)) {
    const id = "f" + ++counter + "-" + name.replace(/[^A-Za-z0-9_-]/g, "_");
    const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== "null") : prop.type;
    const label = name + (required.has(name) ? " *" : "");
    const hint = prop.description || "";
    let control;
    let read;
    if (Array.isArray(prop.enum)) {
      control = h(
        "select",
        { id, name },
        required.has(name) ? null : h("option", { value: "" }, "—"),
        prop.enum.map((v) => h("option", { value: JSON.stringify(v), selected: v === prop.default }, String(v)))
      );
      read = () => (control.value === "" ? undefined : JSON.parse(control.value));
    } else if (type === "boolean") {
      control = h("input", { id, name, type: "checkbox", checked: prop.default === true });
      read = () => control.checked;
    } else if (type === "number" || type === "integer") {
      control = h("input", {
        id,
        name,
        type: "number",
        step: type === "integer" ? "1" : "any",
        min: prop.minimum,
        max: prop.maximum,
        value: prop.default,
        required: required.has(name),
      });
      read = () => (control.value === "" ? undefined : Number(control.value));
    } else if (type === "string") {
      control = h("input", {
        id,
        name,
        type: "text",
        value: prop.default,
        required: required.has(name),
        autocomplete: "off",
      });
      read = () => (control.value === "" ? undefined : control.value);
    } else {
      control = h("textarea", { id, name, rows: 3, class: "mono" }, prop.default !== undefined ? JSON.stringify(prop.default) : "");
      read = () => {
        if (control.value.trim() === "") return undefined;
        try {
          return JSON.parse(control.value);
        } catch {
          throw new Error(`${name}: not valid JSON`);
        }
      };
    }
    fields.push(field(label, control, hint));
    readers.push([name, read]);
  }
  if (!fields.length) fields.push(h("p", { class: "muted" }, "No input fields."));
  return {
    fields,
    read() {
      const out = {};
      for (const [name, read] of readers) {
        const v = read();
        if (v !== undefined) out[name] = v;
      }
      return out;
    },
  };
}
