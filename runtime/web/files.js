// files.js — the shared file space: browse (`/files/<path>`), upload into the current
// folder, download, delete, "shared with me", all files (members.manage), and a safe
// preview of a file:
//  * text, code, JSON, HTML, SVG: shown as text (textContent) — never rendered, so an
//    uploaded page or script cannot run;
//  * markdown: headings, lists, code blocks and paragraphs built as DOM text nodes;
//  * PNG/JPEG/GIF/WebP images: an <img> on a blob: URL of the bytes, typed by us;
//  * audio and video the browser plays (MP3, Ogg, WAV, WebM, MP4, AAC, FLAC): an <audio> or
//    <video> player on the file's URL (a media element only ever decodes media);
//  * anything else (PDF included): size, type and a download link.
// Downloads go to /fs/read/…, which the broker serves as an attachment in a sandbox.

import { AUDIO_TYPES, VIDEO_TYPES, can, confirmAction, fmtBytes, fmtTime, fsUrl, h, identity, inlineNodes, mediaPlayer, mount, navigate, route, toast } from './core.js';
import { allFiles, listDir, removeFile, sharedFiles, statFile } from './api.js';
import { uploadFile } from './thread.js';

const TEXT_MAX = 1024 * 1024;
const IMAGE_MAX = 25 * 1024 * 1024;
const IMAGE_TYPES = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp']);
const CODE_EXT =
  /\.(c|cc|cpp|h|hpp|rs|go|py|rb|js|mjs|ts|tsx|jsx|java|kt|swift|sh|bash|zsh|toml|ya?ml|json|xml|html?|css|svg|sql|diff|patch|txt|log|ini|cfg|conf|env|csv|tsv|tf|lua|php|pl|r|scala|zig)$|(^|\/)(Dockerfile|Makefile|LICENSE|README)$/i;

function kindOf(entry) {
  const mime = (entry.mimeType || '').toLowerCase().split(';')[0].trim();
  const name = entry.name || '';
  if (IMAGE_TYPES.has(mime)) return 'image';
  if (AUDIO_TYPES.has(mime)) return 'audio';
  if (VIDEO_TYPES.has(mime)) return 'video';
  if (mime === 'text/markdown' || mime === 'text/x-markdown' || /\.(md|markdown)$/i.test(name)) return 'markdown';
  if (mime.startsWith('text/') || mime === 'application/json' || mime === 'application/xml' || mime === 'image/svg+xml' || CODE_EXT.test(name)) {
    return 'text';
  }
  return 'binary';
}

// Path segments → breadcrumb links.
function crumbs(path) {
  const segs = path.split('/').filter(Boolean);
  const out = [h('a', { href: '/files' }, 'files')];
  segs.forEach((s, i) => {
    out.push(' / ');
    out.push(h('a', { href: '/files/' + segs.slice(0, i + 1).map(encodeURIComponent).join('/') }, s));
  });
  return h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, out);
}

function entryRow(e, onDelete) {
  const dir = e.kind === 'directory';
  return h(
    'li',
    { class: 'file-row' + (dir ? ' dir' : ''), 'data-path': e.path },
    h('a', { class: 'name', href: '/files' + e.path.split('/').map(encodeURIComponent).join('/') }, (dir ? '📁 ' : '') + e.name + (dir ? '/' : '')),
    h('span', { class: 'muted' }, dir ? '' : ' ' + fmtBytes(e.size) + ' · ' + (e.mimeType || '')),
    h('span', { class: 'muted' }, ' · ' + fmtTime(e.updatedAt || e.createdAt)),
    dir ? null : h('a', { class: 'button small', href: fsUrl(e.path), download: e.name, 'data-external': '' }, 'Download'),
    onDelete ? h('button', { class: 'small danger', onClick: () => onDelete(e) }, 'Delete') : null,
  );
}

async function fetchBytes(path) {
  const res = await fetch(fsUrl(path), { credentials: 'same-origin' });
  if (!res.ok) throw new Error('cannot read ' + path + ': ' + res.status + ' ' + res.statusText);
  return res.blob();
}

// Markdown, built from text nodes only: # headings, - / * / 1. list items, ``` fences,
// > quotes, paragraphs. No HTML, no links that run anything.
export function markdownNodes(text) {
  const out = [];
  const lines = text.split('\n');
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) out.push(h('p', null, inlineNodes(para.join(' '))));
    para = [];
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    if (l.startsWith('```')) {
      flush();
      const code = [];
      i++;
      while (i < lines.length && !lines[i].startsWith('```')) code.push(lines[i++]);
      out.push(h('pre', { class: 'code' }, code.join('\n')));
      continue;
    }
    const head = /^(#{1,6})\s+(.*)$/.exec(l);
    const item = /^\s*(?:[-*+]|\d+\.)\s+(.*)$/.exec(l);
    if (head) {
      flush();
      out.push(h('h' + Math.min(head[1].length + 1, 6), null, inlineNodes(head[2])));
    } else if (item) {
      if (para.length) flush();
      if (!list) {
        list = h('ul');
        out.push(list);
      }
      list.appendChild(h('li', null, inlineNodes(item[1])));
    } else if (l.startsWith('>')) {
      flush();
      out.push(h('blockquote', null, inlineNodes(l.replace(/^>\s?/, ''))));
    } else if (!l.trim()) {
      flush();
    } else {
      list = null;
      para.push(l.trim());
    }
  }
  flush();
  return out;
}

async function preview(el, entry) {
  const kind = kindOf(entry);
  const box = h('div', { class: 'preview', 'data-kind': kind });
  const dir = entry.path.split('/').slice(0, -1).join('/');
  mount(
    el,
    h(
      'section',
      { class: 'page file-preview' },
      crumbs(entry.path),
      h('h1', null, entry.name),
      h('p', { class: 'muted' }, (entry.mimeType || 'unknown type') + ' · ' + fmtBytes(entry.size) + ' · by ' + (entry.createdBy || '?') + ' · ' + fmtTime(entry.updatedAt || entry.createdAt)),
      h(
        'div',
        { class: 'actions' },
        h('a', { class: 'button primary', href: fsUrl(entry.path), download: entry.name, 'data-external': '' }, 'Download'),
        dir ? h('a', { class: 'button', href: '/files' + dir }, 'Back to folder') : null,
      ),
      box,
    ),
  );
  let url = null;
  if (kind === 'image' && entry.size <= IMAGE_MAX) {
    const blob = await fetchBytes(entry.path);
    // Typed by us from the allow-list: the bytes are only ever decoded as an image.
    url = URL.createObjectURL(new Blob([blob], { type: entry.mimeType.toLowerCase().split(';')[0].trim() }));
    mount(box, h('img', { src: url, alt: entry.name, class: 'preview-img' }));
  } else if (kind === 'audio' || kind === 'video') {
    mount(box, mediaPlayer(kind, entry.path, entry.name));
  } else if ((kind === 'text' || kind === 'markdown') && entry.size <= TEXT_MAX) {
    const text = await (await fetchBytes(entry.path)).text();
    if (kind === 'markdown') mount(box, h('div', { class: 'markdown' }, markdownNodes(text)));
    else {
      const lines = text.split('\n');
      mount(box, h('pre', { class: 'code numbered' }, lines.map((l, i) => h('span', { class: 'line', 'data-n': i + 1 }, l + '\n'))));
    }
  } else if (kind === 'binary') {
    mount(box, h('p', { class: 'muted' }, 'No preview for this type. Download it to open it.'));
  } else {
    mount(box, h('p', { class: 'muted' }, 'Too large to preview (' + fmtBytes(entry.size) + ').'));
  }
  return () => url && URL.revokeObjectURL(url);
}

async function listing(el, path, entries, opts = {}) {
  const me = identity().member;
  const canWrite = path && (path.split('/')[1] === me || can('members.manage'));
  const onDelete = canWrite
    ? async (e) => {
        if (!confirmAction('Delete ' + e.path + (e.kind === 'directory' ? ' and everything in it' : '') + '?')) return;
        try {
          await removeFile(e.path);
          navigate(location.pathname, { replace: true });
        } catch (err) {
          toast(err.message, 'error');
        }
      }
    : null;
  const fileIn = h('input', { type: 'file', multiple: true, class: 'upload-input', 'aria-label': 'Upload files' });
  fileIn.addEventListener('change', async () => {
    const files = [...fileIn.files];
    let done = 0;
    for (const f of files) {
      try {
        await uploadFile(f, path);
        done++;
      } catch (err) {
        toast(f.name + ': ' + err.message, 'error');
      }
    }
    if (done) toast('Uploaded ' + done + ' file' + (done === 1 ? '' : 's'), 'info');
    navigate(location.pathname, { replace: true });
  });
  const sorted = entries.slice().sort((a, b) => (a.kind === b.kind ? a.name.localeCompare(b.name) : a.kind === 'directory' ? -1 : 1));
  mount(
    el,
    h(
      'section',
      { class: 'page files' },
      opts.title ? h('h1', null, opts.title) : [h('h1', { class: 'sr-only' }, 'Files in ' + (path || '/')), crumbs(path || '/')],
      h(
        'div',
        { class: 'actions' },
        canWrite && path !== '/' ? h('label', { class: 'button primary' }, 'Upload', fileIn) : null,
        h('a', { class: 'button', href: '/files/' + me }, 'My files'),
        h('a', { class: 'button', href: '/files?view=shared' }, 'Shared with me'),
        can('members.manage') ? h('a', { class: 'button', href: '/files?view=all' }, 'All files') : null,
      ),
      sorted.length ? h('ul', { class: 'items file-list' }, sorted.map((e) => entryRow(e, opts.flat ? null : onDelete))) : h('p', { class: 'empty muted' }, 'This folder is empty.'),
    ),
  );
}

route('/files/*', async ({ params, el, query }) => {
  const rest = params.rest || '';
  const view = query.get('view');
  if (!rest && view === 'shared') {
    const r = await sharedFiles();
    return listing(el, null, r.entries || [], { title: 'Shared with me', flat: true });
  }
  if (!rest && view === 'all') {
    const r = await allFiles();
    return listing(el, null, r.entries || [], { title: 'All files', flat: true });
  }
  if (!rest) {
    if (!can('members.manage')) return navigate('/files/' + identity().member, { replace: true });
    const r = await listDir('/');
    return listing(el, '/', r.entries || []);
  }
  const path = '/' + rest.replace(/\/+$/, '');
  let entry = null;
  try {
    entry = (await statFile(path)).entry;
  } catch (e) {
    // Your own empty home does not exist until the first upload.
    if (e.status !== 404) throw e;
  }
  if (entry && entry.kind !== 'directory') return preview(el, entry);
  const r = await listDir(path);
  return listing(el, path, r.entries || []);
});
