// members.js — members list and admin (create, permissions, tokens, TOTP, delete),
// profiles, the viewer's account page, pending device enrollments and the
// /enroll?code= approval page.

import { can, confirmAction, fmtTime, h, identity, mount, navigate, route, setTheme, theme, toast } from './core.js';
import { approveEnrollment, confirmTotp, createMember, deleteMember, enrollTotp, getMembers, getPresets, getTokens, pendingEnrollments, rejectEnrollment, revokeToken, rotateToken, updateMember } from './api.js';
import { notificationsSwitch } from './push.js';
import { isBusy, isOnline, loadRoster, onChange, presenceDot, state } from './store.js';
import { permSummary } from './chat.js';
import { confirmCode, totpReveal } from './signin.js';

// The seven leaf permissions, in canonical order.
export const LEAVES = [
  ['team.manage', 'Edit the team and its permission presets'],
  ['members.manage', 'Create, edit and delete members; tokens; approve devices; every file'],
  ['objectives.create', 'Create objectives; see every objective'],
  ['objectives.cancel', 'Cancel or update any objective'],
  ['objectives.reassign', 'Reassign any objective'],
  ['objectives.watch', 'Change the watchers of any objective'],
  ['activity.read', "Read any member's activity and traces"],
];

async function presets() {
  try {
    return (await getPresets()).presets || {};
  } catch {
    return {};
  }
}

// Preset buttons (replace the set) and one checkbox per leaf. onChange(perms[]).
function permissionsEditor(initial, presetMap, onChange) {
  let perms = [...initial];
  const boxes = new Map();
  const set = (next, fire) => {
    perms = LEAVES.map(([l]) => l).filter((l) => next.includes(l));
    for (const [l, b] of boxes) b.checked = perms.includes(l);
    if (fire) onChange(perms);
  };
  const list = h(
    'ul',
    { class: 'perms' },
    LEAVES.map(([leaf, desc]) => {
      const b = h('input', { type: 'checkbox', checked: perms.includes(leaf) });
      boxes.set(leaf, b);
      b.addEventListener('change', () => set(b.checked ? [...perms, leaf] : perms.filter((p) => p !== leaf), true));
      return h('li', null, h('label', null, b, h('code', null, leaf), ' ', h('span', { class: 'muted' }, desc)));
    }),
  );
  const buttons = Object.entries(presetMap).map(([name, leaves]) =>
    h('button', { type: 'button', onClick: () => set(leaves, true) }, name),
  );
  const el = h(
    'fieldset',
    { class: 'perm-editor' },
    h('legend', null, 'Permissions'),
    buttons.length ? h('div', { class: 'presets' }, 'Presets: ', buttons, h('button', { type: 'button', onClick: () => set([], true) }, 'none')) : null,
    list,
  );
  return { el, get: () => perms };
}

// A secret shown once: masked until Show, Copy, and a Dismiss that hides it for good.
export function secretBanner(title, secret, note) {
  const code = h('code', { class: 'secret masked' }, secret);
  const box = h(
    'div',
    { class: 'reveal', role: 'alert' },
    h('strong', null, title),
    h('p', null, note || 'Copy it now: it is shown only once. Dismissing this banner hides it forever.'),
    code,
    h(
      'div',
      { class: 'row' },
      h(
        'button',
        {
          type: 'button',
          onClick: (ev) => {
            code.classList.toggle('masked');
            ev.currentTarget.textContent = code.classList.contains('masked') ? 'Show' : 'Hide';
          },
        },
        'Show',
      ),
      h(
        'button',
        {
          type: 'button',
          onClick: () =>
            navigator.clipboard.writeText(secret).then(
              () => toast('Copied', 'success'),
              () => toast('Copy failed; select the text instead', 'warn'),
            ),
        },
        'Copy',
      ),
      h('button', { type: 'button', onClick: () => box.remove() }, 'Dismiss'),
    ),
  );
  return box;
}

// ---------------------------------------------------------------- /members

route('/members', ({ el }) => {
  const admin = can('members.manage');
  const reveal = h('div');
  const pending = h('div');
  const list = h('div');
  const form = h('div', { hidden: true });
  let timer = null;

  let members = state.teammates;
  const drawList = async () => {
    try {
      members = (await getMembers()).members || [];
    } catch (e) {
      toast(e.message, 'error');
    }
    drawRows();
  };
  // Presence comes from the shared roster: redrawn on every change of it.
  const drawRows = () => {
    mount(
      list,
      h(
        'table',
        { class: 'members' },
        h('thead', null, h('tr', null, h('th', null, h('span', { class: 'sr-only' }, 'Presence')), h('th', null, 'Name'), h('th', null, 'Role'), h('th', null, 'Permissions'), h('th', null, 'State'))),
        h(
          'tbody',
          null,
          members.map((m) =>
            h(
              'tr',
              null,
              h('td', null, presenceDot(m.name)),
              h('td', null, h('a', { href: '/@' + m.name }, m.name)),
              h('td', null, m.role ? m.role.title : ''),
              h('td', null, permSummary(m.permissions)),
              h('td', null, isBusy(m.name) ? 'working' : isOnline(m.name) ? 'online' : 'offline'),
            ),
          ),
        ),
      ),
    );
  };

  const drawPending = async () => {
    let rows;
    try {
      rows = (await pendingEnrollments()).enrollments || [];
    } catch {
      return;
    }
    if (!rows.length) {
      pending.replaceChildren();
      return;
    }
    mount(
      pending,
      h('h2', null, 'Pending device enrollments'),
      h(
        'ul',
        { class: 'items pending' },
        rows.map((r) =>
          h(
            'li',
            null,
            h('code', null, r.userCode),
            h('span', null, ' ' + (r.labelHint || 'device')),
            h('span', { class: 'muted' }, ' · ' + (r.sourceIp || 'unknown address') + ' · expires ' + fmtTime(r.expiresAt)),
            ' ',
            h('a', { class: 'button', href: '/enroll?code=' + encodeURIComponent(r.userCode) }, 'Approve…'),
            ' ',
            h(
              'button',
              {
                class: 'danger',
                onClick: async () => {
                  if (!confirmAction('Reject device ' + r.userCode + '?')) return;
                  try {
                    await rejectEnrollment(r.userCode, 'rejected from the members page');
                    drawPending();
                  } catch (e) {
                    toast(e.message, 'error');
                  }
                },
              },
              'Reject',
            ),
          ),
        ),
      ),
    );
  };

  const openForm = async () => {
    form.hidden = false;
    const name = h('input', { required: true, pattern: '[A-Za-z0-9._\\-]+', maxlength: 128, 'aria-label': 'Name' });
    const title = h('input', { required: true, value: 'engineer', maxlength: 64, 'aria-label': 'Role title' });
    const desc = h('input', { maxlength: 512, 'aria-label': 'Role description' });
    const instr = h('textarea', { rows: 3, maxlength: 8192, 'aria-label': 'Instructions' });
    const perms = permissionsEditor([], await presets(), () => {});
    const err = h('p', { class: 'error', role: 'alert' });
    mount(
      form,
      h(
        'form',
        {
          class: 'stack card',
          onSubmit: async (ev) => {
            ev.preventDefault();
            err.textContent = '';
            try {
              const r = await createMember({
                name: name.value.trim(),
                role: { title: title.value.trim(), description: desc.value },
                instructions: instr.value,
                permissions: perms.get(),
              });
              reveal.prepend(secretBanner('Token for ' + r.member.name, r.token, 'Give this token to the member (AC7_TOKEN). It is shown only once; dismissing this banner hides it forever.'));
              form.hidden = true;
              await loadRoster();
              drawList();
            } catch (e) {
              err.textContent = e.message;
            }
          },
        },
        h('h2', null, 'New member'),
        h('label', null, 'Name', name),
        h('label', null, 'Role title', title),
        h('label', null, 'Role description', desc),
        h('label', null, 'Instructions', instr),
        perms.el,
        err,
        h('div', { class: 'row' }, h('button', { class: 'primary' }, 'Create'), h('button', { type: 'button', onClick: () => (form.hidden = true) }, 'Cancel')),
      ),
    );
    name.focus();
  };

  mount(
    el,
    h(
      'section',
      { class: 'page' },
      h('h1', null, 'Members'),
      reveal,
      admin ? pending : null,
      admin ? h('p', null, h('button', { class: 'primary', onClick: openForm }, '+ New member')) : null,
      form,
      list,
    ),
  );
  drawList();
  const off = onChange(drawRows);
  if (admin) {
    drawPending();
    timer = setInterval(drawPending, 5000);
  }
  return () => {
    off();
    clearInterval(timer);
  };
});

// ---------------------------------------------------------------- profile

route('/@:name', async ({ el, params }) => {
  const name = params.name;
  const me = identity().member;
  const admin = can('members.manage');
  let m = state.teammates.find((t) => t.name === name);
  if (admin) {
    try {
      m = ((await getMembers()).members || []).find((x) => x.name === name) || m;
    } catch {
      /* the roster copy will do */
    }
  }
  if (!m) {
    mount(el, h('section', { class: 'page' }, h('h1', null, '@' + name), h('p', null, 'No such member.')));
    return;
  }
  const reveal = h('div');
  const status = h('span');
  const drawStatus = () => status.replaceChildren(presenceDot(name), ' ' + (isBusy(name) ? 'working' : isOnline(name) ? 'online' : 'offline'));
  drawStatus();
  const mine = state.objectives.filter((o) => o.assignee === name && (o.status === 'active' || o.status === 'blocked'));
  mount(
    el,
    h(
      'section',
      { class: 'page profile' },
      h('h1', null, name, name === me ? h('span', { class: 'muted' }, ' (you)') : null),
      h('p', null, status, ' · ', h('strong', null, m.role ? m.role.title : ''), m.role && m.role.description ? ' — ' + m.role.description : ''),
      h(
        'p',
        { class: 'row' },
        h('a', { class: 'button', href: '/dm/' + encodeURIComponent(name) }, '→ DM'),
        h('a', { class: 'button', href: '/files/' + encodeURIComponent(name) }, '→ Files'),
        can('activity.read') || name === me ? h('a', { class: 'button', href: '/@' + name + '/activity' }, '→ Activity') : null,
      ),
      h('p', null, 'Permissions: ', permSummary(m.permissions), m.permissions.length ? h('span', { class: 'muted' }, ' (' + m.permissions.join(', ') + ')') : null),
      mine.length
        ? h(
            'div',
            null,
            h('h2', null, 'Open objectives'),
            h('ul', { class: 'items' }, mine.map((o) => h('li', null, h('a', { href: '/objectives/' + encodeURIComponent(o.id) }, o.title), h('span', { class: 'muted' }, ' ' + o.status)))),
          )
        : null,
      reveal,
      admin ? await manage(m, reveal) : name === me ? selfTools(reveal) : null,
    ),
  );
  return onChange(drawStatus);
});

// Rotate own token and re-enroll TOTP (also on /account).
function selfTools(reveal) {
  const me = identity().member;
  return h('div', { class: 'stack' }, h('h2', null, 'Credentials'), h('div', { class: 'row' }, rotateButton(me, reveal), totpButton(me, reveal)));
}

function rotateButton(name, reveal, after) {
  return h(
    'button',
    {
      onClick: async () => {
        if (!confirmAction('Rotate all tokens of ' + name + '? Every agent and device using them stops working until given the new one.')) return;
        try {
          const r = await rotateToken(name);
          reveal.prepend(secretBanner('New token for ' + name, r.token));
          if (after) after();
        } catch (e) {
          toast(e.message, 'error');
        }
      },
    },
    'Rotate token',
  );
}

function totpButton(name, reveal) {
  return h(
    'button',
    {
      onClick: async () => {
        let r;
        try {
          r = await enrollTotp(name);
        } catch (e) {
          toast(e.message, 'error');
          return;
        }
        // The new secret stays pending (the old one keeps working) until a code confirms it.
        const box = h(
          'div',
          { class: 'card stack enroll-totp' },
          h('h3', null, 'New authenticator for ' + name),
          totpReveal(r),
          confirmCode(
            'Type the code the app shows now to switch to the new secret',
            (code) => confirmTotp(name, code),
            () => {
              box.replaceChildren(h('p', { class: 'notice', role: 'status' }, 'Authenticator enrolled for ' + name + '. Sign in with it from now on.'));
            },
          ),
          h('button', { type: 'button', onClick: () => box.remove() }, 'Dismiss'),
        );
        reveal.prepend(box);
      },
    },
    'Enroll TOTP',
  );
}

async function manage(m, reveal) {
  const name = m.name;
  const saved = h('p', { class: 'muted', role: 'status' });
  const patch = async (body) => {
    try {
      await updateMember(name, body);
      saved.textContent = 'Saved. Restart any running agents for changes to take effect.';
      loadRoster().catch(() => {});
    } catch (e) {
      saved.textContent = '';
      toast(e.message, 'error');
    }
  };
  const title = h('input', { value: m.role ? m.role.title : '', maxlength: 64, 'aria-label': 'Role title' });
  const desc = h('input', { value: m.role ? m.role.description : '', maxlength: 512, 'aria-label': 'Role description' });
  const instr = h('textarea', { rows: 4, maxlength: 8192, 'aria-label': 'Instructions', value: m.instructions || '' });
  const perms = permissionsEditor(m.permissions, await presets(), (p) => patch({ permissions: p }));
  const tokens = h('ul', { class: 'items tokens' });
  const drawTokens = async () => {
    let list = [];
    try {
      list = (await getTokens(name)).tokens || [];
    } catch (e) {
      mount(tokens, h('li', { class: 'error' }, e.message));
      return;
    }
    mount(
      tokens,
      list.map((t) =>
        h(
          'li',
          null,
          h('strong', null, t.label || '(no label)'),
          h('span', { class: 'muted' }, ' ' + t.origin + ' · created ' + fmtTime(t.createdAt) + ' · last used ' + (t.lastUsedAt ? fmtTime(t.lastUsedAt) : 'never') + (t.expiresAt ? ' · expires ' + fmtTime(t.expiresAt) : '')),
          ' ',
          h(
            'button',
            {
              class: 'link danger',
              onClick: async () => {
                if (!confirmAction('Revoke token "' + (t.label || t.id) + '"?')) return;
                try {
                  await revokeToken(name, t.id);
                } catch (e) {
                  toast(e.message, 'error');
                }
                // Either way the list shows what the broker holds now.
                drawTokens();
              },
            },
            'revoke',
          ),
        ),
      ),
      list.length ? null : h('li', { class: 'muted' }, 'No tokens.'),
    );
  };
  drawTokens();
  return h(
    'div',
    { class: 'stack manage' },
    h('h2', null, 'Manage'),
    h(
      'form',
      {
        class: 'stack',
        onSubmit: (ev) => {
          ev.preventDefault();
          patch({ role: { title: title.value.trim(), description: desc.value }, instructions: instr.value });
        },
      },
      h('label', null, 'Role title', title),
      h('label', null, 'Role description', desc),
      h('label', null, 'Instructions (private to admins and the member)', instr),
      h('button', { class: 'primary' }, 'Save'),
    ),
    saved,
    perms.el,
    h('h3', null, 'Tokens'),
    tokens,
    h(
      'div',
      { class: 'row' },
      rotateButton(name, reveal, drawTokens),
      totpButton(name, reveal),
      h(
        'button',
        {
          class: 'danger',
          onClick: async () => {
            if (!confirmAction('Delete member ' + name + '? All of their tokens are revoked.')) return;
            try {
              await deleteMember(name);
              await loadRoster();
              navigate('/members');
            } catch (e) {
              toast(e.message, 'error');
            }
          },
        },
        'Delete member',
      ),
    ),
  );
}

// ---------------------------------------------------------------- /account

route('/account', ({ el }) => {
  const me = identity().member;
  const reveal = h('div');
  const sel = h(
    'select',
    { 'aria-label': 'Theme' },
    ['auto', 'light', 'dark'].map((t) => h('option', { value: t, selected: theme() === t }, t)),
  );
  sel.addEventListener('change', () => setTheme(sel.value));
  mount(
    el,
    h(
      'section',
      { class: 'page' },
      h('h1', null, 'Account'),
      h('p', null, 'Signed in as ', h('a', { href: '/@' + me }, me), '.'),
      h('label', null, 'Theme ', sel),
      notificationsSwitch(),
      reveal,
      selfTools(reveal),
      h('h2', null, 'Keyboard'),
      h(
        'dl',
        { class: 'keys' },
        [
          ['Ctrl K / ⌘ K', 'jump to a member, channel or objective'],
          ['g h, g i, g o, g c, g m, g f, g a', 'home, inbox, objectives, channels, members, files, account'],
          ['/', 'focus the composer'],
          ['Enter / Shift Enter', 'send / new line'],
          ['@', 'complete a teammate\'s name (↑ ↓, Enter or Tab)'],
          ['Esc', 'close the palette or menu, leave a field'],
          ['?', 'this page'],
        ].map(([k, d]) => [h('dt', null, h('kbd', null, k)), h('dd', null, d)]),
      ),
    ),
  );
});

// ---------------------------------------------------------------- /enroll?code=

// Crockford's base32: digits and letters without I, L, O, U.
const CODE_ALPHABET = /^[0-9A-HJKMNP-TV-Z]{8}$/;

// What a human typed → the stored form: upper-case, no spaces or hyphens, and the letters a
// code never holds read as the digits they look like (O → 0, I and L → 1).
export function normCode(s) {
  return s.toUpperCase().replace(/[\s-]/g, '').replace(/O/g, '0').replace(/[IL]/g, '1');
}

route('/enroll', async ({ el, query }) => {
  const fromUrl = query.get('code') || '';
  if (fromUrl) history.replaceState(null, '', '/enroll');
  if (!can('members.manage')) {
    mount(el, h('section', { class: 'page' }, h('h1', null, 'Approve a device'), h('p', null, 'Approving a device requires the members.manage permission. Ask an admin.')));
    return;
  }
  const me = identity().member;
  const input = h('input', { value: fromUrl.toUpperCase(), 'aria-label': 'User code', placeholder: 'XXXX-XXXX', autocomplete: 'off' });
  const out = h('div');
  const lookup = async (ev) => {
    if (ev) ev.preventDefault();
    const code = normCode(input.value);
    if (!CODE_ALPHABET.test(code)) {
      mount(out, h('p', { class: 'error' }, 'A code is 8 characters from 0–9 and A–Z without I, L, O and U, like ABCD-EF23.'));
      return;
    }
    let rows;
    try {
      rows = (await pendingEnrollments()).enrollments || [];
    } catch (e) {
      mount(out, h('p', { class: 'error' }, e.message));
      return;
    }
    const r = rows.find((x) => normCode(x.userCode) === code);
    if (!r) {
      mount(out, h('p', { class: 'error' }, 'No pending enrollment has that code (it may have expired or been resolved).'));
      return;
    }
    approveCard(out, r, me);
  };
  mount(
    el,
    h(
      'section',
      { class: 'page' },
      h('h1', null, 'Approve a device'),
      h('p', null, 'Someone ran `ac7 connect` and was shown a code. Check it matches, then choose the member the device acts as.'),
      h('form', { class: 'row', onSubmit: lookup }, h('label', null, 'User code ', input), h('button', { class: 'primary' }, 'Look up code')),
      out,
    ),
  );
  if (fromUrl) lookup();
});

async function approveCard(out, r, me) {
  const others = state.teammates.map((t) => t.name).filter((n) => n !== me);
  const bind = h('select', { 'aria-label': 'Existing member' }, [...others, me].map((n) => h('option', { value: n }, n)));
  const label = h('input', { value: r.labelHint || '', maxlength: 64, 'aria-label': 'Token label (optional)' });
  const newName = h('input', { pattern: '[A-Za-z0-9._\\-]+', maxlength: 128, 'aria-label': 'New member name' });
  const title = h('input', { value: 'engineer', maxlength: 64, 'aria-label': 'Role title' });
  const desc = h('input', { maxlength: 512, 'aria-label': 'Role description' });
  const instr = h('textarea', { rows: 2, maxlength: 8192, 'aria-label': 'Instructions' });
  const perms = permissionsEditor([], await presets(), () => {});
  const modeBind = h('input', { type: 'radio', name: 'mode', value: 'bind', checked: true });
  const modeCreate = h('input', { type: 'radio', name: 'mode', value: 'create' });
  const createBox = h('div', { class: 'stack', hidden: true }, h('label', null, 'Name', newName), h('label', null, 'Role title', title), h('label', null, 'Role description', desc), h('label', null, 'Instructions', instr), perms.el);
  const bindBox = h('div', null, h('label', null, 'Member ', bind));
  const flip = () => {
    createBox.hidden = !modeCreate.checked;
    bindBox.hidden = modeCreate.checked;
  };
  modeBind.addEventListener('change', flip);
  modeCreate.addEventListener('change', flip);
  const err = h('p', { class: 'error', role: 'alert' });
  const left = h('span');
  const tick = () => {
    const s = Math.max(0, Math.round((r.expiresAt - Date.now()) / 1000));
    left.textContent = s ? 'expires in ' + Math.floor(s / 60) + ':' + String(s % 60).padStart(2, '0') : 'expired';
  };
  tick();
  const timer = setInterval(() => (out.isConnected ? tick() : clearInterval(timer)), 1000);
  mount(
    out,
    h(
      'form',
      {
        class: 'card stack',
        onSubmit: async (ev) => {
          ev.preventDefault();
          err.textContent = '';
          const body = modeCreate.checked
            ? {
                mode: 'create',
                userCode: r.userCode,
                memberName: newName.value.trim(),
                role: { title: title.value.trim(), description: desc.value },
                instructions: instr.value,
                permissions: perms.get(),
              }
            : { mode: 'bind', userCode: r.userCode, memberName: bind.value };
          if (label.value.trim()) body.label = label.value.trim();
          try {
            const res = await approveEnrollment(body);
            clearInterval(timer);
            mount(out, h('p', { class: 'notice', role: 'status' }, 'Approved: code ' + r.userCode + ' is bound to ' + res.member.name + '. The device receives its token on its next poll.'));
            loadRoster().catch(() => {});
          } catch (e) {
            err.textContent = e.message;
          }
        },
      },
      h('h2', null, h('code', null, r.userCode), ' ', left),
      h('p', { class: 'muted' }, 'From ' + (r.sourceIp || 'unknown address') + ' · ' + (r.sourceUa || 'unknown client') + (r.labelHint ? ' · "' + r.labelHint + '"' : '')),
      h('div', { class: 'row' }, h('label', null, modeBind, ' Existing member'), h('label', null, modeCreate, ' New member')),
      bindBox,
      createBox,
      h('label', null, 'Token label (optional)', label),
      err,
      h(
        'div',
        { class: 'row' },
        h('button', { class: 'primary' }, 'Approve'),
        h(
          'button',
          {
            type: 'button',
            class: 'danger',
            onClick: async () => {
              if (!confirmAction('Reject device ' + r.userCode + '?')) return;
              try {
                await rejectEnrollment(r.userCode, 'rejected from the web app');
                clearInterval(timer);
                mount(out, h('p', { class: 'notice' }, 'Rejected ' + r.userCode + '.'));
              } catch (e) {
                err.textContent = e.message;
              }
            },
          },
          'Reject',
        ),
      ),
    ),
  );
}
