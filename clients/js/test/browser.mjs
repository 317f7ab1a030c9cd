// Drives Debian's Chromium (headless) for the Python tests (tests/browser.py): one page, commands as JSON lines
// on stdin, answers as JSON lines on stdout; the page's console and errors go to stderr.
//
//   node test/browser.mjs USER_DATA_DIR [EXTENSION_DIR]      (an unpacked extension to load)
//   {"id": 1, "op": "goto", "url": "http://..."}              -> {"id": 1, "ok": true}
//   {"id": 4, "op": "newpage"}                                -> {"id": 4, "ok": true, "value": 1}
//   any command with "page": 1 runs on that page (default: the first)
//   {"id": 2, "op": "eval", "expr": "1 + 1"}                 -> {"id": 2, "ok": true, "value": 2}
//   {"id": 3, "op": "wait", "expr": "...", "timeoutMs": 5000} -> the expression's first truthy value

import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const EXECUTABLE = process.env.DAOP_CHROMIUM ?? '/usr/bin/chromium';
const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

const extension = process.argv[3];
const EXTENSION_ARGS = extension ? [`--disable-extensions-except=${extension}`, `--load-extension=${extension}`] : [];
const context = await chromium.launchPersistentContext(process.argv[2], {
  executablePath: EXECUTABLE, headless: true, args: [...ARGS, ...EXTENSION_ARGS],
});
const pages = [];

function follow(page) {
  const n = pages.push(page) - 1;
  page.on('console', (message) => process.stderr.write(`[page ${n} console.${message.type()}] ${message.text()}\n`));
  page.on('pageerror', (error) => process.stderr.write(`[page ${n} pageerror] ${error.stack ?? error}\n`));
  return n;
}
follow(context.pages()[0] ?? await context.newPage());

async function perform(command) {
  const page = pages[command.page ?? 0];
  switch (command.op) {
    case 'newpage':
      return follow(await context.newPage());
    case 'goto':
      await page.goto(command.url);
      return null;
    case 'eval':
      return await page.evaluate(command.expr);
    case 'wait':
      return await (await page.waitForFunction(command.expr, null,
        { timeout: command.timeoutMs ?? 30000, polling: 20 })).jsonValue();
    default:
      throw new Error(`unknown op ${command.op}`);
  }
}

process.stdout.write(`${JSON.stringify({ ready: true, version: context.browser()?.version() ?? null })}\n`);
for await (const line of createInterface({ input: process.stdin })) {
  const command = JSON.parse(line);
  if (command.op === 'close') break;
  let answer;
  try {
    answer = { id: command.id, ok: true, value: (await perform(command)) ?? null };
  } catch (error) {
    answer = { id: command.id, ok: false, error: String(error.message ?? error).split('\n')[0] };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
await context.close();
process.exit(0); // stdin, still open, would keep node alive
