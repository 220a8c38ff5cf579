#!/usr/bin/env python3
"""Policy checks on deploy/Dockerfile that hadolint does not make.

  * multi-stage; the final stage is distroless (…:nonroot) or scratch;
  * builder and runtime are the same Debian release (glibc of the binary);
  * the final USER is a numeric non-root uid (Kubernetes can then verify
    runAsNonRoot without a passwd lookup);
  * EXPOSE 8080 and 9464; no HEALTHCHECK (Kubernetes probes do that);
  * exec-form ENTRYPOINT running tokentap; `cargo build --release --locked`;
  * deploy/Dockerfile.dockerignore keeps what the build needs (Cargo.toml,
    Cargo.lock, src/) and drops .git and target/;
  * with cargo on PATH: the build context (the repository filtered by that file,
    as BuildKit would send it) still holds a package with the `tokentap` binary
    target (`cargo metadata --no-deps` inside a copy of the context).
"""
import fnmatch
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
DF = ROOT / "deploy/Dockerfile"
IGNORE = ROOT / "deploy/Dockerfile.dockerignore"

passes = failures = 0


def ok(cond, what, detail=""):
    global passes, failures
    if cond:
        passes += 1
        print(f"PASS {what}")
    else:
        failures += 1
        print(f"FAIL {what}{': ' + str(detail) if detail else ''}")


def instructions(text):
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        word, _, rest = s.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def ignored(path, patterns):
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    result = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(pref, pat) or fnmatch.fnmatch(pref, pat.replace("**/", "")) for pref in prefixes):
            result = not neg
    return result


def main():
    ins = instructions(DF.read_text())
    froms = [(i, rest) for i, (w, rest) in enumerate(ins) if w == "FROM"]
    ok(len(froms) >= 2, "multi-stage build", f"{len(froms)} FROM")
    final_idx, final_from = froms[-1]
    final_image = final_from.split()[0]
    ok(final_image.startswith("gcr.io/distroless/") and final_image.endswith(":nonroot") or final_image == "scratch",
       "final stage is distroless :nonroot or scratch", final_image)
    builder_image = froms[0][1].split()[0]
    same_release = ("bookworm" in builder_image and "debian12" in final_image) or \
                   ("trixie" in builder_image and "debian13" in final_image) or final_image == "scratch"
    ok(same_release, "builder and runtime use the same Debian release", f"{builder_image} -> {final_image}")
    final = ins[final_idx:]
    users = [rest for w, rest in final if w == "USER"]
    uid = users[-1].split(":")[0] if users else ""
    ok(uid.isdigit() and int(uid) != 0, "final USER is a numeric non-root uid", users)
    exposed = {p.split("/")[0] for w, rest in final if w == "EXPOSE" for p in rest.split()}
    ok({"8080", "9464"} <= exposed, "EXPOSE 8080 9464", sorted(exposed))
    ok(all(w != "HEALTHCHECK" for w, _ in ins), "no HEALTHCHECK")
    ep = [rest for w, rest in final if w == "ENTRYPOINT"]
    ok(bool(ep) and ep[-1].startswith("[") and "tokentap" in ep[-1], "exec-form ENTRYPOINT runs tokentap", ep)
    ok(any(w == "RUN" and "cargo build" in rest and "--release" in rest and "--locked" in rest for w, rest in ins),
       "builder runs cargo build --release --locked")
    if IGNORE.exists():
        pats = [l.strip() for l in IGNORE.read_text().splitlines() if l.strip() and not l.startswith("#")]
        kept = [p for p in ("Cargo.toml", "Cargo.lock", "src/main.rs") if ignored(p, pats)]
        ok(not kept, "build context keeps Cargo.toml, Cargo.lock, src/", f"ignored: {kept}")
        dropped = [p for p in (".git/HEAD", "target/release/tokentap", "fuzz/target/x", "fuzz/corpus/x",
                               "crates/sim/target/x") if not ignored(p, pats)]
        ok(not dropped, "build context drops .git, every target/ and fuzz/", f"not ignored: {dropped}")
        if shutil.which("cargo"):
            with tempfile.TemporaryDirectory() as ctx:
                for dirpath, dirnames, filenames in os.walk(ROOT):
                    rel = os.path.relpath(dirpath, ROOT)
                    rel = "" if rel == "." else rel + "/"
                    dirnames[:] = [d for d in dirnames if not ignored(rel + d, pats)]
                    for fn in filenames:
                        if not ignored(rel + fn, pats):
                            dst = pathlib.Path(ctx, rel, fn)
                            dst.parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(os.path.join(dirpath, fn), dst)
                r = subprocess.run(["cargo", "metadata", "--no-deps", "--offline", "--format-version", "1"],
                                   cwd=ctx, capture_output=True, text=True)
                bins = []
                if r.returncode == 0:
                    for pkg in json.loads(r.stdout)["packages"]:
                        bins += [t["name"] for t in pkg["targets"] if "bin" in t["kind"]]
                ok("tokentap" in bins, "the filtered build context is a cargo package with the `tokentap` binary",
                   r.stderr.strip()[-500:] or f"bins: {bins}")
    else:
        ok(False, "deploy/Dockerfile.dockerignore exists")
    print(f"dockerfile: {passes} checks passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
