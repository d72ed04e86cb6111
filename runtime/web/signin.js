// signin.js — the sign-in screen (one 6-digit TOTP code), first-admin setup
// (/setup?code=…) and the one-time TOTP reveal (QR + otpauth URI) used by setup and
// re-enrollment.

import { h, mount, route } from './core.js';
import { setup, setupStatus, signIn } from './api.js';

// 75 → '2 minutes', 30 → '30 seconds', 5400 → '1 hour 30 minutes'.
export function waitText(secs) {
  const s = Math.max(1, Math.ceil(Number(secs) || 0));
  if (s < 60) return s + (s === 1 ? ' second' : ' seconds');
  const m = Math.ceil(s / 60);
  if (m < 60) return m + (m === 1 ? ' minute' : ' minutes');
  const hrs = Math.floor(m / 60);
  const rest = m % 60;
  return hrs + (hrs === 1 ? ' hour' : ' hours') + (rest ? ' ' + rest + (rest === 1 ? ' minute' : ' minutes') : '');
}

// The sign-in form, rendered into `el`. onDone(session) after a successful login.
export function signInScreen(el, onDone, notice) {
  const code = h('input', {
    id: 'totp-code',
    name: 'code',
    inputmode: 'numeric',
    autocomplete: 'one-time-code',
    pattern: '[0-9]{6}',
    maxlength: 6,
    required: true,
    'aria-label': '6-digit code',
  });
  const member = h('input', {
    name: 'member',
    autocomplete: 'username',
    'aria-label': 'Member name (optional)',
    placeholder: 'member name (optional)',
  });
  const err = h('p', { class: 'error', role: 'alert' });
  const go = h('button', { class: 'primary', type: 'submit', disabled: true }, 'Sign in →');
  let busy = false;
  const submit = async (ev) => {
    if (ev) ev.preventDefault();
    if (busy || !/^\d{6}$/.test(code.value)) return;
    busy = true;
    go.disabled = true;
    err.textContent = '';
    const body = { code: code.value };
    if (member.value.trim()) body.member = member.value.trim();
    try {
      const s = await signIn(body);
      onDone(s);
    } catch (e) {
      const wait = e.status === 429 && e.body && e.body.retryAfter;
      err.textContent =
        e.status === 401
          ? 'That code is not valid. Wait for the next one and try again.'
          : wait
            ? 'Too many attempts. Try again in ' + waitText(wait) + '.'
            : e.message;
      code.value = '';
      code.focus();
    } finally {
      busy = false;
    }
  };
  code.addEventListener('input', () => {
    const v = code.value.replace(/\D/g, '').slice(0, 6);
    if (v !== code.value) code.value = v;
    go.disabled = v.length !== 6;
    if (v.length === 6) submit();
  });
  mount(
    el,
    h(
      'main',
      { class: 'signin' },
      h(
        'form',
        { class: 'card stack', onSubmit: submit },
        h('h1', null, 'ac7'),
        notice ? h('p', { class: 'notice' }, notice) : null,
        h('label', { for: 'totp-code' }, 'Enter the 6-digit code from your authenticator app'),
        code,
        h('details', null, h('summary', null, 'Sign in as a specific member'), member),
        err,
        go,
      ),
    ),
  );
  code.focus();
}

// The secret shown once: QR (server-rendered SVG, shown as an <img> from a Blob so it
// cannot run script), the otpauth URI as text, the base32 secret.
export function totpReveal(r, note) {
  const parts = [];
  if (r.qrSvg) {
    const url = URL.createObjectURL(new Blob([r.qrSvg], { type: 'image/svg+xml' }));
    parts.push(h('img', { class: 'qr', src: url, alt: 'QR code for your authenticator app', width: 220, height: 220 }));
  }
  parts.push(
    h('p', null, note || 'Scan the QR code with an authenticator app, or enter the secret by hand. It is shown only once.'),
    h('label', null, 'Secret', h('code', { class: 'secret' }, r.totpSecret || '')),
    h('label', null, 'otpauth URI', h('code', { class: 'secret uri' }, r.totpUri || '')),
  );
  return h('div', { class: 'reveal totp' }, parts);
}

// A "type the current code" check; onOk() when the server accepts it.
export function confirmCode(label, send, onOk) {
  const input = h('input', { inputmode: 'numeric', autocomplete: 'one-time-code', maxlength: 6, 'aria-label': '6-digit code' });
  const err = h('p', { class: 'error', role: 'alert' });
  return h(
    'form',
    {
      class: 'stack',
      onSubmit: async (ev) => {
        ev.preventDefault();
        err.textContent = '';
        try {
          const r = await send(input.value.trim());
          onOk(r);
        } catch (e) {
          err.textContent = e.status === 401 ? 'That code is not valid; try the next one.' : e.message;
          input.value = '';
        }
      },
    },
    h('label', null, label, input),
    err,
    h('button', { class: 'primary' }, 'Confirm'),
  );
}

// First-admin setup: /setup?code=<one-time setup code> (printed by `ac7 serve` on a new team).
route(
  '/setup',
  async ({ el, query }) => {
    // The code is a secret: keep it out of the address bar and the history, but in this
    // tab's session storage, so a reload before the authenticator is set up shows the same
    // (still pending) secret again.
    const KEY = 'ac7:setup-code';
    const fromUrl = query.get('code') || '';
    if (fromUrl) {
      history.replaceState(null, '', '/setup');
      try {
        sessionStorage.setItem(KEY, fromUrl);
      } catch {}
    }
    let code = fromUrl;
    if (!code) {
      try {
        code = sessionStorage.getItem(KEY) || '';
      } catch {}
    }
    const forget = () => {
      try {
        sessionStorage.removeItem(KEY);
      } catch {}
    };
    const page = (...c) => mount(el, h('main', { class: 'signin' }, h('div', { class: 'card stack' }, h('h1', null, 'Set up ac7'), c)));
    let status;
    try {
      status = await setupStatus();
    } catch (e) {
      page(h('p', { class: 'error' }, e.message));
      return;
    }
    if (!status.needed) {
      forget();
      page(h('p', null, 'This team is already set up.'), h('a', { href: '/', class: 'button primary', 'data-external': '' }, 'Sign in'));
      return;
    }
    const input = h('input', { name: 'code', value: code, required: true, autocomplete: 'off', 'aria-label': 'Setup code' });
    const err = h('p', { class: 'error', role: 'alert' });
    const claim = async (ev) => {
      if (ev) ev.preventDefault();
      err.textContent = '';
      let r;
      try {
        r = await setup(input.value.trim());
      } catch (e) {
        err.textContent = e.message;
        if (e.status === 401 || e.status === 409) forget();
        return;
      }
      try {
        sessionStorage.setItem(KEY, input.value.trim());
      } catch {}
      const done = h('div', { class: 'stack', hidden: true }, h('p', null, 'Signed in. '), h('a', { href: '/', class: 'button primary', 'data-external': '' }, 'Open the team →'));
      page(
        h('p', null, 'You are the first admin' + (r.member ? ', ' + r.member : '') + '.'),
        totpReveal(
          r,
          'Scan the QR code with an authenticator app, or enter the secret by hand. Nothing is final until you sign in with a code from it below: until then this page shows the same secret again.',
        ),
        confirmCode(
          'Type the code your app shows now',
          (c) => signIn(r.member ? { code: c, member: r.member } : { code: c }),
          () => {
            forget();
            done.hidden = false;
          },
        ),
        done,
      );
    };
    page(
      h('p', null, 'Claim this new team as its first admin. The setup code was printed by `ac7 serve` when the team was created.'),
      h('form', { class: 'stack', onSubmit: claim }, h('label', null, 'Setup code', input), err, h('button', { class: 'primary' }, 'Claim the team')),
    );
    if (code) claim();
  },
  { bare: true, public: true },
);
