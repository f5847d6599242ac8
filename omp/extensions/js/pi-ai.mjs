// What an extension gets when it imports `@oh-my-pi/pi-ai` or `@mariozechner/pi-ai` at run
// time: the schema helpers (`Type`, `StringEnum`). The model clients of those packages do not
// exist here.
export { StringEnum, Type } from "./schema.mjs";
