#!/usr/bin/env python3
"""Traffic and checks of scripts/ops/e2e-gen-ai.sh (`metrics.names`).

  e2e_gen_ai.py traffic PROXY_URL...
      The same bounded traffic through each proxy: streamed chats with usage,
      non-streamed chats, streamed completions, Ollama chats, and streamed chats the
      engine fails part-way (x-sim-fault: error-after=4).

  e2e_gen_ai.py check --both ADMIN --gen-ai ADMIN --classic PROM --native PROM
      One `PASS ...` or `FAIL ...` line per check: the GenAI families in both
      expositions, the replaced tokentap_ families only under `both`, each family's
      counts against tokentap's own (as its definition says), and both Prometheus
      holding the same counts as the scrape (classic: `_count` series; native:
      histogram_count of the native histogram) with the convention's attributes.
"""
import argparse
import http.client
import json
import sys
import time
import urllib.parse
import urllib.request

from exposition import parse_exposition, total
from tokentap_contract import GEN_AI_METRICS, GEN_AI_REPLACES

MODEL = "llama-3-8b"
STREAMED_CHATS = 6
PLAIN_CHATS = 2
COMPLETIONS = 3
OLLAMA_CHATS = 2
FAILING = 2
# (gen_ai.operation.name, gen_ai.provider.name) of the traffic's requests.
PAIRS = {("chat", "openai"), ("text_completion", "openai"), ("chat", "ollama")}


def post(base, path, body, headers=None):
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("POST", path, json.dumps(body),
                 {"content-type": "application/json", **(headers or {})})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def traffic(proxies):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    sent = 0
    for base in proxies:
        for _ in range(STREAMED_CHATS):
            post(base, "/v1/chat/completions",
                 {**chat, "stream": True, "stream_options": {"include_usage": True}})
        for _ in range(PLAIN_CHATS):
            post(base, "/v1/chat/completions", {**chat, "stream": False})
        for _ in range(COMPLETIONS):
            post(base, "/v1/completions", {"model": MODEL, "prompt": "hi", "stream": True})
        for _ in range(OLLAMA_CHATS):
            post(base, "/api/chat", chat)
        for _ in range(FAILING):
            post(base, "/v1/chat/completions", {**chat, "stream": True},
                 {"x-sim-fault": "error-after=4"})
        sent += STREAMED_CHATS + PLAIN_CHATS + COMPLETIONS + OLLAMA_CHATS + FAILING
    print(f"{sent} requests through {len(proxies)} proxies")


def scrape(admin):
    with urllib.request.urlopen(f"{admin}/metrics", timeout=10) as r:
        return r.read().decode()


def query(prom, expr):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    if data.get("status") != "success":
        raise RuntimeError(f"{expr}: {data}")
    return data["data"]["result"]


def check(args):
    results = []

    def verdict(ok, what):
        results.append(ok)
        print(("PASS " if ok else "FAIL ") + what, flush=True)

    texts = {"both": scrape(args.both), "gen_ai": scrape(args.gen_ai)}
    parsed = {names: parse_exposition(text) for names, text in texts.items()}
    samples = {names: samples for names, (samples, _) in parsed.items()}
    for names, (_, types) in parsed.items():
        missing = [f for f, (kind, _) in GEN_AI_METRICS.items() if types.get(f) != kind]
        verdict(not missing, f"[{names}] every GenAI family exposed with its type"
                + (f" (missing {missing})" if missing else ""))
        bad = []
        for name, labels, _ in samples[names]:
            family = next((f for f in GEN_AI_METRICS if name.startswith(f)), None)
            if family:
                allowed = set(GEN_AI_METRICS[family][1]) | {"le"}
                if not set(labels) <= allowed:
                    bad.append((name, sorted(labels)))
        verdict(not bad, f"[{names}] GenAI series carry only the convention's attributes"
                + (f" ({bad[:3]})" if bad else ""))
        replaced_present = [f for f in GEN_AI_REPLACES if f in types]
        if names == "both":
            verdict(len(replaced_present) == len(GEN_AI_REPLACES),
                    "[both] the tokentap_ families are all still there")
        else:
            verdict(not replaced_present,
                    f"[gen_ai] the replaced tokentap_ families are gone ({replaced_present or 'none left'})")
        verdict("tokentap_inter_token_latency_seconds" in types,
                f"[{names}] tokentap_inter_token_latency_seconds (no GenAI equivalent) stays")

    # Definitions, against tokentap's own families (names: both).
    s = samples["both"]
    completed = total(s, "tokentap_requests_total", outcome="completed")
    failed = total(s, "tokentap_requests_total", outcome="upstream_error")
    requests = total(s, "tokentap_requests_total")
    ttft_all = total(s, "tokentap_time_to_first_token_seconds_count")
    server_ttft = total(s, "gen_ai_server_time_to_first_token_seconds_count")
    first_chunk = total(s, "gen_ai_client_operation_time_to_first_chunk_seconds_count")
    streamed = STREAMED_CHATS + COMPLETIONS + OLLAMA_CHATS + FAILING
    verdict(completed == requests - FAILING and failed == FAILING,
            f"outcomes: {completed:g} completed, {failed:g} upstream_error of {requests:g}")
    verdict(first_chunk == streamed == ttft_all,
            f"time to first chunk: {first_chunk:g} = the {streamed} streamed requests = tokentap's TTFT count")
    verdict(server_ttft == streamed - FAILING,
            f"server TTFT: {server_ttft:g} = the {streamed - FAILING} successful streams (not the failed ones)")
    duration = "gen_ai_server_request_duration_seconds_count"
    errors = total(s, duration, error_type="upstream_error")
    verdict(total(s, duration) == requests and errors == FAILING,
            f"server duration: {total(s, duration):g} requests, {errors:g} under error_type=upstream_error")
    chunks = total(s, "gen_ai_client_operation_time_per_output_chunk_seconds_count")
    inter_chunk = total(s, "tokentap_inter_chunk_latency_seconds_count")
    verdict(chunks == inter_chunk > 0, f"time per output chunk: {chunks:g} gaps = tokentap's inter-chunk {inter_chunk:g}")
    usage_out = total(s, "gen_ai_client_token_usage_sum", gen_ai_token_type="output")
    counted = total(s, "tokentap_output_tokens_total")
    verdict(usage_out == counted > 0, f"output token usage: {usage_out:g} = tokentap_output_tokens_total {counted:g}")
    providers = {(l.get("gen_ai_operation_name"), l.get("gen_ai_provider_name")) for n, l, _ in s
                 if n == "gen_ai_server_request_duration_seconds_count"}
    verdict(providers == PAIRS, f"operation/provider pairs {sorted(providers)}")

    # Both Prometheus hold what the scrape says.
    for kind, prom in (("classic", args.classic), ("native", args.native)):
        for names in ("both", "gen_ai"):
            for family in GEN_AI_METRICS:
                want = total(samples[names], f"{family}_count")
                if kind == "classic":
                    expr = f'sum({family}_count{{names="{names}"}})'
                else:
                    expr = f'sum(histogram_count({family}{{names="{names}"}}))'
                got = None
                for _ in range(60):
                    result = query(prom, expr)
                    got = float(result[0]["value"][1]) if result else None
                    if got == want:
                        break
                    time.sleep(0.5)
                verdict(got == want, f"[{kind}] {expr} = {got} (scrape: {want:g})")
        if kind == "native":
            expr = 'histogram_quantile(0.5, sum(gen_ai_server_time_to_first_token_seconds{names="both"}))'
            result = query(prom, expr)
            p50 = float(result[0]["value"][1]) if result else float("nan")
            verdict(0.09 < p50 < 0.2, f"[native] {expr} = {p50:.4f} s (simulator TTFT 100 ms)")
        labels = query(prom, 'count by (gen_ai_operation_name, gen_ai_provider_name, gen_ai_request_model) '
                             '({__name__=~"gen_ai_server_request_duration_seconds(_count)?",names="both"})')
        seen = {(r["metric"].get("gen_ai_operation_name"), r["metric"].get("gen_ai_provider_name"),
                 r["metric"].get("gen_ai_request_model")) for r in labels}
        verdict(seen == {(o, p, MODEL) for o, p in PAIRS}, f"[{kind}] attributes as stored: {sorted(seen)}")
    return all(results)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("traffic")
    t.add_argument("proxies", nargs="+")
    c = sub.add_parser("check")
    c.add_argument("--both", required=True)
    c.add_argument("--gen-ai", required=True)
    c.add_argument("--classic", required=True)
    c.add_argument("--native", required=True)
    args = parser.parse_args()
    if args.command == "traffic":
        traffic(args.proxies)
        return 0
    return 0 if check(args) else 1


if __name__ == "__main__":
    sys.exit(main())
