// Tool parameter schemas for the extension host: the builders extensions get as `pi.typebox`
// and `pi.zod`, and `toJsonSchema`, which turns whatever an extension passes as a tool's
// `parameters` (one of those builders, a real TypeBox or Zod schema from its own node_modules,
// or a plain JSON Schema object) into the JSON Schema the session offers the model.
//
// Our own small builders, not the libraries: they cover what tool parameters use (objects,
// strings, numbers, booleans, arrays, enums, literals, unions, optional fields, descriptions,
// defaults) and produce plain JSON Schema.

const OPTIONAL = Symbol.for("omp.schema.optional");
// JSON.stringify leaves symbol keys out, so the mark never reaches the session.

function withOptions(schema, options) {
  return options && typeof options === "object" ? { ...options, ...schema } : schema;
}

function objectSchema(properties, options) {
  const required = Object.keys(properties).filter((key) => !properties[key]?.[OPTIONAL]);
  const schema = { type: "object", properties };
  if (required.length > 0) schema.required = required;
  return withOptions(schema, options);
}

// --- a TypeBox-like builder (`pi.typebox`, and `typebox` when an extension has none) --------

export const Type = Object.freeze({
  String: (options) => withOptions({ type: "string" }, options),
  Number: (options) => withOptions({ type: "number" }, options),
  Integer: (options) => withOptions({ type: "integer" }, options),
  Boolean: (options) => withOptions({ type: "boolean" }, options),
  Null: (options) => withOptions({ type: "null" }, options),
  Any: (options) => withOptions({}, options),
  Unknown: (options) => withOptions({}, options),
  Literal: (value, options) => withOptions({ type: typeof value, const: value }, options),
  Array: (items, options) => withOptions({ type: "array", items }, options),
  Object: objectSchema,
  Optional: (schema) => ({ ...schema, [OPTIONAL]: true }),
  Union: (anyOf, options) => withOptions({ anyOf }, options),
  Enum: (values, options) =>
    withOptions({ enum: Array.isArray(values) ? [...values] : Object.values(values) }, options),
  Record: (_key, value, options) =>
    withOptions({ type: "object", additionalProperties: value }, options),
  Tuple: (items, options) =>
    withOptions({ type: "array", prefixItems: items, minItems: items.length,
                  maxItems: items.length }, options),
  Unsafe: (schema) => ({ ...schema }),
});

/** A string enum as a plain `{type: "string", enum}` schema (pi-ai's helper). */
export function StringEnum(values, options) {
  return withOptions({ type: "string", enum: [...values] }, options);
}

// --- a Zod-like builder (`pi.zod`) -----------------------------------------------------------

class ZodLike {
  constructor(schema, optional = false) {
    this.schema = schema;
    this.isOptional = optional;
  }
  #with(extra, optional = this.isOptional) {
    return new ZodLike({ ...this.schema, ...extra }, optional);
  }
  optional() { return new ZodLike(this.schema, true); }
  nullish() { return this.nullable().optional(); }
  nullable() { return new ZodLike({ anyOf: [this.schema, { type: "null" }] }, this.isOptional); }
  describe(description) { return this.#with({ description }); }
  default(value) { return this.#with({ default: value }, true); }
  min(n) { return this.#with(this.#bound("min", n)); }
  max(n) { return this.#with(this.#bound("max", n)); }
  length(n) { return this.#with({ ...this.#bound("min", n), ...this.#bound("max", n) }); }
  int() { return this.#with({ type: "integer" }); }
  positive() { return this.#with({ exclusiveMinimum: 0 }); }
  nonnegative() { return this.#with({ minimum: 0 }); }
  #bound(which, n) {
    const type = this.schema.type;
    if (type === "string") return { [which === "min" ? "minLength" : "maxLength"]: n };
    if (type === "array") return { [which === "min" ? "minItems" : "maxItems"]: n };
    return { [which === "min" ? "minimum" : "maximum"]: n };
  }
  toJSONSchema() { return JSON.parse(JSON.stringify(this.schema, zodReplacer)); }
}

function zodReplacer(_key, value) {
  return value instanceof ZodLike ? value.toJSONSchema() : value;
}

function zodObject(shape) {
  const required = Object.keys(shape).filter((key) => !shape[key]?.isOptional);
  const schema = { type: "object", properties: shape };
  if (required.length > 0) schema.required = required;
  return new ZodLike(schema);
}

export const z = Object.freeze({
  object: zodObject,
  string: () => new ZodLike({ type: "string" }),
  number: () => new ZodLike({ type: "number" }),
  int: () => new ZodLike({ type: "integer" }),
  boolean: () => new ZodLike({ type: "boolean" }),
  null: () => new ZodLike({ type: "null" }),
  any: () => new ZodLike({}),
  unknown: () => new ZodLike({}),
  array: (items) => new ZodLike({ type: "array", items }),
  enum: (values) => new ZodLike({ type: "string", enum: [...values] }),
  literal: (value) => new ZodLike({ type: typeof value, const: value }),
  union: (options) => new ZodLike({ anyOf: options }),
  record: (keyOrValue, value) => new ZodLike({ type: "object",
                                               additionalProperties: value ?? keyOrValue }),
});

// --- any schema → JSON Schema -----------------------------------------------------------------

/** The JSON Schema of a tool's `parameters`; throws when it is not an object schema. */
export function toJsonSchema(parameters, toolName) {
  const schema = parameters === undefined ? { type: "object", properties: {} }
    : convert(parameters);
  if (schema.type === undefined && schema.properties !== undefined) schema.type = "object";
  if (schema.type !== "object") {
    throw new Error(`Tool "${toolName}" parameters must be an object schema`);
  }
  return schema;
}

function convert(schema) {
  if (schema === null || typeof schema !== "object") {
    throw new Error(`a schema must be an object, not ${schema === null ? "null" : typeof schema}`);
  }
  if (schema instanceof ZodLike) return schema.toJSONSchema();
  if (schema._zod?.def) return fromZod4(schema);
  if (typeof schema._def?.typeName === "string") return fromZod3(schema);
  if (typeof schema.toJSONSchema === "function") return schema.toJSONSchema();
  // TypeBox schemas are JSON Schema already (its own marks are symbols or non-enumerable).
  return JSON.parse(JSON.stringify(schema));
}

function described(schema, description) {
  return typeof description === "string" && description ? { ...schema, description } : schema;
}

function zodObjectSchema(shape, inner, isOptional) {
  const properties = {};
  const required = [];
  for (const [key, value] of Object.entries(shape)) {
    properties[key] = inner(value);
    if (!isOptional(value)) required.push(key);
  }
  const schema = { type: "object", properties };
  if (required.length > 0) schema.required = required;
  return schema;
}

// Zod 4: every schema has `_zod.def` with a `type`.
function fromZod4(schema) {
  const def = schema._zod.def;
  const optional = (s) => ["optional", "default"].includes(s?._zod?.def?.type);
  let out;
  switch (def.type) {
    case "object": out = zodObjectSchema(def.shape, fromZod4, optional); break;
    case "string": out = { type: "string" }; break;
    case "number": out = { type: schema.isInt ? "integer" : "number" }; break;
    case "int": out = { type: "integer" }; break;
    case "boolean": out = { type: "boolean" }; break;
    case "null": out = { type: "null" }; break;
    case "array": out = { type: "array", items: fromZod4(def.element) }; break;
    case "enum": out = { type: "string", enum: Object.values(def.entries) }; break;
    case "literal": out = def.values.length === 1 ? { const: def.values[0] }
      : { enum: [...def.values] }; break;
    case "union": out = { anyOf: def.options.map(fromZod4) }; break;
    case "optional": out = fromZod4(def.innerType); break;
    case "nullable": out = { anyOf: [fromZod4(def.innerType), { type: "null" }] }; break;
    case "default": out = { ...fromZod4(def.innerType), default: def.defaultValue }; break;
    case "record": out = { type: "object", additionalProperties: fromZod4(def.valueType) }; break;
    default: out = {};
  }
  return described(out, schema.description);
}

// Zod 3: every schema has `_def.typeName`.
function fromZod3(schema) {
  const def = schema._def;
  const optional = (s) => ["ZodOptional", "ZodDefault"].includes(s?._def?.typeName);
  let out;
  switch (def.typeName) {
    case "ZodObject": out = zodObjectSchema(typeof def.shape === "function" ? def.shape()
      : def.shape, fromZod3, optional); break;
    case "ZodString": out = { type: "string" }; break;
    case "ZodNumber": out = { type: (def.checks ?? []).some((c) => c.kind === "int")
      ? "integer" : "number" }; break;
    case "ZodBoolean": out = { type: "boolean" }; break;
    case "ZodNull": out = { type: "null" }; break;
    case "ZodArray": out = { type: "array", items: fromZod3(def.type) }; break;
    case "ZodEnum": out = { type: "string", enum: [...def.values] }; break;
    case "ZodLiteral": out = { const: def.value }; break;
    case "ZodUnion": out = { anyOf: def.options.map(fromZod3) }; break;
    case "ZodOptional": out = fromZod3(def.innerType); break;
    case "ZodNullable": out = { anyOf: [fromZod3(def.innerType), { type: "null" }] }; break;
    case "ZodDefault": out = { ...fromZod3(def.innerType), default: def.defaultValue() }; break;
    case "ZodRecord": out = { type: "object", additionalProperties: fromZod3(def.valueType) };
      break;
    case "ZodEffects": out = fromZod3(def.schema); break;
    default: out = {};
  }
  return described(out, def.description);
}
