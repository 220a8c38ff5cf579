#!/usr/bin/env python3
"""Policy checks for `tokentap inject` (what schema validation cannot see).

    check-inject.py split IN.yaml BUILTIN.yaml OTHER.json   List items flattened; built-in
                                                             kinds vs the rest (CRD kinds)
    check-inject.py injected OUT.yaml...                     every injected workload
    check-inject.py webhook RENDERED.yaml                    deploy/kubernetes/webhook

injected: each workload carrying tokentap.dev/settings-hash has exactly one tokentap, a
native sidecar (initContainers, restartPolicy Always) whose args alone configure it
(--upstream to an engine port of the pod over loopback, --listen/--admin equal to its
ports `http`-or-the-engine's-name / `metrics`, the live view on loopback and not a
container port), probes /healthz (startup, liveness) and /readyz (readiness) on the
admin port, a preStop sleep, requests and limits, a hardened securityContext, the
pod-identity env, and preStop sleeps + --drain-timeout inside
terminationGracePeriodSeconds; no Service in the file that selects the pods still
targets the engine's port (by number or name); an InferencePool selecting them targets
tokentap.

webhook: failurePolicy Fail only with the webhook's own namespace excluded; sideEffects
None; timeoutSeconds <= 10; every webhook selects by label (objectSelector or
namespaceSelector); CREATE of pods only; admissionReviewVersions v1; the caBundle comes
from a Certificate in the file (cert-manager.io/inject-ca-from) whose dnsNames cover the
Service; the Service's port reaches the Deployment's webhook port; the Deployment runs
`inject --serve` with the certificate's Secret mounted where --tls-cert/--tls-key point,
and probes on its admin port. Prints PASS/FAIL lines, exits 1 on any failure.
"""
import json
import re
import sys

import yaml

from checks import Checker, selects

WORKLOADS = {("apps/v1", k): "/spec/template" for k in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")}
WORKLOADS.update({("batch/v1", "Job"): "/spec/template", ("batch/v1", "CronJob"): "/spec/jobTemplate/spec/template",
                  ("v1", "Pod"): ""})
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    out = []
    for d in docs:
        if str(d.get("kind", "")).endswith("List") and isinstance(d.get("items"), list):
            out.extend(d["items"])
        else:
            out.append(d)
    return out


def pointer(obj, p):
    for part in [x for x in p.split("/") if x]:
        obj = (obj or {}).get(part)
    return obj


def builtin(d):
    group = str(d.get("apiVersion", "")).rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io") and not group.startswith(("inference.", "gateway."))


def split(src, builtin_out, other_out):
    docs = load(src)
    with open(builtin_out, "w") as f:
        yaml.safe_dump_all([d for d in docs if builtin(d)], f, sort_keys=False)
    with open(other_out, "w") as f:
        json.dump([d for d in docs if not builtin(d)], f)
    print(f"{src}: built-in {[d['kind'] for d in docs if builtin(d)]}, other {[d['kind'] for d in docs if not builtin(d)]}")
    return 0


def arg(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def seconds(text):
    m = re.fullmatch(r"(\d+)s", text or "")
    return int(m.group(1)) if m else None


def check_injected(path, c):
    docs = load(path)
    injected = []
    for d in docs:
        p = WORKLOADS.get((d.get("apiVersion"), d.get("kind")))
        if p is None:
            continue
        t = pointer(d, p) if p else d
        if "tokentap.dev/settings-hash" not in ((t.get("metadata") or {}).get("annotations") or {}):
            continue
        name = f"{path}: {d['kind']} {d['metadata'].get('name')}"
        spec = t["spec"]
        tt = [x for x in spec.get("initContainers", []) if x["name"] == "tokentap"]
        c.ok(len(tt) == 1 and not any(x["name"] == "tokentap" for x in spec.get("containers", [])),
             f"{name}: one tokentap, in initContainers")
        if not tt:
            continue
        tok = tt[0]
        c.ok(tok.get("restartPolicy") == "Always", f"{name}: native sidecar (restartPolicy: Always)")
        args = tok.get("args", [])
        ports = {p["containerPort"]: p.get("name") for p in tok.get("ports", [])}
        names = {v: k for k, v in ports.items()}
        listen, admin, ui, up = arg(args, "listen"), arg(args, "admin"), arg(args, "ui-listen"), arg(args, "upstream")
        c.ok(listen and int(listen.rsplit(":", 1)[1]) in ports, f"{name}: --listen is a container port", listen)
        c.ok(admin and int(admin.rsplit(":", 1)[1]) in ports, f"{name}: --admin is a container port", admin)
        admin_port = int(admin.rsplit(":", 1)[1]) if admin else None
        c.ok(ui and ui.rsplit(":", 1)[0] in LOOPBACK and int(ui.rsplit(":", 1)[1]) not in ports,
             f"{name}: the live view on loopback, not a container port", ui)
        m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", up or "")
        engine_port = int(m.group(1)) if m else None
        others = spec.get("containers", []) + [x for x in spec.get("initContainers", []) if x is not tok]
        declared = {p["containerPort"]: p.get("name") for x in others for p in x.get("ports", [])}
        c.ok(engine_port is not None and (engine_port in declared or not declared),
             f"{name}: --upstream is an engine port of the pod, over loopback", up)

        def on_admin(probe):
            g = (probe or {}).get("httpGet") or {}
            port = g.get("port")
            return (names.get(port) if isinstance(port, str) else port) == admin_port, g.get("path")
        for probe, path_want in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            on, got = on_admin(tok.get(probe))
            c.ok(on and got == path_want, f"{name}: {probe} GET {path_want} on the admin port", got)
        sleep = ((((tok.get("lifecycle") or {}).get("preStop") or {}).get("sleep")) or {}).get("seconds")
        c.ok(isinstance(sleep, int) and sleep > 0, f"{name}: preStop sleep")
        res = tok.get("resources") or {}
        c.ok(all(r in (res.get(k) or {}) for k in ("requests", "limits") for r in ("cpu", "memory")),
             f"{name}: requests and limits")
        sc = tok.get("securityContext") or {}
        c.ok(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
             and sc.get("runAsNonRoot") is True and "ALL" in ((sc.get("capabilities") or {}).get("drop") or [])
             and (sc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
             f"{name}: hardened securityContext")
        env = {e["name"] for e in tok.get("env", [])}
        c.ok({"K8S_POD_NAME", "K8S_POD_UID", "K8S_NAMESPACE_NAME", "K8S_NODE_NAME"} <= env, f"{name}: pod identity env")
        drain = seconds(arg(args, "drain-timeout"))
        if "--config" not in args:
            c.ok(drain is not None, f"{name}: configured by args alone (--drain-timeout set)")
        grace = spec.get("terminationGracePeriodSeconds", 30)
        engine_sleep = max([((((x.get("lifecycle") or {}).get("preStop") or {}).get("sleep")) or {}).get("seconds", 0)
                            for x in spec.get("containers", [])] or [0])
        budget = engine_sleep + (sleep or 0) + (drain or 0)
        c.ok(grace > budget, f"{name}: terminationGracePeriodSeconds {grace} > preStop sleeps + drain ({budget})")
        labels = (t.get("metadata") or {}).get("labels") or {}
        engine_names = {declared.get(engine_port)} - {None}
        injected.append((d.get("metadata", {}).get("namespace"), labels, engine_port, engine_names, name))

    for d in docs:
        ns = d.get("metadata", {}).get("namespace")
        for ins, labels, engine_port, engine_names, name in injected:
            if ins != ns:
                continue
            if d.get("kind") == "Service" and selects(d["spec"].get("selector"), labels):
                bypass = [p for p in d["spec"].get("ports", [])
                          if p.get("targetPort", p.get("port")) in {engine_port} | engine_names]
                c.ok(not bypass, f"{path}: Service {d['metadata']['name']} does not bypass tokentap to the engine", bypass)
            if d.get("kind") == "InferencePool" and selects(pointer(d, "/spec/selector"), labels):
                tps = [p.get("number") for p in pointer(d, "/spec/targetPorts") or []]
                c.ok(engine_port not in tps, f"{path}: InferencePool {d['metadata']['name']} targets tokentap", tps)
    c.ok(bool(injected), f"{path}: has injected workloads")


def check_webhook(path, c):
    docs = load(path)
    by = {}
    for d in docs:
        by.setdefault(d["kind"], []).append(d)
    mwcs = by.get("MutatingWebhookConfiguration", [])
    if not c.ok(len(mwcs) == 1, "one MutatingWebhookConfiguration"):
        return
    mwc = mwcs[0]
    deps = [d for d in by.get("Deployment", []) if "inject" in str(d["spec"]["template"]["spec"]["containers"][0].get("args"))]
    if not c.ok(len(deps) == 1, "one webhook Deployment (tokentap inject --serve)"):
        return
    dep = deps[0]
    own_ns = dep["metadata"].get("namespace")
    pod = dep["spec"]["template"]
    ctr = pod["spec"]["containers"][0]
    args = ctr.get("args", [])
    c.ok(args[:2] == ["inject", "--serve"], "the Deployment runs `tokentap inject --serve`", args[:2])
    c.ok(dep["spec"].get("replicas", 1) >= 2, "the webhook runs >= 2 replicas")
    pdbs = [p for p in by.get("PodDisruptionBudget", []) if selects(p["spec"].get("selector"), pod["metadata"]["labels"])]
    c.ok(len(pdbs) == 1, "a PodDisruptionBudget covers the webhook")
    ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    listen = int((arg(args, "listen") or ":8443").rsplit(":", 1)[1])
    admin = int((arg(args, "admin") or ":9464").rsplit(":", 1)[1])
    c.ok(listen in ports.values() and admin in ports.values(), "--listen and --admin are container ports")
    for probe, want in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        g = (ctr.get(probe) or {}).get("httpGet") or {}
        port = ports.get(g.get("port"), g.get("port"))
        c.ok(g.get("path") == want and port == admin, f"webhook {probe} GET {want} on the admin port")
    mounts = {m["name"]: m["mountPath"].rstrip("/") for m in ctr.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    certs = {c_["metadata"]["name"]: c_ for c_ in by.get("Certificate", [])}
    secret_names = {c_["spec"]["secretName"] for c_ in certs.values()}
    tls_ok = False
    for flag in ("tls-cert", "tls-key"):
        f = arg(args, flag) or ""
        hit = [n for n, mp in mounts.items() if f.startswith(mp + "/")]
        tls_ok = bool(hit) and (vols.get(hit[0], {}).get("secret") or {}).get("secretName") in secret_names
        c.ok(tls_ok, f"--{flag} is in a mounted Secret a Certificate writes", f)

    ca_from = (mwc["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from", "")
    cns, _, cname = ca_from.partition("/")
    cert = certs.get(cname)
    c.ok(cert is not None and cns == own_ns, "caBundle injected from a Certificate in the file (cert-manager.io/inject-ca-from)", ca_from)
    services = {s["metadata"]["name"]: s for s in by.get("Service", [])}
    for w in mwc.get("webhooks", []):
        n = w.get("name")
        svc_ref = (w.get("clientConfig") or {}).get("service") or {}
        svc = services.get(svc_ref.get("name"))
        if c.ok(svc is not None and svc_ref.get("namespace") == own_ns, f"{n}: clientConfig names the webhook Service"):
            sp = [p for p in svc["spec"]["ports"] if p["port"] == svc_ref.get("port", 443)]
            tp = sp[0].get("targetPort") if sp else None
            c.ok(bool(sp) and (tp == listen or ports.get(tp) == listen), f"{n}: the Service port reaches the webhook's TLS port")
            c.ok(selects(svc["spec"].get("selector"), pod["metadata"]["labels"]), f"{n}: the Service selects the webhook pods")
            if cert:
                c.ok(f"{svc['metadata']['name']}.{own_ns}.svc" in cert["spec"].get("dnsNames", []),
                     f"{n}: the certificate covers {svc['metadata']['name']}.{own_ns}.svc")
        c.ok(w.get("admissionReviewVersions") == ["v1"], f"{n}: admissionReviewVersions [v1]")
        c.ok(w.get("sideEffects") == "None", f"{n}: sideEffects None")
        c.ok(isinstance(w.get("timeoutSeconds"), int) and w["timeoutSeconds"] <= 10, f"{n}: timeoutSeconds <= 10")
        rules = w.get("rules", [])
        c.ok(rules and all(r.get("operations") == ["CREATE"] and r.get("resources") == ["pods"] and r.get("apiGroups") == [""]
                           for r in rules), f"{n}: CREATE of pods only")
        c.ok(bool(w.get("objectSelector")) or bool(w.get("namespaceSelector", {}).get("matchLabels"))
             or any(e.get("operator") in ("In", "Exists") for e in (w.get("namespaceSelector") or {}).get("matchExpressions", [])),
             f"{n}: selects opted-in pods by label")
        if w.get("failurePolicy", "Fail") == "Fail":
            excluded = any(e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn"
                           and own_ns in e.get("values", []) and "kube-system" in e.get("values", [])
                           for e in (w.get("namespaceSelector") or {}).get("matchExpressions", []))
            c.ok(excluded, f"{n}: failurePolicy Fail excludes the webhook's namespace and kube-system")


def main():
    mode, *files = sys.argv[1:]
    if mode == "split":
        return split(*files)
    c = Checker()
    for f in files:
        (check_injected if mode == "injected" else check_webhook)(f, c)
    print(f"{mode}: {c.passes} policy checks passed, {c.failures} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
