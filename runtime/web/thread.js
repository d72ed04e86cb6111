// thread.js — one thread on screen: messages (inline formatting, attachments, objective
// lifecycle rows), the windowed transcript with older pages, and the composer (mentions,
// attachments, levels, one draft per thread). The chat screens and the objective
// discussion use it.

import { AUDIO_TYPES, VIDEO_TYPES, fmtBytes, fmtTime, fsUrl, h, identity, inlineNodes, live, mediaPlayer, mount, savedScroll, toast } from './core.js';
import { getHistory, pushMessage, writeFile } from './api.js';
import { addHistory, addMessages, leftScreen, markRead, setOnScreen, state, thread, threadTitle } from './store.js';

// ---------------------------------------------------------------- message rendering

// Body text with inline formatting (code, bold, italic, http(s) links); never parsed as HTML.
export function bodyNodes(text) {
  return inlineNodes(text);
}

// An objective's lifecycle event (data.kind 'objective'), shown as one compact row: who did
// what, then the details of the agent-facing text ("Label:   value" lines) run together.
function lifecycleRow(m) {
  const d = m.data || {};
  const lines = String(m.body || '').split('\n').slice(1);
  const details = lines
    .map((l) => l.trim().replace(/^([^:]{1,40}):\s+/, '$1: '))
    .filter(Boolean)
    .join(' · ');
  return h(
    'li',
    { class: 'msg lifecycle', 'data-id': m.id, 'data-event': d.event || '' },
    h('time', { datetime: new Date(m.ts).toISOString(), title: new Date(m.ts).toLocaleString() }, fmtTime(m.ts)),
    h('span', { class: 'event' }, '◆ ', h('strong', null, d.actor || m.from || 'ac7'), ' ', String(d.event || 'update').replace(/_/g, ' ')),
    details ? h('span', { class: 'details muted' }, ' — ', details) : null,
  );
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
  const mime = String(a.mimeType || '').toLowerCase();
  const media = AUDIO_TYPES.has(mime) ? 'audio' : VIDEO_TYPES.has(mime) ? 'video' : null;
  const chip = h(
    'a',
    { class: 'chip', href: url, download: a.name, 'data-external': '' },
    a.name + ' · ' + fmtBytes(a.size),
  );
  return media ? h('div', { class: 'att-media' }, mediaPlayer(media, a.path, a.name), chip) : chip;
}

export function messageRow(m, prev) {
  if (m.data && m.data.kind === 'objective') return lifecycleRow(m);
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

// Rows a thread view renders at first (and adds per "Load older").
const WINDOW = 150;

// A thread view: transcript (live, paged back with before_id) and, when allowed, a composer.
export function threadView(el, opts) {
  const { key, header, historyQuery, push } = opts;
  const t = thread(key);
  const list = h('ol', { class: 'transcript', 'aria-live': 'polite' });
  const older = h('button', { class: 'link older', onClick: loadOlder }, '↑ Load older messages');
  const jump = h('button', { class: 'jump', hidden: true, onClick: () => scrollEnd() }, 'Jump to latest ↓');
  const scroller = h('div', { class: 'scroller' }, older, list);
  // Back to this thread: where the user was (unless that was the bottom), kept while the
  // newest page loads.
  const back = savedScroll();
  let restoreTo = back && !back.end ? back.top : null;
  let stick = restoreTo === null;
  scroller.addEventListener('scroll', () => {
    if (restoreTo !== null) return;
    stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 64;
    if (stick) jump.hidden = true;
  });
  const scrollEnd = () => {
    scroller.scrollTop = scroller.scrollHeight;
    jump.hidden = true;
  };
  let shown = 0;
  // A long thread renders in a window of its newest rows; "Load older" widens the window
  // over what is in memory before it asks the broker for more.
  let windowSize = WINDOW;
  const draw = () => {
    const msgs = t.msgs;
    const rows = [];
    const from = Math.max(0, msgs.length - windowSize);
    for (let i = from; i < msgs.length; i++) rows.push(messageRow(msgs[i], i > from ? msgs[i - 1] : null));
    list.replaceChildren(...rows);
    if (!msgs.length) list.appendChild(h('li', { class: 'empty' }, 'No messages yet.'));
    older.hidden = t.complete && from === 0;
    const grew = msgs.length > shown;
    shown = msgs.length;
    if (stick) scrollEnd();
    else if (restoreTo !== null) {
      scroller.scrollTop = restoreTo;
      if (t.loaded || Math.abs(scroller.scrollTop - restoreTo) <= 1) restoreTo = null;
    } else if (grew) jump.hidden = false;
    if (document.visibilityState === 'visible') markRead(key);
  };
  async function loadOlder() {
    if (t.msgs.length > windowSize) {
      const keepBottom = scroller.scrollHeight - scroller.scrollTop;
      stick = false;
      windowSize += WINDOW;
      draw();
      scroller.scrollTop = scroller.scrollHeight - keepBottom;
      return;
    }
    const q = new URLSearchParams(historyQuery);
    q.set('limit', '50');
    if (t.msgs.length) q.set('before_id', t.msgs[0].id);
    older.disabled = true;
    try {
      const r = await getHistory(q);
      const got = r.messages || [];
      if (got.length < 50) t.complete = true;
      const keepBottom = scroller.scrollHeight - scroller.scrollTop;
      stick = false;
      windowSize = Math.max(windowSize, t.msgs.length) + got.length;
      addHistory(got);
      draw();
      scroller.scrollTop = scroller.scrollHeight - keepBottom;
    } catch (e) {
      toast(e.message, 'error');
    } finally {
      older.disabled = false;
    }
  }
  t.fns.add(draw);
  setOnScreen(key);
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
    getHistory(q)
      .then((r) => {
        t.loaded = true;
        const got = r.messages || [];
        if (got.length < 50) t.complete = true;
        addHistory(got);
        draw();
      })
      .catch((e) => e.status !== 401 && toast(e.message, 'error'));
  }
  return () => {
    t.fns.delete(draw);
    document.removeEventListener('visibilitychange', vis);
    leftScreen(key);
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
  const r = await writeFile(q, file);
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
    // A level is chosen per message: the next one starts at info again.
    const sentLevel = level.value;
    level.value = 'info';
    drawChips();
    grow();
    send.disabled = true;
    try {
      const r = await pushMessage(payload);
      t.msgs.splice(t.msgs.indexOf(tmp), 1);
      addMessages([r.message]);
      for (const f of [...t.fns]) f();
    } catch (e) {
      t.msgs.splice(t.msgs.indexOf(tmp), 1);
      for (const f of [...t.fns]) f();
      if (!ta.value) ta.value = text;
      level.value = sentLevel;
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
