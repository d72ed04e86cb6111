// chat.js — the chat screens: team home, inbox, channel browse/create/settings, and the
// channel and DM threads (drawn by thread.js from the shared state in store.js).

import { can, confirmAction, fmtTime, h, identity, mount, navigate, route, toast } from './core.js';
import { addChannelMember, archiveChannel, createChannel, getChannel, removeChannelMember, renameChannel } from './api.js';
import {
  badge,
  channelById,
  inboxItems,
  isBusy,
  isOnline,
  loadChannels,
  onChange,
  presenceDot,
  rememberArchived,
  state,
  thread,
} from './store.js';
import { threadView } from './thread.js';
import { activityPanel } from './activity.js';

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
                          await addChannelMember(c.slug);
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
        archivedGroup(),
      ),
    );
  draw();
  loadChannels().catch(() => {});
  return onChange(draw);
});

// The archived channels this browser knows of, collapsed (the open state survives redraws).
let archivedOpen = false;
function archivedGroup() {
  const list = state.archived.filter((a) => !channelById(a.id));
  if (!list.length) return null;
  const d = h(
    'details',
    { class: 'archived', open: archivedOpen || null },
    h('summary', null, 'Archived (' + list.length + ')'),
    h(
      'ul',
      { class: 'items' },
      list.map((a) =>
        h('li', null, h('a', { href: '/c/' + a.slug }, '#' + a.slug), h('span', { class: 'muted' }, ' archived ' + fmtTime(a.archivedAt))),
      ),
    ),
  );
  d.addEventListener('toggle', () => {
    archivedOpen = d.open;
  });
  return d;
}

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
              await createChannel(slug);
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
    // The broker lists active channels only: this one may be archived.
    let v = null;
    try {
      v = await getChannel(slug);
    } catch (e) {
      if (e.status !== 404) throw e;
    }
    if (v && v.channel.archivedAt) return archivedChannel(el, v.channel);
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
                await addChannelMember(slug);
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
  const count = h('span', { class: 'muted member-count' }, general ? 'team channel · everyone' : plural(c.memberCount, 'member'));
  // The member count follows the shared channel list (re-listed after every change), and
  // so does the address when the channel is renamed; archived meanwhile, it turns read-only.
  const offCount = general
    ? () => {}
    : onChange(() => {
        const now = channelById(c.id);
        if (now && now.slug !== slug) navigate('/c/' + now.slug, { replace: true });
        else if (now) count.textContent = plural(now.memberCount, 'member');
        else if (state.archived.some((a) => a.id === c.id)) navigate('/c/' + slug, { replace: true });
      });
  const header = h(
    'header',
    { class: 'thread-head' },
    h('h1', null, '#' + slug),
    count,
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
  const leave = threadView(el, {
    key,
    header,
    historyQuery: { channel: general ? 'general' : c.id },
    push: (p) => {
      if (!general) p.data = { thread: 'chan:' + c.id };
    },
  });
  return () => {
    offCount();
    leave();
  };
});

// An archived channel: its history, read-only, under a line saying when it was archived.
function archivedChannel(el, ch) {
  rememberArchived(ch);
  const when = new Date(ch.archivedAt);
  const note = h(
    'p',
    { class: 'archived-note' },
    'This channel was archived on ',
    h('time', { datetime: when.toISOString() }, when.toLocaleString()),
    '. Its history is read-only.',
  );
  if (!ch.joined) {
    mount(el, h('section', { class: 'page' }, h('h1', null, '#' + ch.slug), note, h('p', null, "You weren't a member of this channel.")));
    return;
  }
  const header = h('header', { class: 'thread-head' }, h('h1', null, '#' + ch.slug), h('span', { class: 'muted' }, 'archived'));
  return threadView(el, { key: 'chan:' + ch.id, header, historyQuery: { channel: ch.id }, footer: note });
}

// Channel admins rename the channel; the address follows.
function renameForm(c) {
  const input = h('input', { name: 'rename', value: c.slug, required: true, maxlength: 32, autocomplete: 'off', 'aria-label': 'New channel name' });
  input.addEventListener('input', () => {
    const v = normSlug(input.value);
    if (v !== input.value) input.value = v;
  });
  return h(
    'form',
    {
      class: 'rename row',
      onSubmit: async (ev) => {
        ev.preventDefault();
        const to = input.value.replace(/^-+|-+$/g, '');
        if (!to || to === c.slug) return;
        try {
          await renameChannel(c.slug, to);
          await loadChannels();
          navigate('/c/' + to, { replace: true });
        } catch (e) {
          toast(e.message, 'error');
        }
      },
    },
    input,
    h('button', { type: 'submit' }, 'Rename'),
  );
}

async function channelSettings(box, c) {
  const me = identity().member;
  mount(box, h('p', { class: 'muted' }, 'Loading…'));
  let r;
  try {
    r = await getChannel(c.slug);
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
      if (addSel.value) await addChannelMember(c.slug, addSel.value);
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
                      await removeChannelMember(c.slug, m.memberName);
                  }),
                },
                'remove',
              )
            : null,
        ),
      ),
    ),
    admin && others.length ? addSel : null,
    admin ? renameForm(c) : null,
    h(
      'p',
      null,
      h(
        'button',
        {
          onClick: async () => {
            if (!confirmAction('Leave #' + c.slug + '?')) return;
            try {
              await removeChannelMember(c.slug, me);
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
                  rememberArchived(await archiveChannel(c.slug));
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
  const canSee = can('activity.read') || name === me;
  // Wide screens: the member's activity beside the conversation, opened with a toggle
  // (remembered in this browser).
  const side = h('aside', { class: 'side-panel', 'aria-label': 'Activity of ' + name, hidden: true });
  let closeFeed = null;
  const toggle = h('button', { class: 'side-toggle', type: 'button', 'aria-pressed': 'false', 'aria-controls': 'dm-activity' }, 'Activity');
  side.id = 'dm-activity';
  const showSide = (open) => {
    side.hidden = !open;
    toggle.setAttribute('aria-pressed', String(open));
    if (open && !closeFeed) closeFeed = activityPanel(side, name);
    if (!open && closeFeed) {
      closeFeed();
      closeFeed = null;
      side.replaceChildren();
    }
  };
  toggle.addEventListener('click', () => {
    const open = side.hidden;
    try {
      localStorage.setItem('ac7:dm-activity', open ? '1' : '');
    } catch {
      /* private mode */
    }
    showSide(open);
  });
  const header = h(
    'header',
    { class: 'thread-head' },
    h('h1', null, name === me ? 'Notes to self' : 'DM with ', name === me ? null : h('a', { href: '/@' + name }, name)),
    status,
    canSee ? h('a', { href: '/@' + name + '/activity', class: 'muted' }, 'activity →') : null,
    canSee ? toggle : null,
  );
  if (!known) {
    mount(el, h('section', { class: 'page' }, h('h1', null, '@' + name), h('p', null, 'No such member.')));
    off();
    return;
  }
  const main = h('div', { class: 'split-main' });
  mount(el, h('div', { class: 'split' }, main, canSee ? side : null));
  const done = threadView(main, {
    key: 'dm:' + name,
    header,
    historyQuery: { with: name },
    push: (p) => {
      p.to = name;
    },
  });
  const wide = matchMedia('(min-width: 60rem)');
  let wanted = false;
  try {
    wanted = localStorage.getItem('ac7:dm-activity') === '1';
  } catch {
    /* private mode */
  }
  if (canSee && wanted && wide.matches) showSide(true);
  const narrow = () => !wide.matches && showSide(false);
  wide.addEventListener('change', narrow);
  return () => {
    off();
    done();
    wide.removeEventListener('change', narrow);
    if (closeFeed) closeFeed();
  };
});
