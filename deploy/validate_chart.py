#!/usr/bin/env python3
"""Offline validation of the Loader Helm chart (run by deploy/check.sh).

For every values file in the chart's ci/ folder:
  1. `helm lint --strict` (Helm's Go SDK through the PyPI package
     helm-python-sdk, which bundles it as a shared library): templates,
     Chart.yaml, and the values against values.schema.json;
  2. `helm template` (the same SDK's offline render) with those values;
  3. every rendered object against the Kubernetes OpenAPI schemas of each
     Kubernetes version given (PyPI kubernetes-validate, strict: unknown
     fields fail), and the custom resources (ServiceMonitor, ScaledObject)
     against deploy/schemas/*.json;
  4. references between the objects, which no schema sees: probes and
     Services name ports the containers declare, volume mounts name volumes
     the pod has, Service selectors select a pod template of the release,
     the RoleBinding's Role and ServiceAccount and the ScaledObject's target
     and TriggerAuthentication exist, Secret volumes of a Secret the chart
     renders name keys it has, no LOADER_*_TOKEN value in the manifests
     (tokens are files), env names are unique per container, the dashboard
     is JSON.

--self-test then breaks the default rendering and the values in known ways
and fails unless each break is caught: the checks above must be able to
fail.

No Kubernetes API server is involved anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import json
import pathlib
import sys
from typing import Any, Callable

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

helm.disable_logging()

RELEASE = "loader"
NAMESPACE = "ml"

# The custom resources the chart may render, and their schema file.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication.json",
}

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet", "Pod"}


def render(chart: helm.Chart, values: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`helm template` with `values`: (template path, object) for every document."""
    chart.validate_schema(chart.merge_values(values))
    out = chart.render(chart.merge_values(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            if not text.strip():
                raise ValueError(f"{path} rendered empty")
            continue
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ValueError(f"{path}: a document that is not a mapping: {doc!r:.80}")
            objects.append((path, doc))
    return objects


def name_of(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def schema_errors(objects, kube_versions, crd_dir: pathlib.Path) -> list[str]:
    errors = []
    for path, obj in objects:
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key in CRD_SCHEMAS:
            schema = json.loads((crd_dir / CRD_SCHEMAS[key]).read_text())
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj):
                where = "/".join(str(p) for p in e.absolute_path)
                errors.append(f"{path}: {name_of(obj)}: at /{where}: {e.message}")
            continue
        for version in kube_versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = "/".join(str(p) for p in e.absolute_path)
                errors.append(f"{path}: {name_of(obj)}: Kubernetes {version}: at /{where}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                errors.append(f"{path}: {name_of(obj)}: no Kubernetes {version} schema for {key[0]} {key[1]}"
                              " (a custom resource needs a schema in deploy/schemas)")
    return errors


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    kind = obj.get("kind")
    if kind == "Pod":
        return obj.get("spec")
    if kind in WORKLOAD_KINDS:
        return ((obj.get("spec") or {}).get("template") or {}).get("spec")
    return None


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    if obj.get("kind") == "Pod":
        return (obj.get("metadata") or {}).get("labels") or {}
    return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def reference_errors(objects) -> list[str]:
    """What the schemas cannot see: names that must point at something."""
    errors = []
    objs = [o for _, o in objects]
    by_kind: dict[str, dict[str, dict]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    seen = set()
    for o in objs:
        key = (o["kind"], o["metadata"]["name"])
        if key in seen:
            errors.append(f"{name_of(o)}: rendered twice")
        seen.add(key)

    for o in objs:
        spec = pod_spec(o)
        if spec is None:
            continue
        volumes = {v["name"] for v in spec.get("volumes") or []}
        if o["kind"] == "StatefulSet":
            volumes |= {t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates") or []}
        containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
        names = [c["name"] for c in containers]
        if len(names) != len(set(names)):
            errors.append(f"{name_of(o)}: container names repeat: {names}")
        for c in containers:
            where = f"{name_of(o)} container {c['name']}"
            ports = {p["containerPort"] for p in c.get("ports") or []}
            port_names = {p["name"] for p in c.get("ports") or [] if "name" in p}
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name)
                if not probe:
                    continue
                for handler in ("grpc", "httpGet", "tcpSocket"):
                    if handler in probe:
                        port = probe[handler]["port"]
                        if port not in ports and port not in port_names:
                            errors.append(f"{where}: {probe_name} checks port {port}, which the container does not declare")
            for m in c.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    errors.append(f"{where}: mounts volume {m['name']!r}, which the pod does not have")
            env = [e["name"] for e in c.get("env") or []]
            for e in c.get("env") or []:
                if "value" in e and e["name"].startswith("LOADER_") and e["name"].endswith("_TOKEN"):
                    errors.append(f"{where}: env {e['name']} holds a token in the manifest (mount it as a file)")
            dup = sorted({n for n in env if env.count(n) > 1})
            if dup:
                errors.append(f"{where}: env {dup} set twice")
            image = c.get("image", "")
            if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
                errors.append(f"{where}: image {image!r} is not pinned to a tag")
        for v in spec.get("volumes") or []:
            secret = v.get("secret") or {}
            rendered = by_kind.get("Secret", {}).get(secret.get("secretName"))
            if rendered is not None:
                keys = set(rendered.get("data") or {}) | set(rendered.get("stringData") or {})
                for item in secret.get("items") or []:
                    if item["key"] not in keys:
                        errors.append(f"{name_of(o)}: volume {v['name']} takes key {item['key']!r}, which Secret "
                                      f"{secret['secretName']!r} lacks")
        sa = spec.get("serviceAccountName")
        if sa and sa not in by_kind.get("ServiceAccount", {}):
            errors.append(f"{name_of(o)}: serviceAccountName {sa!r} is not rendered by the chart")

    workloads = [o for o in objs if pod_spec(o) is not None]
    for svc in by_kind.get("Service", {}).values():
        selector = svc["spec"].get("selector") or {}
        targets = [w for w in workloads if selector and all(pod_labels(w).get(k) == v for k, v in selector.items())]
        if not targets:
            errors.append(f"{name_of(svc)}: its selector {selector} selects no pod template of the release")
            continue
        for p in svc["spec"].get("ports") or []:
            target = p.get("targetPort", p["port"])
            for w in targets:
                declared = set()
                for c in (pod_spec(w).get("containers") or []) + (pod_spec(w).get("initContainers") or []):
                    for cp in c.get("ports") or []:
                        declared |= {cp["containerPort"], cp.get("name")}
                if target not in declared:
                    errors.append(f"{name_of(svc)}: port {p['name']} targets {target}, which {name_of(w)} does not declare")
    for sts in by_kind.get("StatefulSet", {}).values():
        governing = sts["spec"].get("serviceName")
        if governing not in by_kind.get("Service", {}):
            errors.append(f"{name_of(sts)}: serviceName {governing!r} is not rendered by the chart")

    for rb in by_kind.get("RoleBinding", {}).values():
        role = rb["roleRef"]["name"]
        if rb["roleRef"]["kind"] == "Role" and role not in by_kind.get("Role", {}):
            errors.append(f"{name_of(rb)}: Role {role!r} is not rendered by the chart")
        for s in rb.get("subjects") or []:
            if s["kind"] == "ServiceAccount" and s["name"] not in by_kind.get("ServiceAccount", {}):
                errors.append(f"{name_of(rb)}: ServiceAccount {s['name']!r} is not rendered by the chart")
    for role in by_kind.get("Role", {}).values():
        for rule in role.get("rules") or []:
            for res in rule.get("resourceNames") or []:
                if "deployments" in " ".join(rule.get("resources") or []) and res not in by_kind.get("Deployment", {}):
                    errors.append(f"{name_of(role)}: grants on Deployment {res!r}, which the chart does not render")

    for so in by_kind.get("ScaledObject", {}).values():
        ref = so["spec"]["scaleTargetRef"]
        if ref.get("kind", "Deployment") != "Deployment" or ref["name"] not in by_kind.get("Deployment", {}):
            errors.append(f"{name_of(so)}: scaleTargetRef {ref} is not a Deployment of the chart")
        for t in so["spec"]["triggers"]:
            addr = t["metadata"].get("scalerAddress", "")
            host = addr.split(":")[0].split(".")[0]
            if host not in by_kind.get("Service", {}):
                errors.append(f"{name_of(so)}: scalerAddress {addr!r} names no Service of the chart")
            auth = (t.get("authenticationRef") or {}).get("name")
            if auth and (t["authenticationRef"].get("kind", "TriggerAuthentication") != "TriggerAuthentication"
                         or auth not in by_kind.get("TriggerAuthentication", {})):
                errors.append(f"{name_of(so)}: authenticationRef {auth!r} is not a TriggerAuthentication of the chart")
    for sm in by_kind.get("ServiceMonitor", {}).values():
        sel = sm["spec"]["selector"].get("matchLabels") or {}
        svcs = [s for s in by_kind.get("Service", {}).values()
                if all((s["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
        for ep in sm["spec"]["endpoints"]:
            if not any(p.get("name") == ep.get("port") for s in svcs for p in s["spec"]["ports"]):
                errors.append(f"{name_of(sm)}: endpoint port {ep.get('port')!r} is on no selected Service")
    for cm in by_kind.get("ConfigMap", {}).values():
        for key, text in (cm.get("data") or {}).items():
            if key.endswith(".json"):
                try:
                    json.loads(text)
                except ValueError as e:
                    errors.append(f"{name_of(cm)}: {key} is not JSON: {e}")
    return errors


def lint_errors(chart_dir: pathlib.Path, values: dict[str, Any], kube_version: str) -> list[str]:
    report = helm.lint(str(chart_dir), values, strict=True, kube_version=f"v{kube_version}")
    # Strict: warnings fail like errors (severity 2 warning, 3 error).
    out = [f"lint {m['path']}: {m['error'].strip()}" for m in report.get("messages", []) if m["severity"] >= 2]
    out += [f"lint: {e.strip()}" for e in report.get("errors", []) if not any(e.strip() in o for o in out)]
    return out


def check_case(chart_dir, chart, values, kube_versions, crd_dir) -> tuple[list[str], list[tuple[str, dict]]]:
    errors = lint_errors(chart_dir, values, kube_versions[0])
    try:
        objects = render(chart, values)
    except (helm.HelmError, ValueError, yaml.YAMLError) as e:
        return errors + [f"render: {e}".strip()], []
    schema = schema_errors(objects, kube_versions, crd_dir)
    # The references are read from objects the schemas passed.
    errors += schema or reference_errors(objects)
    return errors, objects


# Each break must be caught: (what, change to one rendered object, kind it applies to).
def _first_container(o):
    return pod_spec(o)["containers"][0]


BREAKS: list[tuple[str, str, Callable[[dict], None]]] = [
    ("a string where Kubernetes wants an integer", "StatefulSet",
     lambda o: _first_container(o)["ports"][0].__setitem__("containerPort", "grpc")),
    ("a misspelt field (strict schemas)", "Deployment",
     lambda o: _first_container(o).__setitem__("imagePullPolicyy", "Always")),
    ("a missing required field", "Service", lambda o: o["spec"]["ports"][0].pop("port")),
    ("a probe on a port the container does not declare", "StatefulSet",
     lambda o: _first_container(o)["readinessProbe"]["grpc"].__setitem__("port", 7171)),
    ("a mount of a volume the pod lacks", "Deployment",
     lambda o: _first_container(o)["volumeMounts"][0].__setitem__("name", "nope")),
    ("a RoleBinding to no Role", "RoleBinding", lambda o: o["roleRef"].__setitem__("name", "nope")),
    ("an unknown kind", "ServiceAccount", lambda o: o.__setitem__("kind", "ServiceAcount")),
]
CRD_BREAKS: list[tuple[str, str, Callable[[dict], None]]] = [
    ("a misspelt ServiceMonitor field", "ServiceMonitor",
     lambda o: o["spec"].__setitem__("endpoint", o["spec"].pop("endpoints"))),
    ("a ScaledObject trigger without scalerAddress", "ScaledObject",
     lambda o: o["spec"]["triggers"][0]["metadata"].pop("scalerAddress")),
]
# Breaks of the rendering with security on (ci/security-values.yaml).
SECURITY_BREAKS: list[tuple[str, str, Callable[[dict], None]]] = [
    ("a ScaledObject whose authenticationRef names no TriggerAuthentication", "ScaledObject",
     lambda o: o["spec"]["triggers"][0]["authenticationRef"].__setitem__("name", "nope")),
    ("a token Secret volume taking a key the Secret lacks", "StatefulSet",
     lambda o: next(v for v in pod_spec(o)["volumes"] if v["name"].endswith("-tokens"))["secret"]["items"][0]
     .__setitem__("key", "operator")),
    ("a token in a plain env value", "Deployment",
     lambda o: _first_container(o)["env"].append({"name": "LOADER_WORKER_TOKEN", "value": "0123456789abcdef"})),
]
BAD_VALUES = [
    ("a value of the wrong type", {"coordinator": {"port": "7070"}}),
    ("an unknown value", {"workers": {"replicaz": 3}}),
    ("a value outside its enum", {"scaling": {"backend": "aws"}}),
    ("KEDA and the kubernetes backend both owning the count", {"keda": {"enabled": True}}),
    ("TLS on without a Secret", {"security": {"tls": {"enabled": True}}}),
    ("tokens and KEDA without client certificates (KEDA sends no token)",
     {"scaling": {"backend": "none"}, "keda": {"enabled": True}, "security": {"tokens": {"enabled": True}}}),
    ("an unknown worker address mode", {"security": {"tls": {"workerAddress": "podName"}}}),
]


@contextlib.contextmanager
def quiet_stderr():
    """File descriptor 2 to /dev/null for the block (the Go side writes to it directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def self_test(chart_dir, chart, kube_versions, crd_dir, default_objects, crd_objects,
              security_objects) -> list[str]:
    failures = []

    def caught(objects) -> bool:
        return bool(schema_errors(objects, kube_versions, crd_dir) or reference_errors(objects))

    for what, kind, change in BREAKS + CRD_BREAKS + SECURITY_BREAKS:
        if (what, kind, change) in CRD_BREAKS:
            source = crd_objects
        elif (what, kind, change) in SECURITY_BREAKS:
            source = security_objects
        else:
            source = default_objects
        objects = copy.deepcopy(source)
        targets = [o for _, o in objects if o.get("kind") == kind]
        if not targets:
            failures.append(f"self-test: no {kind} rendered to break ({what})")
            continue
        change(targets[0])
        if not caught(objects):
            failures.append(f"self-test: {what} in {kind} was NOT caught")
    for what, values in BAD_VALUES:
        with quiet_stderr():  # Helm's Go logger reports each expected `fail` there
            errors, _ = check_case(chart_dir, chart, values, kube_versions, crd_dir)
        if not errors:
            failures.append(f"self-test: values with {what} were NOT rejected")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", type=pathlib.Path)
    parser.add_argument("--crd-schemas", type=pathlib.Path, required=True)
    parser.add_argument("--kube-versions", default="1.29,1.37",
                        help="comma-separated Kubernetes versions to validate against (the first is the minimum)")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, help="write each case's rendered manifests here")
    args = parser.parse_args()
    kube_versions = args.kube_versions.split(",")
    chart = helm.Chart.load(str(args.chart))

    passed = failed = 0
    rendered: dict[str, list] = {}
    cases = sorted((args.chart / "ci").glob("*.yaml"))
    if not cases:
        print(f"no values files in {args.chart / 'ci'}", file=sys.stderr)
        return 1
    for case in cases:
        values = yaml.safe_load(case.read_text()) or {}
        errors, objects = check_case(args.chart, chart, values, kube_versions, args.crd_schemas)
        rendered[case.stem] = objects
        kinds = sorted({o["kind"] for _, o in objects})
        if errors:
            failed += 1
            print(f"FAIL {case.name}")
            for e in errors:
                print(f"  {e}")
        else:
            passed += 1
            print(f"ok   {case.name}: lint --strict, {len(objects)} objects valid on Kubernetes "
                  f"{' and '.join(kube_versions)} ({', '.join(kinds)})")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{case.stem}.yaml").write_text(yaml.safe_dump_all([o for _, o in objects], sort_keys=False))

    if args.self_test:
        default = rendered.get("default-values") or []
        with_crds = next((objs for objs in rendered.values()
                          if {"ServiceMonitor", "ScaledObject"} <= {o["kind"] for _, o in objs}), [])
        security = rendered.get("security-values") or []
        failures = self_test(args.chart, chart, kube_versions, args.crd_schemas, default, with_crds, security)
        total = len(BREAKS) + len(CRD_BREAKS) + len(SECURITY_BREAKS) + len(BAD_VALUES)
        if failures:
            failed += 1
            print("FAIL self-test")
            for f in failures:
                print(f"  {f}")
        else:
            passed += 1
            print(f"ok   self-test: {total} known breaks (manifests and values) were all caught")

    print(f"deploy: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
