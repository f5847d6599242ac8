// What an extension gets for `import { Type } from "typebox"` (or "@sinclair/typebox") when it
// has no TypeBox of its own, and as `pi.typebox`: omp's small builder (schema.mjs).
import { Type } from "./schema.mjs";

export { Type };
export const {
  String, Number, Integer, Boolean, Null, Any, Unknown, Literal, Array, Object, Optional, Union,
  Enum, Record, Tuple, Unsafe,
} = Type;
