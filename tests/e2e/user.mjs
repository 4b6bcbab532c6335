#!/usr/bin/env node
// A person using two pages of an example app, in Debian's headless Chromium (tests/examples).
//
//   node tests/e2e/user.mjs --see=URL --say=URL --input=SELECTOR --list=SELECTOR --text=TEXT [--timeout=MS]
//   node tests/e2e/user.mjs --see=URL --say=URL --click=SELECTOR --list=SELECTOR --text=TEXT [--timeout=MS]
//   node tests/e2e/user.mjs --say=URL --click=SELECTOR --list=SELECTOR --text=TEXT [--grant=PERMISSION] [--offline=1]
//
// Opens the --see page, then the --say page; types TEXT into --input on the --say page and presses Enter (or
// clicks --click there); waits until TEXT shows inside --list on BOTH pages (without --see: on the --say page).
// Prints one JSON line {see, say}: the text of each list at the end. Exit 0 when both showed it, 3 on timeout,
// 1 on a browser or page failure. Page errors and failed requests go to stderr. Browser: env SHMBUS_CHROMIUM,
// else /usr/bin/chromium. --grant=notifications: the permission is granted (as a person clicking "Allow");
// --offline=1: no host name resolves but 127.0.0.1 (as on a machine offline: the browser's own push service too).

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const args = Object.fromEntries(
  process.argv.slice(2).map((a) => {
    const m = /^--([a-z]+)=(.*)$/s.exec(a);
    if (!m) {
      process.stderr.write(`user: bad argument ${JSON.stringify(a)}\n`);
      process.exit(2);
    }
    return [m[1], m[2]];
  }),
);
for (const name of ['say', 'list', 'text']) {
  if (!args[name]) {
    process.stderr.write(`user: --${name}= is required\n`);
    process.exit(2);
  }
}
if (!args.input === !args.click) {
  process.stderr.write('user: give one of --input= and --click=\n');
  process.exit(2);
}
const timeout = Number(args.timeout || 30000);

async function open(context, url) {
  const page = await context.newPage();
  page.on('pageerror', (err) => process.stderr.write(`pageerror ${url}: ${err.message}\n`));
  page.on('requestfailed', (req) =>
    process.stderr.write(`requestfailed: ${req.url()} ${req.failure()?.errorText ?? ''}\n`),
  );
  await page.goto(url, { timeout });
  return page;
}

async function main() {
  const userDataDir = mkdtempSync(join(tmpdir(), 'shmbus-chromium-'));
  let context = null;
  let code = 1;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: process.env.SHMBUS_CHROMIUM || '/usr/bin/chromium',
      headless: true,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--no-first-run',
        '--disable-background-networking',
        ...(args.offline ? ['--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'] : []),
      ],
    });
    if (args.grant) await context.grantPermissions(args.grant.split(','));
    const see = args.see ? await open(context, args.see) : null;
    const say = await open(context, args.say);
    if (args.click) {
      await say.click(args.click);
    } else {
      await say.fill(args.input, args.text);
      await say.press(args.input, 'Enter');
    }
    const shows = (page) =>
      page.waitForFunction(
        ([list, text]) => (document.querySelector(list)?.textContent || '').includes(text),
        [args.list, args.text],
        { timeout },
      );
    try {
      await Promise.all([see ? shows(see) : null, shows(say)]);
      code = 0;
    } catch (err) {
      process.stderr.write(`user: ${err.message}\n`);
      code = 3;
    }
    const text = (page) => (page ? page.$eval(args.list, (el) => el.textContent).catch(() => null) : null);
    process.stdout.write(`${JSON.stringify({ see: await text(see), say: await text(say) })}\n`);
  } catch (err) {
    process.stderr.write(`user: ${err.stack || err}\n`);
    code = 1;
  } finally {
    if (context) await context.close().catch(() => {});
    rmSync(userDataDir, { recursive: true, force: true });
  }
  process.stdout.write('', () => process.exit(code));
}

main();
