#!/usr/bin/env node
// Many tabs in several browser contexts of one headless Chromium, driven line by line (tests/e2e/tabs.py).
//
//   node tests/e2e/tabs.mjs [--start-timeout=MS]
//
// Reads one JSON command per line on stdin and answers each with one JSON line on stdout, in order:
//   {"op": "context"}                       -> {"ctx": N}       a fresh context (own cookies, storage, workers)
//   {"op": "open", "ctx": N, "url": U}      -> {"tab": N}       a new tab, once U reached DOMContentLoaded
//   {"op": "eval", "tab": N, "js": E}       -> {"value": V}     E evaluated in the tab (a promise is awaited)
//   {"op": "close", "tab": N}               -> {"t": MS}        closes the tab (Date.now() when it was closed)
// A failed command answers {"error": "..."}. End of stdin closes the browser and exits 0. Page errors and
// console lines go to stderr, prefixed with the tab. Browser: env SHMBUS_CHROMIUM, else /usr/bin/chromium.

import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const startArg = process.argv.find((a) => a.startsWith('--start-timeout='));
const startTimeout = Number(startArg ? startArg.slice('--start-timeout='.length) : 60000);

const browser = await chromium.launch({
  executablePath: process.env.SHMBUS_CHROMIUM || '/usr/bin/chromium',
  timeout: startTimeout,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking'],
});
const contexts = [];
const tabs = [];

async function run(cmd) {
  if (cmd.op === 'context') {
    contexts.push(await browser.newContext());
    return { ctx: contexts.length - 1 };
  }
  if (cmd.op === 'open') {
    const page = await contexts[cmd.ctx].newPage();
    const n = tabs.length;
    tabs.push(page);
    page.on('console', (msg) => process.stderr.write(`tab ${n} console.${msg.type()}: ${msg.text()}\n`));
    page.on('pageerror', (err) => process.stderr.write(`tab ${n} pageerror: ${err.message}\n`));
    await page.goto(cmd.url, { waitUntil: 'domcontentloaded', timeout: startTimeout });
    return { tab: n };
  }
  if (cmd.op === 'eval') return { value: await tabs[cmd.tab].evaluate(cmd.js) };
  if (cmd.op === 'close') {
    const t = Date.now();
    await tabs[cmd.tab].close();
    return { t };
  }
  throw new Error(`unknown op ${JSON.stringify(cmd.op)}`);
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let out;
  try {
    out = await run(JSON.parse(line));
  } catch (err) {
    out = { error: String((err && err.stack) || err) };
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
}
await browser.close().catch(() => {});
process.exit(0);
