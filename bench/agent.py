"""Agent overhead benchmark: CPU share and peak RSS of one agent sampling at 1 Hz.

Runs `python -m agent.cli --simulate H200:8 --interval 1` (8 simulated GPUs through the
real pynvml bindings, 8 simulated IB ports through the real sysfs reader) as a child
process pushing to a sink HTTP server in this process, and reads the child's own
/proc/<pid>/stat (utime+stime) and /proc/<pid>/status (VmHWM). Only the agent is
measured; the sink's cost stays in this process. The agent spools to disk (agent/spool/)
in a fresh temporary directory, as a real agent does; `--spool-dir ''` measures it without.

    python bench/agent.py --duration 120
Target: <= 0.5 % of one core and <= 50 MB peak RSS.

Under --simulate the agent attributes each GPU's processes to its workload (agent/workload, one
Slurm job's ranks in a simulated /proc) unless run with `--attribution off`. `--attribution both`
runs the agent with it off and on, alternately for --rounds rounds, and reports both and the
ratio (the cost of attribution, issue #15):

    python bench/agent.py --attribution both --rounds 3 --duration 60
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET_CPU_PCT = 0.5
TARGET_RSS_MB = 50.0


class Sink:
    def __init__(self) -> None:
        self.requests = 0
        self.samples = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(gzip.decompress(raw))
                sink.requests += 1
                sink.samples += len(body["samples"])
                sink.bytes += len(raw)
                data = json.dumps({"accepted": len(body["samples"])}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        # the command name (field 2) may hold spaces: split after its closing paren
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLK_TCK


def status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=180.0, help="measured seconds (default 180)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds excluded for start-up (default 10)")
    ap.add_argument("--simulate", default="H200:8")
    ap.add_argument("--interval", default="1")
    ap.add_argument("--spool-dir", default=None,
                    help="the agent's spool directory (default: a fresh temporary one; '' = no spool, memory queue)")
    ap.add_argument("--attribution", choices=["auto", "off", "both"], default="auto",
                    help="the agent's --attribution (auto: on, the default), or both: off and on side by side")
    ap.add_argument("--rounds", type=int, default=1, help="with --attribution both: off/on pairs, alternated (default 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    args = ap.parse_args()

    modes = ["off", "auto"] * max(1, args.rounds) if args.attribution == "both" else [args.attribution]
    results = []
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="laggard-bench-spool-") as tmp:
            spool_dir = os.path.join(tmp, "spool") if args.spool_dir is None else args.spool_dir
            result = measure(args, spool_dir, mode)
        if result is None:
            return 1
        results.append(result)
    doc: dict = results[0] if len(results) == 1 else {"runs": results, **side_by_side(results)}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["cpu_ok"] and r["rss_ok"] for r in results) else 1


def side_by_side(results: list[dict]) -> dict:
    """Attribution off vs on: each one's CPU per run, medians, and the ratio on/off."""
    cpu = {mode: [r["cpu_pct_one_core"] for r in results if r["attribution"] == mode] for mode in ("off", "auto")}
    med = {mode: statistics.median(v) for mode, v in cpu.items()}
    rss = {mode: max(r["peak_rss_mb"] for r in results if r["attribution"] == mode) for mode in ("off", "auto")}
    ratio = med["auto"] / med["off"] if med["off"] > 0 else None
    print(f"attribution off: CPU {', '.join(f'{v:.3f}' for v in cpu['off'])} % (median {med['off']:.3f} %), peak RSS {rss['off']:.1f} MB")
    print(f"attribution on:  CPU {', '.join(f'{v:.3f}' for v in cpu['auto'])} % (median {med['auto']:.3f} %), peak RSS {rss['auto']:.1f} MB")
    print(f"on/off: {ratio:.2f}, +{med['auto'] - med['off']:.3f} points of one core" if ratio is not None else "on/off: n/a")
    return {"cpu_pct_off": cpu["off"], "cpu_pct_on": cpu["auto"], "median_off": med["off"], "median_on": med["auto"],
            "ratio_on_off": None if ratio is None else round(ratio, 3), "peak_rss_mb_off": rss["off"], "peak_rss_mb_on": rss["auto"],
            "on_ok": med["auto"] <= TARGET_CPU_PCT}


def measure(args: argparse.Namespace, spool_dir: str, attribution: str = "auto") -> dict | None:
    sink = Sink()
    cmd = [sys.executable, "-m", "agent.cli", "--simulate", args.simulate, "--interval", args.interval,
           "--collector", sink.url, "--node", "bench-node", "--spool-dir", spool_dir, "--attribution", attribution]
    env = dict(os.environ, PYTHONPATH=str(REPO), LAGGARD_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    try:
        time.sleep(args.warmup)
        if proc.poll() is not None:
            print(f"agent exited early with code {proc.returncode}", file=sys.stderr)
            return None
        cpu0, t0, samples0 = cpu_seconds(proc.pid), time.monotonic(), sink.samples
        time.sleep(args.duration)
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        hwm_mb = status_kb(proc.pid, "VmHWM") / 1024
        rss_mb = status_kb(proc.pid, "VmRSS") / 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    wall = t1 - t0
    cpu_pct = 100.0 * (cpu1 - cpu0) / wall
    result = {
        "command": " ".join(cmd[1:]),
        "attribution": attribution,
        "spool": bool(spool_dir),
        "measured_s": round(wall, 1),
        "startup_cpu_s": round(cpu0, 3),
        "cpu_pct_one_core": round(cpu_pct, 3),
        "peak_rss_mb": round(hwm_mb, 1),
        "rss_mb_at_end": round(rss_mb, 1),
        "samples_received": sink.samples - samples0,
        "requests_total": sink.requests,
        "gzip_bytes_total": sink.bytes,
        "cpu_ok": cpu_pct <= TARGET_CPU_PCT,
        "rss_ok": hwm_mb <= TARGET_RSS_MB,
    }
    print(f"agent CPU: {cpu_pct:.3f} % of one core over {wall:.0f} s (target <= {TARGET_CPU_PCT} %), "
          f"{'spool ' + spool_dir if spool_dir else 'no spool'}, attribution {'on' if attribution == 'auto' else 'off'}")
    print(f"agent peak RSS: {hwm_mb:.1f} MB (target <= {TARGET_RSS_MB:.0f} MB)")
    print(f"start-up CPU: {cpu0:.2f} s; samples received while measuring: {result['samples_received']}")
    return result


if __name__ == "__main__":
    sys.exit(main())
