#!/usr/bin/env python3
"""Policy checks on a rendered kustomize overlay (what schema validation cannot see).

    check-manifests.py --layout sidecar RENDERED.yaml
    check-manifests.py --layout gateway RENDERED.yaml

Schemas say a manifest is well-formed; these checks say the pieces fit together
and follow the contract of tokentap:
  * the tokentap container: ports http=8080 / metrics=9464 matching `listen` /
    `admin` in its config, probes (/healthz liveness+startup, /readyz readiness on
    the admin port), preStop sleep, requests+limits, hardened securityContext;
  * the config comes from a rendered ConfigMap that is mounted where --config
    points, and uses only the agreed keys;
  * terminationGracePeriodSeconds covers the preStop sleeps + shutdown.drain_timeout;
  * sidecar: a native sidecar (initContainers + restartPolicy Always) forwarding to
    an engine port in the same pod; the Service targets tokentap, not the engine;
  * gateway: >= 2 replicas, a PodDisruptionBudget that matches and allows a
    disruption, the Service targets tokentap;
  * the PodMonitor / ServiceMonitor selects those pods / that Service, scrapes the
    `metrics` port and sets job="tokentap" (what the alerts and dashboard use).
Prints PASS/FAIL lines, exits 1 on any failure. Needs PyYAML.
"""
import argparse
import re
import sys
from urllib.parse import urlparse

import yaml

from checks import Checker, selects

# The gateway serves many models and tenants, so its config raises the label caps.
CONFIG_KEYS = {"listen", "admin", "upstream.url", "shutdown.drain_timeout", "log.format",
               "ui.listen",
               "labels.model.max_values", "labels.tenant.max_values", "labels.max_pairs"}
HTTP_PORT, ADMIN_PORT = 8080, 9464


def duration_seconds(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def flatten(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def probe_path_port(probe):
    g = (probe or {}).get("httpGet") or {}
    return g.get("path"), g.get("port")


def port_number(container, ref):
    for p in container.get("ports", []):
        if ref in (p.get("name"), p.get("containerPort")):
            return p.get("containerPort")
    return None


def check(docs, layout, c):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    deployments = by_kind.get("Deployment", [])
    c.ok(len(deployments) == 1, "exactly one Deployment", f"found {len(deployments)}")
    if not deployments:
        return
    dep = deployments[0]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    pod_labels = pod["metadata"].get("labels", {})
    c.ok(selects(dep["spec"].get("selector"), pod_labels), "Deployment selector matches its pod template labels")

    where = "initContainers" if layout == "sidecar" else "containers"
    tt = [x for x in spec.get(where, []) if x.get("name") == "tokentap"]
    if not c.ok(len(tt) == 1, f"tokentap container in spec.{where}"):
        return
    tok = tt[0]
    other = "containers" if layout == "sidecar" else "initContainers"
    c.ok(all(x.get("name") != "tokentap" for x in spec.get(other, [])), f"no second tokentap in spec.{other}")
    if layout == "sidecar":
        c.ok(tok.get("restartPolicy") == "Always", "tokentap is a native sidecar (restartPolicy: Always)")

    image = tok.get("image", "")
    tag = image.rsplit("/", 1)[-1].partition(":")[2] if "@" not in image else "digest"
    c.ok(tag and tag != "latest", "tokentap image has a pinned tag", image)

    # ports
    c.ok(port_number(tok, "http") == HTTP_PORT, f"tokentap port `http` = {HTTP_PORT}")
    c.ok(port_number(tok, "metrics") == ADMIN_PORT, f"tokentap port `metrics` = {ADMIN_PORT} (admin)")

    # probes
    lp, lport = probe_path_port(tok.get("livenessProbe"))
    rp, rport = probe_path_port(tok.get("readinessProbe"))
    c.ok(lp == "/healthz" and port_number(tok, lport) == ADMIN_PORT, "liveness probe GET /healthz on the admin port", f"{lp} {lport}")
    c.ok(rp == "/readyz" and port_number(tok, rport) == ADMIN_PORT, "readiness probe GET /readyz on the admin port", f"{rp} {rport}")
    if "startupProbe" in tok:
        sp, sport = probe_path_port(tok["startupProbe"])
        # For a native sidecar /readyz would deadlock: it needs the engine, which
        # only starts after the sidecar's startup probe succeeded.
        c.ok(sp == "/healthz" and port_number(tok, sport) == ADMIN_PORT, "startup probe GET /healthz (not /readyz) on the admin port", f"{sp} {sport}")

    # preStop sleep (distroless: no shell for exec)
    pre = ((tok.get("lifecycle") or {}).get("preStop") or {})
    sleep = (pre.get("sleep") or {}).get("seconds")
    c.ok(isinstance(sleep, int) and sleep > 0 and "exec" not in pre, "tokentap preStop is a `sleep` action", str(pre))
    sleep = sleep if isinstance(sleep, int) else 0

    # resources
    res = tok.get("resources") or {}
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            c.ok(r in (res.get(kind) or {}), f"tokentap resources.{kind}.{r} set")

    # securityContext (container level, seccomp may come from the pod)
    sc = tok.get("securityContext") or {}
    psc = spec.get("securityContext") or {}
    c.ok(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem: true")
    c.ok(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation: false")
    c.ok((sc.get("runAsNonRoot", psc.get("runAsNonRoot"))) is True, "runAsNonRoot: true")
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    c.ok(isinstance(uid, int) and uid > 0, "runAsUser is a numeric non-root uid", str(uid))
    c.ok("ALL" in ((sc.get("capabilities") or {}).get("drop") or []), "capabilities drop ALL")
    seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    c.ok(seccomp == "RuntimeDefault", "seccompProfile RuntimeDefault", str(seccomp))

    # config: --config FILE on a mounted, rendered ConfigMap
    args = tok.get("args", [])
    cfg_path = None
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            cfg_path = args[i + 1]
        elif a.startswith("--config="):
            cfg_path = a.split("=", 1)[1]
    if not c.ok(cfg_path is not None, "tokentap runs with --config"):
        return
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    cfg = None
    for m in tok.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/") + "/"
        if cfg_path.startswith(mp):
            vol = volumes.get(m["name"], {})
            cm_name = (vol.get("configMap") or {}).get("name")
            key = cfg_path[len(mp):]
            cms = [d for d in by_kind.get("ConfigMap", []) if d["metadata"]["name"] == cm_name]
            c.ok(m.get("readOnly") is True, f"config volume `{m['name']}` mounted readOnly")
            if c.ok(len(cms) == 1 and key in (cms[0].get("data") or {}), f"--config {cfg_path} is key `{key}` of rendered ConfigMap {cm_name}"):
                cfg = yaml.safe_load(cms[0]["data"][key])
    if not c.ok(isinstance(cfg, dict), "tokentap config is a YAML mapping"):
        return
    flat = flatten(cfg)
    unknown = sorted(set(flat) - CONFIG_KEYS)
    c.ok(not unknown, "config uses only the agreed keys " + ", ".join(sorted(CONFIG_KEYS)), f"unexpected: {unknown}")
    c.ok(str(flat.get("listen", "")).rsplit(":", 1)[-1] == str(HTTP_PORT), f"config listen port = container port http ({HTTP_PORT})", str(flat.get("listen")))
    c.ok(str(flat.get("admin", "")).rsplit(":", 1)[-1] == str(ADMIN_PORT), f"config admin port = container port metrics ({ADMIN_PORT})", str(flat.get("admin")))
    c.ok(flat.get("log.format") in ("json", "text"), "config log.format is json|text", str(flat.get("log.format")))
    # The live view lists requests one by one (model, tenant, trace id): loopback only,
    # reached with kubectl port-forward, never a container port.
    ui_listen = str(flat.get("ui.listen", "127.0.0.1:9465"))
    ui_host, _, ui_port = ui_listen.rpartition(":")
    c.ok(ui_host.strip("[]") in ("127.0.0.1", "::1"), "the live view (ui.listen) listens on loopback", ui_listen)
    declared = {p.get("containerPort") for p in tok.get("ports", [])}
    c.ok(not ui_port.isdigit() or int(ui_port) not in declared, "the live view's port is not a container port", str(sorted(declared)))
    try:
        drain = duration_seconds(flat.get("shutdown.drain_timeout", "30s"))
    except ValueError as e:
        c.ok(False, "shutdown.drain_timeout parses", str(e))
        drain = 30.0
    upstream = urlparse(str(flat.get("upstream.url", "")))
    c.ok(upstream.scheme in ("http", "https") and upstream.hostname, "upstream.url is an http(s) URL", str(flat.get("upstream.url")))

    grace = spec.get("terminationGracePeriodSeconds", 30)
    budget = sleep + drain
    engine_sleep = 0
    if layout == "sidecar":
        engines = spec.get("containers", [])
        c.ok(len(engines) >= 1, "engine container(s) in spec.containers")
        c.ok(upstream.hostname in ("127.0.0.1", "localhost", "::1"), "sidecar forwards to the engine over loopback", upstream.hostname or "")
        up_port = upstream.port or (443 if upstream.scheme == "https" else 80)
        engine_ports = {p.get("containerPort") for e in engines for p in e.get("ports", [])}
        c.ok(up_port in engine_ports, f"upstream port {up_port} is an engine container port", str(sorted(engine_ports)))
        gpu = any("nvidia.com/gpu" in ((e.get("resources") or {}).get("limits") or {}) for e in engines)
        c.ok(gpu, "engine requests a GPU (nvidia.com/gpu limit)")
        # Native sidecars are stopped after the main containers: the engine's preStop
        # and drain come first, then tokentap's preStop + drain.
        engine_sleep = max(((((e.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0) for e in engines), default=0)
        budget += engine_sleep
    c.ok(grace > budget, f"terminationGracePeriodSeconds ({grace}) > preStop sleeps + drain_timeout ({budget:g})")
    c.ok(grace > drain, f"terminationGracePeriodSeconds ({grace}) > shutdown.drain_timeout ({drain:g})")

    # Service -> tokentap http port
    services = by_kind.get("Service", [])
    if c.ok(len(services) == 1, "exactly one Service"):
        svc = services[0]
        c.ok(selects(svc["spec"].get("selector"), pod_labels), "Service selector matches the pod labels")
        http_ports = [p for p in svc["spec"]["ports"] if port_number(tok, p.get("targetPort")) == HTTP_PORT
                      or p.get("targetPort") == HTTP_PORT]
        c.ok(len(http_ports) >= 1, f"Service targets tokentap's http port {HTTP_PORT}")
        if layout == "sidecar":
            # Named targetPorts of sidecar (init) containers are not resolved everywhere.
            c.ok(all(isinstance(p.get("targetPort"), int) for p in svc["spec"]["ports"]), "sidecar Service uses numeric targetPorts")
        engine_ports = {p.get("containerPort") for e in (spec.get("containers", []) if layout == "sidecar" else [])
                        for p in e.get("ports", [])}
        engine_names = {p.get("name") for e in (spec.get("containers", []) if layout == "sidecar" else [])
                        for p in e.get("ports", [])}
        bypass = [p for p in svc["spec"]["ports"] if p.get("targetPort") in engine_ports | engine_names]
        c.ok(not bypass, "no Service port bypasses tokentap to the engine", str(bypass))

    if layout == "sidecar":
        pms = by_kind.get("PodMonitor", [])
        if c.ok(len(pms) == 1, "one PodMonitor"):
            pm = pms[0]["spec"]
            c.ok(selects(pm.get("selector"), pod_labels), "PodMonitor selector matches the pod labels")
            eps = pm.get("podMetricsEndpoints", [])
            c.ok(len(eps) == 1 and eps[0].get("port") == "metrics", "PodMonitor scrapes port `metrics`")
            rel = eps[0].get("relabelings", []) if eps else []
            c.ok(any(r.get("targetLabel") == "job" and r.get("replacement") == "tokentap" for r in rel), "PodMonitor sets job=tokentap")
            c.ok(any(r.get("action") == "keep" and "__meta_kubernetes_pod_container_name" in r.get("sourceLabels", [])
                     and re.fullmatch(r.get("regex", ""), "tokentap") for r in rel), "PodMonitor keeps only the tokentap container")
    else:
        c.ok(dep["spec"].get("replicas", 1) >= 2, "gateway runs >= 2 replicas", str(dep["spec"].get("replicas")))
        pdbs = by_kind.get("PodDisruptionBudget", [])
        if c.ok(len(pdbs) == 1, "one PodDisruptionBudget"):
            pdb = pdbs[0]["spec"]
            c.ok(selects(pdb.get("selector"), pod_labels), "PodDisruptionBudget selector matches the pod labels")
            reps = dep["spec"].get("replicas", 1)
            allows = (isinstance(pdb.get("maxUnavailable"), int) and 1 <= pdb["maxUnavailable"] < reps) or \
                     (isinstance(pdb.get("minAvailable"), int) and pdb["minAvailable"] < reps)
            c.ok(allows, "PodDisruptionBudget keeps a replica and still allows a drain")
        sms = by_kind.get("ServiceMonitor", [])
        if c.ok(len(sms) == 1, "one ServiceMonitor") and services:
            sm = sms[0]["spec"]
            svc = services[0]
            c.ok(selects(sm.get("selector"), svc["metadata"].get("labels", {})), "ServiceMonitor selector matches the Service labels")
            eps = sm.get("endpoints", [])
            svc_ports = {p.get("name"): p for p in svc["spec"]["ports"]}
            ok = len(eps) == 1 and eps[0].get("port") in svc_ports and \
                port_number(tok, svc_ports[eps[0]["port"]].get("targetPort")) == ADMIN_PORT
            c.ok(ok, "ServiceMonitor endpoint is the Service port that targets the admin port")
            rel = eps[0].get("relabelings", []) if eps else []
            c.ok(any(r.get("targetLabel") == "job" and r.get("replacement") == "tokentap" for r in rel), "ServiceMonitor sets job=tokentap")
        aff = (spec.get("affinity") or {}).get("podAntiAffinity")
        if aff:
            terms = aff.get("preferredDuringSchedulingIgnoredDuringExecution", []) + aff.get("requiredDuringSchedulingIgnoredDuringExecution", [])
            sel_ok = all(selects((t.get("podAffinityTerm", t)).get("labelSelector"), pod_labels) for t in terms)
            c.ok(sel_ok, "pod anti-affinity selects the gateway's own pods")

    c.ok(len(by_kind.get("PrometheusRule", [])) == 1, "PrometheusRule included")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", choices=["sidecar", "gateway"], required=True)
    ap.add_argument("rendered")
    a = ap.parse_args()
    with open(a.rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    c = Checker()
    check(docs, a.layout, c)
    print(f"{a.layout}: {c.passes} policy checks passed, {c.failures} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
