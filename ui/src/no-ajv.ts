// @rjsf/core's test helper imports @rjsf/validator-ajv8; the dashboard never calls it and cannot use Ajv (it
// compiles schemas with `new Function`, which the page's CSP forbids). vite.config.ts points that import here.
export { validator as default } from "./validator";
