"""The Kubernetes manifests (deploy/kubernetes), validated offline: against
the API schemas and against each other and the staccato binary, by
deploy/kubernetes/check_manifests.py. Each breaking test damages a copy in
one way and expects the checker to name that damage."""

import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
BIN = ROOT / "target" / "release" / "staccato"
sys.path.insert(0, str(K8S))
import check_manifests  # noqa: E402


def test_the_manifests_are_valid():
    errors = check_manifests.check(K8S, BIN)
    assert errors == []


def test_every_kind_a_cluster_needs_is_there():
    m = check_manifests.Manifests(K8S)
    kinds = {(o["kind"], o["metadata"]["name"]) for _, o in m.objects}
    for k in [("Deployment", "staccato-gateway"), ("DaemonSet", "staccato-engine"), ("StatefulSet", "staccato-etcd"),
              ("Secret", "staccato-tokens"), ("Service", "staccato-gateway"), ("Service", "staccato-gateway-peers"),
              ("NetworkPolicy", "default-deny"), ("Namespace", "staccato")]:
        assert k in kinds
    engine = m.named("DaemonSet", "staccato-engine")
    c = engine["spec"]["template"]["spec"]["containers"][0]
    assert c["securityContext"]["privileged"] is True
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in engine["spec"]["template"]["spec"]["volumes"])
    for _, o in m.of_kind("Deployment", "DaemonSet", "StatefulSet"):
        for c in o["spec"]["template"]["spec"]["containers"]:
            assert c["resources"]["requests"], o["metadata"]["name"]
            assert c.get("readinessProbe") and c.get("livenessProbe"), o["metadata"]["name"]


def damaged(tmp_path, file, change):
    """A copy of the manifests with `change(docs)` applied to one file."""
    d = tmp_path / "k8s"
    shutil.copytree(K8S, d)
    docs = [x for x in yaml.safe_load_all((d / file).read_text()) if x is not None]
    change(docs)
    (d / file).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return d


def find(docs, kind, name=None):
    return next(o for o in docs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name))


def container(docs, kind):
    return find(docs, kind)["spec"]["template"]["spec"]["containers"][0]


def set_arg(c, flag, value):
    c["args"] = [a for a in c["args"] if not a.startswith(flag + "=")] + [f"{flag}={value}"]


BREAKS = {
    "unknown field": ("gateway.yaml", lambda d: find(d, "Deployment")["spec"].update(replica=2),
                      "schema: Additional properties are not allowed ('replica' was unexpected)"),
    "wrong type": ("engine.yaml", lambda d: container(d, "DaemonSet")["ports"][0].update(containerPort="7070"),
                   "schema: '7070' is not of type 'integer'"),
    "service selector": ("gateway.yaml",
                         lambda d: find(d, "Service", "staccato-gateway")["spec"]["selector"].update(
                             {"app.kubernetes.io/component": "gatway"}),
                         "Service/staccato-gateway: selector"),
    "target port": ("gateway.yaml",
                    lambda d: find(d, "Service", "staccato-gateway")["spec"]["ports"][0].update(targetPort="htp"),
                    "targets 'htp', not a port of staccato-gateway"),
    "pod labels": ("gateway.yaml",
                   lambda d: find(d, "Deployment")["spec"]["template"]["metadata"]["labels"].update(
                       {"app.kubernetes.io/component": "gw"}),
                   "does not match its pod labels"),
    "secret name": ("gateway.yaml",
                    lambda d: container(d, "Deployment")["env"][0]["valueFrom"]["secretKeyRef"].update(
                        name="staccato-token"),
                    "env STACCATO_TOKEN: Secret 'staccato-token' does not exist"),
    "secret key": ("engine.yaml",
                   lambda d: find(d, "DaemonSet")["spec"]["template"]["spec"]["volumes"][2]["secret"]["items"][0].update(
                       key="engine_token"),
                   "Secret staccato-tokens has no key 'engine_token'"),
    "listen port": ("gateway.yaml", lambda d: set_arg(container(d, "Deployment"), "--listen", "0.0.0.0:8081"),
                    "--listen=0.0.0.0:8081: port 8081 is not a declared container port"),
    "unknown flag": ("engine.yaml", lambda d: set_arg(container(d, "DaemonSet"), "--engine-port", "7070"),
                     "`staccato engine` has no flag --engine-port"),
    "store service": ("gateway.yaml", lambda d: set_arg(container(d, "Deployment"), "--store", "etcd://etcd:2379"),
                      "--store: etcd is not a Service of the manifests"),
    "join not headless": ("engine.yaml",
                          lambda d: set_arg(container(d, "DaemonSet"), "--join-every", "http://staccato-gateway:8080"),
                          "--join-every needs a headless Service"),
    "token file": ("engine.yaml",
                   lambda d: set_arg(container(d, "DaemonSet"), "--engine-token-file", "/etc/staccato/token"),
                   "the secret volume tokens has no item at token"),
    "probe path": ("gateway.yaml",
                   lambda d: container(d, "Deployment")["livenessProbe"]["httpGet"].update(path="/health"),
                   "path /health is not a route of the gateway (404)"),
    "liveness on healthz": ("gateway.yaml",
                            lambda d: container(d, "Deployment")["livenessProbe"]["httpGet"].update(path="/healthz"),
                            "path /healthz answers 503 with no engine joined"),
    "readiness on system": ("gateway.yaml",
                            lambda d: container(d, "Deployment")["readinessProbe"]["httpGet"].update(
                                path="/system/functions"),
                            "path /system/functions answers 401"),
    "port-less policy rule": ("networkpolicy.yaml",
                              lambda d: find(d, "NetworkPolicy", "staccato-etcd")["spec"]["ingress"][0]["ports"][0].pop(
                                  "port"),
                              "a rule's port entry without a port allows every port"),
    "probe port": ("engine.yaml", lambda d: container(d, "DaemonSet")["readinessProbe"]["tcpSocket"].update(port="eng"),
                   "readinessProbe port 'eng' is not a declared container port"),
    "undefined variable": ("engine.yaml", lambda d: set_arg(container(d, "DaemonSet"), "--advertise", "$(POD_ADDR):7070"),
                           "$(POD_ADDR) in '--advertise=$(POD_ADDR):7070' is not in the container's env"),
    "policy port": ("networkpolicy.yaml",
                    lambda d: find(d, "NetworkPolicy", "staccato-engine")["spec"]["ingress"][0]["ports"][0].update(
                        port=7071),
                    "ingress port 7071 is not a port of staccato-engine"),
    "namespace": ("etcd.yaml", lambda d: find(d, "StatefulSet")["metadata"].update(namespace="default"),
                  "namespace 'default' is not one the manifests create"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_copy_fails(tmp_path, name):
    file, change, expected = BREAKS[name]
    errors = check_manifests.check(damaged(tmp_path, file, change), BIN)
    assert any(expected in e for e in errors), errors


def test_a_manifest_left_out_of_the_kustomization_fails(tmp_path):
    d = tmp_path / "k8s"
    shutil.copytree(K8S, d)
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    k["resources"].remove("networkpolicy.yaml")
    (d / "kustomization.yaml").write_text(yaml.safe_dump(k))
    assert any("networkpolicy.yaml is not in resources" in e for e in check_manifests.check(d))


def test_the_command_line_exits_nonzero_on_a_broken_copy(tmp_path):
    import subprocess

    d = damaged(tmp_path, "gateway.yaml", BREAKS["unknown field"][1])
    p = subprocess.run([sys.executable, str(K8S / "check_manifests.py"), str(d)], capture_output=True, text=True)
    assert p.returncode == 1 and "replica" in p.stdout
    ok = subprocess.run([sys.executable, str(K8S / "check_manifests.py"), "--binary", str(BIN)], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
