"""A stand-in for vLLM's OpenAI server, for launcher tests that must not need vLLM.

Run as `python -m vllm_fake_server --host H --port P --served-model-name M ...` (unknown vLLM
flags are ignored). Serves /health, /v1/models and a /metrics page in vLLM's format. Behaviour by
environment: FAKE_CHILD=1 spawns a grandchild that ignores SIGTERM (like an engine-core process
that hangs), FAKE_IGNORE_TERM=1 makes the server ignore SIGTERM, FAKE_FAIL=message exits at once
after printing the message, FAKE_DELAY_S delays readiness.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{m}"}} 2.0
vllm:num_requests_waiting{{engine="0",model_name="{m}"}} 5.0
vllm:kv_cache_usage_perc{{engine="0",model_name="{m}"}} 0.25
vllm:prefix_cache_queries_total{{engine="0",model_name="{m}"}} {q}
vllm:prefix_cache_hits_total{{engine="0",model_name="{m}"}} {h}
vllm:num_preemptions_total{{engine="0",model_name="{m}"}} 1.0
vllm:cache_config_info{{block_size="128",enable_prefix_caching="True",engine="0",model_name="{m}"}} 1.0
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="fake")
    args, _ = p.parse_known_args()
    if msg := os.environ.get("FAKE_FAIL"):
        print(msg, flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_CHILD"):
        subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    time.sleep(float(os.environ.get("FAKE_DELAY_S", "0")))
    model = args.served_model_name
    scrapes = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": model, "max_model_len": 2048}]}))
            elif self.path == "/metrics":
                scrapes["n"] += 1  # counters grow with every scrape, like a busy worker's
                n = scrapes["n"]
                self._send(200, METRICS.format(m=model, q=1000.0 * n, h=256.0 * n), "text/plain")
            else:
                self._send(404, "{}")

    print(f"fake vLLM server on {args.host}:{args.port} model {model}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
