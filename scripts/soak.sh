#!/usr/bin/env bash
# Soak test: sustained streaming load through tokentap for a while, watching that nothing
# grows and nothing is lost.
#
#   scripts/soak.sh [--minutes N] [--interval S] [--concurrency C] [--debug] [--keep]
#
#   --minutes N      how long the load runs (default 30; fractions allowed: 0.5)
#   --interval S     seconds between samples (default 10, or less so a short run still
#                    gets at least 9 samples)
#   --concurrency C  concurrent client streams (default 32)
#   --debug          use the debug build (target/debug/tokentap, as `cargo test` leaves
#                    it) instead of building release: the CI short run
#   --keep           keep the work directory (logs, samples) under /tmp
#
# It starts `tokentap sim` (the simulated backend) and tokentap in front of it, drives
# streaming chat requests from a small stdlib-only Python client (keep-alive HTTP/1.1,
# one connection per stream slot), and every interval samples tokentap's RSS
# (/proc/PID/status), open file descriptors (/proc/PID/fd), series count (sample lines of
# /metrics) and in-flight streams. The client mixes in, by request number, client
# disconnects after the first event (~5%) and upstream error events (~2%,
# `x-sim-fault: error-after=3`), so every outcome is exercised all along.
#
# Checks, each one line, then `soak: N passed, M failed`:
#   - no unexpected client error (connect failure, bad status, broken stream);
#   - every request counted exactly once: sum of tokentap_requests_total equals the
#     requests the client sent, and per outcome (completed, cancelled, upstream_error)
#     equals what the client did;
#   - streams_in_flight back to 0 at the end;
#   - flat: RSS max of the last third <= max of the first third * 1.10 + 8 MiB; open fds
#     max of the last third <= max of the first third + 16; series count of the last
#     third == that of the first third;
#   - SIGTERM: tokentap exits 0 within its drain deadline.
#
# CI runs the short version: scripts/soak.sh --minutes 0.5 --debug
set -uo pipefail
# The live view of every tokentap started here on a free port, not its default 9465.
export TOKENTAP_UI_LISTEN=127.0.0.1:0
cd "$(dirname "$0")/.."

minutes=30
interval=""
concurrency=32
profile=release
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --interval) interval="$2"; shift 2 ;;
        --concurrency) concurrency="$2"; shift 2 ;;
        --debug) profile=debug; shift ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

target_dir="${CARGO_TARGET_DIR:-target}"
if [ "$profile" = release ]; then
    echo "==> cargo build --release --bin tokentap"
    cargo build --release --bin tokentap || { echo "soak: 0 passed, 1 failed (build)"; exit 1; }
    bin="$target_dir/release/tokentap"
else
    echo "==> cargo build --bin tokentap (debug)"
    cargo build --bin tokentap || { echo "soak: 0 passed, 1 failed (build)"; exit 1; }
    bin="$target_dir/debug/tokentap"
fi

work=$(mktemp -d /tmp/tokentap-soak.XXXXXX)
export SOAK_BIN="$bin" SOAK_MINUTES="$minutes" SOAK_INTERVAL="$interval" \
    SOAK_CONCURRENCY="$concurrency" SOAK_WORK="$work" SOAK_PROFILE="$profile"
python3 - <<'PY'
import json, os, re, signal, socket, subprocess, sys, threading, time

BIN = os.environ["SOAK_BIN"]
MINUTES = float(os.environ["SOAK_MINUTES"])
DURATION = MINUTES * 60
INTERVAL = float(os.environ["SOAK_INTERVAL"] or min(10.0, max(1.0, DURATION / 9)))
CONCURRENCY = int(os.environ["SOAK_CONCURRENCY"])
WORK = os.environ["SOAK_WORK"]
MODELS = ["soak-a", "soak-b"]
TENANTS = ["t0", "t1", "t2", "t3"]
DRAIN = 15


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


sim_port, proxy_port, admin_port = free_port(), free_port(), free_port()
config = os.path.join(WORK, "tokentap.yaml")
with open(config, "w") as f:
    f.write(f"""listen: 127.0.0.1:{proxy_port}
admin: 127.0.0.1:{admin_port}
upstream:
  url: http://127.0.0.1:{sim_port}
  probe_interval: 1s
shutdown:
  drain_timeout: {DRAIN}s
log:
  level: warn
""")
sim = subprocess.Popen(
    [BIN, "sim", "--listen", f"127.0.0.1:{sim_port}", "--models", ",".join(MODELS),
     "--ttft", "20ms", "--itl", "10ms", "--tokens", "30", "--usage", "always"],
    stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "sim.log"), "w"))
proxy = subprocess.Popen(
    [BIN, "--config", config], stdout=subprocess.DEVNULL,
    stderr=open(os.path.join(WORK, "tokentap.log"), "w"))


def http_get(port, path, timeout=5.0):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return status, body


def dechunk(body):
    out, i = b"", 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j].split(b";")[0], 16)
        if size == 0:
            return out
        out += body[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def ready():
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if http_get(admin_port, "/readyz", 1.0)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def cleanup():
    for p in (proxy, sim):
        if p.poll() is None:
            p.kill()
            p.wait()


if not ready():
    print("tokentap did not become ready; log:")
    print(open(os.path.join(WORK, "tokentap.log")).read()[-3000:])
    print("soak: 0 passed, 1 failed")
    cleanup()
    sys.exit(1)


def scrape():
    status, body = http_get(admin_port, "/metrics")
    text = body.decode()
    series, total, outcomes, in_flight = 0, 0.0, {}, 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        name_labels, _, value = line.rpartition(" ")
        if name_labels.startswith("tokentap_requests_total{"):
            v = float(value)
            total += v
            m = re.search(r'outcome="([^"]*)"', name_labels)
            outcomes[m.group(1)] = outcomes.get(m.group(1), 0.0) + v
        elif name_labels == "tokentap_streams_in_flight":
            in_flight = float(value)
    return series, total, outcomes, in_flight


# --- the client ------------------------------------------------------------------------
lock = threading.Lock()
counts = {"sent": 0, "completed": 0, "cancelled": 0, "upstream_error": 0, "errors": 0}
errors = []
next_index = [0]
stop = threading.Event()


def plan(i):
    """What request i does: model, tenant and kind, cycling through every combination."""
    combo, round_ = i % 8, i // 8
    model, tenant = MODELS[combo % 2], TENANTS[combo // 2]
    if round_ % 20 == 3:
        kind = "cancel"
    elif round_ % 50 == 11:
        kind = "fault"
    else:
        kind = "normal"
    return model, tenant, kind


class Broken(Exception):
    pass


def read_response(sock, buf, cancel):
    """Read one chunked SSE response; returns (leftover, body). With cancel, return as
    soon as the first event arrived (the caller then closes the connection)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise Broken("closed before the response head")
        buf += chunk
    head, _, buf = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        raise Broken(f"status {status}")
    if b"transfer-encoding: chunked" not in head.lower():
        raise Broken("expected a chunked response")
    body = b""
    while True:
        while b"\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise Broken("closed mid-stream")
            buf += chunk
        line, _, rest = buf.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        while len(rest) < size + 2:
            chunk = sock.recv(65536)
            if not chunk:
                raise Broken("closed mid-chunk")
            rest += chunk
        body += rest[:size]
        buf = rest[size + 2:]
        if cancel and b"data: " in body:
            return buf, body
        if size == 0:
            return buf, body


def worker():
    sock, buf = None, b""
    while not stop.is_set():
        with lock:
            i = next_index[0]
            next_index[0] += 1
        model, tenant, kind = plan(i)
        payload = json.dumps({"model": model, "stream": True,
                              "messages": [{"role": "user", "content": f"soak request {i}"}]})
        fault = "x-sim-fault: error-after=3\r\n" if kind == "fault" else ""
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\n"
                   f"Content-Type: application/json\r\nX-Tenant-ID: {tenant}\r\n{fault}"
                   f"Content-Length: {len(payload)}\r\n\r\n{payload}").encode()
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=30)
                buf = b""
            with lock:
                counts["sent"] += 1
            sock.sendall(request)
            buf, body = read_response(sock, buf, kind == "cancel")
            if kind == "cancel":
                sock.close()
                sock = None
                outcome = "cancelled"
            elif kind == "fault":
                if b"simulated engine failure" not in body:
                    raise Broken("fault stream without its error event")
                outcome = "upstream_error"
            else:
                if b"data: [DONE]" not in body:
                    raise Broken("stream ended without [DONE]")
                outcome = "completed"
            with lock:
                counts[outcome] += 1
        except (OSError, Broken, ValueError) as err:
            with lock:
                counts["errors"] += 1
                if len(errors) < 10:
                    errors.append(f"request {i}: {err!r}")
            if sock is not None:
                sock.close()
            sock = None
    if sock is not None:
        sock.close()


def proc_sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds


print(f"==> soak: {MINUTES:g} min, {CONCURRENCY} streams, sample every {INTERVAL:g} s "
      f"({os.environ['SOAK_PROFILE']} build; work dir {WORK})")
threads = [threading.Thread(target=worker, daemon=True) for _ in range(CONCURRENCY)]
start = time.time()
for t in threads:
    t.start()

samples = []
header = f"{'t_s':>7} {'rss_kib':>9} {'fds':>5} {'series':>7} {'in_flight':>9} {'requests':>9} {'sent':>9}"
print(header)
next_sample = start + INTERVAL
while True:
    now = time.time()
    if now >= start + DURATION:
        break
    time.sleep(max(0.0, min(next_sample, start + DURATION) - now))
    if time.time() < next_sample:
        continue
    next_sample += INTERVAL
    try:
        rss, fds = proc_sample(proxy.pid)
        series, total, _, in_flight = scrape()
    except (OSError, ValueError) as err:
        print(f"sample failed: {err!r}")
        continue
    with lock:
        sent = counts["sent"]
    samples.append((time.time() - start, rss, fds, series, in_flight, total, sent))
    print(f"{samples[-1][0]:7.1f} {rss // 1024:9d} {fds:5d} {series:7d} {int(in_flight):9d} "
          f"{int(total):9d} {sent:9d}", flush=True)

stop.set()
for t in threads:
    t.join(timeout=60)
elapsed = time.time() - start

# Let tokentap record the last outcomes (a cancel is noticed at its next write).
deadline = time.time() + 15
while True:
    series, total, outcomes, in_flight = scrape()
    if (in_flight == 0 and total >= counts["sent"]) or time.time() > deadline:
        break
    time.sleep(0.1)

results = []


def check(name, ok, detail):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")


print()
print(f"client: {counts['sent']} sent in {elapsed:.0f} s ({counts['sent'] / elapsed:.0f}/s): "
      f"{counts['completed']} completed, {counts['cancelled']} cancelled by the client, "
      f"{counts['upstream_error']} with an upstream error event, {counts['errors']} errors")
print(f"tokentap: requests_total {int(total)} {json.dumps({k: int(v) for k, v in sorted(outcomes.items())})}")
check("no unexpected client error", counts["errors"] == 0,
      f"{counts['errors']} errors" + (f" (first: {errors[0]})" if errors else ""))
check("every request counted exactly once", total == counts["sent"],
      f"requests_total {int(total)} vs sent {counts['sent']}")
for outcome in ("completed", "cancelled", "upstream_error"):
    got = int(outcomes.get(outcome, 0))
    want = counts[outcome]
    check(f"outcome {outcome}", got == want, f"tokentap {got} vs client {want}")
check("streams_in_flight back to 0", in_flight == 0, f"{int(in_flight)}")

if len(samples) >= 3:
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    rss_first, rss_last = max(s[1] for s in first), max(s[1] for s in last)
    fd_first, fd_last = max(s[2] for s in first), max(s[2] for s in last)
    se_first, se_last = max(s[3] for s in first), max(s[3] for s in last)
    check("RSS flat", rss_last <= rss_first * 1.10 + (8 << 20),
          f"first third max {rss_first >> 10} KiB, last third max {rss_last >> 10} KiB")
    check("open fds flat", fd_last <= fd_first + 16,
          f"first third max {fd_first}, last third max {fd_last}")
    check("series flat", se_last == se_first,
          f"first third max {se_first}, last third max {se_last}")
else:
    check("enough samples", False, f"{len(samples)} samples (need 3)")

proxy.send_signal(signal.SIGTERM)
try:
    code = proxy.wait(timeout=DRAIN + 10)
except subprocess.TimeoutExpired:
    code = None
check("SIGTERM: exit 0", code == 0, f"exit code {code}")
cleanup()
with open(os.path.join(WORK, "samples.json"), "w") as f:
    json.dump({"samples": samples, "client": counts, "outcomes": outcomes}, f)
passed = sum(results)
failed = len(results) - passed
print()
print(f"soak: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
status=$?
if [ "$keep" = 1 ] || [ "$status" -ne 0 ]; then
    echo "(work directory kept: $work)"
else
    rm -rf "$work"
fi
exit $status
