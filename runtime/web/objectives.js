// objectives.js — the objectives screens: the list with filters (status, assignee),
// create, and the detail page (overview, actions, watchers, event log, discussion,
// trace). Every action re-reads the objective; live objective events refresh an open
// detail page and the list.

import { can, confirmAction, fmtBytes, fmtTime, h, identity, inlineNodes, live, mount, navigate, route, toast } from './core.js';
import { createObjective, discussObjective, getObjective, getObjectives, objectiveAction, updateObjective } from './api.js';
import { addMessages, loadObjectives, showingThread, state, thread } from './store.js';
import { messageRow, uploadFile } from './thread.js';
import { objectiveTrace } from './activity.js';

const STATUSES = ['active', 'blocked', 'done', 'cancelled'];

function statusBadge(s) {
  return h('span', { class: 'status status-' + s }, s);
}

function names() {
  return state.teammates.map((t) => t.name).sort();
}

function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', null, label), input, hint ? h('small', { class: 'muted' }, hint) : null);
}

function select(name, options, value, label) {
  return h(
    'select',
    { name, 'aria-label': label || null },
    options.map(([v, text]) => h('option', { value: v, selected: v === value }, text)),
  );
}

// ---------------------------------------------------------------- list

route('/objectives', async ({ el, query }) => {
  const me = identity().member;
  const status = query.get('status') || '';
  const assignee = query.get('assignee') || '';
  const q = new URLSearchParams();
  if (status) q.set('status', status);
  if (assignee) q.set('assignee', assignee);
  const r = await getObjectives(q);
  const list = r.objectives || [];
  const apply = (ev) => {
    const f = new FormData(ev.target.form);
    const nq = new URLSearchParams();
    for (const k of ['status', 'assignee']) if (f.get(k)) nq.set(k, f.get(k));
    navigate('/objectives' + (nq.toString() ? '?' + nq : ''), { replace: true });
  };
  // Without objectives.create the broker lists only your own (and refuses other assignees).
  const assignees = can('objectives.create')
    ? [['', 'anyone'], ...names().map((n) => [n, n === me ? n + ' (you)' : n])]
    : [['', 'anyone'], [me, me + ' (you)']];
  const filters = h(
    'form',
    { class: 'filters', onSubmit: (e) => e.preventDefault() },
    field('Status', select('status', [['', 'any'], ...STATUSES.map((s) => [s, s])], status)),
    field('Assignee', select('assignee', assignees, assignee)),
  );
  for (const s of filters.querySelectorAll('select')) s.addEventListener('change', apply);
  const rows = list.map((o) =>
    h(
      'li',
      { class: 'objective-row', 'data-id': o.id },
      statusBadge(o.status),
      h('a', { class: 'title', href: '/objectives/' + encodeURIComponent(o.id) }, o.title),
      h('span', { class: 'muted' }, o.assignee === me ? ' (you)' : ' → ' + o.assignee),
      h('div', { class: 'outcome muted' }, o.outcome),
      o.status === 'blocked' && o.blockReason ? h('div', { class: 'blocked' }, 'blocked: ' + o.blockReason) : null,
    ),
  );
  mount(
    el,
    h(
      'section',
      { class: 'page objectives' },
      h(
        'header',
        { class: 'page-head' },
        h('h1', null, 'Objectives'),
        h('span', { class: 'muted' }, list.length + ' on the board'),
        can('objectives.create') ? h('a', { class: 'button primary', href: '/objectives/new' }, '+ New') : null,
      ),
      filters,
      rows.length ? h('ul', { class: 'items objective-list' }, rows) : h('p', { class: 'empty muted' }, 'No objectives match.'),
    ),
  );
  return live('objective', () => navigate(location.pathname + location.search, { replace: true }));
});

// ---------------------------------------------------------------- create

route('/objectives/new', ({ el }) => {
  if (!can('objectives.create')) {
    mount(el, h('p', { class: 'error-box' }, 'Creating objectives needs the objectives.create permission.'));
    return;
  }
  const me = identity().member;
  const uploads = []; // {file, status: 'up'|'ok'|'err', att}
  const watchers = h(
    'fieldset',
    { class: 'checks' },
    h('legend', null, 'Watchers'),
    names().map((n) => h('label', null, h('input', { type: 'checkbox', name: 'watchers', value: n }), ' ' + n)),
  );
  const form = h(
    'form',
    { class: 'form objective-new' },
    field('Title', h('input', { name: 'title', required: true, maxlength: 200, autofocus: true })),
    field('Outcome', h('textarea', { name: 'outcome', required: true, maxlength: 2048, rows: 3 }), 'The contract: done when this holds.'),
    field('Body', h('textarea', { name: 'body', maxlength: 4096, rows: 5 })),
    field('Assignee', select('assignee', names().map((n) => [n, n === me ? n + ' (you)' : n]), names().find((n) => n !== me) || me)),
    watchers,
    attachField(me, uploads),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Create objective'), h('a', { class: 'button', href: '/objectives' }, 'Cancel')),
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = {
      title: f.get('title').trim(),
      outcome: f.get('outcome').trim(),
      assignee: f.get('assignee'),
      watchers: f.getAll('watchers').filter((w) => w !== f.get('assignee')),
    };
    if (f.get('body').trim()) body.body = f.get('body').trim();
    if (uploads.some((u) => u.status === 'up')) {
      toast('Wait for the files to finish uploading.', 'warn');
      return;
    }
    const atts = uploads.filter((u) => u.status === 'ok').map((u) => u.att);
    if (atts.length) body.attachments = atts;
    const btn = form.querySelector('button[type=submit]');
    btn.disabled = true;
    try {
      const o = await createObjective(body);
      loadObjectives().catch(() => {});
      navigate('/objectives/' + encodeURIComponent(o.id));
    } catch (e) {
      toast(e.message, 'error');
      btn.disabled = false;
    }
  });
  mount(el, h('section', { class: 'page' }, h('h1', null, 'New objective'), form));
});

// Files for a new objective: each uploads at once to the member's uploads folder (as the
// chat composer's do); the broker copies them into the objective's folder on create.
function attachField(me, uploads) {
  const chips = h('div', { class: 'chips' });
  const input = h('input', { type: 'file', name: 'files', multiple: true });
  const draw = () =>
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
                draw();
              },
            },
            '×',
          ),
        ),
      ),
    );
  input.addEventListener('change', () => {
    for (const file of input.files) {
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
        .finally(draw);
    }
    input.value = '';
    draw();
  });
  return h('div', { class: 'attach' }, field('Attachments', input), chips);
}

// ---------------------------------------------------------------- detail

function eventText(e) {
  const p = e.payload || {};
  switch (e.kind) {
    case 'assigned':
      return 'assigned to ' + p.assignee + (p.watchers && p.watchers.length ? ' · watchers ' + p.watchers.join(', ') : '');
    case 'blocked':
      return 'blocked: ' + (p.reason || '');
    case 'unblocked':
      return 'unblocked';
    case 'completed':
      return 'completed: ' + (p.result || '');
    case 'cancelled':
      return 'cancelled' + (p.reason ? ': ' + p.reason : '');
    case 'reassigned':
      return 'reassigned ' + p.from + ' → ' + p.to + (p.note ? ' (' + p.note + ')' : '');
    case 'watcher_added':
      return 'watcher added: ' + p.name;
    case 'watcher_removed':
      return 'watcher removed: ' + p.name;
    default:
      return e.kind;
  }
}

// A one-field form with a submit button (block, complete, cancel, reassign).
function actionForm(cls, input, label, submit) {
  const btn = h('button', { type: 'submit' }, label);
  const form = h('form', { class: 'inline-form ' + cls }, input, btn);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    btn.disabled = true;
    try {
      await submit(input.value.trim());
    } catch (e) {
      toast(e.message, 'error');
    } finally {
      btn.disabled = false;
    }
  });
  return form;
}

route('/objectives/:id', async ({ params, el, query }) => {
  const id = params.id;
  const me = identity().member;
  const tab = query.get('tab') === 'trace' ? 'trace' : 'overview';
  let stopTrace = null;
  let cleanups = [];

  async function draw() {
    for (const c of cleanups) c();
    cleanups = [];
    const { objective: o, events } = await getObjective(id);
    const terminal = o.status === 'done' || o.status === 'cancelled';
    const mayUpdate = o.assignee === me || can('objectives.cancel');
    const mayComplete = o.assignee === me;
    const mayCancel = o.originator === me || can('objectives.cancel');
    const mayReassign = can('objectives.reassign');
    const mayWatch = o.originator === me || can('objectives.watch');
    const inThread = [o.assignee, o.originator, ...o.watchers].includes(me) || can('members.manage');
    const act = (path, body) => async (value) => {
      await (path ? objectiveAction(id, path, body(value)) : updateObjective(id, body(value)));
      loadObjectives().catch(() => {});
      await draw();
    };

    const actions = [];
    if (!terminal && mayUpdate) {
      if (o.status === 'blocked') {
        actions.push(
          h('button', { class: 'unblock', onClick: () => act('', () => ({ status: 'active' }))().catch((e) => toast(e.message, 'error')) }, 'Unblock'),
        );
      } else {
        actions.push(
          actionForm('block', h('input', { name: 'reason', placeholder: 'Why is it blocked?', required: true, maxlength: 2048 }), 'Block', act('', (v) => ({ status: 'blocked', blockReason: v }))),
        );
      }
    }
    if (!terminal && mayComplete) {
      actions.push(
        actionForm('complete', h('textarea', { name: 'result', placeholder: 'Result: show that the outcome holds', required: true, maxlength: 4096, rows: 2 }), 'Mark complete', act('complete', (v) => ({ result: v }))),
      );
    }
    if (!terminal && mayReassign) {
      const to = select('to', names().filter((n) => n !== o.assignee).map((n) => [n, n]), '', 'Reassign to');
      actions.push(actionForm('reassign', to, 'Reassign', act('reassign', (v) => ({ to: v }))));
    }
    if (!terminal && mayCancel) {
      const cancel = act('cancel', (v) => (v ? { reason: v } : {}));
      actions.push(
        actionForm('cancel', h('input', { name: 'reason', placeholder: 'Reason (optional)', maxlength: 2048 }), 'Cancel objective', (v) =>
          confirmAction('Cancel this objective?') ? cancel(v) : Promise.resolve(),
        ),
      );
    }

    const watcherItems = o.watchers.map((w) =>
      h(
        'li',
        { class: 'chip' },
        h('a', { href: '/@' + w }, w),
        mayWatch
          ? h('button', { class: 'link', 'aria-label': 'remove watcher ' + w, onClick: () => act('watchers', () => ({ remove: [w] }))().catch((e) => toast(e.message, 'error')) }, '×')
          : null,
      ),
    );
    const addable = names().filter((n) => n !== o.assignee && n !== o.originator && !o.watchers.includes(n));
    const addWatcher =
      mayWatch && addable.length
        ? actionForm('add-watcher', select('name', addable.map((n) => [n, n]), '', 'Watcher to add'), 'Add watcher', act('watchers', (v) => ({ add: [v] })))
        : null;

    const tabs = h(
      'nav',
      { class: 'tabs', 'aria-label': 'Objective views' },
      h('a', { href: '/objectives/' + encodeURIComponent(id), class: tab === 'overview' ? 'active' : '' }, 'Overview'),
      h('a', { href: '/objectives/' + encodeURIComponent(id) + '?tab=trace', class: tab === 'trace' ? 'active' : '' }, 'Trace'),
    );

    const overview = [
      o.body ? h('div', { class: 'body pre' }, inlineNodes(o.body)) : null,
      h('h2', null, 'Outcome'),
      h('p', { class: 'outcome' }, o.outcome),
      o.status === 'blocked' && o.blockReason ? h('div', { class: 'callout warn' }, 'Blocked: ' + o.blockReason) : null,
      o.result ? h('div', { class: 'callout ok result' }, 'Result: ' + o.result) : null,
      o.attachments && o.attachments.length
        ? h('ul', { class: 'items' }, o.attachments.map((a) => h('li', null, h('a', { href: '/files' + a.path }, a.name))))
        : null,
      h('h2', null, 'Watchers'),
      h('ul', { class: 'chips watchers' }, watcherItems.length ? watcherItems : h('li', { class: 'muted' }, 'none')),
      addWatcher,
      actions.length ? h('h2', null, 'Actions') : null,
      actions.length ? h('div', { class: 'objective-actions' }, actions) : null,
      h('h2', null, 'Discussion'),
      discussion(o, terminal, inThread),
      h('h2', null, 'Event log'),
      h(
        'ol',
        { class: 'events' },
        events.map((e) => h('li', null, h('time', null, fmtTime(e.ts)), ' ', h('b', null, e.actor), ' ', eventText(e))),
      ),
    ];
    const traceEl = h('div', { class: 'trace' });
    mount(
      el,
      h(
        'section',
        { class: 'page objective-detail', 'data-status': o.status },
        h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '/objectives' }, 'Objectives'), ' / ', o.id),
        h('h1', null, o.title, ' ', statusBadge(o.status)),
        h(
          'p',
          { class: 'muted' },
          'assignee ',
          h('a', { href: '/@' + o.assignee }, o.assignee),
          ' · from ',
          h('a', { href: '/@' + o.originator }, o.originator),
          ' · created ' + fmtTime(o.createdAt),
          o.completedAt ? ' · completed ' + fmtTime(o.completedAt) : '',
        ),
        tabs,
        tab === 'trace' ? traceEl : overview,
      ),
    );
    if (tab === 'trace') {
      if (stopTrace) stopTrace();
      stopTrace = objectiveTrace(traceEl, o);
    }
  }

  function discussion(o, terminal, inThread) {
    const key = 'obj:' + o.id;
    const t = thread(key);
    const list = h('ol', { class: 'transcript discussion' });
    const redraw = () => {
      const rows = t.msgs.map((m, i) => messageRow(m, t.msgs[i - 1]));
      list.replaceChildren(...(rows.length ? rows : [h('li', { class: 'empty muted' }, 'No discussion yet.')]));
    };
    t.fns.add(redraw);
    cleanups.push(() => t.fns.delete(redraw));
    redraw();
    if (terminal) return h('div', null, list, h('p', { class: 'muted' }, '◇ Discussion closed'));
    if (!inThread) return list;
    const ta = h('textarea', { name: 'body', rows: 2, maxlength: 16384, placeholder: 'Discuss this objective (Enter sends, Shift+Enter newline)' });
    const form = h('form', { class: 'composer discuss' }, ta, h('button', { type: 'submit', class: 'primary' }, 'Send'));
    const send = async () => {
      const body = ta.value.trim();
      if (!body) return;
      try {
        const m = await discussObjective(o.id, body);
        ta.value = '';
        addMessages([m]);
      } catch (e) {
        toast(e.message, 'error');
      }
    };
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      send();
    });
    ta.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey) {
        ev.preventDefault();
        send();
      }
    });
    return h('div', null, list, form);
  }

  const redrawSoon = () => draw().catch((e) => toast(e.message, 'error'));
  await draw();
  // The discussion is on screen: it counts as read, and its messages raise no toast.
  const unshow = showingThread('obj:' + id);
  const off = live('objective', (m) => {
    if (m.data && m.data.objective_id === id) redrawSoon();
  });
  return () => {
    off();
    unshow();
    for (const c of cleanups) c();
    if (stopTrace) stopTrace();
  };
});
