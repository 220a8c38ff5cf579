#!/usr/bin/env python3
"""Helpers for deploy/prometheus/scrape-config.yaml.

  prom_config.py check-sd CONFIG
      Structural check of the `tokentap` job's kubernetes_sd_configs (Debian's
      promtool is built without Kubernetes discovery and rejects the block, so it
      cannot check it): known keys, role `pod`, and every __meta_kubernetes_*
      label used by relabel_configs exists for the pod role (a typo there silently
      drops every target, which no promtool would catch).

  prom_config.py derive CONFIG OUT [--rules PATH] [--interval 1s]
                 [--target ADDR[,label=value...]]... [--alertmanager ADDR]
      Write a runnable config: the same job with the same relabel_configs, but
      static targets that carry the __meta_kubernetes_* labels the pod role would
      set, and with --alertmanager an Alertmanager to send alerts to. Used by
      ops-check (`promtool check config` on everything but the SD block) and by
      e2e-prometheus.sh and e2e-alerts.sh (the real relabel rules decide which
      loopback targets are scraped).
"""
import argparse
import copy
import re
import sys

import yaml

SD_KEYS = {"api_server", "role", "kubeconfig_file", "basic_auth", "authorization", "oauth2", "proxy_url",
           "no_proxy", "proxy_from_environment", "proxy_connect_header", "follow_redirects", "enable_http2",
           "tls_config", "namespaces", "selectors", "attach_metadata", "http_headers"}
ROLES = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
POD_META = {"namespace", "pod_name", "pod_ip", "pod_container_init", "pod_container_name", "pod_container_id",
            "pod_container_image", "pod_container_port_name", "pod_container_port_number",
            "pod_container_port_protocol", "pod_ready", "pod_phase", "pod_node_name", "pod_host_ip", "pod_uid",
            "pod_controller_kind", "pod_controller_name"}
POD_META_PREFIX = ("pod_label_", "pod_labelpresent_", "pod_annotation_", "pod_annotationpresent_",
                   "namespace_label_", "namespace_labelpresent_", "namespace_annotation_", "namespace_annotationpresent_",
                   "node_label_", "node_labelpresent_")
PHASES = {"Pending", "Running", "Succeeded", "Failed", "Unknown"}


def job(cfg, name="tokentap"):
    for j in cfg.get("scrape_configs") or []:
        if j.get("job_name") == name:
            return j
    sys.exit(f"no scrape job {name!r}")


def check_sd(path):
    cfg = yaml.safe_load(open(path))
    j = job(cfg)
    problems = []
    sds = j.get("kubernetes_sd_configs") or []
    if len(sds) != 1:
        problems.append(f"expected one kubernetes_sd_configs entry, got {len(sds)}")
    for sd in sds:
        unknown = set(sd) - SD_KEYS
        if unknown:
            problems.append(f"unknown kubernetes_sd_config keys {sorted(unknown)}")
        if sd.get("role") != "pod":
            problems.append(f"role must be pod (container ports), got {sd.get('role')!r}")
        ns = sd.get("namespaces")
        if ns is not None and (not isinstance(ns, dict) or set(ns) - {"names", "own_namespace"}):
            problems.append(f"bad namespaces block {ns!r}")
    metas = set()
    for r in j.get("relabel_configs") or []:
        for l in r.get("source_labels") or []:
            if l.startswith("__meta_"):
                metas.add(l)
        try:
            re.compile(str(r.get("regex", "(.*)")))
        except re.error as e:
            problems.append(f"bad regex {r.get('regex')!r}: {e}")
        if r.get("action") == "drop" and r.get("source_labels") == ["__meta_kubernetes_pod_phase"]:
            bad = set(str(r.get("regex", "")).split("|")) - PHASES
            if bad:
                problems.append(f"unknown pod phases {sorted(bad)}")
    for l in sorted(metas):
        rest = l[len("__meta_kubernetes_"):] if l.startswith("__meta_kubernetes_") else None
        if rest is None or not (rest in POD_META or rest.startswith(POD_META_PREFIX)):
            problems.append(f"{l} is not a pod-role meta label")
    keep = [r for r in j.get("relabel_configs") or [] if r.get("action") == "keep"]
    if not any("__meta_kubernetes_pod_container_port_name" in (r.get("source_labels") or []) for r in keep):
        problems.append("no keep rule on __meta_kubernetes_pod_container_port_name")
    for p in problems:
        print(f"FAIL {p}")
    if not problems:
        print(f"PASS kubernetes_sd_configs (role pod) and the {len(metas)} meta labels used by relabel_configs: {sorted(metas)}")
    return 1 if problems else 0


def derive(path, out, rules, interval, targets, alertmanager=None):
    cfg = yaml.safe_load(open(path))
    new = copy.deepcopy(cfg)
    new["global"] = dict(new.get("global") or {}, scrape_interval=interval, evaluation_interval=interval)
    new["rule_files"] = [rules] if rules else []
    if alertmanager:
        new["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    j = job(new)
    j.pop("kubernetes_sd_configs", None)
    j["scrape_interval"] = interval
    j["scrape_timeout"] = interval
    static = []
    for t in targets:
        addr, *pairs = t.split(",")
        static.append({"targets": [addr], "labels": dict(p.split("=", 1) for p in pairs)})
    j["static_configs"] = static
    new["scrape_configs"] = [j]
    with open(out, "w") as f:
        yaml.safe_dump(new, f, sort_keys=False)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-sd")
    c.add_argument("config")
    d = sub.add_parser("derive")
    d.add_argument("config")
    d.add_argument("out")
    d.add_argument("--rules")
    d.add_argument("--interval", default="15s")
    d.add_argument("--target", action="append", default=[])
    d.add_argument("--alertmanager", help="host:port of an Alertmanager")
    a = ap.parse_args()
    if a.cmd == "check-sd":
        return check_sd(a.config)
    return derive(a.config, a.out, a.rules, a.interval, a.target, a.alertmanager)


if __name__ == "__main__":
    sys.exit(main())
