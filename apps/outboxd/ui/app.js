// outboxd's dashboard. Plain JavaScript, no framework, no build step: it reads outboxd's own
// JSON (/api/outbox, /api/outbox/rates, /api/outbox/relay, /readyz, /api/messages) and renders
// every value as text (textContent, createElement), never as markup, so a topic or payload
// holding "<script>" shows as those characters. The page's Content-Security-Policy allows no
// inline script or style and no other origin.
// When outboxd relays many databases (/api/outbox/relay has "databases"), a selector in the header
// chooses the one that every admin request names (?database=NAME): the message list, a message,
// replay, skip, abandon and the relays list. The choice is kept in the hash (#messages?database=x)
// and in localStorage; the overview lists the databases, relayed or not and why.
'use strict';

(function () {
  const TOKEN_KEY = 'outbox.token';
  const DATABASE_KEY = 'outbox.database';  // localStorage: the database last chosen
  const STATUSES = ['pending', 'processing', 'failed', 'abandoned', 'published'];
  const PAGES = ['overview', 'topics', 'messages', 'abandoned', 'relays'];
  const PAGE_SIZE = 50;
  const SVG = 'http://www.w3.org/2000/svg';

  const $ = (id) => document.getElementById(id);
  const state = {
    adminApi: null,       // whether outboxd has a token configured (null: not known yet)
    needsToken: false,    // true when outboxd answered 401 without one
    timer: null,
    messages: {query: null, after: null, pages: []},
    abandoned: {after: null, next: null, rows: []},
    pending: null,        // the change a confirmation would send
    databases: null,      // many databases: [{name, relaying, problem, published, failed}]; else null
    database: null,       // many databases: the name the admin requests send
  };

  // ---- DOM helpers: text only ----

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === 'string' || typeof child === 'number'
        ? document.createTextNode(String(child)) : child);
    }
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  function setText(id, text) { $(id).textContent = text; }
  function kvRows(table, rows) {
    clear(table);
    for (const [key, value] of rows) table.appendChild(el('tr', {}, el('th', {text: key}), el('td', {text: String(value)})));
  }

  function banner(text, kind) {
    const node = $('banner');
    if (!text) { node.hidden = true; node.textContent = ''; return; }
    node.textContent = text;
    node.className = 'banner ' + (kind || 'error');
    node.hidden = false;
  }

  // ---- formatting ----

  function fmtCount(value) {
    if (value === null || value === undefined || Number.isNaN(value)) return '–';
    return Math.round(value).toLocaleString('en-US');
  }
  function fmtSeconds(seconds) {
    if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return '–';
    if (seconds < 1) return Math.round(seconds * 1000) + ' ms';
    if (seconds < 120) return seconds.toFixed(1) + ' s';
    if (seconds < 7200) return (seconds / 60).toFixed(1) + ' min';
    if (seconds < 172800) return (seconds / 3600).toFixed(1) + ' h';
    return (seconds / 86400).toFixed(1) + ' d';
  }
  function fmtTime(text) { return text ? text.replace('T', ' ').replace(/\.\d+Z$/, 'Z') : ''; }
  function short(text, length) {
    if (!text) return '';
    return text.length > length ? text.slice(0, length - 1) + '…' : text;
  }

  // ---- the API ----

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

  async function api(path, options) {
    const init = Object.assign({method: 'GET', headers: {}, cache: 'no-store', credentials: 'omit'}, options || {});
    const current = token();
    if (current) init.headers['Authorization'] = 'Bearer ' + current;
    if (init.body !== undefined) init.headers['Content-Type'] = 'application/json';
    let response;
    try {
      response = await fetch(path, init);
    } catch (failure) {
      throw new ApiError(0, 'outboxd cannot be reached (' + failure.message + ')');
    }
    const text = await response.text();
    if (response.status === 401) {
      throw new ApiError(401, current
        ? 'The token was refused (401): nothing was changed. Enter the right token above.'
        : 'This outboxd needs a token: enter it above.');
    }
    const json = (response.headers.get('Content-Type') || '').startsWith('application/json') ? safeParse(text) : null;
    if (!response.ok && response.status !== 503) {
      throw new ApiError(response.status, (json && json.error) || text.trim() || ('HTTP ' + response.status));
    }
    if (!response.ok && json && json.error) throw new ApiError(response.status, json.error);
    return {status: response.status, json, text};
  }
  function safeParse(text) { try { return JSON.parse(text); } catch (e) { return null; } }

  // ---- many databases: the one the admin requests name ----

  // Whether this outboxd relays many databases (then every admin request needs ?database=NAME).
  function many() { return Array.isArray(state.databases); }
  function chosenDatabase() {
    return many() ? state.databases.find((d) => d.name === state.database) || null : null;
  }
  // `query` (URLSearchParams) with database=<name> added when outboxd relays many databases.
  function withDatabase(query, database) {
    const name = database === undefined ? state.database : database;
    if (many() && name) query.set('database', name);
    return query;
  }
  // An admin path with ?database=<name> (URL-encoded) when outboxd relays many databases.
  function adminPath(path, database) {
    const query = withDatabase(new URLSearchParams(), database).toString();
    return query ? path + '?' + query : path;
  }
  function problemText(database) { return (database.problem || '').replace(/\s+/g, ' ').trim(); }
  function storedDatabase() {
    try { return localStorage.getItem(DATABASE_KEY); } catch (e) { return null; }
  }
  function storeDatabase(name) {
    try { localStorage.setItem(DATABASE_KEY, name); } catch (e) { /* not kept: the hash still has it */ }
  }
  // The location's hash: "#<page>" or "#<page>?database=<name>".
  function hashParts() {
    const text = location.hash.replace(/^#/, '');
    const at = text.indexOf('?');
    return {page: at < 0 ? text : text.slice(0, at),
      database: at < 0 ? null : new URLSearchParams(text.slice(at + 1)).get('database')};
  }
  function pageHref(page) {
    return '#' + page + (many() && state.database ? '?database=' + encodeURIComponent(state.database) : '');
  }

  // The databases of /api/outbox/relay (undefined with one database). The choice: the one chosen
  // already, else the hash's, else the one last chosen in this browser, else the first relayed.
  function setDatabases(list) {
    if (!Array.isArray(list)) {
      state.databases = null;
      $('database-picker').hidden = true;
      $('database-note').hidden = true;
      $('databases-panel').hidden = true;
      return;
    }
    state.databases = list;
    const names = list.map((d) => d.name);
    if (!names.includes(state.database)) {
      const relayed = list.find((d) => d.relaying) || list[0];
      state.database = [hashParts().database, storedDatabase()].find((n) => n && names.includes(n)) ||
        (relayed ? relayed.name : null);
    }
    renderPicker();
  }

  function renderPicker() {
    const select = $('database-select');
    const signature = JSON.stringify(state.databases.map((d) => [d.name, d.relaying, d.problem]));
    if (state.pickerSignature !== signature) {  // rebuilt only when a database comes, goes or changes
      state.pickerSignature = signature;
      clear(select);
      for (const d of state.databases) {
        select.appendChild(el('option', {value: d.name,
          title: d.relaying ? d.name + ': relayed' : d.name + ': not relayed: ' + problemText(d),
          text: d.relaying ? d.name : d.name + ' (not relayed)'}));
      }
    }
    select.value = state.database || '';
    const chosen = chosenDatabase();
    select.title = !chosen ? '' : chosen.relaying ? chosen.name + ': relayed'
      : chosen.name + ': not relayed: ' + problemText(chosen);
    select.disabled = !state.databases.length;
    $('database-picker').hidden = false;
    for (const page of PAGES) $('nav-' + page).setAttribute('href', pageHref(page));
    const note = $('database-note');
    note.textContent = !state.databases.length
      ? 'outboxd relays many databases, but names none yet (its discovery catalog has no row, or cannot be read: see Readiness).'
      : chosen && !chosen.relaying ? 'Database ' + chosen.name + ' is not relayed: ' + problemText(chosen) : '';
    note.hidden = !note.textContent;
    if (currentPage() === 'overview') renderDatabases();
  }

  // The overview's table of databases: relayed or not (and why), this relay's counters for each.
  function renderDatabases() {
    $('databases-panel').hidden = !many();
    if (!many()) return;
    const body = clear($('databases-table').tBodies[0]);
    for (const d of state.databases) {
      const row = el('tr', {class: 'link' + (d.name === state.database ? ' selected' : ''), 'data-database': d.name},
        el('td', {class: 'mono', text: d.name}),
        el('td', {class: d.relaying ? 'ok' : 'bad', text: d.relaying ? 'relayed' : 'not relayed: ' + problemText(d)}),
        el('td', {class: 'num', text: fmtCount(d.published)}), el('td', {class: 'num', text: fmtCount(d.failed)}));
      row.addEventListener('click', () => chooseDatabase(d.name));
      body.appendChild(row);
    }
    if (!state.databases.length) {
      body.appendChild(el('tr', {}, el('td', {colspan: '4', class: 'muted', text: 'No database is named yet.'})));
    }
    const relayed = state.databases.filter((d) => d.relaying).length;
    setText('databases-note', relayed + ' of ' + state.databases.length + ' relayed. Published and failed: by this ' +
      'relay since it started. Select a row (or use the selector above) to browse that database.');
  }

  // The user chose another database: what was shown, or about to be changed, was the other's.
  function chooseDatabase(name) {
    if (!many() || name === state.database) return;
    state.database = name;
    storeDatabase(name);
    state.messages.after = null;
    state.messages.pages = [];
    state.abandoned.after = null;
    state.pending = null;
    $('ab-confirm').hidden = true;
    $('ab-result').textContent = '';
    $('message-detail').hidden = true;
    for (const table of ['messages-table', 'ab-table', 'relay-list']) clear($(table).tBodies[0]);
    clear($('relay-shared'));
    for (const id of ['messages-count', 'ab-count', 'relay-list-note']) setText(id, '');
    history.replaceState(null, '', pageHref(currentPage()));
    banner('');
    renderPicker();
    render();
  }

  async function refreshDatabases() {
    const relay = (await api('/api/outbox/relay')).json;
    if (relay && Array.isArray(relay.databases)) setDatabases(relay.databases);
  }

  // The admin pages with many databases and none to name: say so instead of asking.
  function noDatabase(body, colspan) {
    if (!many() || state.database) return false;
    clear(body).appendChild(el('tr', {}, el('td', {colspan: String(colspan), class: 'muted',
      text: 'No database to browse: outboxd names none yet.'})));
    return true;
  }
  // An admin request for a chosen database that is not relayed failed (it cannot be reached, say):
  // said where its data would be, under the note that says why it is not relayed, rather than in
  // a second banner. Any other failure is thrown on.
  function unreadable(failure, database, show) {
    const chosen = chosenDatabase();
    if (database !== state.database) return;  // another database was chosen meanwhile
    if (!chosen || chosen.relaying || failure.status === 401 || failure.status === 0) throw failure;
    show('Could not read database ' + chosen.name + ': ' + failure.message);
  }
  // A page of /api/messages for `query` in the chosen database; null when it could not be read
  // (said in `body`) or another database was chosen meanwhile (the answer is stale).
  async function listPage(query, body, colspan) {
    const database = state.database;
    let page;
    try {
      page = (await api('/api/messages?' + withDatabase(query).toString())).json;
    } catch (failure) {
      unreadable(failure, database, (text) => tableNote(body, colspan, text));
      return null;
    }
    return database === state.database ? page : null;
  }
  function tableNote(body, colspan, text) {
    clear(body).appendChild(el('tr', {}, el('td', {colspan: String(colspan), class: 'error-text', text})));
  }

  function reportError(failure) {
    if (failure.status === 401) {
      state.needsToken = true;
      renderTokenState();
    }
    banner(failure.message, 'error');
  }

  // ---- metrics from /api/outbox ----

  function series(metrics, name) {
    const family = metrics && metrics.metrics ? metrics.metrics[name] : null;
    return family ? family.series : [];
  }
  function gauge(metrics, name, labels) {
    for (const s of series(metrics, name)) {
      if (Object.entries(labels || {}).every(([k, v]) => s.labels[k] === v)) return s.value;
    }
    return null;
  }
  // The sum of a family's series (many databases: one series per database).
  function total(metrics, name) {
    const list = series(metrics, name);
    return list.length ? list.reduce((sum, s) => sum + s.value, 0) : null;
  }
  // A family's histograms added up, bucket by bucket (many databases: one per database).
  function mergedHistogram(list) {
    if (list.length <= 1) return list[0];
    const merged = {count: 0, sum: 0, buckets: list[0].buckets.map((b) => ({le: b.le, count: 0}))};
    for (const h of list) {
      merged.count += h.count;
      merged.sum += h.sum;
      h.buckets.forEach((b, i) => { if (merged.buckets[i]) merged.buckets[i].count += b.count; });
    }
    return merged;
  }
  // The q-quantile of a cumulative histogram, interpolated within its bucket (as Prometheus'
  // histogram_quantile does); null with no observations.
  function quantile(histogram, q) {
    if (!histogram || !histogram.count) return null;
    const rank = q * histogram.count;
    let previousBound = 0;
    let previousCount = 0;
    for (const bucket of histogram.buckets) {
      if (bucket.count >= rank) {
        if (bucket.le === '+Inf') return previousBound;
        const inBucket = bucket.count - previousCount;
        const fraction = inBucket > 0 ? (rank - previousCount) / inBucket : 0;
        return previousBound + (bucket.le - previousBound) * fraction;
      }
      if (bucket.le !== '+Inf') previousBound = bucket.le;
      previousCount = bucket.count;
    }
    return previousBound;
  }

  // ---- pages ----

  async function showOverview() {
    const [outbox, rates, ready] = await Promise.all([
      api('/api/outbox'), api('/api/outbox/rates'), api('/readyz'),
      many() ? refreshDatabases() : null]);
    const m = outbox.json;
    if (many()) {
      // The counts by status are not read per database in this mode: no tiles of zeros.
      $('count-cards').hidden = true;
      setText('counts-note', 'Counts by status are not read when outboxd relays many databases: ' +
        'choose a database above and browse its messages, or run outboxctl --database NAME status.');
      renderDatabases();
    } else {
      for (const status of STATUSES) {
        setText('count-' + status, fmtCount(gauge(m, 'outbox_messages', {status})));
      }
      setText('oldest-pending', fmtSeconds(gauge(m, 'outbox_oldest_pending_age_seconds')));
      const estimated = gauge(m, 'outbox_messages_estimated') === 1;
      const age = gauge(m, 'outbox_stats_age_seconds');
      setText('counts-note', (estimated ? 'Some counts are estimates (over 100,000 rows). ' : '') +
        (age !== null && age >= 0 ? 'Counts read from the database ' + fmtSeconds(age) + ' ago.' : 'Counts not read yet.'));
    }

    const isReady = ready.status === 200;
    const readyState = $('ready-state');
    readyState.textContent = isReady ? 'Ready' : 'Not ready';
    readyState.className = 'state ' + (isReady ? 'ok' : 'bad');
    const reasons = clear($('ready-reasons'));
    for (const line of ready.text.split('\n').filter((l) => l.trim())) {
      reasons.appendChild(el('li', {text: line}));
    }
    const sinks = clear($('sinks'));
    const reachable = series(m, 'outbox_sink_reachable');
    for (const s of reachable) {
      sinks.appendChild(el('li', {class: s.value === 1 ? 'ok' : 'bad',
        text: s.labels.sink + ': ' + (s.value === 1 ? 'reachable' : 'unreachable')}));
    }
    for (const s of series(m, 'outbox_relay_target_paused')) {
      if (s.value === 1) sinks.appendChild(el('li', {class: 'bad', text: 'target ' + s.labels.target + ': paused (no broker)'}));
    }
    if (!sinks.firstChild) sinks.appendChild(el('li', {class: 'muted', text: 'no broker to probe (file sinks are not checked)'}));

    const latency = mergedHistogram(series(m, 'outbox_publish_latency_seconds'));
    const rows = [];
    for (const [name, q] of [['p50', 0.5], ['p90', 0.9], ['p99', 0.99]]) {
      const value = quantile(latency, q);
      rows.push([name, value === null ? '–' : fmtSeconds(value)]);
    }
    rows.push(['published by this relay', fmtCount(latency ? latency.count : 0)]);
    kvRows($('latency'), rows);

    drawRates(rates.json);

    const errors = clear($('recent-errors'));
    const recent = (m.recent_errors || []).slice(-8).reverse();
    for (const e of recent) {
      errors.appendChild(el('li', {}, el('span', {class: 'muted', text: fmtTime(e.time) + ' '}),
        el('span', {class: 'tag', text: e.kind}), ' ', e.message));
    }
    if (!recent.length) errors.appendChild(el('li', {class: 'muted', text: 'none'}));
  }

  // The rates ring as an inline SVG: published/s and failures/s (failed + unconfirmed).
  function drawRates(rates) {
    const box = clear($('rates-chart'));
    const width = 640, height = 180, left = 44, bottom = 22, top = 8;
    const capacity = 900;
    const published = rates.published || [];
    const failures = (rates.failed || []).map((v, i) => v + ((rates.unconfirmed || [])[i] || 0));
    const max = Math.max(1, ...published, ...failures);
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    svg.setAttribute('class', 'rates');
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', 'published and failed messages per second');
    const x = (i, n) => left + (width - left - 4) * (capacity - n + i) / (capacity - 1);
    const y = (v) => top + (height - top - bottom) * (1 - v / max);
    const line = (x1, y1, x2, y2, cls) => {
      const node = document.createElementNS(SVG, 'line');
      node.setAttribute('x1', x1); node.setAttribute('y1', y1);
      node.setAttribute('x2', x2); node.setAttribute('y2', y2);
      node.setAttribute('class', cls);
      svg.appendChild(node);
    };
    const label = (tx, ty, text, anchor) => {
      const node = document.createElementNS(SVG, 'text');
      node.setAttribute('x', tx); node.setAttribute('y', ty);
      node.setAttribute('text-anchor', anchor || 'end');
      node.setAttribute('class', 'axis-label');
      node.textContent = text;
      svg.appendChild(node);
    };
    for (const fraction of [0, 0.5, 1]) {
      line(left, y(max * fraction), width - 4, y(max * fraction), 'grid-line');
      label(left - 4, y(max * fraction) + 4, fmtCount(max * fraction));
    }
    for (const minutes of [15, 10, 5, 0]) {
      const tx = left + (width - left - 4) * (1 - minutes / 15);
      label(tx, height - 6, minutes ? '-' + minutes + ' min' : 'now',
        minutes === 15 ? 'start' : minutes ? 'middle' : 'end');
    }
    const path = (values, cls) => {
      if (!values.length) return;
      const n = values.length;
      let d = '';
      values.forEach((v, i) => { d += (i ? 'L' : 'M') + x(i, n).toFixed(1) + ' ' + y(v).toFixed(1); });
      const node = document.createElementNS(SVG, 'path');
      node.setAttribute('d', d);
      node.setAttribute('class', cls);
      svg.appendChild(node);
    };
    path(published, 'series published');
    path(failures, 'series failures');
    box.appendChild(svg);
    const last = (values) => values.length ? values[values.length - 1] : 0;
    const sum = (values) => values.reduce((a, b) => a + b, 0);
    setText('rates-now', 'last second: ' + fmtCount(last(published)) + ' published, ' +
      fmtCount(last(failures)) + ' failures; last 15 min: ' + fmtCount(sum(published)) +
      ' published, ' + fmtCount(sum(failures)) + ' failures');
  }

  async function showTopics() {
    const m = (await api('/api/outbox')).json;
    const body = clear($('topics-table').tBodies[0]);
    const skipped = gauge(m, 'outbox_messages_by_topic_skipped') === 1;
    const rows = series(m, 'outbox_messages_by_topic');
    for (const s of rows) {
      const {status, target, topic} = s.labels;
      const other = topic === '_other' && target === '_other';
      const row = el('tr', {class: other ? '' : 'link'}, el('td', {text: status}), el('td', {text: target}),
        el('td', {class: 'wrap', text: topic}), el('td', {class: 'num', text: fmtCount(s.value)}));
      if (!other) {
        row.addEventListener('click', () => {
          setFilters({status, topic, target});
          location.hash = '#messages';
        });
      }
      body.appendChild(row);
    }
    if (!rows.length) {
      body.appendChild(el('tr', {}, el('td', {colspan: '4', class: 'muted',
        text: many() ? 'Not counted when outboxd relays many databases: choose a database above and browse its messages.'
          : skipped ? 'Skipped: the backlog is too large to group exactly (or the count timed out); see the counts on the overview.'
          : 'Nothing is waiting: every message is published.'})));
    }
  }

  function readonlyNotice(node, colspan) {
    clear(node).appendChild(el('tr', {}, el('td', {colspan: String(colspan), class: 'muted',
      text: 'Read-only: this outboxd has no [http] token, so the admin API (messages, replay, abandon) is off. Set [http] token or OUTBOX_HTTP_TOKEN to use this page.'})));
  }

  // ---- messages ----

  function filterQuery(prefix) {
    const query = new URLSearchParams();
    const add = (key, id) => { const v = $(id) ? $(id).value.trim() : ''; if (v) query.set(key, v); };
    if (prefix === 'f') {
      add('status', 'f-status'); add('topic', 'f-topic'); add('stream', 'f-stream');
      add('target', 'f-target'); add('older_than', 'f-older'); add('event', 'f-event');
    } else {
      add('status', 'ab-status'); add('topic', 'ab-topic'); add('stream', 'ab-stream');
      add('target', 'ab-target'); add('older_than', 'ab-older');
      // "held": the abandoned messages that hold their stream (on_abandon = "hold").
      if (query.get('status') === 'held') { query.set('status', 'abandoned'); query.set('held', 'true'); }
    }
    return query;
  }
  function setFilters(values) {
    $('f-status').value = values.status || '';
    $('f-topic').value = values.topic || '';
    $('f-target').value = values.target || '';
    $('f-stream').value = '';
    $('f-older').value = '';
    $('f-event').value = '';
    state.messages.after = null;
    state.messages.pages = [];
  }

  async function showMessages() {
    const body = $('messages-table').tBodies[0];
    if (state.adminApi === false) { readonlyNotice(body, 8); return; }
    if (noDatabase(body, 8)) return;
    const query = filterQuery('f');
    query.set('limit', String(PAGE_SIZE));
    if (state.messages.after) query.set('after', state.messages.after);
    const page = await listPage(query, body, 8);
    if (!page) return;
    clear(body);
    for (const message of page.messages) {
      const row = el('tr', {class: 'link', 'data-id': message.id},
        el('td', {class: 'mono', text: message.id}), el('td', {class: 'nowrap', text: fmtTime(message.created_at)}),
        el('td', {}, el('span', {class: 'status ' + message.status, text: message.status}),
          message.holds_stream ? el('span', {class: 'muted', text: ' holds its stream'}) : null),
        el('td', {class: 'wrap', text: message.topic}), el('td', {text: message.target}),
        el('td', {text: message.stream_key || ''}), el('td', {class: 'num', text: String(message.attempts)}),
        el('td', {class: 'error-text', text: short(message.last_error, 80)}));
      row.addEventListener('click', () => showDetail(message.id).catch(reportError));
      body.appendChild(row);
    }
    if (!page.messages.length) body.appendChild(el('tr', {}, el('td', {colspan: '8', class: 'muted', text: 'No message matches.'})));
    state.messages.next = page.next_after;
    $('messages-next').disabled = !page.more;
    $('messages-first').disabled = !state.messages.after;
    setText('messages-count', page.messages.length + ' shown' + (many() ? ' from database ' + state.database : '') +
      (page.more ? ', more after these' : ''));
  }

  async function showDetail(id) {
    const database = state.database;
    const message = (await api(adminPath('/api/messages/' + encodeURIComponent(id)))).json;
    if (database !== state.database) return;
    const panel = clear($('message-detail'));
    panel.hidden = false;
    panel.appendChild(el('h2', {text: 'Message'}));
    const fields = el('table', {class: 'kv', id: 'detail-fields'});
    kvRows(fields, [
      ['id', message.id], ['event id', message.event_id], ['topic', message.topic],
      ['target', message.target], ['type', message.type || ''], ['stream', message.stream_key || ''],
      ['stream seq', message.stream_seq === null ? '' : message.stream_seq], ['partition', message.partition],
      ['status', message.status], ['attempts', message.attempts], ['created', fmtTime(message.created_at)],
      ['available', fmtTime(message.available_at)], ['abandoned', fmtTime(message.abandoned_at)],
      ['published', fmtTime(message.published_at)], ['lease owner', message.lease_owner || ''],
      ['content type', message.content_type], ['payload', message.payload_bytes + ' bytes (' + message.payload_encoding + ')'],
    ]);
    panel.appendChild(fields);
    panel.appendChild(el('h3', {text: 'Last error'}));
    panel.appendChild(el('pre', {id: 'detail-error', class: 'error-text', text: message.last_error || '(none)'}));
    panel.appendChild(el('h3', {text: 'Headers'}));
    const headers = el('table', {class: 'kv', id: 'detail-headers'});
    kvRows(headers, Object.entries(message.headers || {}));
    if (!Object.keys(message.headers || {}).length) headers.appendChild(el('tr', {}, el('td', {class: 'muted', text: '(none)'})));
    panel.appendChild(headers);
    panel.appendChild(el('h3', {text: 'Payload' + (message.payload_encoding === 'hex' ? ' (hex: not printable text)' : '')}));
    panel.appendChild(el('pre', {id: 'detail-payload', class: 'payload', text: prettyPayload(message)}));
  }
  function prettyPayload(message) {
    if (message.payload_encoding === 'hex') return message.payload.replace(/(.{64})/g, '$1\n');
    if ((message.content_type || '').includes('json')) {
      try { return JSON.stringify(JSON.parse(message.payload), null, 2); } catch (e) { /* as is */ }
    }
    return message.payload;
  }

  // ---- abandoned: replay, abandon with reason ----

  async function showAbandoned() {
    const body = $('ab-table').tBodies[0];
    const disabled = state.adminApi === false;
    for (const id of ['ab-replay', 'ab-skip', 'ab-abandon', 'ab-reason', 'ab-search']) $(id).disabled = disabled;
    if (disabled) { readonlyNotice(body, 8); return; }
    if (noDatabase(body, 8)) return;
    const query = filterQuery('ab');
    query.set('limit', String(PAGE_SIZE));
    if (state.abandoned.after) query.set('after', state.abandoned.after);
    const page = await listPage(query, body, 8);
    if (!page) return;
    clear(body);
    $('ab-all').checked = false;
    for (const message of page.messages) {
      const box = el('input', {type: 'checkbox', class: 'ab-select', 'data-id': message.id,
        'aria-label': 'select ' + message.id});
      body.appendChild(el('tr', {'data-id': message.id}, el('td', {}, box),
        el('td', {class: 'mono', text: message.id}), el('td', {class: 'nowrap', text: fmtTime(message.created_at)}),
        el('td', {}, el('span', {class: 'status ' + message.status, text: message.status}),
          message.holds_stream ? el('span', {class: 'muted', text: ' holds its stream'}) : null),
        el('td', {class: 'wrap', text: message.topic}), el('td', {text: message.target}),
        el('td', {class: 'num', text: String(message.attempts)}),
        el('td', {class: 'error-text', text: short(message.last_error, 100)})));
    }
    if (!page.messages.length) body.appendChild(el('tr', {}, el('td', {colspan: '8', class: 'muted', text: 'No message matches.'})));
    state.abandoned.next = page.next_after;
    $('ab-next').disabled = !page.more;
    setText('ab-count', page.messages.length + ' shown' + (many() ? ' from database ' + state.database : '') +
      (page.more ? ', more after these' : ''));
  }

  // The body of a replay or abandon: the selected ids, or the filter.
  function changeBody(kind) {
    const body = {};
    if ($('ab-scope-all').checked) {
      for (const [key, value] of filterQuery('ab').entries()) body[key] = value;
    } else {
      const ids = Array.from(document.querySelectorAll('.ab-select:checked')).map((b) => b.getAttribute('data-id'));
      if (!ids.length) throw new ApiError(400, 'Select at least one message (or choose "every message matching the filter").');
      body.ids = ids;
    }
    if (kind === 'abandon') {
      const reason = $('ab-reason').value.trim();
      if (!reason) throw new ApiError(400, 'Abandoning needs a reason: it is kept as the message\'s last error.');
      body.reason = reason;
    }
    return body;
  }

  // Step one: a dry run, whose count the confirmation shows.
  async function prepareChange(kind) {
    banner('');
    $('ab-result').textContent = '';
    const body = changeBody(kind);
    if (many() && !state.database) throw new ApiError(400, 'Choose a database first.');
    const database = state.database;  // the confirmation acts on this one, whatever is chosen later
    const dry = (await api(adminPath('/api/messages/' + kind, database), {method: 'POST', body: JSON.stringify(Object.assign({dry_run: true}, body))})).json;
    if (database !== state.database) return;
    state.pending = {kind, body, count: dry.count, database};
    setText('ab-confirm-text', 'Dry run: this would ' + kind + ' ' + dry.count + ' message' + (dry.count === 1 ? '' : 's') +
      (kind === 'abandon' ? ' with the reason "' + body.reason + '"' : '') +
      (many() ? ' in database ' + database : '') + '.');
    $('ab-confirm-go').textContent = {replay: 'Replay ', skip: 'Skip ', abandon: 'Abandon '}[kind] + dry.count;
    $('ab-confirm-go').disabled = dry.count === 0;
    $('ab-confirm').hidden = false;
  }
  // Step two: the change itself.
  async function confirmChange() {
    const pending = state.pending;
    state.pending = null;
    $('ab-confirm').hidden = true;
    if (!pending) return;
    const done = (await api(adminPath('/api/messages/' + pending.kind, pending.database), {method: 'POST', body: JSON.stringify(Object.assign({dry_run: false}, pending.body))})).json;
    const said = {replay: ['Replayed ', ': they are pending again, with their ids unchanged.'],
      skip: ['Skipped ', ': their streams go on past them; they stay abandoned.'], abandon: ['Abandoned ', '.']}[pending.kind];
    setText('ab-result', said[0] + done.count + ' message' + (done.count === 1 ? '' : 's') +
      (many() ? ' in database ' + pending.database : '') + said[1]);
    state.abandoned.after = null;
    await showAbandoned();
  }

  // ---- relays ----

  async function showRelays() {
    const [relay, outbox] = await Promise.all([api('/api/outbox/relay'), api('/api/outbox')]);
    const r = relay.json;
    const m = outbox.json;
    if (Array.isArray(r.databases)) setDatabases(r.databases);
    // Many databases: the relay's series are per database, so add them up.
    const sum = (name) => many() ? total(m, name) : gauge(m, name);
    const rows = [
      ['instance', r.instance], ['version', r.version], ['database', r.database],
      ['partitions held', r.partitions_owned], ['takeovers (partitions taken from an expired lease)', r.takeovers],
      ['rebalances', fmtCount(sum('outbox_relay_rebalances_total'))],
      ['messages leased now', fmtCount(sum('outbox_relay_leases_held'))],
      ['published', fmtCount(r.published)], ['failed (attempt spent)', fmtCount(r.failed)],
      ['unconfirmed (republished)', fmtCount(r.unconfirmed)],
      ['admin API', r.admin_api ? 'on (token required)' : 'off (no token configured)'],
    ];
    if (many()) {
      rows.splice(3, 0, ['databases', state.databases.filter((d) => d.relaying).length + ' of ' +
        state.databases.length + ' relayed']);
    }
    kvRows($('relay-self'), rows);
    const body = $('relay-list').querySelector('tbody');
    if (many()) {
      // The shared gauges are not read per database: the chosen database's relays list says it.
      setText('relay-shared-title', 'Relays on database ' + (state.database || '(none)'));
      if (!state.database) { clear(body); setText('relay-list-note', 'No database is named yet.'); return; }
    } else {
      kvRows($('relay-shared'), [
        ['live relays (heartbeating)', fmtCount(gauge(m, 'outbox_relays_live'))],
        ['relays holding message leases', fmtCount(gauge(m, 'outbox_lease_owners'))],
        ['partitions no live relay holds', fmtCount(gauge(m, 'outbox_partitions_unowned'))],
      ]);
    }
    const database = state.database;
    let list;
    try {
      list = (await api(adminPath('/api/outbox/relays'))).json;
    } catch (failure) {
      if (!many()) throw failure;
      clear(body);
      clear($('relay-shared'));
      setText('relay-list-note', '');
      unreadable(failure, database, (text) => setText('relay-list-note', text));
      return;
    }
    if (database !== state.database) return;
    if (many()) {
      kvRows($('relay-shared'), [
        ['live relays (heartbeating)', fmtCount(list.relays.length)],
        ['partitions no live relay holds', fmtCount(list.unowned_partitions)],
        ['partitions this relay holds', fmtCount(gauge(m, 'outbox_relay_partitions_owned', {database}))],
        ['published by this relay', fmtCount(gauge(m, 'outbox_published_total', {database}))],
      ]);
    }
    clear(body);
    for (const relay of list.relays) {
      body.appendChild(el('tr', {},
        el('td', {class: 'mono', text: relay.owner}),
        el('td', {text: fmtTime(relay.started_at)}),
        el('td', {text: fmtTime(relay.heartbeat_at)}),
        el('td', {text: fmtTime(relay.expires_at)}),
        el('td', {class: 'num', text: String(relay.partitions.length)}),
        el('td', {class: 'mono', text: partitionRanges(relay.partitions)}),
        el('td', {text: relay.next_lease_expiry ? fmtTime(relay.next_lease_expiry) : '–'})));
    }
    setText('relay-list-note', list.partition_count === 0
      ? 'This store has no partition leases (SQLite: one relay per database file).'
      : list.relays.length + ' live relay' + (list.relays.length === 1 ? '' : 's') + ', ' +
        list.partition_count + ' partitions, ' + list.unowned_partitions + ' held by nobody; ' +
        list.lease_acquisitions + ' lease acquisitions (joins, hand-overs and takeovers) since the schema was created. ' +
        'Database time ' + fmtTime(list.database_now) + '.');
  }

  // [0, 1, 2, 5] -> "0–2, 5"
  function partitionRanges(partitions) {
    const parts = [];
    for (let i = 0; i < partitions.length;) {
      let j = i;
      while (j + 1 < partitions.length && partitions[j + 1] === partitions[j] + 1) ++j;
      parts.push(i === j ? String(partitions[i]) : partitions[i] + '–' + partitions[j]);
      i = j + 1;
    }
    return parts.join(', ');
  }

  // ---- token and navigation ----

  function renderTokenState() {
    const hasToken = !!token();
    const offerForm = state.adminApi !== false && (!hasToken || state.needsToken);
    $('token-form').hidden = !offerForm;
    $('token-state').hidden = !hasToken || state.needsToken;
  }

  async function useToken(candidate) {
    sessionStorage.setItem(TOKEN_KEY, candidate);
    try {
      await api('/api/outbox/relay');
    } catch (failure) {
      sessionStorage.removeItem(TOKEN_KEY);
      throw failure.status === 401 ? new ApiError(401, 'The token was refused (401). Nothing was changed; try again.') : failure;
    }
    state.needsToken = false;
    $('token-input').value = '';
    banner('');
    await probe();
    renderTokenState();
    await render();
  }

  // What this outboxd offers: whether it needs a token, whether the admin API is on.
  async function probe() {
    try {
      const relay = (await api('/api/outbox/relay')).json;
      state.adminApi = relay.admin_api;
      state.needsToken = false;
      setDatabases(relay.databases);
      setText('instance', relay.instance + ' · ' + relay.version + ' · ' + relay.database +
        (many() ? ' · ' + state.databases.length + ' databases' : ''));
      if (!relay.admin_api) {
        banner('Read-only: this outboxd has no [http] token configured, so the admin API (the message browser, replay and abandon) is off. Counts, rates and readiness are shown.', 'info');
      }
    } catch (failure) {
      if (failure.status === 401) {
        state.needsToken = true;
        banner(token() ? 'The token was refused (401): enter the right one above.' : 'This outboxd needs its admin token: enter it above (it is kept for this tab only).', token() ? 'error' : 'info');
        if (token()) sessionStorage.removeItem(TOKEN_KEY);
      } else {
        banner(failure.message, 'error');
      }
    }
    renderTokenState();
  }

  function currentPage() {
    const name = hashParts().page;
    return PAGES.includes(name) ? name : 'overview';
  }

  async function render() {
    const page = currentPage();
    for (const name of PAGES) {
      $('page-' + name).hidden = name !== page;
      $('nav-' + name).className = name === page ? 'active' : '';
    }
    document.body.setAttribute('data-page', page);
    // Many databases: the hash names the chosen one, so that a link or a reload shows it again.
    if (many() && state.database && hashParts().database !== state.database) {
      history.replaceState(null, '', pageHref(page));
    }
    if (state.needsToken) return;
    try {
      if (page === 'overview') await showOverview();
      else if (page === 'topics') await showTopics();
      else if (page === 'messages') await showMessages();
      else if (page === 'abandoned') await showAbandoned();
      else if (page === 'relays') await showRelays();
      document.body.setAttribute('data-rendered', page);
    } catch (failure) {
      reportError(failure);
    }
  }

  // The overview, topics and relays refresh themselves; the lists only on request.
  function schedule() {
    if (state.timer) clearInterval(state.timer);
    state.timer = setInterval(() => {
      if (document.hidden || state.needsToken) return;
      const page = currentPage();
      if (page === 'overview') showOverview().catch(reportError);
      else if (page === 'topics') showTopics().catch(reportError);
      else if (page === 'relays') showRelays().catch(reportError);
      else if (many()) refreshDatabases().catch(reportError);  // which are relayed, for the selector
    }, 2000);
  }

  function wire() {
    window.addEventListener('hashchange', () => {
      banner('');
      // A hash that names another database (a link, or typed): choose it.
      const wanted = hashParts().database;
      if (many() && wanted && wanted !== state.database) {
        if (state.databases.some((d) => d.name === wanted)) { chooseDatabase(wanted); return; }
        banner('No database named "' + wanted + '" is relayed here; showing ' + (state.database || 'none') + '.', 'error');
      }
      render();
    });
    $('database-select').addEventListener('change', () => chooseDatabase($('database-select').value));
    $('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const candidate = $('token-input').value.trim();
      if (!candidate) return;
      useToken(candidate).catch(reportError);
    });
    $('token-forget').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
    $('filter-form').addEventListener('submit', (event) => {
      event.preventDefault();
      banner('');
      state.messages.after = null;
      state.messages.pages = [];
      $('message-detail').hidden = true;
      showMessages().catch(reportError);
    });
    $('messages-next').addEventListener('click', () => {
      state.messages.pages.push(state.messages.after);
      state.messages.after = state.messages.next;
      showMessages().catch(reportError);
    });
    $('messages-first').addEventListener('click', () => {
      state.messages.after = null;
      state.messages.pages = [];
      showMessages().catch(reportError);
    });
    $('ab-form').addEventListener('submit', (event) => {
      event.preventDefault();
      banner('');
      state.abandoned.after = null;
      $('ab-confirm').hidden = true;
      showAbandoned().catch(reportError);
    });
    $('ab-next').addEventListener('click', () => {
      state.abandoned.after = state.abandoned.next;
      showAbandoned().catch(reportError);
    });
    $('ab-all').addEventListener('change', () => {
      for (const box of document.querySelectorAll('.ab-select')) box.checked = $('ab-all').checked;
    });
    $('ab-replay').addEventListener('click', () => prepareChange('replay').catch(reportError));
    $('ab-skip').addEventListener('click', () => prepareChange('skip').catch(reportError));
    $('ab-abandon').addEventListener('click', () => prepareChange('abandon').catch(reportError));
    $('ab-confirm-go').addEventListener('click', () => confirmChange().catch(reportError));
    $('ab-confirm-cancel').addEventListener('click', () => { state.pending = null; $('ab-confirm').hidden = true; });
  }

  async function start() {
    wire();
    await probe();
    await render();
    schedule();
  }

  document.addEventListener('DOMContentLoaded', () => { start(); });
})();
