// The decode example runs to completion (prefill, then decode steps carrying the state).

import { expect, test } from "bun:test";
import { join } from "node:path";

test("examples/decode.ts runs", () => {
  const proc = Bun.spawnSync([process.execPath, join("examples", "decode.ts")], {
    cwd: join(import.meta.dir, ".."),
    stdout: "pipe",
    stderr: "pipe",
  });
  const stdout = proc.stdout.toString();
  expect(proc.stderr.toString()).toBe("");
  expect(proc.exitCode).toBe(0);
  expect(stdout).toContain("prefill  T=12");
  expect(stdout).toContain("decode   step 4");
  expect(stdout.trim().endsWith("done")).toBe(true);
});
