#!/usr/bin/env python3
"""Checks the Kubernetes manifests offline: every object against the
Kubernetes API schemas (the `kubernetes-validate` package bundles them),
then the references between objects and against the staccato binary.

    python3 deploy/kubernetes/check_manifests.py [DIR] [--binary target/release/staccato]

What it checks besides the schemas:
* the kustomization lists every manifest file in DIR, and only those;
* every namespaced object is in the Namespace the manifests create;
* a workload's selector matches its pod template's labels;
* a Service's selector matches some workload's pods, and each of its
  target ports is a port those pods' containers declare;
* a StatefulSet's serviceName is a headless Service;
* every secretKeyRef and secret volume names a Secret and a key it has;
* every volumeMount names a volume of its pod; every $(VAR) in args or
  command is defined in the container's env;
* probes' ports are declared ports; with --binary, the gateway's probe
  paths are routes a running gateway (with no engine) answers: 2xx for
  liveness, 200 or 503 for readiness;
* for the staccato containers, with --binary: every flag in args is one the
  subcommand accepts (from its --help), the listen ports are the declared
  container ports, --store and --join-every name Services that serve that
  port, and --*-file flags point into a mounted volume (for a secret
  volume: at one of its items);
* NetworkPolicies select existing pods and allow only ports those pods
  declare.

Exit status 1 and one line per problem if anything fails.
"""

import argparse
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

K8S_VERSION = "1.30"
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet")
CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding")


class Manifests:
    def __init__(self, directory):
        self.dir = Path(directory)
        self.objects = []  # (file name, object)
        self.errors = []
        self.kustomization = None
        for f in sorted(self.dir.glob("*.yaml")):
            try:
                docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
            except yaml.YAMLError as e:
                self.errors.append(f"{f.name}: not YAML: {e}")
                continue
            for d in docs:
                if not isinstance(d, dict):
                    self.errors.append(f"{f.name}: a document that is not a mapping")
                elif d.get("kind") == "Kustomization":
                    self.kustomization = (f.name, d)
                else:
                    self.objects.append((f.name, d))

    def err(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def of_kind(self, *kinds):
        return [(f, o) for f, o in self.objects if o.get("kind") in kinds]

    def named(self, kind, name):
        for _, o in self.of_kind(kind):
            if o.get("metadata", {}).get("name") == name:
                return o
        return None


def where(f, o):
    return f"{f} {o.get('kind')}/{o.get('metadata', {}).get('name')}"


def pod_spec(o):
    return o.get("spec", {}).get("template", {}).get("spec", {})


def pod_labels(o):
    return o.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}) or {}


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_ports(o):
    """name -> number and the set of numbers of a workload's containers."""
    names, numbers = {}, set()
    for c in pod_spec(o).get("containers", []):
        for p in c.get("ports", []) or []:
            numbers.add(p.get("containerPort"))
            if p.get("name"):
                names[p["name"]] = p.get("containerPort")
    return names, numbers


def resolve_port(o, port):
    """A named or numbered port of workload `o`, as a number, or None."""
    names, numbers = container_ports(o)
    if port is None:
        return None
    if isinstance(port, str) and not port.isdigit():
        return names.get(port)
    return int(port) if int(port) in numbers else None


# ------------------------------------------------------------ the checks

def check_schemas(m):
    import kubernetes_validate

    for f, o in m.objects:
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            m.err(where(f, o), f"schema: {e.message} (at {path or 'top level'})")
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
            m.err(where(f, o), f"schema: {e}")


def check_kustomization(m):
    if m.kustomization is None:
        m.err(str(m.dir), "no kustomization.yaml (kubectl apply -k needs one)")
        return
    f, k = m.kustomization
    listed = set(k.get("resources", []))
    present = {p.name for p in m.dir.glob("*.yaml")} - {f}
    for missing in sorted(present - listed):
        m.err(f, f"{missing} is not in resources")
    for extra in sorted(listed - present):
        m.err(f, f"resources lists {extra}, which does not exist")


def check_namespaces(m):
    spaces = {o["metadata"]["name"] for _, o in m.of_kind("Namespace")}
    for f, o in m.objects:
        if o.get("kind") in CLUSTER_SCOPED:
            continue
        ns = o.get("metadata", {}).get("namespace")
        if ns not in spaces:
            m.err(where(f, o), f"namespace {ns!r} is not one the manifests create ({sorted(spaces)})")


def check_workloads(m):
    for f, o in m.of_kind(*WORKLOAD_KINDS):
        sel = o.get("spec", {}).get("selector", {}).get("matchLabels", {})
        if not matches(sel, pod_labels(o)):
            m.err(where(f, o), f"selector {sel} does not match its pod labels {pod_labels(o)}")
        spec = pod_spec(o)
        volumes = {v.get("name") for v in spec.get("volumes", []) or []}
        volumes |= {t.get("metadata", {}).get("name") for t in o.get("spec", {}).get("volumeClaimTemplates", []) or []}
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            cw = f"{where(f, o)} container {c.get('name')}"
            for vm in c.get("volumeMounts", []) or []:
                if vm.get("name") not in volumes:
                    m.err(cw, f"volumeMount {vm.get('name')!r} names no volume of the pod")
            env = {e.get("name") for e in c.get("env", []) or []}
            for arg in (c.get("args") or []) + (c.get("command") or []):
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(arg)):
                    if var not in env:
                        m.err(cw, f"$({var}) in {arg!r} is not in the container's env")
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = c.get(kind) or {}
                for how in ("httpGet", "tcpSocket"):
                    if how in probe and resolve_port(o, probe[how].get("port")) is None:
                        m.err(cw, f"{kind} port {probe[how].get('port')!r} is not a declared container port")
    for f, o in m.of_kind("StatefulSet"):
        svc = m.named("Service", o.get("spec", {}).get("serviceName"))
        if svc is None:
            m.err(where(f, o), f"serviceName {o['spec'].get('serviceName')!r} is not a Service")
        elif svc.get("spec", {}).get("clusterIP") != "None":
            m.err(where(f, o), f"serviceName {svc['metadata']['name']} is not headless (clusterIP: None)")


def service_targets(m, svc):
    sel = svc.get("spec", {}).get("selector", {})
    return [o for _, o in m.of_kind(*WORKLOAD_KINDS) if matches(sel, pod_labels(o))]


def check_services(m):
    for f, s in m.of_kind("Service"):
        targets = service_targets(m, s)
        if not targets:
            m.err(where(f, s), f"selector {s.get('spec', {}).get('selector')} matches no workload's pods")
            continue
        for p in s.get("spec", {}).get("ports", []):
            tp = p.get("targetPort", p.get("port"))
            for o in targets:
                if resolve_port(o, tp) is None:
                    m.err(where(f, s), f"port {p.get('port')} targets {tp!r}, not a port of {o['metadata']['name']}")


def check_secrets(m):
    def has(name, key):
        s = m.named("Secret", name)
        if s is None:
            return f"Secret {name!r} does not exist"
        keys = set((s.get("data") or {}).keys()) | set((s.get("stringData") or {}).keys())
        return None if key is None or key in keys else f"Secret {name} has no key {key!r} (has {sorted(keys)})"

    for f, o in m.of_kind(*WORKLOAD_KINDS):
        spec = pod_spec(o)
        for c in spec.get("containers", []):
            for e in c.get("env", []) or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref and (why := has(ref.get("name"), ref.get("key"))):
                    m.err(f"{where(f, o)} env {e.get('name')}", why)
        for v in spec.get("volumes", []) or []:
            if "secret" in v:
                sec = v["secret"]
                if why := has(sec.get("secretName"), None):
                    m.err(f"{where(f, o)} volume {v.get('name')}", why)
                for item in sec.get("items", []) or []:
                    if why := has(sec.get("secretName"), item.get("key")):
                        m.err(f"{where(f, o)} volume {v.get('name')}", why)


def check_network_policies(m):
    workloads = m.of_kind(*WORKLOAD_KINDS)

    def selected(sel, w=""):
        if (sel or {}).get("matchExpressions"):
            m.err(w, "a selector with matchExpressions: the checker follows matchLabels only")
        labels = (sel or {}).get("matchLabels", {})
        return [o for _, o in workloads if all(pod_labels(o).get(k) == v for k, v in labels.items())]

    for f, p in m.of_kind("NetworkPolicy"):
        spec = p.get("spec", {})
        for rule in (spec.get("ingress") or []) + (spec.get("egress") or []):
            for port in rule.get("ports", []) or []:
                if port.get("port") is None:
                    m.err(where(f, p), "a rule's port entry without a port allows every port")
        own = selected(spec.get("podSelector"), where(f, p))
        if not own:
            m.err(where(f, p), "podSelector matches no workload's pods")
        for rule in spec.get("ingress", []) or []:
            for port in rule.get("ports", []) or []:
                for o in own:
                    if resolve_port(o, port.get("port")) is None:
                        m.err(where(f, p), f"ingress port {port.get('port')} is not a port of {o['metadata']['name']}")
            for peer in rule.get("from", []) or []:
                if "podSelector" in peer and "namespaceSelector" not in peer and not selected(peer["podSelector"], where(f, p)):
                    m.err(where(f, p), f"ingress from {peer['podSelector']} matches no workload's pods")
        for rule in spec.get("egress", []) or []:
            for peer in rule.get("to", []) or []:
                if "podSelector" not in peer or "namespaceSelector" in peer:
                    continue  # outside the manifests (e.g. the cluster's DNS)
                targets = selected(peer["podSelector"], where(f, p))
                if not targets:
                    m.err(where(f, p), f"egress to {peer['podSelector']} matches no workload's pods")
                for port in rule.get("ports", []) or []:
                    for o in targets:
                        if resolve_port(o, port.get("port")) is None:
                            m.err(where(f, p), f"egress port {port.get('port')} is not a port of {o['metadata']['name']}")


# ------------------------------------------------------------ against the binary

def staccato_containers(m):
    for f, o in m.of_kind(*WORKLOAD_KINDS):
        for c in pod_spec(o).get("containers", []):
            if c.get("image", "").split("/")[-1].startswith("staccato:"):
                yield f, o, c


def flags_of(binary, sub, cache={}):
    if (binary, sub) not in cache:
        out = subprocess.run([str(binary), sub, "--help"], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"{binary} {sub} --help failed: {out.stderr.strip()}")
        cache[(binary, sub)] = set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", out.stdout, re.M))
    return cache[(binary, sub)]


def parse_args(args):
    """--flag=value and --flag value pairs, in order."""
    out, i = [], 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                k, v = a, str(args[i + 1])
                i += 1
            else:
                k, v = a, None
            out.append((k, v))
        i += 1
    return out


def service_serving(m, host, port):
    """Why host:port is not a Service port of the manifests, or None."""
    name = host.split(".")[0]
    s = m.named("Service", name)
    if s is None:
        return f"{host} is not a Service of the manifests"
    if int(port) not in {p.get("port") for p in s.get("spec", {}).get("ports", [])}:
        return f"Service {name} has no port {port}"
    return None


def check_binary_flags(m, binary):
    for f, o, c in staccato_containers(m):
        cw = f"{where(f, o)} container {c.get('name')}"
        args = c.get("args") or []
        if not args or str(args[0]).startswith("-"):
            m.err(cw, "args must start with the subcommand (gateway or engine)")
            continue
        sub = str(args[0])
        try:
            known = flags_of(binary, sub)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            m.err(cw, str(e))
            continue
        mounts = {vm["mountPath"]: vm["name"] for vm in c.get("volumeMounts", []) or []}
        volumes = {v["name"]: v for v in pod_spec(o).get("volumes", []) or []}
        _, declared = container_ports(o)
        for k, v in parse_args(args[1:]):
            if k not in known:
                m.err(cw, f"`staccato {sub}` has no flag {k}")
                continue
            if k in ("--listen", "--engine-listen", "--advertise") and v:
                port = v.rsplit(":", 1)[-1]
                if not port.isdigit() or int(port) not in declared:
                    m.err(cw, f"{k}={v}: port {port} is not a declared container port {sorted(declared)}")
            if k == "--store" and v:
                hit = re.fullmatch(r"etcd://([^/]+)(/.*)?", v)
                if not hit:
                    m.err(cw, f"--store={v} is not etcd://HOST:PORT[,...]")
                for hp in (hit.group(1).split(",") if hit else []):
                    host, _, port = hp.rpartition(":")
                    if why := service_serving(m, host, port):
                        m.err(cw, f"--store: {why}")
            if k in ("--join-every", "--join") and v:
                hit = re.fullmatch(r"http://([^:/]+):(\d+)/?", v)
                if not hit:
                    m.err(cw, f"{k}={v} is not http://HOST:PORT")
                elif why := service_serving(m, hit.group(1), hit.group(2)):
                    m.err(cw, f"{k}: {why}")
                elif k == "--join-every":
                    svc = m.named("Service", hit.group(1).split(".")[0])
                    if svc.get("spec", {}).get("clusterIP") != "None":
                        m.err(cw, f"--join-every needs a headless Service (one address per gateway): {svc['metadata']['name']} is not")
            if k.endswith("-file") and v:
                mp = next((mp for mp in mounts if v.startswith(mp.rstrip("/") + "/")), None)
                if mp is None:
                    m.err(cw, f"{k}={v} is in no mounted volume")
                    continue
                vol = volumes.get(mounts[mp], {})
                rel = v[len(mp.rstrip("/")) + 1:]
                items = (vol.get("secret") or {}).get("items")
                if items is not None and rel not in {i.get("path") for i in items}:
                    m.err(cw, f"{k}={v}: the secret volume {mounts[mp]} has no item at {rel}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_probe_paths(m, binary):
    """Starts a gateway on loopback, with no engine, and asks it for each
    probe path. A liveness path must answer 2xx even so (or a gateway
    whose engines are away would be restarted for it); a readiness path
    200 or 503 (not ready: no engine); a startup path 2xx."""
    paths = set()
    for f, o, c in staccato_containers(m):
        if (c.get("args") or [None])[0] != "gateway":
            continue
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            if "httpGet" in (c.get(kind) or {}):
                paths.add((f"{where(f, o)} {kind}", kind, c[kind]["httpGet"].get("path", "/")))
    if not paths:
        return
    with tempfile.TemporaryDirectory() as state:
        port = free_port()
        p = subprocess.Popen([str(binary), "gateway", "--listen", f"127.0.0.1:{port}", "--state-dir", state,
                              "--engine-token", "probe-check"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 20
            for w, kind, path in sorted(paths):
                while True:
                    try:
                        code = urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
                    except urllib.error.HTTPError as e:
                        code = e.code
                    except OSError:
                        if time.time() > deadline or p.poll() is not None:
                            m.err(w, f"the gateway did not answer on 127.0.0.1:{port}")
                            return
                        time.sleep(0.1)
                        continue
                    break
                if code == 404:
                    m.err(w, f"path {path} is not a route of the gateway (404)")
                elif kind == "readinessProbe" and code not in (200, 503):
                    m.err(w, f"path {path} answers {code} (readiness wants 200, or 503 while no engine is there)")
                elif kind != "readinessProbe" and not 200 <= code < 300:
                    m.err(w, f"path {path} answers {code} with no engine joined: a {kind} there would restart "
                             "a gateway whose engines are away")
        finally:
            p.terminate()
            p.wait(10)


def check(directory, binary=None):
    m = Manifests(directory)
    check_schemas(m)
    check_kustomization(m)
    check_namespaces(m)
    check_workloads(m)
    check_services(m)
    check_secrets(m)
    check_network_policies(m)
    if binary:
        check_binary_flags(m, binary)
        check_probe_paths(m, binary)
    return m.errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default=str(Path(__file__).parent))
    ap.add_argument("--binary", help="the staccato binary, to check flags and probe paths against")
    a = ap.parse_args()
    errors = check(a.dir, a.binary)
    for e in errors:
        print(e)
    n = len(Manifests(a.dir).objects)
    print(f"{n} objects in {a.dir}: " + (f"{len(errors)} problems" if errors else "valid"), file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
