// Module resolution hooks for the extension host on node (registered with `module.register`):
// the original's package names resolve to omp's stand-ins (host.mjs lists them), and a schema
// library an extension does not have itself (`typebox`) falls back to omp's builder.
let always = {};
let fallback = {};

export async function initialize(data) {
  always = data.always;
  fallback = data.fallback;
}

export async function resolve(specifier, context, next) {
  if (Object.hasOwn(always, specifier)) return { url: always[specifier], shortCircuit: true };
  try {
    return await next(specifier, context);
  } catch (error) {
    if (Object.hasOwn(fallback, specifier)) {
      return { url: fallback[specifier], shortCircuit: true };
    }
    throw error;
  }
}
