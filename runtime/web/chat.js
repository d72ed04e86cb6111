// chat.js — the team's shared state (briefing, roster, channels, threads, unread) and
// the chat screens: team home, inbox, channel browse/create, channel and DM threads
// with the composer (mentions, attachments, levels).

import {
  api,
  can,
  fmtBytes,
  fmtTime,
  fsUrl,
  h,
  identity,
  live,
  mount,
  navigate,
  route,
  toast,
  confirmAction,
} from './core.js';

// ---------------------------------------------------------------- shared state

export const state = {
  briefing: null,
  teammates: [], // Teammate[]
  presence: new Map(), // name → Presence
  channels: [], // ChannelSummary[]
  objectives: [], // the viewer's objectives (assigned, originated, watched)
};

const threads = new Map(); // key → {msgs: Message[], ids: Set, complete: bool}
const changeFns = new Set();
let changeQueued = false;

// fn() after any change to roster, channels, threads or unread counts (batched per frame).
export function onChange(fn) {
  changeFns.add(fn);
  return () => changeFns.delete(fn);
}

export function changed() {
  if (changeQueued) return;
  changeQueued = true;
  requestAnimationFrame(() => {
    changeQueued = false;
    for (const f of [...changeFns]) f();
  });
}

// ---- read marks: per thread, persisted per member in this browser

let reads = null; // {since, marks: {key: ts}}

function readKey() {
  return 'ac7:read:' + identity().member;
}

function loadReads() {
  try {
    reads = JSON.parse(localStorage.getItem(readKey()));
  } catch {
    reads = null;
  }
  if (!reads || typeof reads.marks !== 'object') reads = { since: Date.now(), marks: {} };
}

function saveReads() {
  try {
    localStorage.setItem(readKey(), JSON.stringify(reads));
  } catch {
    /* private mode: memory only */
  }
}

export function markRead(key) {
  const t = threads.get(key);
  const last = t && t.msgs.length ? t.msgs[t.msgs.length - 1].ts : 0;
  if ((reads.marks[key] || 0) >= last) return;
  reads.marks[key] = last;
  saveReads();
  changed();
}

export function unread(key) {
  const t = threads.get(key);
  if (!t) return 0;
  const mark = reads.marks[key] || reads.since;
  const me = identity().member;
  let n = 0;
  for (let i = t.msgs.length - 1; i >= 0 && t.msgs[i].ts > mark; i--) {
    if (t.msgs[i].from !== me) n++;
  }
  return n;
}

export function badge(n) {
  return n > 0 ? h('span', { class: 'badge', 'aria-label': n + ' unread' }, n > 99 ? '99+' : n) : null;
}

// ---- threads

// The thread a message belongs to: 'general', 'chan:<id>', 'obj:<id>' or 'dm:<other>'.
export function threadKey(m) {
  const t = m.data && typeof m.data.thread === 'string' ? m.data.thread : null;
  if (t === 'chan:general') return 'general';
  if (t && (t.startsWith('chan:') || t.startsWith('obj:'))) return t;
  if (m.to) {
    const me = identity().member;
    return 'dm:' + (m.from === me ? m.to : m.from);
  }
  return 'general';
}

export function thread(key) {
  let t = threads.get(key);
  if (!t) {
    t = { msgs: [], ids: new Set(), complete: false, fns: new Set() };
    threads.set(key, t);
  }
  return t;
}

// Adds messages (any order) to their threads; returns those that were new.
export function addMessages(list) {
  const fresh = [];
  for (const m of list) {
    if (!m || !m.id) continue;
    const t = thread(threadKey(m));
    if (t.ids.has(m.id)) continue;
    t.ids.add(m.id);
    fresh.push(m);
    const msgs = t.msgs;
    if (!msgs.length || msgs[msgs.length - 1].ts <= m.ts) msgs.push(m);
    else {
      let i = msgs.length;
      while (i > 0 && msgs[i - 1].ts > m.ts) i--;
      msgs.splice(i, 0, m);
    }
  }
  if (fresh.length) {
    const keys = new Set(fresh.map(threadKey));
    for (const k of keys) for (const f of [...thread(k).fns]) f();
    changed();
  }
  return fresh;
}

// ---- loading

export async function loadRoster() {
  const r = await api('GET', '/roster');
  state.teammates = r.teammates || [];
  state.presence = new Map((r.connected || []).map((p) => [p.name, p]));
  changed();
}

export async function loadChannels() {
  const r = await api('GET', '/channels');
  state.channels = r.channels || [];
  changed();
}

export async function loadObjectives() {
  const r = await api('GET', '/objectives');
  state.objectives = r.objectives || [];
  changed();
}

// Boot: everything the chrome needs. Failures other than 401 leave that panel empty.
export async function loadAll() {
  loadReads();
  threads.clear();
  const results = await Promise.allSettled([
    api('GET', '/briefing').then((b) => {
      state.briefing = b;
    }),
    loadRoster(),
    loadChannels(),
    loadObjectives(),
    api('GET', '/history?limit=200').then((r) => addMessages(r.messages || [])),
  ]);
  if (results.some((r) => r.status === 'rejected' && r.reason.status !== 401)) {
    toast('Some panels failed to load; reload to retry.', 'warn');
  }
}

let liveOff = [];
let pollTimer = null;

// Live wiring: messages into threads, objective events refresh the list, presence polled.
export function startSync() {
  stopSync();
  liveOff.push(
    live('*', (m) => {
      const k = threadKey(m);
      // A channel we have not listed yet: someone added us, or created it just now.
      if (k.startsWith('chan:') && !channelById(k.slice(5))) loadChannels().catch(() => {});
      const fresh = addMessages([m]);
      if (fresh.length) notify(m);
    }),
    live('objective', () => loadObjectives().catch(() => {})),
    live('open', () => loadRoster().catch(() => {})),
    live('reset', async () => {
      const r = await api('GET', '/history?limit=200');
      addMessages(r.messages || []);
    }),
  );
  const poll = () => {
    if (document.visibilityState !== 'visible') return;
    loadRoster().catch(() => {});
    loadChannels().catch(() => {});
  };
  pollTimer = setInterval(poll, 10000);
  document.addEventListener('visibilitychange', poll);
  liveOff.push(() => document.removeEventListener('visibilitychange', poll));
}

export function stopSync() {
  for (const f of liveOff) f();
  liveOff = [];
  clearInterval(pollTimer);
}

let onScreen = null; // the thread key shown now

function notify(m) {
  const key = threadKey(m);
  if (m.from === identity().member || key === onScreen || key.startsWith('obj:')) return;
  if (document.visibilityState !== 'visible') return;
  const where = key === 'general' ? ' · #general' : key.startsWith('dm:') ? ' · DM' : '';
  toast((m.from || 'ac7') + where + ': ' + m.body.slice(0, 140), 'info');
}

// ---- names and titles

export function channelById(id) {
  return state.channels.find((c) => c.id === id);
}

export function threadTitle(key) {
  if (key === 'general') return '#general';
  if (key.startsWith('dm:')) return '@' + key.slice(3);
  if (key.startsWith('chan:')) {
    const c = channelById(key.slice(5));
    return c ? '#' + c.slug : 'a channel';
  }
  if (key.startsWith('obj:')) {
    const o = state.objectives.find((x) => x.id === key.slice(4));
    return o ? o.title : key.slice(4);
  }
  return key;
}

export function threadHref(key) {
  if (key === 'general') return '/c/general';
  if (key.startsWith('dm:')) return '/dm/' + encodeURIComponent(key.slice(3));
  if (key.startsWith('chan:')) {
    const c = channelById(key.slice(5));
    return c ? '/c/' + c.slug : '/channels';
  }
  if (key.startsWith('obj:')) return '/objectives/' + encodeURIComponent(key.slice(4));
  return '/';
}

export function isOnline(name) {
  const p = state.presence.get(name);
  return !!p && p.connected > 0;
}

export function isBusy(name) {
  const p = state.presence.get(name);
  return !!p && p.busy === true;
}

export function presenceDot(name) {
  const busy = isBusy(name);
  const on = isOnline(name);
  const label = busy ? 'working' : on ? 'online' : 'offline';
  return h('span', {
    class: 'dot ' + (busy ? 'busy' : on ? 'on' : 'off'),
    title: label,
    'aria-label': label,
  });
}

// Inbox items: unread threads, then the viewer's open assignments, then watched blocked ones.
export function inboxItems() {
  const me = identity().member;
  const items = [];
  for (const [key, t] of threads) {
    const n = unread(key);
    if (!n) continue;
    const last = t.msgs[t.msgs.length - 1];
    items.push({ key, title: threadTitle(key), n, ts: last.ts, text: last.body.slice(0, 80), href: threadHref(key) });
  }
  items.sort((a, b) => b.ts - a.ts);
  for (const o of state.objectives) {
    if (o.assignee === me && (o.status === 'active' || o.status === 'blocked')) {
      items.push({
        key: 'obj:' + o.id,
        title: 'Assigned to you · ' + o.title,
        text: o.status === 'blocked' ? 'blocked: ' + (o.blockReason || '') : o.outcome,
        ts: o.updatedAt,
        href: '/objectives/' + encodeURIComponent(o.id),
      });
    } else if (o.status === 'blocked' && o.watchers.includes(me)) {
      items.push({
        key: 'obj:' + o.id,
        title: 'Blocked · ' + o.title,
        text: 'Assigned to ' + o.assignee + ' — ' + (o.blockReason || ''),
        ts: o.updatedAt,
        href: '/objectives/' + encodeURIComponent(o.id),
      });
    }
  }
  return items;
}

// ---------------------------------------------------------------- message rendering

const URL_RE = /\bhttps?:\/\/[^\s<>"']+[^\s<>"'.,;:!?)\]]/g;

// Body text with http(s) links; never parsed as HTML.
export function bodyNodes(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(URL_RE)) {
    if (m.index > at) out.push(text.slice(at, m.index));
    out.push(h('a', { href: m[0], target: '_blank', rel: 'noopener noreferrer', 'data-external': '' }, m[0]));
    at = m.index + m[0].length;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

function attachmentNode(a) {
  const url = fsUrl(a.path);
  if (/^image\/(png|jpeg|gif|webp)$/.test(a.mimeType)) {
    return h(
      'a',
      { class: 'att-img', href: url, target: '_blank', rel: 'noopener', 'data-external': '' },
      h('img', { src: url, alt: a.name, loading: 'lazy' }),
    );
  }
  return h(
    'a',
    { class: 'chip', href: url, download: a.name, 'data-external': '' },
    a.name + ' · ' + fmtBytes(a.size),
  );
}

export function messageRow(m, prev) {
  const me = identity().member;
  const cont =
    prev && prev.from === m.from && prev.level === m.level && !prev.title && !m.title && m.ts - prev.ts < 300000;
  const lvl = m.level || 'info';
  return h(
    'li',
    {
      class: 'msg lvl-' + lvl + (cont ? ' cont' : '') + (m.pending ? ' pending' : ''),
      'data-id': m.id,
    },
    h('time', { datetime: new Date(m.ts).toISOString(), title: new Date(m.ts).toLocaleString() }, fmtTime(m.ts)),
    cont ? null : h('a', { class: 'from' + (m.from === me ? ' me' : ''), href: '/@' + m.from }, m.from || 'ac7'),
    lvl !== 'info' ? h('span', { class: 'lvl' }, lvl) : null,
    m.title ? h('span', { class: 'title' }, '[' + m.title + ']') : null,
    h('div', { class: 'body' }, bodyNodes(m.body)),
    m.attachments && m.attachments.length ? h('div', { class: 'atts' }, m.attachments.map(attachmentNode)) : null,
  );
}

// ---------------------------------------------------------------- transcript + composer

// A thread view: transcript (live, paged back with before_id) and, when allowed, a composer.
function threadView(el, opts) {
  const { key, header, historyQuery, push } = opts;
  const t = thread(key);
  const list = h('ol', { class: 'transcript', 'aria-live': 'polite' });
  const older = h('button', { class: 'link older', onClick: loadOlder }, '↑ Load older messages');
  const jump = h('button', { class: 'jump', hidden: true, onClick: () => scrollEnd() }, 'Jump to latest ↓');
  const scroller = h('div', { class: 'scroller' }, older, list);
  let stick = true;
  scroller.addEventListener('scroll', () => {
    stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 64;
    if (stick) jump.hidden = true;
  });
  const scrollEnd = () => {
    scroller.scrollTop = scroller.scrollHeight;
    jump.hidden = true;
  };
  let shown = 0;
  const draw = () => {
    const msgs = t.msgs;
    const rows = [];
    for (let i = 0; i < msgs.length; i++) rows.push(messageRow(msgs[i], msgs[i - 1]));
    list.replaceChildren(...rows);
    if (!msgs.length) list.appendChild(h('li', { class: 'empty' }, 'No messages yet.'));
    older.hidden = t.complete;
    const grew = msgs.length > shown;
    shown = msgs.length;
    if (stick) scrollEnd();
    else if (grew) jump.hidden = false;
    if (document.visibilityState === 'visible') markRead(key);
  };
  async function loadOlder() {
    const q = new URLSearchParams(historyQuery);
    q.set('limit', '50');
    if (t.msgs.length) q.set('before_id', t.msgs[0].id);
    older.disabled = true;
    try {
      const r = await api('GET', '/history?' + q);
      const got = r.messages || [];
      if (got.length < 50) t.complete = true;
      const keepBottom = scroller.scrollHeight - scroller.scrollTop;
      stick = false;
      addMessages(got);
      draw();
      scroller.scrollTop = scroller.scrollHeight - keepBottom;
    } catch (e) {
      toast(e.message, 'error');
    } finally {
      older.disabled = false;
    }
  }
  t.fns.add(draw);
  onScreen = key;
  const vis = () => document.visibilityState === 'visible' && markRead(key);
  document.addEventListener('visibilitychange', vis);
  mount(
    el,
    h(
      'section',
      { class: 'thread' },
      header,
      h('div', { class: 'scroll-wrap' }, scroller, jump),
      push ? composer(key, push) : opts.footer || null,
    ),
  );
  draw();
  // Newest page from the server (the boot feed may not hold this thread's latest 50).
  if (!t.loaded) {
    const q = new URLSearchParams(historyQuery);
    q.set('limit', '50');
    api('GET', '/history?' + q)
      .then((r) => {
        t.loaded = true;
        const got = r.messages || [];
        if (got.length < 50) t.complete = true;
        addMessages(got);
        draw();
      })
      .catch((e) => e.status !== 401 && toast(e.message, 'error'));
  }
  return () => {
    t.fns.delete(draw);
    document.removeEventListener('visibilitychange', vis);
    if (onScreen === key) onScreen = null;
  };
}

const drafts = new Map(); // thread key → text (one draft per thread)
const LEVELS = ['info', 'notice', 'warning', 'error', 'critical'];

// Upload names must be valid path segments: [A-Za-z0-9._- ], no leading/trailing space.
export function safeFileName(name) {
  const s = name
    .replace(/[^A-Za-z0-9._ -]/g, '_')
    .replace(/ {2,}/g, ' ')
    .trim()
    .replace(/^\.+/, '_');
  return (s || 'file').slice(0, 200);
}

export async function uploadFile(file, dir) {
  const q = new URLSearchParams({
    path: dir + '/' + safeFileName(file.name),
    mime: file.type || 'application/octet-stream',
    collide: 'suffix',
  });
  const r = await api('POST', '/fs/write?' + q, file);
  const e = r.entry;
  return { path: e.path, name: e.name, size: e.size, mimeType: e.mimeType };
}

// The composer: Enter sends (Shift+Enter: newline; on touch screens only the button
// sends), '@' completes teammates' names, files upload at once to /<me>/uploads.
function composer(key, push) {
  const me = identity().member;
  const ta = h('textarea', {
    rows: 1,
    placeholder: 'Message ' + threadTitle(key) + ' — Enter to send, Shift+Enter for a new line',
    'aria-label': 'Message',
  });
  ta.value = drafts.get(key) || '';
  const level = h('select', { 'aria-label': 'Level', class: 'level' }, LEVELS.map((l) => h('option', { value: l }, l)));
  const fileIn = h('input', { type: 'file', multiple: true, hidden: true, 'aria-label': 'Attach files' });
  const chips = h('div', { class: 'chips' });
  const sugg = h('ul', { class: 'mentions', role: 'listbox', hidden: true });
  const send = h('button', { class: 'primary', type: 'submit' }, 'Send');
  const uploads = []; // {file, status: 'up'|'ok'|'err', att}
  let suggIdx = 0;
  let suggList = [];

  const grow = () => {
    ta.style.height = 'auto';
    ta.style.height = Math.min(ta.scrollHeight, 160) + 'px';
  };
  const sync = () => {
    drafts.set(key, ta.value);
    const busy = uploads.some((u) => u.status === 'up');
    const ready = uploads.some((u) => u.status === 'ok');
    send.disabled = busy || (!ta.value.trim() && !ready);
  };
  const drawChips = () => {
    chips.replaceChildren(
      ...uploads.map((u) =>
        h(
          'span',
          { class: 'chip up-' + u.status },
          (u.status === 'up' ? '… ' : u.status === 'ok' ? '✓ ' : '! ') + u.file.name + ' · ' + fmtBytes(u.file.size),
          h(
            'button',
            {
              class: 'icon',
              type: 'button',
              'aria-label': 'Remove ' + u.file.name,
              onClick: () => {
                uploads.splice(uploads.indexOf(u), 1);
                drawChips();
              },
            },
            '×',
          ),
        ),
      ),
    );
    sync();
  };
  const addFiles = (files) => {
    for (const file of files) {
      const u = { file, status: 'up', att: null };
      uploads.push(u);
      uploadFile(file, '/' + me + '/uploads')
        .then((att) => {
          u.att = att;
          u.status = 'ok';
        })
        .catch((e) => {
          u.status = 'err';
          toast(file.name + ': ' + e.message, 'error');
        })
        .finally(drawChips);
    }
    drawChips();
  };
  fileIn.addEventListener('change', () => {
    addFiles([...fileIn.files]);
    fileIn.value = '';
  });

  // ---- mention completion
  const mentionAt = () => {
    const upto = ta.value.slice(0, ta.selectionStart);
    const m = /(^|\s)@([A-Za-z0-9._-]*)$/.exec(upto);
    return m ? { start: upto.length - m[2].length, word: m[2] } : null;
  };
  const drawSugg = () => {
    const m = mentionAt();
    suggList = m
      ? state.teammates
          .map((t) => t.name)
          .filter((n) => n !== me && n.toLowerCase().startsWith(m.word.toLowerCase()))
          .slice(0, 8)
      : [];
    suggIdx = Math.min(suggIdx, Math.max(0, suggList.length - 1));
    sugg.hidden = !suggList.length;
    sugg.replaceChildren(
      ...suggList.map((n, i) =>
        h(
          'li',
          {
            role: 'option',
            'aria-selected': i === suggIdx ? 'true' : 'false',
            class: i === suggIdx ? 'sel' : null,
            onMousedown: (ev) => {
              ev.preventDefault();
              pick(n);
            },
          },
          '@' + n,
        ),
      ),
    );
  };
  const pick = (name) => {
    const m = mentionAt();
    if (!m) return;
    const before = ta.value.slice(0, m.start);
    const after = ta.value.slice(ta.selectionStart);
    ta.value = before + name + ' ' + after;
    const pos = before.length + name.length + 1;
    ta.setSelectionRange(pos, pos);
    suggList = [];
    sugg.hidden = true;
    sync();
  };

  ta.addEventListener('input', () => {
    grow();
    sync();
    drawSugg();
  });
  ta.addEventListener('keydown', (ev) => {
    if (suggList.length) {
      if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
        ev.preventDefault();
        suggIdx = (suggIdx + (ev.key === 'ArrowDown' ? 1 : suggList.length - 1)) % suggList.length;
        drawSugg();
        return;
      }
      if (ev.key === 'Enter' || ev.key === 'Tab') {
        ev.preventDefault();
        pick(suggList[suggIdx]);
        return;
      }
      if (ev.key === 'Escape') {
        ev.preventDefault();
        ev.stopPropagation();
        suggList = [];
        sugg.hidden = true;
        return;
      }
    }
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing && !matchMedia('(pointer: coarse)').matches) {
      ev.preventDefault();
      submit();
    }
  });
  ta.addEventListener('blur', () => {
    sugg.hidden = true;
  });

  async function submit(ev) {
    if (ev) ev.preventDefault();
    if (send.disabled) return;
    const atts = uploads.filter((u) => u.status === 'ok').map((u) => u.att);
    const text = ta.value;
    const body = text.trim() ? text.replace(/\s+$/, '') : ' ';
    const payload = { body, level: level.value, attachments: atts };
    push(payload);
    // Optimistic row, replaced by the stored message (same thread, de-duplicated by id).
    const t = thread(key);
    const tmp = { id: 'pending-' + Date.now(), ts: Date.now(), from: me, to: null, title: null, body, level: level.value, attachments: atts, data: {}, pending: true };
    t.msgs.push(tmp);
    for (const f of [...t.fns]) f();
    ta.value = '';
    uploads.length = 0;
    drawChips();
    grow();
    send.disabled = true;
    try {
      const r = await api('POST', '/push', payload);
      t.msgs.splice(t.msgs.indexOf(tmp), 1);
      addMessages([r.message]);
      for (const f of [...t.fns]) f();
    } catch (e) {
      t.msgs.splice(t.msgs.indexOf(tmp), 1);
      for (const f of [...t.fns]) f();
      if (!ta.value) ta.value = text;
      for (const a of atts) uploads.push({ file: { name: a.name, size: a.size }, status: 'ok', att: a });
      drawChips();
      toast('Not sent: ' + e.message, 'error');
    }
  }

  const form = h(
    'form',
    {
      class: 'composer',
      onSubmit: submit,
      onDragover: (ev) => ev.preventDefault(),
      onDrop: (ev) => {
        ev.preventDefault();
        if (ev.dataTransfer && ev.dataTransfer.files.length) addFiles([...ev.dataTransfer.files]);
      },
    },
    sugg,
    chips,
    h(
      'div',
      { class: 'row' },
      h('button', { type: 'button', class: 'icon', 'aria-label': 'Attach files', title: 'Attach files', onClick: () => fileIn.click() }, 'Attach'),
      fileIn,
      ta,
      level,
      send,
    ),
  );
  sync();
  requestAnimationFrame(grow);
  return form;
}

// ---------------------------------------------------------------- screens

export const plural = (n, w) => n + ' ' + w + (n === 1 ? '' : 's');

function roleTitle(name) {
  const t = state.teammates.find((x) => x.name === name);
  return t && t.role ? t.role.title : '';
}

export function permSummary(perms) {
  if (!perms || !perms.length) return 'none';
  const presets = (state.briefing && state.briefing.team && state.briefing.team.permissionPresets) || {};
  for (const [name, leaves] of Object.entries(presets)) {
    if (leaves.length === perms.length && leaves.every((l) => perms.includes(l))) return name;
  }
  return 'custom (' + perms.length + ')';
}

route('/', ({ el }) => {
  const me = identity().member;
  const draw = () => {
    const b = state.briefing;
    const team = b && b.team;
    const online = state.teammates.filter((t) => isOnline(t.name)).length;
    const active = state.objectives.filter((o) => o.status === 'active').length;
    const blocked = state.objectives.filter((o) => o.status === 'blocked').length;
    mount(
      el,
      h(
        'section',
        { class: 'page home' },
        h('h1', null, team ? team.name : 'Team'),
        team ? h('p', { class: 'directive' }, team.directive) : null,
        team && team.context ? h('p', { class: 'muted' }, team.context) : null,
        h(
          'div',
          { class: 'cards' },
          card('Members', state.teammates.length, '/members'),
          card('Online', online, null),
          card('Active objectives', active, '/objectives'),
          card('Blocked', blocked, '/objectives?status=blocked'),
        ),
        h('h2', null, 'Roster'),
        h(
          'ul',
          { class: 'roster' },
          state.teammates.map((t) =>
            h(
              'li',
              null,
              presenceDot(t.name),
              h('a', { href: '/@' + t.name, class: 'name' }, t.name),
              t.name === me ? h('span', { class: 'muted' }, ' (you)') : null,
              h('span', { class: 'role' }, t.role ? t.role.title : ''),
              h('span', { class: 'muted perm' }, permSummary(t.permissions)),
              h('span', { class: 'state' }, isBusy(t.name) ? 'WORKING' : isOnline(t.name) ? 'ONLINE' : 'OFFLINE'),
            ),
          ),
        ),
      ),
    );
  };
  draw();
  return onChange(draw);
});

function card(label, n, href) {
  const inner = [h('strong', null, String(n)), h('span', null, label)];
  return href ? h('a', { class: 'card', href }, inner) : h('div', { class: 'card' }, inner);
}

route('/inbox', ({ el }) => {
  const draw = () => {
    const items = inboxItems();
    mount(
      el,
      h(
        'section',
        { class: 'page inbox' },
        h('h1', null, 'Inbox'),
        items.length
          ? h(
              'ul',
              { class: 'items' },
              items.map((i) =>
                h(
                  'li',
                  null,
                  h(
                    'a',
                    { href: i.href },
                    h('span', { class: 'title' }, i.title),
                    badge(i.n || 0),
                    h('span', { class: 'muted' }, i.text),
                    h('time', null, fmtTime(i.ts)),
                  ),
                ),
              ),
            )
          : h('p', { class: 'muted' }, 'Nothing needs you right now.'),
      ),
    );
  };
  draw();
  return onChange(draw);
});

route('/channels', ({ el }) => {
  const draw = () =>
    mount(
      el,
      h(
        'section',
        { class: 'page' },
        h('h1', null, 'Channels'),
        h(
          'p',
          null,
          h('a', { href: '/channels/new', class: 'button' }, '+ New channel'),
          ' ',
          h('button', { onClick: () => loadChannels().catch((e) => toast(e.message, 'error')) }, 'Refresh'),
        ),
        h(
          'ul',
          { class: 'items' },
          state.channels.map((c) =>
            h(
              'li',
              null,
              h('a', { href: '/c/' + c.slug }, '#' + c.slug),
              h('span', { class: 'muted' }, c.id === 'general' ? ' everyone' : ' ' + plural(c.memberCount, 'member')),
              c.joined
                ? null
                : h(
                    'button',
                    {
                      onClick: async () => {
                        try {
                          await api('POST', '/channels/' + c.slug + '/members', {});
                          await loadChannels();
                          navigate('/c/' + c.slug);
                        } catch (e) {
                          toast(e.message, 'error');
                        }
                      },
                    },
                    'Join',
                  ),
            ),
          ),
        ),
      ),
    );
  draw();
  loadChannels().catch(() => {});
  return onChange(draw);
});

export function normSlug(s) {
  return s
    .toLowerCase()
    .replace(/\s+/g, '-')
    .replace(/[^a-z0-9-]/g, '')
    .replace(/--+/g, '-')
    .slice(0, 32);
}

route('/channels/new', ({ el }) => {
  const input = h('input', { name: 'slug', required: true, maxlength: 32, autocomplete: 'off', 'aria-label': 'Channel name' });
  const err = h('p', { class: 'error', role: 'alert' });
  input.addEventListener('input', () => {
    const v = normSlug(input.value);
    if (v !== input.value) input.value = v;
  });
  mount(
    el,
    h(
      'section',
      { class: 'page' },
      h('h1', null, 'New channel'),
      h(
        'form',
        {
          class: 'stack',
          onSubmit: async (ev) => {
            ev.preventDefault();
            const slug = input.value.replace(/^-+|-+$/g, '');
            try {
              await api('POST', '/channels', { slug });
              await loadChannels();
              navigate('/c/' + slug);
            } catch (e) {
              err.textContent = e.message;
            }
          },
        },
        h('label', null, 'Name (lowercase letters, digits, dashes)', input),
        err,
        h('button', { class: 'primary' }, 'Create'),
      ),
    ),
  );
  input.focus();
});

route('/c/:slug', async ({ el, params }) => {
  const slug = params.slug;
  let c = state.channels.find((x) => x.slug === slug);
  if (!c) {
    await loadChannels();
    c = state.channels.find((x) => x.slug === slug);
  }
  if (!c) {
    mount(el, h('section', { class: 'page' }, h('h1', null, '#' + slug), h('p', null, 'No such channel. ', h('a', { href: '/channels' }, 'Browse channels'))));
    return;
  }
  const general = c.id === 'general';
  if (!c.joined) {
    mount(
      el,
      h(
        'section',
        { class: 'page' },
        h('h1', null, '#' + slug),
        h('p', null, "You aren't a member of this channel."),
        h(
          'button',
          {
            class: 'primary',
            onClick: async () => {
              try {
                await api('POST', '/channels/' + slug + '/members', {});
                await loadChannels();
                navigate('/c/' + slug, { replace: true });
              } catch (e) {
                toast(e.message, 'error');
              }
            },
          },
          'Join #' + slug,
        ),
      ),
    );
    return;
  }
  const key = general ? 'general' : 'chan:' + c.id;
  const settings = h('div', { class: 'settings', hidden: true });
  const header = h(
    'header',
    { class: 'thread-head' },
    h('h1', null, '#' + slug),
    h('span', { class: 'muted' }, general ? 'team channel · everyone' : plural(c.memberCount, 'member')),
    general
      ? null
      : h(
          'button',
          {
            class: 'icon',
            'aria-label': 'Channel members and settings',
            'aria-expanded': 'false',
            onClick: (ev) => {
              settings.hidden = !settings.hidden;
              ev.currentTarget.setAttribute('aria-expanded', String(!settings.hidden));
              if (!settings.hidden) channelSettings(settings, c);
            },
          },
          '⚙',
        ),
    settings,
  );
  return threadView(el, {
    key,
    header,
    historyQuery: { channel: general ? 'general' : c.id },
    push: (p) => {
      if (!general) p.data = { thread: 'chan:' + c.id };
    },
  });
});

async function channelSettings(box, c) {
  const me = identity().member;
  mount(box, h('p', { class: 'muted' }, 'Loading…'));
  let r;
  try {
    r = await api('GET', '/channels/' + c.slug);
  } catch (e) {
    mount(box, h('p', { class: 'error' }, e.message));
    return;
  }
  const admin = r.channel.myRole === 'admin';
  const members = r.members || [];
  const act = (fn) => async () => {
    try {
      await fn();
      await loadChannels();
      channelSettings(box, c);
    } catch (e) {
      toast(e.message, 'error');
    }
  };
  const others = state.teammates.map((t) => t.name).filter((n) => !members.some((m) => m.memberName === n));
  const addSel = h('select', { 'aria-label': 'Add a teammate' }, h('option', { value: '' }, 'add a teammate…'), others.map((n) => h('option', { value: n }, n)));
  addSel.addEventListener(
    'change',
    act(async () => {
      if (addSel.value) await api('POST', '/channels/' + c.slug + '/members', { member: addSel.value });
    }),
  );
  mount(
    box,
    h(
      'ul',
      { class: 'members' },
      members.map((m) =>
        h(
          'li',
          null,
          presenceDot(m.memberName),
          h('a', { href: '/@' + m.memberName }, m.memberName),
          h('span', { class: 'muted' }, ' ' + m.role),
          admin && m.memberName !== me
            ? h(
                'button',
                {
                  class: 'link',
                  onClick: act(async () => {
                    if (confirmAction('Remove ' + m.memberName + ' from #' + c.slug + '?'))
                      await api('DELETE', '/channels/' + c.slug + '/members/' + encodeURIComponent(m.memberName));
                  }),
                },
                'remove',
              )
            : null,
        ),
      ),
    ),
    admin && others.length ? addSel : null,
    h(
      'p',
      null,
      h(
        'button',
        {
          onClick: async () => {
            if (!confirmAction('Leave #' + c.slug + '?')) return;
            try {
              await api('DELETE', '/channels/' + c.slug + '/members/' + encodeURIComponent(me));
              await loadChannels();
              navigate('/channels');
            } catch (e) {
              toast(e.message, 'error');
            }
          },
        },
        'Leave',
      ),
      ' ',
      admin
        ? h(
            'button',
            {
              class: 'danger',
              onClick: async () => {
                if (!confirmAction('Archive #' + c.slug + '? Nobody can post in it afterwards.')) return;
                try {
                  await api('DELETE', '/channels/' + c.slug);
                  await loadChannels();
                  navigate('/channels');
                } catch (e) {
                  toast(e.message, 'error');
                }
              },
            },
            'Archive',
          )
        : null,
    ),
  );
}

route('/dm/:name', ({ el, params }) => {
  const name = params.name;
  const me = identity().member;
  const known = state.teammates.some((t) => t.name === name);
  const status = h('span', { class: 'muted' });
  const drawStatus = () => {
    status.replaceChildren(presenceDot(name), ' ' + (isBusy(name) ? 'working' : isOnline(name) ? 'online' : 'offline') + (roleTitle(name) ? ' · ' + roleTitle(name) : ''));
  };
  drawStatus();
  const off = onChange(drawStatus);
  const header = h(
    'header',
    { class: 'thread-head' },
    h('h1', null, name === me ? 'Notes to self' : 'DM with ', name === me ? null : h('a', { href: '/@' + name }, name)),
    status,
    can('activity.read') || name === me ? h('a', { href: '/@' + name + '/activity', class: 'muted' }, 'activity →') : null,
  );
  if (!known) {
    mount(el, h('section', { class: 'page' }, h('h1', null, '@' + name), h('p', null, 'No such member.')));
    off();
    return;
  }
  const done = threadView(el, {
    key: 'dm:' + name,
    header,
    historyQuery: { with: name },
    push: (p) => {
      p.to = name;
    },
  });
  return () => {
    off();
    done();
  };
});
