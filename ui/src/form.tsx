// A form generated from a JSON schema served by the Admin API (rjsf), falling back to the editor alone when a
// schema is beyond what the form library renders.
import { Component, type ReactNode } from "react";
import Form from "@rjsf/core";
import type { RJSFSchema, ErrorSchema } from "@rjsf/utils";
import { validator } from "./validator";
export { prune } from "./prune";

class Boundary extends Component<{ children: ReactNode; resetKey: string }, { err: string | null; key: string }> {
  state = { err: null as string | null, key: this.props.resetKey };
  static getDerivedStateFromError(e: Error) {
    return { err: e.message };
  }
  static getDerivedStateFromProps(p: { resetKey: string }, s: { err: string | null; key: string }) {
    return p.resetKey !== s.key ? { err: null, key: p.resetKey } : null;
  }
  render() {
    if (this.state.err)
      return <p className="muted">This schema has no form here ({this.state.err}); use the editor beside it.</p>;
    return this.props.children;
  }
}

/** Drops what a form cannot edit usefully: the `plugins` object has its own editor. */
export function formSchema(schema: any, omit: string[] = []): RJSFSchema {
  if (!schema || typeof schema !== "object") return {};
  const s = { ...schema };
  if (s.properties) {
    s.properties = { ...s.properties };
    for (const k of omit) delete s.properties[k];
  }
  if (Array.isArray(s.required)) s.required = s.required.filter((r: string) => !omit.includes(r));
  // Cross-field rules (oneOf required, anyOf) stay with the server: it reports them on save.
  titleOptions(s);
  delete s.oneOf;
  delete s.anyOf;
  delete s.not;
  delete s.dependencies;
  delete s.if;
  delete s.then;
  delete s.else;
  return s;
}

/** rjsf labels untitled oneOf/anyOf branches "Option 1", "Option 2": name them by what they accept instead. */
function titleOptions(node: any, seen = new Set<any>()) {
  if (!node || typeof node !== "object" || seen.has(node)) return;
  seen.add(node);
  for (const key of ["oneOf", "anyOf"]) {
    const opts = node[key];
    if (!Array.isArray(opts)) continue;
    node[key] = opts.map((o: any, i: number) => {
      if (!o || typeof o !== "object" || o.title) return o;
      const what = o.format ?? (Array.isArray(o.type) ? o.type.join(" or ") : o.type) ?? (o.pattern ? "pattern" : o.anyOf || o.oneOf ? "one of several forms" : o.enum ? "one of a list" : o.required ? `with ${o.required.join(", ")}` : `option ${i + 1}`);
      const extra = o.type === "array" && o.items?.type ? ` of ${o.items.type}s` : o.pattern && o.type ? " (pattern)" : "";
      return { ...o, title: `${what}${extra}` };
    });
  }
  for (const v of Object.values(node)) if (v && typeof v === "object") titleOptions(v, seen);
}

export function SchemaForm(props: {
  schema: RJSFSchema;
  value: any;
  onChange: (v: any) => void;
  readOnly?: boolean;
  extraErrors?: ErrorSchema;
  id: string;
}) {
  return (
    <Boundary resetKey={props.id}>
      <Form
        schema={props.schema}
        formData={props.value}
        validator={validator}
        idPrefix={props.id}
        idSeparator="__"
        readonly={props.readOnly}
        noHtml5Validate
        liveValidate={false}
        showErrorList={false}
        extraErrors={props.extraErrors}
        extraErrorsBlockSubmit={false}
        omitExtraData={false}
        // The form shows what the resource holds; the server applies the schema's defaults itself.
        experimental_defaultFormStateBehavior={{ emptyObjectFields: "skipDefaults", arrayMinItems: { populate: "never" } }}
        onChange={(e) => props.onChange(e.formData)}
        uiSchema={{ "ui:submitButtonOptions": { norender: true } }}
      />
    </Boundary>
  );
}
