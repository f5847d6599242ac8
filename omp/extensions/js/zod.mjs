// What an extension gets as `pi.zod` (and for `@oh-my-pi/omptype/zod`): omp's small Zod-like
// builder (schema.mjs); `z.object({...})` and `pi.zod.object({...})` both work.
import { z } from "./schema.mjs";

export { z };
export default z;
export const {
  object, string, number, int, boolean, any, unknown, array, literal, union, record,
} = z;
export const { enum: enum_, null: null_ } = z;
export { enum_ as enum, null_ as null };
