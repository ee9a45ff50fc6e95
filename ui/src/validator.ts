// rjsf's validator over @cfworker/json-schema, an interpreting JSON-schema validator: Ajv compiles schemas with
// `new Function`, which the dashboard's Content-Security-Policy (no 'unsafe-eval') forbids. The form uses it to
// pick oneOf/anyOf branches and to show errors while typing; the Admin API validates again on save, with the same
// schemas, and its error is what counts.
import { Validator } from "@cfworker/json-schema";
import type { RJSFValidationError, ValidationData, ValidatorType, ErrorSchema } from "@rjsf/utils";

const cache = new WeakMap<object, Validator>();

function validatorFor(schema: any, root?: any): Validator {
  const key = schema as object;
  let v = cache.get(key);
  if (!v) {
    const s = root && root !== schema && root.definitions && !schema.definitions ? { ...schema, definitions: root.definitions } : schema;
    v = new Validator(s, "7", false);
    cache.set(key, v);
  }
  return v;
}

function pointerToPath(p: string): string[] {
  return p
    .replace(/^#\/?/, "")
    .split("/")
    .filter(Boolean)
    .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
}

export const validator: ValidatorType = {
  // The dashboard passes no customValidate.
  validateFormData(formData, schema, _customValidate, transformErrors, uiSchema): ValidationData<any> {
    let errors: RJSFValidationError[] = [];
    try {
      const r = validatorFor(schema).validate(formData ?? {});
      errors = r.errors
        .filter((e) => e.keyword !== "properties" && e.keyword !== "items" && e.keyword !== "allOf")
        .map((e) => {
          const path = pointerToPath(e.instanceLocation);
          return { name: e.keyword, property: "." + path.join("."), message: e.error, stack: `${path.join(".") || "value"}: ${e.error}` };
        });
    } catch {
      errors = [];
    }
    if (transformErrors) errors = transformErrors(errors, uiSchema);
    const errorSchema: ErrorSchema = {};
    for (const e of errors) {
      let node: any = errorSchema;
      for (const seg of (e.property ?? ".").split(".").filter(Boolean)) node = node[seg] ??= {};
      (node.__errors ??= []).push(e.message ?? "");
    }
    return { errors, errorSchema };
  },
  isValid(schema, formData, rootSchema) {
    try {
      return validatorFor(schema, rootSchema).validate(formData).valid;
    } catch {
      return false;
    }
  },
  rawValidation(schema, formData) {
    try {
      const r = validatorFor(schema).validate(formData);
      return { errors: r.errors as any };
    } catch (e) {
      return { validationError: e as Error };
    }
  },
};
