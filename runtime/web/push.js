// push.js — the service worker and Web Push: registers /sw.js (offline start, notifications),
// follows a notification click into its thread, and the Notifications switch of the
// account page (subscribe through the worker with the team's VAPID key, tell the broker;
// unsubscribe). The subscription's broker id is kept per member in localStorage, so turning
// it off after a reload still removes it on the broker, and signing out removes it too.

import { h, identity, navigate } from './core.js';
import { addPushSubscription, removePushSubscription, vapidPublicKey } from './api.js';

const supported = () => 'serviceWorker' in navigator && 'PushManager' in window && 'Notification' in window;
const storeKey = () => 'ac7:push:' + (identity() ? identity().member : '');

let registered = false;

// Registers the service worker once per page; a click on a notification (the worker posts
// {type: 'notification-click', url}) opens its thread here. app.js calls it once the live
// stream is open: the worker's first install fetches every asset, and those requests must
// not hold up the app's own (the browser allows six connections per host).
export function startWorker() {
  if (registered || !('serviceWorker' in navigator)) return;
  registered = true;
  navigator.serviceWorker.register('/sw.js', { scope: '/' }).catch((e) => {
    console.warn('ac7: the service worker did not register:', e);
  });
  navigator.serviceWorker.addEventListener('message', (e) => {
    const d = e.data || {};
    if (d.type === 'notification-click' && typeof d.url === 'string' && d.url.startsWith('/')) navigate(d.url);
  });
}

function saved() {
  try {
    return JSON.parse(localStorage.getItem(storeKey()) || 'null');
  } catch {
    return null;
  }
}

// base64url → bytes, as PushManager.subscribe wants the key.
function keyBytes(b64) {
  const s = atob(b64.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - (b64.length % 4)) % 4));
  return Uint8Array.from(s, (c) => c.charCodeAt(0));
}

// `promise`, or an error saying `what` did not answer within `secs` (a browser without a
// reachable push service may never settle a subscription).
function within(secs, what, promise) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(what + ' did not answer within ' + secs + ' s')), secs * 1000);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

async function current() {
  const reg = await navigator.serviceWorker.ready;
  return { reg, sub: await reg.pushManager.getSubscription() };
}

async function enable() {
  const permission = await within(60, 'the permission prompt', Notification.requestPermission());
  if (permission !== 'granted') {
    throw new Error(
      permission === 'denied'
        ? 'notifications are blocked for this site: allow them in the browser’s site settings'
        : 'notifications were not allowed',
    );
  }
  const { publicKey } = await vapidPublicKey();
  const { reg, sub: old } = await current();
  let sub = old;
  if (!sub) {
    try {
      sub = await within(
        10,
        'the browser’s push service',
        reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(publicKey) }),
      );
    } catch (e) {
      throw new Error('this browser could not subscribe to push messages (' + (e.message || e.name) + ')');
    }
  }
  const row = await addPushSubscription(sub.toJSON());
  localStorage.setItem(storeKey(), JSON.stringify({ id: row.id, endpoint: row.endpoint }));
}

// Removes this browser's subscription: on the broker (when its id is known) and in the browser.
export async function disablePush() {
  const mine = saved();
  localStorage.removeItem(storeKey());
  if (mine) {
    try {
      await removePushSubscription(mine.id);
    } catch (e) {
      if (e.status !== 404) throw e;
    }
  }
  if (!supported()) return;
  const reg = await navigator.serviceWorker.getRegistration('/');
  const sub = reg && (await reg.pushManager.getSubscription());
  if (sub) await sub.unsubscribe();
}

// The account page's "Notifications" switch, with a status line saying what happened.
export function notificationsSwitch() {
  const status = h('span', { class: 'muted', role: 'status', 'data-push-status': '' });
  const box = h('input', { type: 'checkbox', role: 'switch', 'aria-describedby': 'push-status', disabled: true });
  status.id = 'push-status';
  const say = (text, error) => {
    status.className = error ? 'error' : 'muted';
    status.textContent = text;
  };
  if (!supported()) {
    say('Not available in this browser (on iPhone and iPad: add ac7 to the home screen first).');
  } else if (Notification.permission === 'denied') {
    say('Blocked: allow notifications for this site in the browser’s settings.', true);
  } else {
    current()
      .then(({ sub }) => {
        const mine = saved();
        box.checked = !!(sub && mine && mine.endpoint === sub.endpoint);
        box.disabled = false;
        say(box.checked ? 'On: messages for you arrive while the app is closed.' : 'Off.');
      })
      .catch((e) => say('Unavailable: ' + e.message, true));
  }
  box.addEventListener('change', async () => {
    const on = box.checked;
    box.disabled = true;
    say(on ? 'Subscribing…' : 'Turning off…');
    try {
      if (on) await enable();
      else await disablePush();
      say(on ? 'On: messages for you arrive while the app is closed.' : 'Off.');
    } catch (e) {
      box.checked = !on;
      say('Could not turn notifications ' + (on ? 'on' : 'off') + ': ' + e.message, true);
    } finally {
      box.disabled = false;
    }
  });
  return h('p', null, h('label', null, box, ' Notifications'), ' ', status);
}
