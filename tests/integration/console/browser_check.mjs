// Drives the console in headless Chromium for test_console_browser.py, one step per line
// read on stdin, answering one line on stdout per step:
//   open            -> "ready"                    the page is live (its feed said ready)
//   expect JOB [N]  -> "seen JOB MS"              N rows (default 1) of JOB, MS after asking
//   jobs JOB        -> "listed JOB"               JOB is in the jobs table
//   filter JOB      -> "filtered JOB"             the job filter applied and the feed live again
//   check JOB OTHER -> "checked N_JOB N_OTHER"    rows of each in the events table
//   shot PATH       -> "shot PATH"                a full-page screenshot
//   quit            -> "bye"
// Errors end the process with a message on stderr and a non-zero exit.
import { chromium } from "playwright-core";
import readline from "node:readline";

const [url, token] = process.argv.slice(2);
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const say = (line) => process.stdout.write(line + "\n");

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
  ],
});
const page = await browser.newPage({ viewport: { width: 1600, height: 900 } });
page.on("pageerror", (err) => process.stderr.write(`page error: ${err}\n`));
const rows = (job) => page.locator(`#events tr.event[data-job="${job}"]`);

async function live() {
  await page.waitForSelector("#status.live", { timeout: 15000 });
}

try {
  for await (const line of readline.createInterface({ input: process.stdin })) {
    const [cmd, ...args] = line.trim().split(/\s+/);
    if (cmd === "open") {
      await page.goto(`${url}#token=${encodeURIComponent(token)}`);
      await live();
      say("ready");
    } else if (cmd === "expect") {
      const asked = Date.now();
      await rows(args[0]).nth(Number(args[1] || 1) - 1).waitFor({ timeout: 15000 });
      say(`seen ${args[0]} ${Date.now() - asked}`);
    } else if (cmd === "jobs") {
      await page.locator(`#jobs tr[data-job="${args[0]}"]`).waitFor({ timeout: 15000 });
      say(`listed ${args[0]}`);
    } else if (cmd === "filter") {
      await page.fill("#job", args[0]);
      await page.click("#apply");
      await live();
      say(`filtered ${args[0]}`);
    } else if (cmd === "check") {
      say(`checked ${await rows(args[0]).count()} ${await rows(args[1]).count()}`);
    } else if (cmd === "shot") {
      await page.screenshot({ path: args[0], fullPage: true });
      say(`shot ${args[0]}`);
    } else if (cmd === "quit") {
      say("bye");
      break;
    } else {
      throw new Error(`unknown step ${line}`);
    }
  }
} catch (err) {
  process.stderr.write(`${err.stack || err}\n`);
  await browser.close();
  process.exit(1);
}
await browser.close();
