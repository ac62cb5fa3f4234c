// Drives the console in headless Chromium for the console's browser tests: one JSON
// request a line on stdin, one JSON answer a line on stdout ({"ok": value} or
// {"error": message}); the test holds the logic, this only does what a user's hands do.
//   {"op": "goto", "url": U}                       open U
//   {"op": "wait", "sel": S, "state": "visible"}   until S is attached/visible/hidden/detached
//   {"op": "click", "sel": S}                      click the first S
//   {"op": "fill", "sel": S, "value": V}           type V into S
//   {"op": "select", "sel": S, "value": V}         choose V in the <select> S
//   {"op": "count", "sel": S}                      how many S
//   {"op": "text", "sel": S}                       textContent of the first S
//   {"op": "texts", "sel": S}                      textContent of every S
//   {"op": "eval", "js": "() => ..."}              a function run in the page, its result
//   {"op": "until", "js": "() => ...", "timeout": MS}  until the function returns truthy
//   {"op": "dialogs", "accept": true, "text": T}   how the next dialogs are answered
//   {"op": "viewport", "width": W, "height": H}    the window's size
//   {"op": "shot", "path": P}                      a full-page screenshot
//   {"op": "quit"}
// Errors of a page (uncaught exceptions, console errors) are collected and returned by
// {"op": "errors"}: a test checks that the page ran clean.
import { chromium } from "playwright-core";
import readline from "node:readline";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const answer = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
  ],
});
const page = await browser.newPage({ viewport: { width: 1600, height: 900 } });
const errors = [];
page.on("pageerror", (err) => errors.push(`page error: ${err}`));
page.on("console", (msg) => { if (msg.type() === "error") errors.push(`console: ${msg.text()}`); });
let dialog = { accept: true, text: undefined };
page.on("dialog", async (d) => {
  if (dialog.accept) await d.accept(dialog.text);
  else await d.dismiss();
});

const T = 20000;
async function run(req) {
  const timeout = req.timeout || T;
  switch (req.op) {
    case "goto": await page.goto(req.url); return true;
    case "wait": await page.locator(req.sel).first().waitFor({ state: req.state || "visible", timeout }); return true;
    case "click": await page.locator(req.sel).first().click({ timeout }); return true;
    case "fill": await page.locator(req.sel).first().fill(String(req.value), { timeout }); return true;
    case "select": await page.locator(req.sel).first().selectOption(req.value, { timeout }); return true;
    case "count": return await page.locator(req.sel).count();
    case "text": return await page.locator(req.sel).first().textContent({ timeout });
    case "texts": return await page.locator(req.sel).allTextContents();
    case "eval": return await page.evaluate(`(${req.js})()`);
    case "until": {
      // polled with evaluate: waitForFunction evaluates a string in the page, which the
      // console's Content-Security-Policy (no unsafe-eval) rightly refuses
      const deadline = Date.now() + timeout;
      for (;;) {
        const got = await page.evaluate(`(${req.js})()`);
        if (got) return got;
        if (Date.now() > deadline) throw new Error(`not true within ${timeout} ms: ${req.js}`);
        await new Promise((res) => setTimeout(res, 100));
      }
    }
    case "dialogs": dialog = { accept: req.accept !== false, text: req.text }; return true;
    case "errors": return errors.splice(0);
    case "viewport": await page.setViewportSize({ width: req.width, height: req.height }); return true;
    case "shot": await page.screenshot({ path: req.path, fullPage: true }); return req.path;
    default: throw new Error(`unknown op ${req.op}`);
  }
}

for await (const line of readline.createInterface({ input: process.stdin })) {
  const req = JSON.parse(line);
  if (req.op === "quit") { answer({ ok: "bye" }); break; }
  try {
    answer({ ok: await run(req) });
  } catch (err) {
    answer({ error: `${req.op} ${req.sel || req.url || ""}: ${String(err.message || err).split("\n")[0]}` });
  }
}
await browser.close();
