#!/usr/bin/env python3
"""Real third-party gRPC clients against `tokentap sim` (issue 25, item 3).

`grpcio` with stubs generated now, from the repository's vendored `crates/wire/proto/`
files, into a temporary directory, streams `Generate` from the SGLang, vLLM and TensorRT-LLM services
and calls their `GetModelInfo` and `HealthCheck`; `tritonclient[grpc]` streams Triton's
`ModelStreamInfer` (skipped, and said so, if it is not installed). Each check is printed:
messages, token ids against the simulator's profile, the first message's time and the
gaps against its TTFT and ITL, the gRPC status, and the statuses the faults map to.

    python3 scripts/ops/grpc_client.py [--install] [--tokentap target/debug/tokentap]
        [--addr HOST:PORT] [--compress] [--through-tokentap]

Without --addr it starts `tokentap sim` itself (with --compress, gzip messages). With
--through-tokentap it also starts tokentap in front of it (h2c to the simulator) and runs
every check through tokentap, then checks what tokentap measured (`/metrics`): each call
counted once with the outcome and status its gRPC status maps to, the token ids the
clients received as output tokens, TTFT and ITL against the simulator's timing, health and
model-info calls as passthrough, and a call's messages and trailers identical to a direct
one's; then that a client's deadline and cancel end the call and are counted `cancelled`,
and that tokentap's own answer with the engine down reads as `UNAVAILABLE` with
tokentap's message. With
--install, it pip-installs grpcio, grpcio-tools and tritonclient[grpc] if they are
missing. Exit 0: every check passed; 1: a check failed; 77: grpcio/grpcio-tools missing
(nothing checked).
"""

import argparse
import importlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "grpc-model"
TTFT = 0.150
ITL = 0.020
TOKENS = 12
PER_EVENT = 3
# A Python client on a shared machine: never early, late by this much at most.
SLACK = 0.080


def have(*modules):
    try:
        for m in modules:
            importlib.import_module(m)
        return True
    except ImportError:
        return False


def install(packages):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages], check=False)
    importlib.invalidate_caches()


def generate_stubs(out):
    from grpc_tools import protoc
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    smg = os.path.join(ROOT, "crates", "wire", "proto", "smg")
    files = ["common.proto", "sglang_scheduler.proto", "vllm_engine.proto", "trtllm_service.proto"]
    args = ["protoc", f"-I{smg}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + [os.path.join(smg, f) for f in files]) != 0:
        raise SystemExit("protoc failed on crates/wire/proto/smg")
    sys.path.insert(0, out)


def start_sim(binary, compress):
    args = [binary, "sim", "--listen", "127.0.0.1:0", "--models", f"{MODEL},other-model",
            "--ttft", f"{int(TTFT * 1000)}ms", "--itl", f"{int(ITL * 1000)}ms",
            "--tokens", str(TOKENS), "--tokens-per-event", str(PER_EVENT)]
    if compress:
        args.append("--compress")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "simulator listening" in line:
            found = re.search(r"127\.0\.0\.1:\d+", line[line.find("simulator listening"):])
            if found:
                return proc, found.group(0)
    proc.kill()
    raise SystemExit("tokentap sim did not say where it listens")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tokentap(binary, upstream, workdir, probe="readyz"):
    """tokentap in front of `upstream` over h2c; returns (process, proxy addr, admin addr).
    It is up when its admin port's `probe` answers 200 (`healthz` for an upstream that is
    down on purpose)."""
    import urllib.request
    listen, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = os.path.join(workdir, f"tokentap-{listen.rsplit(':', 1)[1]}.yaml")
    with open(config, "w") as f:
        f.write(f"listen: {listen}\nadmin: {admin}\nupstream:\n  url: http://{upstream}\n"
                f"  http2: true\nui:\n  listen: 127.0.0.1:0\n")
    proc = subprocess.Popen([binary, "--config", config], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{admin}/{probe}", timeout=1) as r:
                if r.status == 200:
                    return proc, listen, admin
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("tokentap did not become ready")


def scrape(admin):
    """`/metrics` as {(name, frozenset(labels)): value}."""
    import urllib.request
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels))
        samples[(name, pairs)] = float(value)
    return samples


def total(samples, name, **labels):
    want = set(labels.items())
    return sum(v for (n, pairs), v in samples.items() if n == name and want <= pairs)


def measured_checks(c, admin, direct_addr, proxy_addr, grpc):
    """What tokentap measured of the calls the checks made through it."""
    deadline = time.monotonic() + 10
    expected = sum(c.calls.values())
    while True:
        m = scrape(admin)
        if total(m, "tokentap_requests_total") >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    c.check(total(m, "tokentap_requests_total") == expected,
            f"tokentap: {total(m, 'tokentap_requests_total'):.0f} calls counted, {expected} made")
    for (outcome, status), n in sorted(c.calls.items()):
        got = total(m, "tokentap_requests_total", outcome=outcome, status=status)
        c.check(got == n, f"tokentap: {got:.0f} counted {outcome}/{status}, {n} expected")
    # GetModelInfo and HealthCheck of each engine.
    passthrough = total(m, "tokentap_passthrough_requests_total")
    c.check(passthrough == 6, f"tokentap: {passthrough:.0f} model-info and health calls passthrough")
    tokens = total(m, "tokentap_output_tokens_total")
    c.check(tokens == c.token_ids,
            f"tokentap: {tokens:.0f} output tokens, the clients received {c.token_ids} token ids")
    exact = total(m, "tokentap_event_tokens_total", accuracy="exact")
    c.check(exact == c.token_ids, f"tokentap: {exact:.0f} of them counted exact (token ids)")
    n = total(m, "tokentap_time_to_first_token_seconds_count")
    mean = total(m, "tokentap_time_to_first_token_seconds_sum") / max(n, 1)
    c.check(TTFT <= mean <= TTFT + SLACK,
            f"tokentap: mean TTFT {mean * 1000:.1f} ms over {n:.0f} calls (simulator: "
            f"{TTFT * 1000:.0f} ms)")
    n = total(m, "tokentap_inter_token_latency_seconds_count")
    mean = total(m, "tokentap_inter_token_latency_seconds_sum") / max(n, 1)
    # Each message carries PER_EVENT ids, ITL * PER_EVENT after the previous one: per token,
    # ITL, a late timer spread over PER_EVENT tokens.
    c.check(ITL * 0.95 <= mean <= ITL + SLACK / PER_EVENT,
            f"tokentap: mean ITL {mean * 1000:.2f} ms over {n:.0f} tokens (simulator: "
            f"{ITL * 1000:.0f} ms)")
    # Byte for byte: a call's messages and trailers through tokentap and directly.
    import sglang_scheduler_pb2 as sg
    import sglang_scheduler_pb2_grpc as sg_grpc
    views = []
    for addr in (direct_addr, proxy_addr):
        with grpc.insecure_channel(addr) as channel:
            stub = sg_grpc.SglangSchedulerStub(channel)
            request = sg.GenerateRequest(request_id="same", stream=True,
                                         tokenized=sg.TokenizedInput(input_ids=[1, 2, 3]))
            call = stub.Generate(request, metadata=[("x-sim-fault", "rate-limit-error-after=6")])
            messages = []
            try:
                for response in call:
                    messages.append(response.SerializeToString())
            except grpc.RpcError:
                pass
            views.append((messages, call.code(), call.details(),
                          sorted((k, v) for k, v in call.trailing_metadata() or ())))
    c.check(views[0] == views[1],
            f"tokentap: messages, status and trailers identical to a direct call "
            f"({len(views[1][0])} messages, {views[1][1].name})")


def deadline_checks(c, admin, proxy_addr, grpc, binary, workdir):
    """A client's deadline and cancel through tokentap (each frees the call and is counted
    `cancelled`; tokentap enforces no deadline itself), and tokentap's own answer when it
    cannot reach the engine, as a gRPC client reads it."""
    import sglang_scheduler_pb2 as sg
    import sglang_scheduler_pb2_grpc as sg_grpc

    def cancelled():
        return total(scrape(admin), "tokentap_requests_total", outcome="cancelled")

    def run(call):
        got = 0
        try:
            for _ in call:
                got += 1
                yield got
            return
        except grpc.RpcError:
            return

    before = cancelled()
    request = sg.GenerateRequest(request_id="d1", stream=True,
                                 tokenized=sg.TokenizedInput(input_ids=[1, 2, 3]))
    whole = TTFT + ITL * TOKENS
    with grpc.insecure_channel(proxy_addr) as channel:
        stub = sg_grpc.SglangSchedulerStub(channel)
        # A deadline that passes mid-stream: the client ends the call itself.
        deadline = TTFT + ITL * PER_EVENT
        call = stub.Generate(request, timeout=deadline)
        for _ in run(call):
            pass
        c.check(call.code() == grpc.StatusCode.DEADLINE_EXCEEDED,
                f"through tokentap, a {deadline * 1000:.0f} ms deadline on a {whole * 1000:.0f} ms "
                f"stream: {call.code().name}")
        # Cancelled after its first message.
        call = stub.Generate(request)
        got = 0
        for got in run(call):
            call.cancel()
        c.check(call.code() == grpc.StatusCode.CANCELLED and got == 1,
                f"through tokentap, cancelled after {got} message: {call.code().name}")
        # A deadline the stream ends within: the whole stream, whatever tokentap's timeouts.
        call = stub.Generate(request, timeout=10)
        got = 0
        for got in run(call):
            pass
        c.check(call.code() == grpc.StatusCode.OK and got == TOKENS // PER_EVENT + 1,
                f"through tokentap, a 10 s deadline: {call.code().name} after {got} messages")
    wait = time.monotonic() + 10
    while cancelled() < before + 2 and time.monotonic() < wait:
        time.sleep(0.05)
    now = cancelled()
    c.check(now == before + 2,
            f"tokentap: the call past its deadline and the cancelled call counted cancelled "
            f"({now - before:.0f})")

    down = f"127.0.0.1:{free_port()}"
    proc, addr, _ = start_tokentap(binary, down, workdir, probe="healthz")
    try:
        with grpc.insecure_channel(addr) as channel:
            stub = sg_grpc.SglangSchedulerStub(channel)
            try:
                for _ in stub.Generate(request, timeout=10):
                    pass
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
        c.check(code == grpc.StatusCode.UNAVAILABLE and details.startswith("tokentap: "),
                f"tokentap with its engine down answers {code.name}: {details!r}")
    finally:
        proc.kill()
        proc.wait()


class Checks:
    def __init__(self):
        self.failed = 0
        # Token ids every streamed call delivered to its client, and the calls ended by
        # (outcome, status) as tokentap should count them.
        self.token_ids = 0
        self.calls = {}

    def expect(self, outcome, status):
        self.calls[(outcome, status)] = self.calls.get((outcome, status), 0) + 1

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failed += 1

    def timing(self, name, times):
        first = times[0]
        self.check(TTFT <= first <= TTFT + SLACK, f"{name}: first message at {first * 1000:.1f} ms "
                   f"(TTFT {TTFT * 1000:.0f} ms)")
        gaps = [b - a for a, b in zip(times, times[1:])]
        want = ITL * PER_EVENT
        # The deadlines are absolute: message i is due at TTFT + i x PER_EVENT x ITL, so a
        # late message does not push the next one, and each is checked against its own.
        late = [t - (TTFT + i * want) for i, t in enumerate(times)]
        self.check(all(-0.002 <= d <= SLACK for d in late),
                   f"{name}: gaps {', '.join(f'{g * 1000:.1f}' for g in gaps)} ms "
                   f"({PER_EVENT} x ITL = {want * 1000:.0f} ms), each message "
                   f"{min(late) * 1000:.1f} to {max(late) * 1000:.1f} ms after its deadline")


def smg_checks(c, grpc, addr):
    import sglang_scheduler_pb2 as sg
    import sglang_scheduler_pb2_grpc as sg_grpc
    import vllm_engine_pb2 as vl
    import vllm_engine_pb2_grpc as vl_grpc
    import trtllm_service_pb2 as tr
    import trtllm_service_pb2_grpc as tr_grpc

    channel = grpc.insecure_channel(addr)
    # Connected before the first call is timed: the first message's time is the
    # simulator's TTFT (and tokentap's hop), not the client's connection set-up, which on
    # a loaded machine can take longer than the slack.
    grpc.channel_ready_future(channel).result(timeout=10)
    services = [
        ("sglang", sg_grpc.SglangSchedulerStub(channel),
         sg.GenerateRequest(request_id="s1", tokenized=sg.TokenizedInput(input_ids=list(range(7))),
                            stream=True),
         sg.GetModelInfoRequest(), sg.HealthCheckRequest(), "output_ids"),
        ("vllm", vl_grpc.VllmEngineStub(channel),
         vl.GenerateRequest(request_id="v1", tokenized=vl.TokenizedInput(input_ids=list(range(7))),
                            stream=True),
         vl.GetModelInfoRequest(), vl.HealthCheckRequest(), "output_ids"),
        ("trtllm", tr_grpc.TrtllmServiceStub(channel),
         tr.GenerateRequest(request_id="t1",
                            tokenized=tr.TokenizedInput(input_token_ids=list(range(7))),
                            streaming=True),
         tr.GetModelInfoRequest(), tr.HealthCheckRequest(), "output_token_ids"),
    ]
    for name, stub, request, info_request, health_request, ids_field in services:
        started = time.monotonic()
        call = stub.Generate(request)
        chunks, times, complete = [], [], None
        for response in call:
            kind = response.WhichOneof("response")
            if kind == "chunk":
                chunks.append(list(response.chunk.token_ids))
                times.append(time.monotonic() - started)
            elif kind == "complete":
                complete = response.complete
        c.token_ids += sum(len(k) for k in chunks)
        c.expect("completed", "2xx")
        c.check(call.code() == grpc.StatusCode.OK, f"{name} Generate: status {call.code().name}")
        c.check(len(chunks) == TOKENS // PER_EVENT and all(len(k) == PER_EVENT for k in chunks),
                f"{name} Generate: {len(chunks)} chunks of {[len(k) for k in chunks]} token ids")
        total = sum(len(k) for k in chunks)
        c.check(total == TOKENS, f"{name} Generate: {total} token ids (profile: {TOKENS})")
        c.check(complete is not None and complete.completion_tokens == TOKENS
                and complete.prompt_tokens == 7
                and list(getattr(complete, ids_field)) == [i for k in chunks for i in k],
                f"{name} Generate: complete says {complete.completion_tokens if complete else None}"
                f" completion and {complete.prompt_tokens if complete else None} prompt tokens,"
                f" finish_reason {complete.finish_reason if complete else None!r}")
        c.timing(f"{name} Generate", times)
        info = stub.GetModelInfo(info_request)
        served = info.model_id if name == "trtllm" else info.served_model_name
        c.check(served == MODEL, f"{name} GetModelInfo: {served!r}")
        health = stub.HealthCheck(health_request)
        healthy = health.status == "OK" if name == "trtllm" else health.healthy
        c.check(healthy, f"{name} HealthCheck: healthy")

    # Faults, through a real client: the gRPC status each maps to.
    stub, request = services[0][1], services[0][2]
    for fault, want, chunks_before, counted in [
        ("status=429", grpc.StatusCode.RESOURCE_EXHAUSTED, 0, ("upstream_refused", "429")),
        ("status=503", grpc.StatusCode.UNAVAILABLE, 0, ("upstream_error", "503")),
        ("rate-limit-error-after=3", grpc.StatusCode.RESOURCE_EXHAUSTED, 1,
         ("upstream_refused", "429")),
        ("overloaded-error-after=6", grpc.StatusCode.UNAVAILABLE, 2, ("upstream_error", "503")),
        ("error-after=3", grpc.StatusCode.INTERNAL, 1, ("upstream_error", "5xx")),
    ]:
        call = stub.Generate(request, metadata=[("x-sim-fault", fault)])
        got = 0
        c.expect(*counted)
        try:
            for response in call:
                if response.WhichOneof("response") == "chunk":
                    got += 1
                    c.token_ids += len(response.chunk.token_ids)
            code = call.code()
        except grpc.RpcError as e:
            code = e.code()
        c.check(code == want and got == chunks_before,
                f"sglang Generate x-sim-fault {fault}: {code.name} after {got} chunks")
    vstub, vrequest = services[1][1], services[1][2]
    finish = None
    c.expect("upstream_error", "2xx")
    for response in vstub.Generate(vrequest, metadata=[("x-sim-fault", "error-after=3")]):
        if response.WhichOneof("response") == "complete":
            finish = response.complete.finish_reason
        elif response.WhichOneof("response") == "chunk":
            c.token_ids += len(response.chunk.token_ids)
    c.check(finish == "error", f"vllm Generate x-sim-fault error-after=3: finish_reason {finish!r}")
    channel.close()


def triton_checks(c, grpc, addr):
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=addr)
    # Connected before the stream is timed, as in smg_checks, without a call (the
    # simulator serves none but the stream, and tokentap would count one). The client
    # keeps its channel in a private attribute; without it the stream connects itself.
    channel = getattr(client, "_channel", None)
    if channel is not None:
        grpc.channel_ready_future(channel).result(timeout=10)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((time.monotonic(), result, error)))
    inputs = [
        grpcclient.InferInput("text_input", [1, 1], "BYTES"),
        grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
        grpcclient.InferInput("stream", [1, 1], "BOOL"),
    ]
    inputs[0].set_data_from_numpy(np.array([["hi"]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[100]], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([[True]], dtype=bool))
    started = time.monotonic()
    client.async_stream_infer(MODEL, inputs, request_id="r1", enable_empty_final_response=True)
    times, ids, text, responses, final, errors = [], [], "", 0, False, []
    while not final:
        at, result, error = results.get(timeout=10)
        responses += 1
        if error is not None:
            errors.append(str(error))
            break
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        step = result.as_numpy("output_ids")
        if step is not None:
            ids.extend(step.flatten().tolist())
            times.append(at - started)
            text += b"".join(result.as_numpy("text_output").flatten()).decode()
    client.stop_stream()
    c.check(not errors, f"triton ModelStreamInfer: errors {errors}")
    c.check(responses == TOKENS // PER_EVENT + 1 and final,
            f"triton ModelStreamInfer: {responses} responses, the last with triton_final_response")
    c.token_ids += len(ids)
    c.expect("completed", "2xx")
    c.check(len(ids) == TOKENS and len(times) == TOKENS // PER_EVENT,
            f"triton ModelStreamInfer: {len(ids)} output_ids in {len(times)} responses, "
            f"text_output {text[:40]!r}...")
    c.timing("triton ModelStreamInfer", times)
    client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--tokentap", default=os.path.join(ROOT, "target", "debug", "tokentap"))
    parser.add_argument("--addr")
    parser.add_argument("--compress", action="store_true")
    parser.add_argument("--through-tokentap", action="store_true")
    args = parser.parse_args()
    if args.install and not have("grpc", "grpc_tools", "tritonclient.grpc"):
        install(["grpcio", "grpcio-tools", "tritonclient[grpc]"])
    if not have("grpc", "grpc_tools"):
        print("skip: grpcio and grpcio-tools are not installed (pip install grpcio grpcio-tools "
              "'tritonclient[grpc]', or run with --install)")
        return 77
    import grpc

    c = Checks()
    with tempfile.TemporaryDirectory() as stubs:
        generate_stubs(stubs)
        proc = proxy = None
        addr = args.addr
        if addr is None:
            proc, addr = start_sim(args.tokentap, args.compress)
        sim_addr = addr
        if args.through_tokentap:
            proxy, addr, admin = start_tokentap(args.tokentap, sim_addr, stubs)
            print(f"through tokentap at {addr} (metrics at {admin})")
        try:
            print(f"tokentap sim at {addr}{' (gzip)' if args.compress else ''}: {MODEL}, "
                  f"TTFT {TTFT * 1000:.0f} ms, ITL {ITL * 1000:.0f} ms, {TOKENS} tokens, "
                  f"{PER_EVENT} per message; grpcio {grpc.__version__}")
            smg_checks(c, grpc, addr)
            if have("tritonclient.grpc", "numpy"):
                triton_checks(c, grpc, addr)
            else:
                print("skip: tritonclient[grpc] is not installed: ModelStreamInfer not checked")
            if proxy is not None:
                measured_checks(c, admin, sim_addr, addr, grpc)
                deadline_checks(c, admin, addr, grpc, args.tokentap, stubs)
        finally:
            for p in (proxy, proc):
                if p is not None:
                    p.kill()
                    p.wait()
    print(f"{'FAILED' if c.failed else 'passed'}: {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
