/**
 * Tiny helpers to build the page. Data only ever lands in the DOM as text (textContent, text
 * nodes, attribute values, form values): nothing here parses HTML.
 */

export type Child = Node | string | number | null | undefined | false | Child[];

/** Attribute values: strings/numbers become attributes, booleans toggle them, functions on* listen. */
export type Attrs = Record<string, unknown>;

const PROPS = new Set(['value', 'checked', 'disabled', 'selected', 'indeterminate', 'readOnly', 'open']);

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs?: Attrs | null, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) setAttrs(el, attrs);
  append(el, ...children);
  return el;
}

function setAttrs(el: HTMLElement, attrs: Attrs): void {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      if (PROPS.has(name)) (el as unknown as Record<string, unknown>)[name] = false;
      continue;
    }
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value as EventListener);
    } else if (name === 'class') {
      el.className = Array.isArray(value) ? value.filter(Boolean).join(' ') : String(value);
    } else if (PROPS.has(name)) {
      (el as unknown as Record<string, unknown>)[name] = value;
    } else if (value === true) {
      el.setAttribute(name, '');
    } else {
      el.setAttribute(name, String(value));
    }
  }
}

export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(parent, ...child);
    else if (child instanceof Node) parent.appendChild(child);
    else parent.appendChild(document.createTextNode(String(child)));
  }
}

/** Replaces every child of `parent`. */
export function replace(parent: Node, ...children: Child[]): void {
  while (parent.firstChild) parent.removeChild(parent.firstChild);
  append(parent, ...children);
}

let ids = 0;
/** A fresh id for label/input pairs. */
export function uid(prefix = 'f'): string {
  ids += 1;
  return `${prefix}-${ids}`;
}

const SVG = 'http://www.w3.org/2000/svg';

/** A small stroked icon from path data (24×24 viewBox). Decorative: hidden from screen readers. */
export function icon(paths: string[], cls = 'icon'): SVGSVGElement {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('class', cls);
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  for (const d of paths) {
    const p = document.createElementNS(SVG, 'path');
    p.setAttribute('d', d);
    svg.appendChild(p);
  }
  return svg;
}

export const icons = {
  groups: ['M12 3l9 5-9 5-9-5z', 'M3 13l9 5 9-5'],
  keys: ['M3 12a4 4 0 1 0 8 0a4 4 0 1 0-8 0', 'M11 12h10', 'M17 12v3', 'M20 12v2'],
  models: ['M12 3l8 4.5v9L12 21l-8-4.5v-9z', 'M12 12l8-4.5', 'M12 12v9', 'M12 12L4 7.5'],
  usage: ['M4 20V10', 'M10 20V4', 'M16 20v-7', 'M22 20H2'],
  requests: ['M4 6h16', 'M4 12h16', 'M4 18h10'],
  audit: ['M6 3h9l4 4v14H6z', 'M9 12h7', 'M9 16h7', 'M9 8h3'],
  mcp: ['M14.7 6.3a4 4 0 0 0-5.4 5.4L3 18l3 3 6.3-6.3a4 4 0 0 0 5.4-5.4l-2.5 2.5-2.5-.5-.5-2.5z'],
  logout: ['M15 4h3a2 2 0 0 1 2 2v12a2 2 0 0 1-2 2h-3', 'M10 17l-5-5 5-5', 'M5 12h11'],
  plus: ['M12 5v14', 'M5 12h14'],
  copy: ['M9 9h10v10H9z', 'M5 15V5h10'],
  download: ['M12 4v11', 'M7 10l5 5 5-5', 'M5 20h14'],
  refresh: ['M20 11a8 8 0 1 0-2.3 5.7', 'M20 5v6h-6'],
  check: ['M5 12.5l4.5 4.5L19 7'],
  alert: ['M12 8v5', 'M12 16.5h.01', 'M10.3 3.9L2.4 18a2 2 0 0 0 1.7 3h15.8a2 2 0 0 0 1.7-3L13.7 3.9a2 2 0 0 0-3.4 0z'],
};
