// sw.js — the service worker (served at /sw.js, scope /): the app shell for an offline start,
// and Web Push notifications. The broker writes the current asset version into every
// "/_app/…" string below when it serves this file, so a new binary is a new worker with
// its own cache.

const SHELL = [
  '/_app/shell.html',
  '/_app/app.css',
  '/_app/core.js',
  '/_app/app.js',
  '/_app/api.js',
  '/_app/store.js',
  '/_app/thread.js',
  '/_app/chat.js',
  '/_app/signin.js',
  '/_app/members.js',
  '/_app/objectives.js',
  '/_app/files.js',
  '/_app/activity.js',
  '/_app/push.js',
  '/_app/icon-192.png',
];
const CACHE = 'ac7-' + SHELL[0].split('/')[2];

self.addEventListener('install', (event) => {
  event.waitUntil(
    (async () => {
      await (await caches.open(CACHE)).addAll(SHELL);
      await self.skipWaiting();
    })(),
  );
});

self.addEventListener('activate', (event) => {
  event.waitUntil(
    (async () => {
      for (const key of await caches.keys()) if (key !== CACHE) await caches.delete(key);
      await self.clients.claim();
    })(),
  );
});

// Navigations: the network first (the broker answers every app URL with the shell), the
// cached shell when it cannot be reached. Versioned assets: the cache first (immutable).
// Everything else (the API, live streams, downloads) is left to the network.
self.addEventListener('fetch', (event) => {
  const req = event.request;
  if (req.method !== 'GET') return;
  const url = new URL(req.url);
  if (url.origin !== self.location.origin) return;
  if (req.mode === 'navigate') {
    event.respondWith(fetch(req).catch(async () => (await caches.match(SHELL[0])) || Response.error()));
  } else if (url.pathname.startsWith('/_app/')) {
    event.respondWith((async () => (await caches.match(req)) || fetch(req))());
  }
});

self.addEventListener('push', (event) => {
  let n = {};
  try {
    n = event.data ? event.data.json() : {};
  } catch {
    n = { body: event.data ? event.data.text() : '' };
  }
  event.waitUntil(
    self.registration.showNotification(n.title || 'ac7', {
      body: n.body || '',
      tag: n.tag || 'ac7',
      icon: '/_app/icon-192.png',
      requireInteraction: n.severity === 'high',
      data: { url: n.url || '/', messageId: n.messageId || null },
    }),
  );
});

// A click focuses an open tab of the app and asks it to open the thread; without one it
// opens the thread's URL.
self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const { url, messageId } = event.notification.data || {};
  event.waitUntil(
    (async () => {
      const tabs = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
      const tab = tabs.find((c) => new URL(c.url).origin === self.location.origin);
      if (tab) {
        await tab.focus();
        tab.postMessage({ type: 'notification-click', url: url || '/', messageId });
      } else {
        await self.clients.openWindow(url || '/');
      }
    })(),
  );
});

// The browser replaced the subscription: subscribe again with the same key and tell the
// broker (the session cookie comes along).
self.addEventListener('pushsubscriptionchange', (event) => {
  event.waitUntil(
    (async () => {
      const key = event.oldSubscription && event.oldSubscription.options.applicationServerKey;
      const sub =
        event.newSubscription ||
        (key && (await self.registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key })));
      if (!sub) return;
      await fetch('/push/subscriptions', {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'content-type': 'application/json', accept: 'application/json' },
        body: JSON.stringify(sub.toJSON()),
      });
    })(),
  );
});
