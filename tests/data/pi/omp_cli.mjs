// What pi's RpcClient starts as its CLI (`node <cliPath> --mode rpc ...`): this runtime,
// `$OMP_PYTHON -m omp` with the same arguments and the same stdin/stdout/stderr. A signal the
// client sends (its stop() sends SIGTERM) is passed on; the exit status is the runtime's.
import { spawn } from "node:child_process";

const child = spawn(process.env.OMP_PYTHON, ["-m", "omp", ...process.argv.slice(2)], {
  stdio: "inherit",
});
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(signal, () => child.kill(signal));
}
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 128 + 15 : 1)));
