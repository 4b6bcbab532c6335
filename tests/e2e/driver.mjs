#!/usr/bin/env node
// Open one page in Debian's headless Chromium and relay what it reports, for Python tests.
//
//   node tests/e2e/driver.mjs URL [--timeout=MS] [--start-timeout=MS] [--screenshot=PATH]
//
// The page reports by console.log("SHMBUS:" + payload). Each payload is printed to stdout as
// one JSON line (a payload that is valid JSON is re-printed compactly, anything else becomes a
// JSON string), in the order logged. The page ends the run with console.log("SHMBUS:DONE").
// URL is used exactly as given: the page's options travel in its query string.
//
// Exit codes: 0 after SHMBUS:DONE; 3 on timeout (messages so far are still printed);
// 1 if the browser cannot start or the page cannot load. Everything else (other console
// lines, page errors, failed requests) goes to stderr, prefixed, for debugging.
// Timeout: --timeout=MS, else env SHMBUS_E2E_TIMEOUT_MS, else 30000: the page's budget, counted
// from its DOMContentLoaded (its parser-run scripts have run, and what they logged is already
// relayed), so a slow or loaded machine's Chromium start is not taken from it. Starting the
// browser and loading the page to that point have a bound of their own: --start-timeout=MS, else
// env SHMBUS_E2E_START_TIMEOUT_MS, else 60000, each (past it: exit 1).
// Browser: env SHMBUS_CHROMIUM, else /usr/bin/chromium (never a downloaded browser).
// --screenshot=PATH saves a PNG of the page when it logs SHMBUS:DONE (before the browser closes).

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const PREFIX = 'SHMBUS:';
const DONE = 'DONE';

function usage(message) {
  process.stderr.write(`driver: ${message}\nusage: node driver.mjs URL [--timeout=MS] [--start-timeout=MS]\n`);
  process.exit(2);
}

function parseArgs(argv) {
  let url = null;
  let screenshot = null;
  let timeout = Number(process.env.SHMBUS_E2E_TIMEOUT_MS || 30000);
  let startTimeout = Number(process.env.SHMBUS_E2E_START_TIMEOUT_MS || 60000);
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg.startsWith('--timeout=')) timeout = Number(arg.slice('--timeout='.length));
    else if (arg === '--timeout') timeout = Number(argv[(i += 1)]);
    else if (arg.startsWith('--start-timeout=')) startTimeout = Number(arg.slice('--start-timeout='.length));
    else if (arg.startsWith('--screenshot=')) screenshot = arg.slice('--screenshot='.length);
    else if (url === null) url = arg;
    else usage(`unexpected argument ${JSON.stringify(arg)}`);
  }
  if (!url) usage('missing URL');
  if (!Number.isFinite(timeout) || timeout <= 0) usage('timeout must be a positive number of ms');
  if (!Number.isFinite(startTimeout) || startTimeout <= 0) usage('start timeout must be a positive number of ms');
  return { url, timeout, startTimeout, screenshot };
}

function relay(payload) {
  let line;
  try {
    line = JSON.stringify(JSON.parse(payload));
  } catch {
    line = JSON.stringify(payload);
  }
  process.stdout.write(`${line}\n`);
}

async function main() {
  const { url, timeout, startTimeout, screenshot } = parseArgs(process.argv.slice(2));
  const executablePath = process.env.SHMBUS_CHROMIUM || '/usr/bin/chromium';
  const userDataDir = mkdtempSync(join(tmpdir(), 'shmbus-chromium-'));
  let context = null;
  let exitCode = 1;
  let over = false;
  let finish;
  const finished = new Promise((resolve) => {
    finish = (code) => {
      over = true;
      resolve(code);
    };
  });
  let timer = null;
  // The page's budget starts once it is ready (see the header): never during Chromium's start.
  const startBudget = () => {
    if (over || timer !== null) return;
    timer = setTimeout(() => {
      process.stderr.write(`driver: timeout after ${timeout} ms (from DOMContentLoaded) without ${PREFIX}${DONE}\n`);
      finish(3);
    }, timeout);
  };
  // A killed driver must not leave Chromium or its profile behind.
  for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
    process.on(sig, () => finish(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGHUP' ? 1 : 15)));
  }
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath,
      timeout: startTimeout,
      headless: true,
      handleSIGINT: false,
      handleSIGTERM: false,
      handleSIGHUP: false,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    const page = context.pages()[0] || (await context.newPage());
    page.on('console', (msg) => {
      const text = msg.text();
      if (over) return;
      if (text.startsWith(PREFIX)) {
        const payload = text.slice(PREFIX.length);
        if (payload === DONE) finish(0);
        else relay(payload);
      } else {
        process.stderr.write(`console.${msg.type()}: ${text}\n`);
      }
    });
    page.on('pageerror', (err) => process.stderr.write(`pageerror: ${err.message}\n`));
    page.on('requestfailed', (req) =>
      process.stderr.write(`requestfailed: ${req.url()} ${req.failure()?.errorText ?? ''}\n`),
    );
    // Console events reach us in the order the page logged them, before the navigation's
    // DOMContentLoaded: what the page's scripts logged while loading is relayed before the budget runs.
    page.goto(url, { waitUntil: 'domcontentloaded', timeout: startTimeout }).then(startBudget, (err) => {
      if (over) return; // closing the browser aborts a pending navigation
      process.stderr.write(`driver: cannot load ${url}: ${err.message}\n`);
      finish(1);
    });
    exitCode = await finished;
    if (screenshot && exitCode === 0) {
      await page.screenshot({ path: screenshot, fullPage: true }).catch((err) => {
        process.stderr.write(`driver: screenshot failed: ${err.message}\n`);
      });
    }
  } catch (err) {
    process.stderr.write(`driver: ${err.stack || err}\n`);
    exitCode = 1;
  } finally {
    if (timer !== null) clearTimeout(timer);
    if (context) await context.close().catch(() => {});
    rmSync(userDataDir, { recursive: true, force: true });
  }
  // Let stdout drain before exiting (it may be a pipe to the Python test).
  process.stdout.write('', () => process.exit(exitCode));
}

main();
