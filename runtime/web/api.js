// api.js — every broker endpoint the app calls, by name. Views never spell a path: they
// call these (core.js's api() does the request, errors and the 401 check). Live streams
// (EventSource) and file URLs are opened by core.js, activity.js and fsUrl().

import { api } from './core.js';

const seg = encodeURIComponent;
const query = (q) => {
  const s = new URLSearchParams(q).toString();
  return s ? '?' + s : '';
};

// ---- session and first-admin setup
export function getSession() {
  return api('GET', '/session');
}
export function signIn(body) {
  return api('POST', '/session/totp', body);
}
export function signOut() {
  return api('POST', '/session/logout');
}
export function setupStatus() {
  return api('GET', '/setup/status');
}
export function setup(code) {
  return api('POST', '/setup', { code });
}

// ---- team, roster, messages
export function getBriefing() {
  return api('GET', '/briefing');
}
export function getRoster() {
  return api('GET', '/roster');
}
// q: URLSearchParams or an object of history filters (limit, before_id, with, thread…).
export function getHistory(q) {
  return api('GET', '/history' + query(q));
}
export function pushMessage(payload) {
  return api('POST', '/push', payload);
}

// ---- channels
export function getChannels() {
  return api('GET', '/channels');
}
export function getArchivedChannels() {
  return api('GET', '/channels?archived=true');
}
export function getChannel(slug) {
  return api('GET', '/channels/' + seg(slug));
}
export function createChannel(slug) {
  return api('POST', '/channels', { slug });
}
export function renameChannel(slug, to) {
  return api('PATCH', '/channels/' + seg(slug), { slug: to });
}
export function archiveChannel(slug) {
  return api('DELETE', '/channels/' + seg(slug));
}
// Joins the channel yourself (no member), or adds `member` (channel admins).
export function addChannelMember(slug, member) {
  return api('POST', '/channels/' + seg(slug) + '/members', member ? { member } : {});
}
export function removeChannelMember(slug, name) {
  return api('DELETE', '/channels/' + seg(slug) + '/members/' + seg(name));
}

// ---- objectives
export function getObjectives(q) {
  return api('GET', '/objectives' + query(q || {}));
}
export function getObjective(id) {
  return api('GET', '/objectives/' + seg(id));
}
export function createObjective(body) {
  return api('POST', '/objectives', body);
}
export function updateObjective(id, body) {
  return api('PATCH', '/objectives/' + seg(id), body);
}
// action: complete | cancel | reassign | watchers
export function objectiveAction(id, action, body) {
  return api('POST', '/objectives/' + seg(id) + '/' + action, body);
}
export function discussObjective(id, body) {
  return api('POST', '/objectives/' + seg(id) + '/discuss', { body });
}
export function objectiveActivity(id, q) {
  return api('GET', '/objectives/' + seg(id) + '/activity' + query(q));
}

// ---- files
export function writeFile(q, file) {
  return api('POST', '/fs/write' + query(q), file);
}
export function removeFile(path) {
  return api('DELETE', '/fs/rm' + query({ path, recursive: 'true' }));
}
export function statFile(path) {
  return api('GET', '/fs/stat' + query({ path }));
}
export function listDir(path) {
  return api('GET', '/fs/ls' + query({ path }));
}
export function sharedFiles() {
  return api('GET', '/fs/shared');
}
export function allFiles() {
  return api('GET', '/fs/all');
}

// ---- members, tokens, authenticators, permission presets
export function getPresets() {
  return api('GET', '/team/presets');
}
export function getMembers() {
  return api('GET', '/members');
}
export function createMember(body) {
  return api('POST', '/members', body);
}
export function updateMember(name, body) {
  return api('PATCH', '/members/' + seg(name), body);
}
export function deleteMember(name) {
  return api('DELETE', '/members/' + seg(name));
}
export function rotateToken(name) {
  return api('POST', '/members/' + seg(name) + '/rotate-token');
}
export function getTokens(name) {
  return api('GET', '/members/' + seg(name) + '/tokens');
}
export function revokeToken(name, id) {
  return api('DELETE', '/members/' + seg(name) + '/tokens/' + seg(id));
}
export function enrollTotp(name) {
  return api('POST', '/members/' + seg(name) + '/enroll-totp');
}
export function confirmTotp(name, code) {
  return api('POST', '/members/' + seg(name) + '/enroll-totp/confirm', { code });
}
export function memberActivity(name, q) {
  return api('GET', '/members/' + seg(name) + '/activity' + query(q));
}

// ---- device enrollments (ac7 connect)
export function pendingEnrollments() {
  return api('GET', '/enroll/pending');
}
export function approveEnrollment(body) {
  return api('POST', '/enroll/approve', body);
}
export function rejectEnrollment(userCode, reason) {
  return api('POST', '/enroll/reject', { userCode, reason });
}

// ---- Web Push
export function vapidPublicKey() {
  return api('GET', '/push/vapid-public-key');
}
export function addPushSubscription(sub) {
  return api('POST', '/push/subscriptions', sub);
}
export function removePushSubscription(id) {
  return api('DELETE', '/push/subscriptions/' + seg(String(id)));
}
