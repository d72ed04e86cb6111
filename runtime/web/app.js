// app.js — the entry: boots (GET /session → sign-in or the shell), draws the chrome
// (nav rail, roster, disconnected banner, theme, keyboard, command palette) and starts
// the router. View modules register their routes when imported (imports run first).

import {
  applyTheme,
  can,
  h,
  identity,
  mount,
  navigate,
  onConnection,
  render,
  viewFailed,
  resetLive,
  setIdentity,
  setOutlet,
  setTheme,
  setUnauthorizedHandler,
  startLive,
  startRouter,
  theme,
} from './core.js';
import { getSession, signOut } from './api.js';
import { signInScreen } from './signin.js';
import { badge, inboxItems, loadAll, onChange, presenceDot, startSync, state, stopSync, unread } from './store.js';
import './chat.js';
import './members.js';
import { disablePush, startWorker } from './push.js';

const root = document.getElementById('app');
let shell = null; // {view, nav, banner} once built
let routerStarted = false;

// ---------------------------------------------------------------- boot

async function boot() {
  applyTheme();
  setUnauthorizedHandler(() => signedOut('Your session expired — please sign in again.'));
  setOutlet(null, onRouteChange);
  let s = null;
  try {
    s = await getSession();
  } catch (e) {
    if (e.status !== 401) {
      mount(root, h('main', { class: 'signin' }, h('div', { class: 'card stack' }, h('h1', null, 'ac7'), h('p', { class: 'error' }, 'The broker did not answer: ' + e.message), h('button', { onClick: () => location.reload() }, 'Reload'))));
      return;
    }
  }
  if (s) setIdentity(s);
  if (s) await enter();
  else start();
}

function start() {
  if (routerStarted) render();
  else {
    routerStarted = true;
    startRouter();
  }
}

async function enter() {
  mount(root, h('div', { class: 'boot' }, 'Loading…'));
  await loadAll();
  shell = null;
  startLive();
  startSync();
  start();
}

let signInNotice = null;

function signedOut(notice) {
  if (!identity()) return; // several requests may see the same 401
  stopSync();
  resetLive();
  setIdentity(null);
  shell = null;
  signInNotice = notice || null;
  render();
}

// The notice (why the member was signed out) stays on the sign-in screen however often it is
// drawn again (a navigation, the live stream seeing the same 401) until someone signs in.
function showSignIn() {
  signInScreen(
    root,
    (s) => {
      signInNotice = null;
      setIdentity(s);
      enter();
    },
    signInNotice,
  );
}

let lastPath = null;

// Where a route renders: bare pages (setup) straight into #app, others into the shell.
function onRouteChange(path, opts) {
  opts = opts || {};
  if (!identity() && !opts.public) {
    showSignIn();
    return null;
  }
  closeOverlays();
  if (opts.bare) {
    shell = null;
    const page = h('div', { class: 'bare' });
    mount(root, page);
    return page;
  }
  const fresh = !shell;
  if (!shell) buildShell();
  drawNav();
  // After an in-app navigation to another page focus goes to the new view (not left on
  // <body> or on the nav link clicked), so keyboard and screen-reader users land on it. A
  // view re-rendered in place (live updates) keeps focus where it is.
  const moved = path !== lastPath;
  lastPath = path;
  if (!fresh && moved) queueMicrotask(() => shell && shell.view.focus({ preventScroll: true }));
  return shell.view;
}

// ---------------------------------------------------------------- chrome

function buildShell() {
  const view = h('main', { id: 'view', class: 'view', tabindex: '-1' });
  const nav = h('nav', { class: 'rail', id: 'rail', 'aria-label': 'Main' });
  const banner = h('div', { class: 'banner', role: 'alert', hidden: true }, 'Disconnected from the broker — reconnecting…');
  const header = h(
    'header',
    { class: 'topbar' },
    h(
      'button',
      {
        class: 'icon menu',
        'aria-label': 'Menu',
        'aria-controls': 'rail',
        onClick: () => document.body.classList.toggle('drawer-open'),
      },
      '☰',
    ),
    h('a', { href: '/', class: 'brand' }, 'ac7'),
    h('button', { class: 'pill', onClick: openPalette, 'aria-keyshortcuts': 'Control+K Meta+K' }, 'Jump to member, channel, objective… ', h('kbd', null, 'Ctrl K')),
    h('button', { class: 'icon', 'aria-label': 'Theme: ' + theme(), title: 'Theme', onClick: cycleTheme }, '◐'),
  );
  const skip = h('a', { class: 'skip', href: '#view', 'data-external': '', onClick: (ev) => (ev.preventDefault(), view.focus()) }, 'Skip to content');
  mount(root, h('div', { class: 'shell' }, skip, header, banner, nav, h('div', { class: 'scrim', onClick: closeOverlays }), view));
  shell = { view, nav, banner };
}

function cycleTheme(ev) {
  const next = { auto: 'light', light: 'dark', dark: 'auto' }[theme()];
  setTheme(next);
  ev.currentTarget.setAttribute('aria-label', 'Theme: ' + next);
}

function navLink(href, label, extra, opts = {}) {
  const here = location.pathname;
  const cur = opts.exact ? here === href : here === href || here.startsWith(href + '/');
  return h('a', { href, class: 'nav-item' + (cur ? ' current' : ''), 'aria-current': cur ? 'page' : null }, label, extra || null);
}

function drawNav() {
  if (!shell) return;
  const me = identity().member;
  const team = state.briefing && state.briefing.team;
  const inboxN = inboxItems().length;
  const mineOpen = state.objectives.filter((o) => o.assignee === me && (o.status === 'active' || o.status === 'blocked')).length;
  const joined = state.channels.filter((c) => c.joined);
  joined.sort((a, b) => (a.id === 'general' ? -1 : b.id === 'general' ? 1 : b.createdAt - a.createdAt));
  mount(
    shell.nav,
    h('a', { href: '/', class: 'team' }, h('strong', null, team ? team.name : 'ac7'), h('span', { class: 'muted' }, me)),
    navLink('/', 'Home', null, { exact: true }),
    navLink('/inbox', 'Inbox', badge(inboxN)),
    navLink('/objectives', 'Objectives', mineOpen ? h('span', { class: 'badge soft' }, mineOpen) : null),
    navLink('/files/' + me, 'Files'),
    navLink('/members', 'Members'),
    h('div', { class: 'nav-head' }, h('a', { href: '/channels' }, 'Channels'), h('a', { href: '/channels/new', class: 'icon', 'aria-label': 'New channel' }, '+')),
    joined.map((c) => navLink('/c/' + c.slug, '#' + c.slug, badge(unread(c.id === 'general' ? 'general' : 'chan:' + c.id)))),
    h('div', { class: 'nav-head' }, 'Direct'),
    state.teammates
      .filter((t) => t.name !== me)
      .map((t) => {
        const p = state.presence.get(t.name);
        return navLink('/dm/' + encodeURIComponent(t.name), [presenceDot(t.name), ' ' + t.name, p && p.busy ? h('span', { class: 'muted busy-label' }, ' working') : null], badge(unread('dm:' + t.name)));
      }),
    h(
      'div',
      { class: 'nav-foot' },
      navLink('/account', 'Account'),
      h(
        'button',
        {
          class: 'link',
          onClick: async () => {
            // This browser stops notifying the member who leaves it.
            await disablePush().catch(() => {});
            try {
              await signOut();
            } catch {
              /* signed out either way */
            }
            history.replaceState(null, '', '/');
            signedOut();
          },
        },
        'Sign out',
      ),
    ),
  );
}

onChange(() => {
  drawNav();
  // The title counts what the Inbox lists (the nav badge is the same number).
  const n = identity() ? inboxItems().length : 0;
  document.title = (n ? '(' + n + ') ' : '') + 'ac7';
});

onConnection((up) => {
  if (shell) shell.banner.hidden = up;
  // Presence is not known while the stream is down: every dot greys out.
  document.body.classList.toggle('disconnected', !up);
  // A view that failed while the broker was unreachable renders again.
  if (up && viewFailed()) render();
  // The service worker (offline start, notifications), once the app itself has loaded.
  if (up) startWorker();
});

// ---------------------------------------------------------------- command palette

let palette = null;

function paletteItems() {
  const me = identity().member;
  const items = [
    { label: 'Home', href: '/' },
    { label: 'Inbox', href: '/inbox' },
    { label: 'Objectives', href: '/objectives' },
    { label: 'Files', href: '/files/' + me },
    { label: 'Members', href: '/members' },
    { label: 'Channels', href: '/channels' },
    { label: 'Account', href: '/account' },
  ];
  if (can('objectives.create')) items.push({ label: '+ New objective', href: '/objectives/new' });
  for (const c of state.channels) if (c.joined) items.push({ label: '#' + c.slug, href: '/c/' + c.slug });
  for (const t of state.teammates) {
    if (t.name !== me) items.push({ label: 'DM @' + t.name, href: '/dm/' + encodeURIComponent(t.name) });
    items.push({ label: '@' + t.name, href: '/@' + t.name });
  }
  for (const o of state.objectives) items.push({ label: o.title + ' · ' + o.status + ' · ' + o.assignee, href: '/objectives/' + encodeURIComponent(o.id) });
  return items;
}

// Subsequence match; earlier and word-start hits score higher; null when no match.
export function score(label, q) {
  if (!q) return 0;
  const s = label.toLowerCase();
  let at = 0;
  let total = 0;
  for (const ch of q.toLowerCase()) {
    const i = s.indexOf(ch, at);
    if (i < 0) return null;
    total += 100 - Math.min(i, 90);
    if (i === 0 || /[\s@#·/-]/.test(s[i - 1])) total += 10;
    if (i === at) total += 5;
    at = i + 1;
  }
  return total;
}

function openPalette() {
  if (!identity() || palette) return;
  const input = h('input', { type: 'search', 'aria-label': 'Jump to', placeholder: 'Jump to…', role: 'combobox', 'aria-controls': 'palette-list', 'aria-expanded': 'true' });
  const list = h('ul', { id: 'palette-list', role: 'listbox' });
  let cur = 0;
  let shown = [];
  const all = paletteItems();
  const draw = () => {
    const q = input.value.trim();
    shown = all
      .map((it, i) => ({ it, s: score(it.label, q), i }))
      .filter((x) => x.s !== null)
      .sort((a, b) => b.s - a.s || a.i - b.i)
      .slice(0, 20)
      .map((x) => x.it);
    cur = Math.min(cur, Math.max(0, shown.length - 1));
    input.setAttribute('aria-activedescendant', shown.length ? 'palette-opt-' + cur : '');
    list.replaceChildren(
      ...shown.map((it, i) =>
        h('li', { id: 'palette-opt-' + i, role: 'option', 'aria-selected': i === cur ? 'true' : 'false', class: i === cur ? 'sel' : null, onMousedown: (ev) => (ev.preventDefault(), go(it)), onMousemove: () => i !== cur && ((cur = i), draw()) }, it.label),
      ),
    );
  };
  const go = (it) => {
    closePalette();
    navigate(it.href);
  };
  input.addEventListener('input', () => {
    cur = 0;
    draw();
  });
  input.addEventListener('keydown', (ev) => {
    if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
      ev.preventDefault();
      if (shown.length) cur = (cur + (ev.key === 'ArrowDown' ? 1 : shown.length - 1)) % shown.length;
      draw();
    } else if (ev.key === 'Enter') {
      ev.preventDefault();
      if (shown[cur]) go(shown[cur]);
    }
  });
  const back = document.activeElement;
  palette = h('div', { class: 'palette-wrap', onMousedown: (ev) => ev.target === palette && closePalette() }, h('div', { class: 'palette', role: 'dialog', 'aria-modal': 'true', 'aria-label': 'Jump to' }, input, list));
  palette.back = back;
  document.body.appendChild(palette);
  draw();
  input.focus();
}

function closePalette() {
  if (!palette) return;
  const back = palette.back;
  palette.remove();
  palette = null;
  if (back && back.focus) back.focus();
}

function closeOverlays() {
  closePalette();
  document.body.classList.remove('drawer-open');
}

// ---------------------------------------------------------------- keyboard

let gPending = 0;
const G_KEYS = { i: '/inbox', o: '/objectives', h: '/', m: '/members', c: '/channels', a: '/account' };

function typing(t) {
  return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
}

document.addEventListener('keydown', (ev) => {
  if (!identity()) return;
  if ((ev.key === 'k' || ev.key === 'K') && (ev.metaKey || ev.ctrlKey)) {
    ev.preventDefault();
    palette ? closePalette() : openPalette();
    return;
  }
  if (ev.key === 'Escape') {
    if (palette || document.body.classList.contains('drawer-open')) {
      ev.preventDefault();
      closeOverlays();
    } else if (typing(ev.target)) ev.target.blur();
    return;
  }
  if (typing(ev.target) || ev.metaKey || ev.ctrlKey || ev.altKey) return;
  if (gPending && Date.now() - gPending < 1500) {
    gPending = 0;
    const to = ev.key === 'f' ? '/files/' + identity().member : G_KEYS[ev.key];
    if (to) {
      ev.preventDefault();
      navigate(to);
    }
    return;
  }
  if (ev.key === 'g') {
    gPending = Date.now();
    return;
  }
  if (ev.key === '/') {
    const ta = document.querySelector('.composer textarea');
    if (ta) {
      ev.preventDefault();
      ta.focus();
    }
  } else if (ev.key === '?') {
    navigate('/account');
  }
});

boot();

// The other views register their routes when imported.
import './objectives.js';
import './files.js';
import './activity.js';
