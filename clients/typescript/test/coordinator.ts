// A real coordinator for the tests: the `palisade` binary that scripts/test builds
// (PALISADE_BIN), on a loopback port of its own choosing, in a temporary directory.

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export class Coordinator {
  private constructor(
    readonly process: ChildProcess,
    readonly address: string,
    readonly directory: string,
  ) {}

  static async start(...extra: string[]): Promise<Coordinator> {
    const binary = process.env.PALISADE_BIN;
    if (!binary) throw new Error("PALISADE_BIN is not set: run ./scripts/test");
    const directory = mkdtempSync(join(tmpdir(), "palisade-ts-"));
    const child = spawn(
      binary,
      [
        "serve",
        ...(extra.includes("--listen") ? [] : ["--listen", "127.0.0.1:0"]),
        "--data-dir",
        join(directory, "data"),
        ...extra,
      ],
      { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, RUST_LOG: "warn" } },
    );
    const prefix = "palisade coordinator listening on ";
    const lines = createInterface({ input: child.stderr! });
    const address = await new Promise<string>((resolve, reject) => {
      lines.on("line", (line) => {
        if (line.startsWith(prefix)) resolve(line.slice(prefix.length).trim());
      });
      child.on("exit", () => reject(new Error("the coordinator exited before listening")));
    });
    return new Coordinator(child, address, directory);
  }

  async stop(): Promise<void> {
    const exited = new Promise((resolve) => this.process.on("exit", resolve));
    this.process.kill("SIGCONT");
    this.process.kill("SIGTERM");
    await exited;
    rmSync(this.directory, { recursive: true, force: true });
  }
}
