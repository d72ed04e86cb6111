// activity.js — what an agent did: a member's activity feed (`/@name/activity`,
// also `/members/name/activity`) with model, duration and token usage per LLM
// exchange, live over the activity SSE stream; and an objective's trace (the Trace
// tab of the objective page) from `GET /objectives/:id/activity` with usage totals.
// Everything is rendered as text: prompts and tool output never become HTML.

import { fmtTime, fmtTokens, h, mount, route, toast } from './core.js';
import { memberActivity, objectiveActivity } from './api.js';

const MAX_ROWS = 500;

function usageOf(row) {
  const e = row.event || {};
  const u = e.entry && e.entry.response && e.entry.response.usage;
  return {
    input: (u && u.inputTokens) || 0,
    output: (u && u.outputTokens) || 0,
    cacheRead: (u && u.cacheReadInputTokens) || 0,
    cacheWrite: (u && u.cacheCreationInputTokens) || 0,
  };
}

// Sums usage over the exchanges of a list of rows.
export function totals(rows) {
  const t = { exchanges: 0, input: 0, output: 0, cacheRead: 0, cacheWrite: 0, duration: 0 };
  for (const r of rows) {
    if (!r.event || r.event.kind !== 'llm_exchange') continue;
    const u = usageOf(r);
    t.exchanges++;
    t.input += u.input;
    t.output += u.output;
    t.cacheRead += u.cacheRead;
    t.cacheWrite += u.cacheWrite;
    t.duration += r.event.duration || 0;
  }
  return t;
}

function totalsLine(t) {
  return h(
    'p',
    { class: 'usage-totals' },
    t.exchanges + ' exchange' + (t.exchanges === 1 ? '' : 's'),
    ' · in ' + fmtTokens(t.input),
    ' · out ' + fmtTokens(t.output),
    t.cacheRead ? ' · cache read ' + fmtTokens(t.cacheRead) : '',
    t.cacheWrite ? ' · cache write ' + fmtTokens(t.cacheWrite) : '',
    ' · ' + (t.duration / 1000).toFixed(1) + ' s in the model',
  );
}

function blockText(b) {
  switch (b && b.type) {
    case 'text':
      return b.text;
    case 'thinking':
      return '(thinking) ' + b.text;
    case 'tool_use':
      return 'tool_use ' + b.name + ' ' + JSON.stringify(b.input);
    case 'tool_result':
      return 'tool_result' + (b.isError ? ' (error)' : '') + ' ' + (typeof b.content === 'string' ? b.content : JSON.stringify(b.content));
    case 'image':
      return '[image ' + (b.mediaType || '') + ']';
    default:
      return '[' + ((b && b.type) || 'unknown') + ' block]';
  }
}

function messagesNode(msgs) {
  return h(
    'ol',
    { class: 'llm-messages' },
    (msgs || []).map((m) => h('li', { class: 'role-' + m.role }, h('b', null, m.role + ': '), h('pre', null, (m.content || []).map(blockText).join('\n')))),
  );
}

// One activity row as a list item.
export function rowNode(r) {
  const e = r.event || {};
  const at = h('time', { datetime: new Date(e.ts || r.createdAt).toISOString() }, fmtTime(e.ts || r.createdAt));
  if (e.kind === 'llm_exchange') {
    const entry = e.entry || {};
    const req = entry.request || {};
    const res = entry.response || {};
    const u = usageOf(r);
    const status = res.status;
    const summary = h(
      'summary',
      null,
      at,
      ' ',
      h('span', { class: 'model' }, req.model || entry.api || 'model'),
      ' · ' + (e.duration || 0) + ' ms',
      h('span', { class: 'tokens' }, ' · in ' + fmtTokens(u.input) + ' out ' + fmtTokens(u.output) + (u.cacheRead ? ' cache ' + fmtTokens(u.cacheRead) : '')),
      res.stopReason ? ' · stop ' + res.stopReason : '',
      status && status !== 200 ? h('span', { class: 'bad' }, ' · status ' + status) : '',
    );
    const details = h('details', { class: 'exchange' }, summary);
    // The (possibly large) conversation is built only when opened.
    details.addEventListener(
      'toggle',
      () => {
        if (!details.open || details.dataset.built) return;
        details.dataset.built = '1';
        details.append(
          req.system ? h('pre', { class: 'system' }, typeof req.system === 'string' ? req.system : JSON.stringify(req.system)) : '',
          h('h4', null, 'Request'),
          messagesNode(req.messages),
          h('h4', null, 'Response'),
          messagesNode(res.messages),
        );
      },
    );
    return h('li', { class: 'act act-llm', 'data-id': r.id }, details);
  }
  if (e.kind === 'opaque_http') {
    const en = e.entry || {};
    return h('li', { class: 'act act-http muted', 'data-id': r.id }, at, ' ', (en.method || '') + ' ' + (en.host || '') + (en.url || '') + ' ' + (en.status ?? ''));
  }
  if (e.kind === 'objective_open' || e.kind === 'objective_close') {
    const open = e.kind === 'objective_open';
    return h(
      'li',
      { class: 'act act-marker', 'data-id': r.id },
      at,
      ' ',
      open ? '▼ ' : '▲ ',
      h('a', { href: '/objectives/' + encodeURIComponent(e.objectiveId) }, e.objectiveId),
      open ? ' opened' : ' closed (' + (e.result || '') + ')',
    );
  }
  return h('li', { class: 'act muted', 'data-id': r.id }, at, ' ' + (e.kind || 'event'));
}

// ---------------------------------------------------------------- member feed

function feed({ params, el }) {
  return activityFeed(el, params.name, false);
}

// A member's activity in a side panel (beside a DM with them): the same live feed.
export function activityPanel(el, name) {
  return activityFeed(el, name, true);
}

function activityFeed(el, name, panel) {
  const rows = new Map(); // id → row
  const list = h('ol', { class: 'activity-feed' });
  const sum = h('div');
  const dot = h('span', { class: 'dot', title: 'offline' });
  const older = h('button', { class: 'link older', onClick: loadOlder }, '↑ Load older');
  const draw = () => {
    const sorted = [...rows.values()].sort((a, b) => a.id - b.id);
    list.replaceChildren(...(sorted.length ? sorted.map(rowNode) : [h('li', { class: 'empty muted' }, 'No activity recorded for ' + name + ' yet.')]));
    mount(sum, totalsLine(totals(sorted)));
  };
  const add = (list) => {
    for (const r of list) rows.set(r.id, r);
    // Keep the newest MAX_ROWS.
    if (rows.size > MAX_ROWS) {
      const ids = [...rows.keys()].sort((a, b) => a - b);
      for (const id of ids.slice(0, rows.size - MAX_ROWS)) rows.delete(id);
    }
    draw();
  };
  async function loadOlder() {
    const oldest = Math.min(...rows.keys());
    if (!Number.isFinite(oldest)) return;
    try {
      const r = await memberActivity(name, { limit: 100, before_id: oldest });
      if ((r.activity || []).length < 100) older.hidden = true;
      add(r.activity || []);
    } catch (e) {
      toast(e.message, 'error');
    }
  }
  mount(
    el,
    h(
      'section',
      { class: 'page activity' },
      panel ? null : h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '/@' + name }, name), ' / activity'),
      h(panel ? 'h2' : 'h1', null, 'Activity of ' + name, ' ', dot),
      sum,
      older,
      list,
    ),
  );
  let es = null;
  let stopped = false;
  (async () => {
    try {
      const r = await memberActivity(name, { limit: 200 });
      add(r.activity || []);
    } catch (e) {
      mount(el, h('div', { class: 'error-box', role: 'alert' }, e.message));
      return;
    }
    if (stopped) return;
    // The live tail, from the newest row read (0: every row, when there was none), so a row
    // uploaded between the read and the stream's opening is replayed, not lost. On a drop
    // EventSource resumes from the last row id it got by itself (Last-Event-ID).
    const after = rows.size ? Math.max(...rows.keys()) : 0;
    const q = new URLSearchParams({ lastEventId: String(after) });
    es = new EventSource('/members/' + encodeURIComponent(name) + '/activity/stream?' + q.toString(), {
      withCredentials: true,
    });
    es.addEventListener('open', () => {
      dot.className = 'dot on';
      dot.title = 'live';
    });
    es.addEventListener('error', () => {
      dot.className = 'dot';
      dot.title = 'offline';
    });
    es.addEventListener('activity', (ev) => {
      try {
        add([JSON.parse(ev.data)]);
      } catch (e) {
        console.error(e);
      }
    });
    // An unknown resume id: re-read the newest page.
    es.addEventListener('reset', () => {
      memberActivity(name, { limit: 200 })
        .then((r) => add(r.activity || []))
        .catch(() => {});
    });
  })();
  return () => {
    stopped = true;
    if (es) es.close();
  };
}

route('/@:name/activity', feed);
route('/members/:name/activity', feed);

// ---------------------------------------------------------------- objective trace

// Renders objective `o`'s trace into `el`; returns a cleanup function.
export function objectiveTrace(el, o) {
  let alive = true;
  mount(el, h('p', { class: 'muted' }, 'Loading trace…'));
  objectiveActivity(o.id, { limit: 1000 })
    .then((r) => {
      if (!alive) return;
      const rows = (r.activity || []).slice().sort((a, b) => a.id - b.id);
      const intervals = r.intervals || [];
      mount(
        el,
        totalsLine(totals(rows)),
        intervals.length
          ? h(
              'ul',
              { class: 'intervals muted' },
              intervals.map((iv) =>
                h('li', null, h('a', { href: '/@' + iv.memberName + '/activity' }, iv.memberName), ' ' + fmtTime(iv.from) + ' → ' + (iv.to ? fmtTime(iv.to) : 'now')),
              ),
            )
          : null,
        rows.length
          ? h('ol', { class: 'activity-feed' }, rows.map(rowNode))
          : h('p', { class: 'empty muted' }, 'No LLM exchanges captured during this objective.'),
      );
    })
    .catch((e) => alive && mount(el, h('div', { class: 'error-box', role: 'alert' }, e.message)));
  return () => {
    alive = false;
  };
}
