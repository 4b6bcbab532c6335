// shmbus admin page: live plots of a bus's host-wide figures (uPlot), fed once a second by the admin app's
// Server-Sent Events stream of the bus's own SSE transport, or by polling snapshot.json where there is no
// stream (sync WSGI workers).
// ?report=N (for tests): after N samples, log what the plots hold as "SHMBUS:<json>" then "SHMBUS:DONE".
(function () {
  'use strict';

  const config = JSON.parse(document.body.dataset.config || '{}');
  const params = new URLSearchParams(location.search);
  const reportAfter = Number(params.get('report') || 0);
  const MAX_POINTS = 300;
  const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'];

  const times = [];
  const series = {
    publishes: [], deliveries: [], fill: [], history: [], listenerLag: [], relayLag: [], lost: [],
  };
  const perWorker = { clients: new Map(), deliveries: new Map() }; // pid -> values aligned with times
  const charts = {};
  let samples = 0;
  let tailChannel = params.get('tail') || config.tail || '';
  let tailAfter = null;
  let source = null;
  let pollTimer = null;

  document.getElementById('bus').textContent = config.bus || '';
  document.getElementById('tail-channel').value = tailChannel;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function fmt(n) {
    return typeof n === 'number' ? n.toLocaleString(undefined, { maximumFractionDigits: 1 }) : String(n);
  }

  function width(id) {
    return Math.max(document.getElementById(id).clientWidth || 460, 300);
  }

  // Every plot's y axes, with units. Each series names its axis (scale); the ring's fill % has its own 0-100 axis
  // on the left and its seconds of history their own on the right (it was drawn against the seconds).
  const AXES = {
    rates: [{ scale: 'n', label: 'messages / s' }],
    clients: [{ scale: 'n', label: 'clients held', whole: true }],
    deliveries: [{ scale: 'n', label: 'deliveries / s' }],
    ring: [{ scale: '%', label: 'ring fill (%)', range: [0, 100] }, { scale: 's', label: 'history (s)' }],
    lag: [{ scale: 'n', label: 'messages', whole: true }],
  };

  const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 1e6, 1e7];

  function tick(v) {
    if (v === null || v === undefined) return '';
    const a = Math.abs(v);
    if (a >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
    if (a >= 1e4) return `${+(v / 1e3).toFixed(1)}k`;
    return `${+v.toFixed(a < 10 && a % 1 ? 2 : 0)}`;
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  }

  function fromZero(fixed) {
    return (u, min, max) => (fixed || [0, max > 0 ? max * 1.1 : 1]);
  }

  function makeChart(name, id, labels, data, seriesScales) {
    const axes = AXES[name];
    const scales = { x: { time: true } };
    for (const a of axes) scales[a.scale] = { range: fromZero(a.range) };
    const opts = {
      width: width(id),
      height: 220,
      padding: [null, axes.length > 1 ? null : 30, null, null], // room for the last time label
      scales,
      series: [{ label: 'time', value: (u, t) => (t === null ? '--' : clock(t)) }].concat(labels.map((label, i) => ({
        label,
        stroke: COLORS[i % COLORS.length],
        width: 2,
        scale: (seriesScales && seriesScales[i]) || axes[0].scale,
        value: (u, v) => (v === null ? '--' : fmt(v)),
      }))),
      axes: [{
        scale: 'x',
        label: 'time',
        labelSize: 20,
        space: 70,
        incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
        values: (u, splits) => splits.map(clock),
      }].concat(axes.map((a, i) => ({
        scale: a.scale,
        label: a.label,
        labelSize: 20,
        side: i === 0 ? 3 : 1,
        size: 50,
        grid: { show: i === 0 },
        values: (u, splits) => splits.map(tick),
        ...(a.whole ? { incrs: WHOLE } : {}), // counts: no 2.5 clients
      }))),
    };
    const target = document.getElementById(id);
    target.textContent = '';
    return new uPlot(opts, data, target);
  }

  function trim(arr) {
    while (arr.length > MAX_POINTS) arr.shift();
  }

  function workerData(map) {
    return [...map.keys()].sort((a, b) => a - b).map((pid) => map.get(pid));
  }

  function workerChart(name, id, map) {
    const pids = [...map.keys()].sort((a, b) => a - b);
    const key = pids.join(',');
    const data = [times.slice()].concat(workerData(map).map((a) => a.slice()));
    if (!charts[name] || charts[name].key !== key) {
      if (charts[name]) charts[name].plot.destroy();
      charts[name] = { key, plot: makeChart(name, id, pids.map((p) => `pid ${p}`), data) };
    } else {
      charts[name].plot.setData(data);
    }
  }

  function fixedChart(name, id, labels, arrays, seriesScales) {
    const data = [times.slice()].concat(arrays.map((a) => a.slice()));
    if (!charts[name]) charts[name] = { key: '', plot: makeChart(name, id, labels, data, seriesScales) };
    else charts[name].plot.setData(data);
  }

  function record(sample) {
    times.push(sample.time);
    series.publishes.push(sample.rates.publishes);
    series.deliveries.push(sample.rates.deliveries);
    series.fill.push(sample.ring.fill_percent);
    series.history.push(sample.ring.history_seconds);
    series.listenerLag.push(Math.max(0, ...sample.processes.map((p) => p.listener_lag)));
    series.relayLag.push(sample.relay ? sample.relay.lag : 0);
    series.lost.push(sample.totals.lost);
    const seen = new Set();
    for (const p of sample.processes) {
      seen.add(p.pid);
      for (const [kind, value] of [['clients', p.parked + p.streams], ['deliveries', p.deliveries_per_s]]) {
        const map = perWorker[kind];
        if (!map.has(p.pid)) map.set(p.pid, new Array(times.length - 1).fill(null));
        map.get(p.pid).push(value);
      }
    }
    for (const map of Object.values(perWorker)) {
      for (const [pid, arr] of map) {
        if (!seen.has(pid)) arr.push(null);
        trim(arr);
        if (arr.every((v) => v === null)) map.delete(pid);
      }
    }
    trim(times);
    for (const arr of Object.values(series)) trim(arr);
  }

  function draw(sample) {
    fixedChart('rates', 'chart-rates', ['publishes/s', 'deliveries/s'], [series.publishes, series.deliveries]);
    workerChart('clients', 'chart-clients', perWorker.clients);
    workerChart('deliveries', 'chart-deliveries', perWorker.deliveries);
    fixedChart('ring', 'chart-ring', ['fill %', 'history s'], [series.fill, series.history], ['%', 's']);
    fixedChart('lag', 'chart-lag', ['listener lag (max)', 'relay lag', 'lost (total)'],
      [series.listenerLag, series.relayLag, series.lost]);

    const summary = document.getElementById('summary');
    summary.textContent = '';
    const relay = sample.relay ? `${sample.relay.state} (pid ${sample.relay.pid}), lag ${sample.relay.lag}` : 'none';
    for (const [label, value] of [
      ['publishes/s', fmt(sample.rates.publishes)],
      ['deliveries/s', fmt(sample.rates.deliveries)],
      ['ids', `${fmt(sample.oldest_global_id)}..${fmt(sample.global_id)}${sample.sparse_ids ? ' (sparse)' : ''}`],
      ['ring', `${fmt(sample.ring.fill_percent)}% , ${fmt(sample.ring.history_seconds)} s of history`],
      ['channels', `${fmt(sample.channels.count)} of ${fmt(sample.channels.max)}`],
      ['lost', fmt(sample.totals.lost)],
      ['relay', relay],
    ].concat(sample.has_metrics ? [] : [['per-worker figures', 'none: this segment predates metrics']])) {
      const d = el('div');
      d.append(el('span', `${label} `), el('b', value));
      summary.append(d);
    }

    const workers = document.getElementById('workers');
    workers.textContent = '';
    const head = el('tr');
    for (const h of ['pid', 'pub/s', 'deliv/s', 'parked', 'streams', 'lag', 'lost', 'relay']) head.append(el('th', h));
    workers.append(head);
    for (const p of sample.processes) {
      const row = el('tr');
      for (const v of [p.pid, fmt(p.publishes_per_s), fmt(p.deliveries_per_s), p.parked, p.streams,
        p.listener_lag, p.lost, p.relay]) row.append(el('td', v));
      workers.append(row);
    }

    const busiest = document.getElementById('busiest');
    busiest.textContent = '';
    const bh = el('tr');
    bh.append(el('th', 'channel'), el('th', 'site'), el('th', 'msgs/s'));
    busiest.append(bh);
    for (const c of sample.busiest) {
      const row = el('tr');
      row.append(el('td', c.channel), el('td', c.site_id || ''), el('td', fmt(c.per_s)));
      busiest.append(row);
    }
  }

  function showTail(tail) {
    if (!tail) return;
    tailAfter = tail.last_id;
    const table = document.getElementById('tail');
    for (const m of tail.messages) {
      const row = el('tr');
      row.append(el('td', m.id), el('td', new Date(m.time * 1000).toLocaleTimeString()));
      row.append(m.hidden ? el('td', m.hidden, 'hidden') : el('td', m.data));
      table.prepend(row);
    }
    while (table.rows.length > 40) table.deleteRow(table.rows.length - 1);
  }

  function report() {
    const out = { samples, transport: source ? 'sse' : 'poll', charts: {} };
    out.axes = {};
    out.dpr = window.devicePixelRatio || 1;
    for (const [name, c] of Object.entries(charts)) {
      const u = c.plot;
      out.charts[name] = u.series.slice(1).map((s, i) => ({
        label: s.label,
        scale: s.scale,
        points: u.data[i + 1].filter((v) => v !== null).length,
        max: Math.max(0, ...u.data[i + 1].filter((v) => v !== null)),
      }));
      // where the plot is drawn: the canvas (axes included) and the plotting area, in page pixels, so a test can
      // measure the axes on a screenshot; and each axis's scale, label, side and the tick values it shows
      const page = (r) => ({
        left: r.left + scrollX, top: r.top + scrollY, right: r.right + scrollX, bottom: r.bottom + scrollY,
      });
      out.axes[name] = {
        canvas: page(u.root.querySelector('canvas').getBoundingClientRect()),
        plot: page(u.over.getBoundingClientRect()),
        axes: u.axes.map((a) => ({ scale: a.scale, label: a.label, side: a.side, ticks: (a._values || []).slice() })),
        ranges: Object.fromEntries(Object.entries(u.scales).map(([k, sc]) => [k, [sc.min, sc.max]])),
      };
    }
    out.tail = [...document.querySelectorAll('#tail tr')].map((r) => r.textContent);
    return out;
  }

  function showPanels(panels) {
    // extra figures an app passes (AdminApp(panels={"push": connector.stats})): one line per panel
    const box = document.getElementById('panels');
    box.textContent = '';
    for (const [name, figures] of Object.entries(panels)) {
      const d = el('div');
      d.append(el('span', `${name} `));
      for (const [k, v] of Object.entries(figures)) d.append(el('span', ` ${k} `), el('b', v === null ? '-' : String(v)));
      box.append(d);
    }
  }

  function showPresence(presence) {
    // who is present per channel (docs/presence.md): the channels with the most clients, and their first members
    const table = document.getElementById('presence');
    const summary = document.getElementById('presence-summary');
    table.textContent = '';
    if (!presence) { summary.textContent = 'off'; return; }
    summary.textContent = `${fmt(presence.clients)} present on ${fmt(presence.channels)} channels` +
      ` (${presence.workers} announcing workers${presence.ready ? '' : ', still listening'})`;
    const head = el('tr');
    head.append(el('th', 'channel'), el('th', 'present'), el('th', 'members (client id: user id)'));
    table.append(head);
    for (const c of presence.busiest) {
      const row = el('tr');
      const names = c.members.map(function (m) { return m[1] === null ? m[0] : `${m[0]}: ${m[1]}`; }).join(', ');
      row.append(el('td', c.channel), el('td', fmt(c.count)), el('td', names));
      table.append(row);
    }
  }

  function onSample(body) {
    const status = document.getElementById('status');
    status.className = '';
    status.textContent = `updated ${new Date(body.sample.time * 1000).toLocaleTimeString()}`;
    record(body.sample);
    draw(body.sample);
    showPanels(body.panels || {});
    showPresence(body.presence);
    showTail(body.tail);
    samples += 1;
    if (reportAfter && samples === reportAfter) {
      console.log(`SHMBUS:${JSON.stringify(report())}`);
      console.log('SHMBUS:DONE');
    }
  }

  function tailQuery(withAfter) {
    const q = new URLSearchParams();
    if (tailChannel) {
      q.set('tail', tailChannel);
      if (withAfter && tailAfter !== null) q.set('after', String(tailAfter));
    }
    const s = q.toString();
    return s ? `?${s}` : '';
  }

  function poll() {
    fetch(`snapshot.json${tailQuery(true)}`, { credentials: 'same-origin', cache: 'no-store' })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`HTTP ${r.status}`))))
      .then(onSample)
      .catch((err) => {
        const status = document.getElementById('status');
        status.className = 'error';
        status.textContent = `error: ${err.message}`;
      })
      .finally(() => { pollTimer = setTimeout(poll, (config.interval || 1) * 1000); });
  }

  // The live feed is the bus's own SSE transport: this page listens on its view's channel, on which the
  // worker that holds the stream publishes one sample a second (process-local, targeted at admin viewers).
  const view = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, '0')).join('');
  const viewChannel = `/_shmbus_admin/${view}`;

  function connect() {
    if (source) source.close();
    if (pollTimer) clearTimeout(pollTimer);
    pollTimer = null;
    let opened = false;
    const q = tailQuery(false);
    source = new EventSource(`events?view=${view}${q ? `&${q.slice(1)}` : ''}`);
    source.onopen = () => { opened = true; };
    source.addEventListener(viewChannel, (ev) => onSample(JSON.parse(ev.data).data));
    source.onerror = () => {
      if (!opened) { // no stream here (a sync WSGI worker answers 503): poll instead
        source.close();
        source = null;
        poll();
      }
    };
  }

  document.getElementById('tail-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    tailChannel = document.getElementById('tail-channel').value.trim();
    tailAfter = null;
    document.getElementById('tail').textContent = '';
    if (source) connect();
  });

  window.shmbusAdmin = { charts, report };
  connect();
}());
