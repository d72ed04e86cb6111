// core.js — the app's small runtime: router, API client, live stream, DOM builder,
// identity, toasts and formatting. Every view module imports from here; nothing here
// knows about a particular screen. No dependencies, no build step (see README "The web app").

import { getSession } from './api.js';

// ---------------------------------------------------------------- DOM builder

const PROPS = new Set(['value', 'checked', 'disabled', 'selected', 'hidden', 'multiple']);

// h('button', {class: 'x', onClick: fn, 'data-id': 3}, 'text', child, [more])
// Strings and numbers become text nodes (never parsed as HTML); null/false children vanish.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k.length > 2 && k.startsWith('on') && typeof v === 'function') {
        el.addEventListener(k.slice(2).toLowerCase(), v);
      } else if (PROPS.has(k)) {
        el[k] = v;
      } else if (k === 'href' || k === 'src' || k === 'action') {
        el.setAttribute(k, safeUrl(String(v)));
      } else if (k === 'style') {
        throw new Error('inline style is refused by the CSP; use a class');
      } else {
        el.setAttribute(k, v === true ? '' : String(v));
      }
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false || c === true) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// Only same-origin paths, http(s), mailto and blob/data images get through; anything
// else (javascript:, vbscript:, …) becomes '#'.
export function safeUrl(u) {
  if (u.startsWith('/') && !u.startsWith('//')) return u;
  if (u.startsWith('#') || u.startsWith('?')) return u;
  if (/^(https?:|mailto:|blob:)/i.test(u)) return u;
  if (/^data:image\/(png|gif|jpeg|webp);/i.test(u)) return u;
  return '#';
}

// ---------------------------------------------------------------- inline text formatting

// `code`, **bold**, *italic* / _italic_, [label](http(s) URL) and bare http(s) URLs. The text
// is never parsed as HTML: each piece becomes a text node or an element built here, and a
// link's address goes through safeUrl.
const INLINE = new RegExp(
  [
    '(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)', // 1, 2: code (any backtick run, matched in length)
    '\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*', // 3: bold
    '(?<![\\w*])\\*(?=[^\\s*])([^*\\n]*?[^\\s*])\\*(?![\\w*])', // 4: italic
    '(?<![\\w_])_(?=[^\\s_])([^_\\n]*?[^\\s_])_(?![\\w_])', // 5: italic
    '\\[([^\\]\\n]+)\\]\\((https?:\\/\\/[^\\s()<>]+)\\)', // 6, 7: labelled link
    '\\bhttps?:\\/\\/[^\\s<>"\']*[^\\s<>"\'.,;:!?)\\]]', // bare link
  ].join('|'),
  'g',
);

function link(href, label) {
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer', 'data-external': '' }, label);
}

export function inlineNodes(text, depth = 0) {
  const out = [];
  let at = 0;
  for (const m of String(text).matchAll(INLINE)) {
    if (m.index > at) out.push(text.slice(at, m.index));
    at = m.index + m[0].length;
    const inner = (s) => (depth < 4 ? inlineNodes(s, depth + 1) : s);
    if (m[1]) out.push(h('code', null, m[2].length > 2 && m[2].startsWith(' ') && m[2].endsWith(' ') ? m[2].slice(1, -1) : m[2]));
    else if (m[3] !== undefined) out.push(h('strong', null, inner(m[3])));
    else if (m[4] !== undefined) out.push(h('em', null, inner(m[4])));
    else if (m[5] !== undefined) out.push(h('em', null, inner(m[5])));
    else if (m[6] !== undefined) out.push(link(m[7], m[6]));
    else out.push(link(m[0], m[0]));
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

// Replaces an element's children.
export function mount(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// ---------------------------------------------------------------- identity

let me = null; // {member, role, permissions, expiresAt}

export function identity() {
  return me;
}

export function setIdentity(id) {
  me = id;
}

export function can(permission) {
  return !!me && Array.isArray(me.permissions) && me.permissions.includes(permission);
}

// ---------------------------------------------------------------- API client

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

let onUnauthorized = () => {};

// app.js installs what a 401 does (drop the session, show sign-in).
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

// api('GET', '/roster') → parsed JSON (null for 204). Objects are sent as JSON;
// FormData, Blob, File, ArrayBuffer and strings are passed through as the body.
// Errors throw ApiError{status, message}; message is the server's `error` text.
// A 401 calls the unauthorized handler (sign-in screen) before throwing.
export async function api(method, path, body) {
  const init = {
    method,
    credentials: 'same-origin',
    headers: { Accept: 'application/json' },
  };
  if (body !== undefined && body !== null) {
    if (
      body instanceof FormData ||
      body instanceof Blob ||
      body instanceof ArrayBuffer ||
      typeof body === 'string'
    ) {
      init.body = body;
    } else {
      init.body = JSON.stringify(body);
      init.headers['Content-Type'] = 'application/json';
    }
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'the broker cannot be reached (' + e.message + ')');
  }
  const type = res.headers.get('Content-Type') || '';
  let data = null;
  if (res.status !== 204) {
    if (type.includes('json')) {
      try {
        data = await res.json();
      } catch {
        data = null;
      }
    } else {
      const text = await res.text();
      data = text ? { error: text } : null;
    }
  }
  if (!res.ok) {
    const msg = (data && data.error) || res.status + ' ' + res.statusText;
    const err = new ApiError(res.status, msg, data);
    // A 401 may be about the request (a wrong confirmation code) rather than the session:
    // sign out only when the session itself is gone.
    if (res.status === 401 && !path.startsWith('/session')) sessionCheck();
    throw err;
  }
  return data;
}

let checking = null;

function sessionCheck() {
  if (checking) return checking;
  checking = fetch('/session', { credentials: 'same-origin', headers: { Accept: 'application/json' } })
    .then((r) => {
      if (r.status === 401) onUnauthorized(new ApiError(401, 'session expired'));
    })
    .catch(() => {})
    .finally(() => {
      checking = null;
    });
  return checking;
}

// ---------------------------------------------------------------- router

const routes = []; // {re, keys, render, opts}
let outlet = null; // where views render
let cleanup = null;
let renderToken = null;
let onRouteChange = () => {};
let failed = false; // the current view's render threw (shown as an error box)

// Whether the view on screen failed to render (app.js renders it again on reconnect).
export function viewFailed() {
  return failed;
}

const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

// route('/objectives/:id', render[, {chrome: false}]). `:name` matches one segment,
// a trailing `*` the rest (as params.rest). render({params, query, el, path}) may
// return a cleanup function (or a promise of one), called when the route is left.
export function route(pattern, render, opts = {}) {
  const keys = [];
  let src = '';
  for (const seg of pattern.split('/').filter(Boolean)) {
    if (seg === '*') {
      keys.push('rest');
      src += '(?:/(.*))?';
    } else if (seg.includes(':')) {
      // '/:id' or a literal prefix such as '/@:name'.
      const i = seg.indexOf(':');
      keys.push(seg.slice(i + 1));
      src += '/' + esc(seg.slice(0, i)) + '([^/]+)';
    } else {
      src += '/' + esc(seg);
    }
  }
  routes.push({ re: new RegExp('^' + (src || '/') + '/?$'), keys, render, opts, pattern });
}

export function match(path) {
  for (const r of routes) {
    const m = r.re.exec(path);
    if (!m) continue;
    const params = {};
    r.keys.forEach((k, i) => {
      params[k] = m[i + 1] === undefined ? '' : decodeURIComponent(m[i + 1]);
    });
    return { route: r, params };
  }
  return null;
}

// app.js: where views go, and a hook told about every route change (chrome, nav highlight).
export function setOutlet(el, onChange) {
  outlet = el;
  if (onChange) onRouteChange = onChange;
}

export function navigate(path, opts = {}) {
  if (opts.replace) history.replaceState({ k: newEntryKey() }, '', path);
  else history.pushState({ k: newEntryKey() }, '', path);
  render();
}

// ---- scroll positions: one per history entry, given back when the user returns to it
// (back/forward), never on a fresh navigation.

const scrolls = new Map(); // entry key → {top, end}
let restoring = false; // the next render is a return to an entry
let saved = null; // the position the view on screen is to restore, or null

function newEntryKey() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function entryKey() {
  if (!history.state || !history.state.k) history.replaceState({ ...(history.state || {}), k: newEntryKey() }, '');
  return history.state.k;
}

// What scrolls: a thread's transcript, else the view itself.
function onScroll(ev) {
  const t = ev.target;
  if (!(t instanceof Element) || !(t.classList.contains('view') || t.classList.contains('scroller'))) return;
  const k = entryKey();
  scrolls.delete(k);
  scrolls.set(k, { top: t.scrollTop, end: t.scrollHeight - t.scrollTop - t.clientHeight < 64 });
  if (scrolls.size > 100) scrolls.delete(scrolls.keys().next().value);
}

// The scroll position the view being rendered should go back to ({top, end: at the
// bottom}), or null on a fresh visit. A thread view uses it; other views get theirs back
// from render() itself.
export function savedScroll() {
  return saved;
}

// Puts `el`'s view back at `pos`, trying again while the view's content is still arriving.
function restoreScroll(el, pos, token) {
  const until = performance.now() + 3000;
  const step = () => {
    if (renderToken !== token || el.querySelector('.scroller')) return;
    el.scrollTop = pos.top;
    if (Math.abs(el.scrollTop - pos.top) > 1 && performance.now() < until) requestAnimationFrame(step);
  };
  step();
}

// Runs the current view's cleanup (closes its streams and timers), once.
function leaveView() {
  if (typeof cleanup === 'function') {
    try {
      cleanup();
    } catch (e) {
      console.error(e);
    }
  }
  cleanup = null;
}

export async function render() {
  leaveView();
  const path = location.pathname;
  const query = new URLSearchParams(location.search);
  const m = match(path) || match('/');
  const el = onRouteChange(path, m && m.route.opts) || outlet;
  saved = restoring ? scrolls.get(entryKey()) || null : null;
  restoring = false;
  if (!el || !m) return;
  el.replaceChildren();
  const token = {};
  renderToken = token;
  failed = false;
  try {
    const c = await m.route.render({ params: m.params, query, el, path });
    if (renderToken !== token) {
      if (typeof c === 'function') c();
    } else {
      cleanup = c;
      if (saved) restoreScroll(el, saved, token);
      // The ready marker (browser tests, `ac7-bench web`): the first view has rendered.
      if (!document.body.dataset.ready) performance.mark('ac7-ready');
      document.body.dataset.ready = '1';
    }
  } catch (e) {
    if (renderToken !== token) return;
    if (e instanceof ApiError && e.status === 401) return;
    failed = true;
    el.replaceChildren(h('div', { class: 'error-box', role: 'alert' }, String(e.message || e)));
  }
}

// Links: any same-origin <a href="/…"> without target/download navigates in-app.
function onClick(ev) {
  if (ev.defaultPrevented || ev.button !== 0) return;
  if (ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
  const a = ev.target.closest && ev.target.closest('a[href]');
  if (!a || a.target || a.hasAttribute('download') || a.dataset.external !== undefined) return;
  const href = a.getAttribute('href');
  if (!href.startsWith('/') || href.startsWith('//') || href.startsWith('/fs/')) return;
  ev.preventDefault();
  navigate(href);
}

export function startRouter() {
  document.addEventListener('click', onClick);
  document.addEventListener('scroll', onScroll, { capture: true, passive: true });
  try {
    for (const [k, v] of JSON.parse(sessionStorage.getItem('ac7:scroll')) || []) scrolls.set(k, v);
  } catch {
    /* none kept */
  }
  window.addEventListener('popstate', () => {
    restoring = true;
    render();
  });
  // The back/forward cache keeps a page that was left alive but frozen, its connections
  // open: every cached page of ours would hold one of the browser's six sockets for this
  // host (the live stream, a view's activity stream), and after a few page loads the next
  // one would wait a minute for a free socket. So a page being hidden closes its streams,
  // and one shown again from the cache reopens them and renders its view afresh.
  window.addEventListener('pagehide', () => {
    leaveView();
    stopLive();
    // Kept for this tab: back from a page outside the app reloads it.
    try {
      sessionStorage.setItem('ac7:scroll', JSON.stringify([...scrolls]));
    } catch {
      /* private mode */
    }
  });
  window.addEventListener('pageshow', (ev) => {
    if (!ev.persisted) return;
    if (me) startLive();
    restoring = true;
    render();
  });
  // A reload, or back into the app from another page: where this entry was.
  const nav = performance.getEntriesByType('navigation')[0];
  restoring = !!nav && (nav.type === 'reload' || nav.type === 'back_forward');
  return render();
}

// ---------------------------------------------------------------- live stream (SSE)

const listeners = new Set(); // {kind, fn}
const connListeners = new Set();
let source = null;
let lastId = null;
let backoff = 1000;
let retryTimer = null;
let bannerTimer = null;
let connected = false;
let everOpened = false;

// live('*', fn) gets every message; live('objective', fn) those whose data.kind is
// 'objective'; live('reset', fn) the broker's reset notice (refetch what you show);
// live('open', fn) every (re)connection; live('presence', fn) a member's presence changed;
// live('channels', fn) the channel list changed.
// Returns the unsubscribe function.
export function live(kind, fn) {
  const l = { kind, fn };
  listeners.add(l);
  return () => listeners.delete(l);
}

// fn(connected: bool) on every change; the disconnected banner listens here.
export function onConnection(fn) {
  connListeners.add(fn);
  return () => connListeners.delete(fn);
}

export function isConnected() {
  return connected;
}

function emit(kind, payload) {
  for (const l of [...listeners]) {
    if (l.kind !== kind && !(l.kind === '*' && kind === 'message')) continue;
    try {
      l.fn(payload);
    } catch (e) {
      console.error(e);
    }
  }
}

function emitMessage(msg) {
  const k = msg && msg.data && msg.data.kind;
  for (const l of [...listeners]) {
    if (l.kind === '*' || (k && l.kind === k)) {
      try {
        l.fn(msg);
      } catch (e) {
        console.error(e);
      }
    }
  }
}

function setConnected(v) {
  if (v === connected) return;
  connected = v;
  clearTimeout(bannerTimer);
  if (v) {
    for (const f of connListeners) f(true);
  } else {
    // The banner shows only if the drop lasts (a quick resume stays silent).
    bannerTimer = setTimeout(() => {
      if (!connected && everOpened) for (const f of connListeners) f(false);
    }, 3000);
  }
}

// Opens the stream for the signed-in member. Resumes from the last message id after
// any drop (the broker replays what was missed: `lastEventId`), with backoff 1 s → 30 s.
export function startLive() {
  stopLive();
  if (!me) return;
  const q = new URLSearchParams({ name: me.member });
  if (lastId) q.set('lastEventId', lastId);
  const es = new EventSource('/subscribe?' + q.toString(), { withCredentials: true });
  source = es;
  es.addEventListener('open', () => {
    if (source !== es) return;
    backoff = 1000;
    everOpened = true;
    setConnected(true);
    emit('open', null);
  });
  es.addEventListener('message', (ev) => {
    if (source !== es) return;
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch {
      return;
    }
    if (ev.lastEventId) lastId = ev.lastEventId;
    else if (msg && msg.id) lastId = msg.id;
    emitMessage(msg);
  });
  // A member's presence changed on the broker (a stream opened or closed, a busy report
  // started or ended): {type: 'presence', name}.
  es.addEventListener('presence', (ev) => {
    if (source !== es) return;
    let p = null;
    try {
      p = JSON.parse(ev.data);
    } catch {
      return;
    }
    emit('presence', p);
  });
  // The channel list changed (a channel created, renamed or archived, a member joined or
  // left): {type: 'channels'}.
  es.addEventListener('channels', () => {
    if (source !== es) return;
    emit('channels', null);
  });
  es.addEventListener('reset', (ev) => {
    if (source !== es) return;
    let r = null;
    try {
      r = JSON.parse(ev.data);
    } catch {
      /* still a reset */
    }
    emit('reset', r);
  });
  es.addEventListener('error', () => {
    if (source !== es) return;
    setConnected(false);
    // EventSource retries by itself on a dropped connection (sending Last-Event-ID);
    // after an HTTP error it gives up (CLOSED): then we check the session and retry.
    if (es.readyState === EventSource.CLOSED) {
      es.close();
      source = null;
      clearTimeout(retryTimer);
      retryTimer = setTimeout(async () => {
        try {
          await getSession();
        } catch (e) {
          if (e.status === 401) {
            onUnauthorized(e);
            return;
          }
        }
        if (me) startLive();
      }, backoff);
      backoff = Math.min(backoff * 2, 30000);
    }
  });
}

export function stopLive() {
  clearTimeout(retryTimer);
  if (source) source.close();
  source = null;
}

// Forget the stream position (on sign-out).
export function resetLive() {
  stopLive();
  lastId = null;
  everOpened = false;
  connected = false;
}

// ---------------------------------------------------------------- toasts

const TOAST_MS = { info: 5000, success: 5000, warn: 7000, error: 7000 };

// toast('Saved', 'success'); levels info | success | warn | error. With
// action = {label, href} the toast gets a button that opens href (and clicking its text does too).
export function toast(text, level = 'info', action) {
  let box = document.getElementById('toasts');
  if (!box) {
    box = h('div', { id: 'toasts', class: 'toasts' });
    document.body.appendChild(box);
  }
  const role = level === 'error' || level === 'warn' ? 'alert' : 'status';
  const open = () => {
    t.remove();
    navigate(action.href);
  };
  const t = h(
    'div',
    { class: 'toast toast-' + level + (action ? ' actionable' : ''), role },
    h('span', { onClick: action ? open : null }, text),
    action ? h('button', { class: 'link', onClick: open }, action.label) : null,
    h('button', { class: 'icon', 'aria-label': 'Dismiss', onClick: () => t.remove() }, '×'),
  );
  box.appendChild(t);
  while (box.children.length > 5) box.firstChild.remove();
  setTimeout(() => t.remove(), TOAST_MS[level] || 5000);
  return t;
}

// ---------------------------------------------------------------- formatting

const pad = (n) => String(n).padStart(2, '0');
const MONTHS = 'Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec'.split(' ');

// Local time: 'HH:MM' today, 'Mon D HH:MM' this year, 'Mon D YYYY' before.
export function fmtTime(ms) {
  if (ms === null || ms === undefined) return '';
  const d = new Date(ms);
  const now = new Date();
  const hm = pad(d.getHours()) + ':' + pad(d.getMinutes());
  if (d.toDateString() === now.toDateString()) return hm;
  const md = MONTHS[d.getMonth()] + ' ' + d.getDate();
  if (d.getFullYear() === now.getFullYear()) return md + ' ' + hm;
  return md + ' ' + d.getFullYear();
}

// 950 → '950', 1234 → '1.2k', 56_000 → '56k', 1_500_000 → '1.5M'.
export function fmtTokens(n) {
  if (n === null || n === undefined || !isFinite(n)) return '–';
  const a = Math.abs(n);
  const f = (v, s) => (v < 10 ? v.toFixed(1).replace(/\.0$/, '') : Math.round(v)) + s;
  if (a < 1000) return String(Math.round(n));
  if (a < 1e6) return f(n / 1e3, 'k');
  if (a < 1e9) return f(n / 1e6, 'M');
  return f(n / 1e9, 'G');
}

// 1536 → '1.5 KB'.
export function fmtBytes(n) {
  if (n === null || n === undefined) return '';
  if (n < 1024) return n + ' B';
  const u = ['KB', 'MB', 'GB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024;
    i++;
  }
  return (v < 10 ? v.toFixed(1) : Math.round(v)) + ' ' + u[i];
}

// ---------------------------------------------------------------- theme

// 'auto' (follow prefers-color-scheme; no stored key), 'light' or 'dark', kept in
// localStorage['ac7:theme'] and applied as <html data-theme>.
export function theme() {
  try {
    const t = localStorage.getItem('ac7:theme');
    return t === 'light' || t === 'dark' ? t : 'auto';
  } catch {
    return 'auto';
  }
}

export function setTheme(t) {
  try {
    if (t === 'light' || t === 'dark') localStorage.setItem('ac7:theme', t);
    else localStorage.removeItem('ac7:theme');
  } catch {
    /* memory only */
  }
  applyTheme();
}

export function applyTheme() {
  const t = theme();
  if (t === 'auto') document.documentElement.removeAttribute('data-theme');
  else document.documentElement.setAttribute('data-theme', t);
}

// ---------------------------------------------------------------- small shared helpers

// A path under /fs/read/, each segment URL-encoded.
export function fsUrl(path) {
  return '/fs/read' + path.split('/').map(encodeURIComponent).join('/');
}

// confirm() is blocked by nothing in our CSP; kept in one place so tests can rely on it.
export function confirmAction(text) {
  return window.confirm(text);
}

// Audio and video formats the app plays inline (in file previews and attachments).
export const AUDIO_TYPES = new Set(['audio/mpeg', 'audio/ogg', 'audio/wav', 'audio/x-wav', 'audio/wave', 'audio/webm', 'audio/mp4', 'audio/aac', 'audio/flac']);
export const VIDEO_TYPES = new Set(['video/mp4', 'video/webm', 'video/ogg']);

// A player for an audio or video file, streamed from its URL; the link is for browsers that
// cannot play its format.
export function mediaPlayer(kind, path, name) {
  return h(
    kind,
    { class: 'preview-' + kind, src: fsUrl(path), controls: true, preload: 'metadata', 'aria-label': name },
    h('a', { href: fsUrl(path), download: name, 'data-external': '' }, 'Download ' + name),
  );
}
