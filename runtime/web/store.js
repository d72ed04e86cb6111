// store.js — the team's shared state in this tab: briefing, roster and presence, channels,
// the viewer's objectives, message threads and read marks (per member, in localStorage);
// loading it, keeping it in sync with the live stream and polls, and the names, titles and
// links of threads. Views read it and subscribe with onChange().

import { h, identity, live, toast } from './core.js';
import { getArchivedChannels, getBriefing, getChannels, getHistory, getObjectives, getRoster } from './api.js';

// ---------------------------------------------------------------- shared state

export const state = {
  briefing: null,
  teammates: [], // Teammate[]
  presence: new Map(), // name → Presence
  channels: [], // ChannelSummary[]
  archived: [], // archived channels ({id, slug, archivedAt}), most recently archived first
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

// Where a message of time `ts` goes in a thread's list (oldest first): after the messages of
// the same millisecond, or before them (`tiesFirst`).
function place(msgs, ts, tiesFirst) {
  let lo = 0;
  let hi = msgs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (msgs[mid].ts < ts || (!tiesFirst && msgs[mid].ts === ts)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Adds a page of /history (newest first, as it answers without `after`). A thread holds its
// newest messages, so whatever in the page is new here was logged before all of them: each
// goes before the messages of its millisecond already held, and the page keeps its own order.
// (Messages of one millisecond thus keep their log order across pages and "Load older".)
export function addHistory(page) {
  return addMessages(page || [], true);
}

// Adds messages logged after what their threads hold (live ones, a send's answer), oldest
// first; returns those that were new.
export function addMessages(list, older = false) {
  const fresh = [];
  for (const m of list) {
    if (!m || !m.id) continue;
    const t = thread(threadKey(m));
    if (t.ids.has(m.id)) continue;
    t.ids.add(m.id);
    fresh.push(m);
    const msgs = t.msgs;
    if (!older && (!msgs.length || msgs[msgs.length - 1].ts <= m.ts)) msgs.push(m);
    else msgs.splice(place(msgs, m.ts, older), 0, m);
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
  const r = await getRoster();
  state.teammates = r.teammates || [];
  state.presence = new Map((r.connected || []).map((p) => [p.name, p]));
  changed();
}

export async function loadChannels() {
  const [r, a] = await Promise.all([getChannels(), getArchivedChannels().catch(() => null)]);
  state.channels = r.channels || [];
  if (a) state.archived = (a.channels || []).map((c) => ({ id: c.id, slug: c.slug, archivedAt: c.archivedAt }));
  changed();
}

// ---- archived channels: listed by the broker apart from the active ones; one archived here
// joins the list at once, before the next read.

export function rememberArchived(c) {
  if (!c || !c.id || !c.archivedAt) return;
  if (state.archived.some((x) => x.id === c.id && x.slug === c.slug)) return;
  const entry = { id: c.id, slug: c.slug, archivedAt: c.archivedAt };
  state.archived = [entry, ...state.archived.filter((x) => x.id !== c.id)].sort((a, b) => b.archivedAt - a.archivedAt);
  changed();
}

export async function loadObjectives() {
  const r = await getObjectives();
  state.objectives = r.objectives || [];
  changed();
}

// Boot: everything the chrome needs. Failures other than 401 leave that panel empty.
export async function loadAll() {
  loadReads();
  threads.clear();
  const results = await Promise.allSettled([
    getBriefing().then((b) => {
      state.briefing = b;
    }),
    loadRoster(),
    loadChannels(),
    loadObjectives(),
    getHistory({ limit: 200 }).then((r) => addHistory(r.messages)),
  ]);
  if (results.some((r) => r.status === 'rejected' && r.reason.status !== 401)) {
    toast('Some panels failed to load; reload to retry.', 'warn');
  }
}

let liveOff = [];
let pollTimer = null;
let firstOpen = true;

// A function that runs `load` 50 ms after its first call, once however many calls a burst
// makes (a burst of notices reads once).
function coalesced(load) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      load().catch(() => {});
    }, 50);
  };
}

// Live wiring: messages into threads, objective events refresh the list, presence and the
// channel list re-read when the broker says they changed (and every 10 s).
export function startSync() {
  stopSync();
  firstOpen = true;
  liveOff.push(
    live('*', (m) => {
      const k = threadKey(m);
      // A channel we have not listed yet: someone added us, or created it just now.
      if (k.startsWith('chan:') && !channelById(k.slice(5))) loadChannels().catch(() => {});
      const fresh = addMessages([m]);
      if (fresh.length) notify(m);
    }),
    live('objective', () => loadObjectives().catch(() => {})),
    // Presence or the channel list changed on the broker: re-read it at once.
    live('presence', coalesced(loadRoster)),
    live('channels', coalesced(loadChannels)),
    // Every (re)connection: presence at once; after a drop, whatever may have changed or
    // failed to load while the broker was unreachable.
    live('open', () => {
      loadRoster().catch(() => {});
      if (!firstOpen) {
        loadChannels().catch(() => {});
        loadObjectives().catch(() => {});
        if (!state.briefing) getBriefing().then((b) => ((state.briefing = b), changed())).catch(() => {});
      }
      firstOpen = false;
    }),
    live('reset', async () => {
      const r = await getHistory({ limit: 200 });
      addHistory(r.messages);
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

// The thread view (thread.js) says which thread is on screen, and when it leaves.
export function setOnScreen(key) {
  onScreen = key;
}

export function leftScreen(key) {
  if (onScreen === key) onScreen = null;
}

// A view that shows thread `key` outside threadView (the objective detail's discussion):
// it counts as on screen (no toast) and is marked read whenever it changes while visible.
// Returns the function that stops it.
export function showingThread(key) {
  const t = thread(key);
  const mark = () => document.visibilityState === 'visible' && markRead(key);
  onScreen = key;
  t.fns.add(mark);
  document.addEventListener('visibilitychange', mark);
  mark();
  return () => {
    t.fns.delete(mark);
    document.removeEventListener('visibilitychange', mark);
    if (onScreen === key) onScreen = null;
  };
}

function notify(m) {
  const key = threadKey(m);
  if (m.from === identity().member || key === onScreen || key.startsWith('obj:')) return;
  if (document.visibilityState !== 'visible') return;
  const where = key === 'general' ? ' · #general' : key.startsWith('dm:') ? ' · DM' : '';
  toast((m.from || 'ac7') + where + ': ' + m.body.slice(0, 140), 'info', { label: 'View', href: threadHref(key) });
}

// ---- names and titles

export function channelById(id) {
  return state.channels.find((c) => c.id === id);
}

// An active channel, or one known to be archived.
function anyChannel(id) {
  return channelById(id) || state.archived.find((c) => c.id === id);
}

export function threadTitle(key) {
  if (key === 'general') return '#general';
  if (key.startsWith('dm:')) return '@' + key.slice(3);
  if (key.startsWith('chan:')) {
    const c = anyChannel(key.slice(5));
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
    const c = anyChannel(key.slice(5));
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
    role: 'img',
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
