// What an extension gets when it imports `@oh-my-pi/pi-tui` or `@mariozechner/pi-tui`: inert
// stand-ins for the components and helpers renderers use. omp has no terminal UI, so renderers
// (`renderCall`, `renderResult`, `registerMessageRenderer`) are never called; these only let a
// module that imports them at its top level load.
class Component {
  constructor(...args) { this.args = args; }
  render() { return []; }
  invalidate() {}
  addChild() {}
  removeChild() {}
  clear() {}
  setText() {}
}

export class Text extends Component {}
export class Container extends Component {}
export class Spacer extends Component {}
export class Box extends Component {}
export class Markdown extends Component {}
export class Editor extends Component {}
export class Input extends Component {}
export class SelectList extends Component {}

export const Key = new Proxy({}, { get: (_target, name) => String(name) });

export function matchesKey() { return false; }
export function visibleWidth(text) { return String(text).length; }
export function truncateToWidth(text, width) { return String(text).slice(0, Math.max(0, width)); }
