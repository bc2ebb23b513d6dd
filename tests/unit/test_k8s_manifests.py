"""The Kubernetes manifests (infra/k8s), rendered and checked offline.

A small renderer applies what the kustomizations use (resources, namespace, labels,
images, configMapGenerator with its name hash, JSON 6902 patches) and refuses any other
field, so it stays faithful; where ``kubectl`` is installed, its own kustomize renders
the same directories and the two outputs must agree. Every object is then validated
against the Kubernetes OpenAPI schemas (``kubernetes-validate``, schemas bundled in the
package: nothing is downloaded) and every KEDA ScaledObject against KEDA's CRD schema
(vendored in tests/data/keda/), then cross-checked with the code: consumer groups and
topics from the routing table, commands from the CLI's parser, settings from the
settings classes, PDB selectors against the Deployments. Planted errors must be caught.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import ipaddress
import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, cast

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.test_deploy_files import (
    DOCUMENTED_WORKERS,
    TOKEN_KEY_VARIABLES,
    cli_problem,
    env_problems,
    needs_grant_key,
    verifies_tokens,
    workers_of,
)
from toolfleet.api.routes.health import router as health_router
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.events import routing
from toolfleet.events.types import DEFAULT_POOL, POOL_NAME_PATTERN, pool_topic
from toolfleet.observability.health import LIVENESS_PATH, METRICS_PATH, READINESS_PATH
from toolfleet.policy.documents import PolicyDocument
from toolfleet.settings import FleetSettings
from toolfleet.worker import (
    DEFAULT_LAYOUT,
    Resources,
    load_build,
    process_name,
    worker_services,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
BASE = K8S / "base"
KUSTOMIZATIONS = (BASE, K8S / "overlays" / "example")
TOPICS_FILE = ROOT / "services" / "toolfleet" / "bus" / "topics.yaml"

#: KEDA's ScaledObject CRD, verbatim from kedacore/keda v2.20.2 (commit
#: 68a5b5028f35b22d50597c69819ab32c4e92f21a), config/crd/bases/keda.sh_scaledobjects.yaml.
KEDA_CRD = ROOT / "tests" / "data" / "keda" / "keda.sh_scaledobjects.yaml"

#: The kafka scaler's trigger metadata keys, from the same KEDA release
#: (pkg/scalers/kafka_scaler.go, ``kafkaMetadata``: the fields read from triggerMetadata).
#: ``resolvedEnv`` fields may also be given as ``<key>FromEnv``: the name of a variable
#: of the target's container (its env and envFrom), resolved by KEDA.
KAFKA_TRIGGER_KEYS = frozenset(
    {
        "bootstrapServers",
        "consumerGroup",
        "topic",
        "partitionLimitation",
        "lagThreshold",
        "activationLagThreshold",
        "offsetResetPolicy",
        "allowIdleConsumers",
        "excludePersistentLag",
        "scaleToZeroOnInvalidOffset",
        "limitToPartitionsWithLag",
        "ensureEvenDistributionOfPartitions",
        "version",
        "tls",
        "unsafeSsl",
        "sasl",
        "saslTokenProvider",
        "awsRegion",
    }
)
KAFKA_TRIGGER_FROM_ENV = frozenset({"bootstrapServers", "consumerGroup", "topic"})

#: The Kubernetes versions the manifests are validated against: the oldest one whose
#: schema has every field they use (appArmorProfile: 1.30), and the newest bundled.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())

#: The Secrets the README tells operators to create: the manifests reference no other.
DOCUMENTED_SECRETS: Mapping[str, frozenset[str]] = {
    "toolfleet-keys": frozenset({"jwt_public.pem", "grant.key"}),
    "toolfleet-connections": frozenset({"database-url", "redis-url"}),
}

#: Variables that hold credentials: from a Secret, never a literal or a ConfigMap.
SECRET_VARIABLES = ("TOOLFLEET_DATABASE_URL", "TOOLFLEET_REDIS_URL")

Obj = dict[str, Any]

# --- the renderer -------------------------------------------------------------------------

_KUSTOMIZATION_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "namespace",
        "labels",
        "images",
        "configMapGenerator",
        "resources",
        "patches",
    }
)
_CLUSTER_SCOPED = frozenset({"Namespace"})
_GENERATED = "__generated_name__"


def render(directory: Path) -> list[Obj]:
    """The objects ``kubectl kustomize directory`` prints (for the fields used here)."""
    objects = _build(directory)
    names = {
        obj[_GENERATED]: f"{obj[_GENERATED]}-{_config_map_hash(obj.get('data', {}))}"
        for obj in objects
        if _GENERATED in obj
    }
    for obj in objects:
        if _GENERATED in obj:
            obj["metadata"]["name"] = names[obj.pop(_GENERATED)]
        for spec in pod_specs(obj):
            _rename_config_maps(spec, names)
    return objects


def _build(directory: Path) -> list[Obj]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - _KUSTOMIZATION_FIELDS
    if unknown:
        raise ValueError(f"{directory}: the test's renderer does not apply {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += _build(path)
        else:
            objects += [o for o in yaml.safe_load_all(path.read_text()) if o]
    for generator in kustomization.get("configMapGenerator", []):
        _generate(directory, generator, objects)
    for patch in kustomization.get("patches", []):
        _patch(patch, objects)
    namespace = kustomization.get("namespace")
    for obj in objects if namespace else ():
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace  # kustomize renames it too
        elif obj["kind"] not in _CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
    for entry in kustomization.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise ValueError("the test's renderer adds labels to metadata only")
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in kustomization.get("images", []):
        for obj in objects:
            for spec in pod_specs(obj):
                for container in containers(spec):
                    container["image"] = _retag(container["image"], image)
    return objects


def _generate(directory: Path, generator: Mapping[str, Any], objects: list[Obj]) -> None:
    if set(generator) - {"name", "behavior", "envs", "files", "literals"}:
        raise ValueError(f"the test's renderer does not generate {dict(generator)}")
    data: dict[str, str] = {}
    for env_file in generator.get("envs", []):
        for line in (directory / env_file).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = value
    for file in generator.get("files", []):
        key, _, path = file.rpartition("=") if "=" in file else (Path(file).name, "", file)
        data[key] = (directory / path).read_text()
    for literal in generator.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    name = generator["name"]
    behavior = generator.get("behavior", "create")
    existing = [o for o in objects if o.get(_GENERATED) == name]
    if behavior == "create":
        assert not existing, f"ConfigMap {name} generated twice"
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name},
                "data": data,
                _GENERATED: name,
            }
        )
    elif behavior in ("merge", "replace"):
        assert len(existing) == 1, f"{behavior}: no ConfigMap {name} to {behavior}"
        existing[0]["data"] = {**existing[0]["data"], **data} if behavior == "merge" else data
    else:
        raise ValueError(f"unknown generator behavior {behavior}")


def _config_map_hash(data: Mapping[str, str]) -> str:
    """kustomize's name suffix: sha256 of Go's JSON of kind, data and the name as it is
    when hashed (empty), first 10 hex digits with 0, 1, 3, a, e made letters."""
    text = json.dumps(
        {"data": dict(data), "kind": "ConfigMap", "name": ""},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _rename_config_maps(spec: Obj, names: Mapping[str, str]) -> None:
    def rename(ref: Obj | None) -> None:
        if ref is not None and ref.get("name") in names:
            ref["name"] = names[ref["name"]]

    for volume in spec.get("volumes", []):
        rename(volume.get("configMap"))
        for source in volume.get("projected", {}).get("sources", []):
            rename(source.get("configMap"))
    for container in containers(spec):
        for source in container.get("envFrom", []):
            rename(source.get("configMapRef"))
        for var in container.get("env", []):
            rename(var.get("valueFrom", {}).get("configMapKeyRef"))


def _patch(patch: Mapping[str, Any], objects: list[Obj]) -> None:
    target = patch["target"]
    if set(target) - {"kind", "name"} or set(patch) - {"target", "patch"}:
        raise ValueError(f"the test's renderer applies JSON 6902 patches by kind and name: {patch}")
    name = re.compile(target.get("name", ".*"))  # kustomize: an anchored regular expression
    matched = [
        o for o in objects if o["kind"] == target["kind"] and name.fullmatch(o["metadata"]["name"])
    ]
    assert matched, f"patch target {target} matches nothing"
    for obj in matched:
        for op in yaml.safe_load(patch["patch"]):
            _json_patch(obj, op)


def _json_patch(obj: Obj, op: Mapping[str, Any]) -> None:
    *parents, last = [
        part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]
    ]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    if op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if key == "-" else key, op["value"])
        else:
            node[key] = op["value"]
    elif op["op"] == "replace":
        if isinstance(node, dict) and key not in node:
            raise KeyError(f"replace: {op['path']} does not exist")
        node[key] = op["value"]
    elif op["op"] == "remove":
        del node[key]
    else:
        raise ValueError(f"the test's renderer does not apply op {op['op']}")


def _retag(image: str, entry: Mapping[str, str]) -> str:
    name, digest = image.split("@", 1) if "@" in image else (image, None)
    tag = None
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != entry["name"]:
        return image
    name = entry.get("newName", name)
    if "digest" in entry:
        return f"{name}@{entry['digest']}"
    tag = entry.get("newTag", tag)
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest and not tag else "")


def pod_specs(obj: Obj) -> Iterator[Obj]:
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        yield spec["template"]["spec"]
    elif kind == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "Pod":
        yield spec


def containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


# --- what the checks read -------------------------------------------------------------------


def of_kind(objects: Sequence[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def name_of(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def config_data(objects: Sequence[Obj], name: str) -> dict[str, str]:
    """The data of the ConfigMap a reference names (a generated name included)."""
    for obj in of_kind(objects, "ConfigMap"):
        if obj["metadata"]["name"] == name:
            return dict(obj.get("data", {}))
    return {}


def container_env(objects: Sequence[Obj], container: Obj) -> dict[str, Any]:
    """Name -> value (a string, or the ``valueFrom`` mapping) of every variable."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config_data(objects, source["configMapRef"]["name"]))
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", var.get("valueFrom"))
    return env


def fleet_env(objects: Sequence[Obj]) -> dict[str, str]:
    for obj in of_kind(objects, "ConfigMap"):
        if obj["metadata"]["name"].startswith("toolfleet-env"):
            return dict(obj["data"])
    raise AssertionError("no toolfleet-env ConfigMap")


def the_container(deployment: Obj) -> Obj:
    found = deployment["spec"]["template"]["spec"]["containers"]
    assert len(found) == 1, f"{name_of(deployment)}: one container per pod"
    return found[0]


def argv_of(container: Obj) -> list[str]:
    """The image's entrypoint is ``toolfleet``: ``args`` are its arguments."""
    assert "command" not in container, "keep the image's entrypoint (toolfleet)"
    return [str(a) for a in container.get("args", [])]


def served_pools(argv: Sequence[str], env: Mapping[str, Any]) -> list[str]:
    """The executor pools a worker serves: its ``--pool`` values, else
    ``TOOLFLEET_EXECUTOR_POOLS``, else the default pool (invalid names left out: the
    CLI check reports them)."""
    given = [v for flag, v in itertools.pairwise(argv) if flag == "--pool"]
    given += [a.removeprefix("--pool=") for a in argv if a.startswith("--pool=")]
    from_env = str(env.get("TOOLFLEET_EXECUTOR_POOLS") or DEFAULT_POOL).split(",")
    return [p for p in given or [p.strip() for p in from_env] if re.fullmatch(POOL_NAME_PATTERN, p)]


Trigger = tuple[str, str, str]
"""(consumer group, topic, offset reset policy)"""


def expected_triggers(
    argv: Sequence[str], env: Mapping[str, Any], prefix: str, deployed_pools: Sequence[str]
) -> tuple[set[Trigger], set[Trigger]]:
    """The triggers a worker's ScaledObject needs, and those it may have besides.

    Needed: every consumer group the worker joins that scales with lag, on each topic
    it reads, from the routing table (per-worker groups see every record and do not
    scale): an executor's one group per pool it serves (:func:`routing.pool_group`),
    and the analytics app's group (its faust app id). Allowed besides: an observer's
    group on the topic of a pool some executor of these manifests serves. Nothing for a
    command the CLI refuses (:func:`workload_problems` says so).
    """
    needed: set[Trigger] = set()
    allowed: set[Trigger] = set()
    if cli_problem(argv) is not None:
        return needed, allowed
    workers = workers_of(argv)
    if workers == ("analytics",):
        needed = {
            (analytics_group(prefix), f"{prefix}{route.topic}", "earliest")
            for route in routing.ANALYTICS.receives
        }
        return needed, needed
    for consumer in joined_consumers("+".join(workers)) if workers else ():
        reset = consumer.auto_offset_reset
        for route in consumer.reads:
            if route.pools and not consumer.all_pools:
                needed |= {
                    (
                        prefix + routing.pool_group(consumer.group, pool),
                        pool_topic(prefix, pool),
                        reset,
                    )
                    for pool in served_pools(argv, env)
                }
                continue
            needed.add((prefix + consumer.group, f"{prefix}{route.topic}", reset))
            if route.pools:
                allowed |= {
                    (prefix + consumer.group, pool_topic(prefix, pool), reset)
                    for pool in deployed_pools
                }
    return needed, allowed | needed


def joined_consumers(worker: str) -> list[routing.Consumer]:
    """The routing table's consumers whose groups ``toolfleet worker WORKER`` joins and
    scales with (per-worker groups left out). In a process of several services, the
    observers among them that read the same topics read them once, in one group named
    after them all (``audit+status``), as :func:`toolfleet.worker.share_fetches` builds it
    (:func:`test_the_groups_expected_are_those_the_worker_joins` holds the two together)."""
    kept: list[routing.Consumer] = []
    observers: dict[tuple[str, ...], list[routing.Consumer]] = {}
    for party in routing.ROUTING:
        if party.name not in worker_services(worker):
            continue
        for consumer in party.consumers:
            if consumer.per_worker:
                continue
            if consumer.all_pools:  # an observer of every lifecycle topic
                observers.setdefault(tuple(sorted(consumer.topics)), []).append(consumer)
            else:
                kept.append(consumer)
    for group in observers.values():
        name = "+".join(sorted(c.name for c in group))
        kept.append(dataclasses.replace(group[0], name=name, group=name))
    return kept


@cache
def analytics_group(prefix: str) -> str:
    """The analytics app's consumer group: its faust app id, read off the app itself."""
    import tempfile

    from toolfleet.analytics.app import create_app
    from toolfleet.analytics.settings import AnalyticsSettings

    with tempfile.TemporaryDirectory() as data_dir:
        faust_app, _ = create_app(AnalyticsSettings(topic_prefix=prefix), data_dir=Path(data_dir))
        return str(faust_app.conf.id)


@cache
def keda_schema() -> Obj:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _closed(schema: Any) -> Any:
    """The schema with unknown fields refused, as the API server's strict field
    validation does (``kubectl apply`` warns, ``--validate=strict`` fails): every object
    with ``properties`` and no ``additionalProperties`` gets ``additionalProperties: false``."""
    if isinstance(schema, list):
        for item in schema:
            _closed(item)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties":  # a map of field names to schemas, not a schema
                for field in value.values():
                    _closed(field)
            else:
                _closed(value)
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
    return schema


def quantity(text: object) -> float | None:
    """A CPU or memory quantity's value, or None when ``text`` is not one."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|k|M|G)?", str(text))
    if match is None:
        return None
    scale = {
        None: 1,
        "m": 0.001,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
    }
    return float(match[1]) * scale[match[2]]


# --- the checks -----------------------------------------------------------------------------


def schema_problems(objects: Sequence[Obj]) -> list[str]:
    problems: list[str] = []
    validator = jsonschema.Draft7Validator(keda_schema())
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            problems += [
                f"{name_of(obj)}: KEDA schema: {'.'.join(map(str, e.path))}: {e.message}"
                for e in validator.iter_errors(obj)
            ]
            continue
        problems += [
            f"{name_of(obj)}: {error}"
            for version in KUBERNETES_VERSIONS
            for error in kubernetes_errors(json.dumps(obj, sort_keys=True), version)
        ]
    return problems


@cache
def kubernetes_errors(obj_json: str, version: str) -> tuple[str, ...]:
    """Why the object (as JSON) is not valid in Kubernetes ``version``, strictly (unknown
    fields refused). Cached: kubernetes-validate reads its schema files on every call."""
    try:
        kubernetes_validate.validate(json.loads(obj_json), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return (f"Kubernetes {version} schema: {'.'.join(map(str, exc.path))}: {exc.message}",)
    except kubernetes_validate.SchemaNotFoundError:
        return (f"no Kubernetes {version} schema for it",)
    return ()


def workload_problems(objects: Sequence[Obj]) -> list[str]:
    """Commands, env, keys, probes, resources and security of every pod."""
    problems: list[str] = []
    shared = fleet_env(objects)
    problems += env_problems("ConfigMap toolfleet-env", shared)
    for var in SECRET_VARIABLES:
        if var in shared:
            problems.append(f"ConfigMap toolfleet-env: {var} holds a credential (use a Secret)")
    drain = float(shared.get("TOOLFLEET_DRAIN_TIMEOUT_S", 30))
    images = set()
    run: set[str] = set()
    for obj in [
        *of_kind(objects, "Deployment"),
        *of_kind(objects, "Job"),
        *of_kind(objects, "CronJob"),
    ]:
        for spec in pod_specs(obj):
            where = name_of(obj)
            problems += pod_security_problems(where, spec)
            if obj["kind"] == "Deployment":
                grace = spec.get("terminationGracePeriodSeconds", 30)
                if grace <= drain:
                    problems.append(f"{where}: terminationGracePeriodSeconds <= drain timeout")
            for container in containers(spec):
                images.add(container["image"])
                argv = argv_of(container)
                problem = cli_problem(argv)
                if problem:
                    problems.append(f"{where}: {problem}")
                    continue
                run.update(workers_of(argv))
                problems += container_problems(objects, where, obj, spec, container, argv)
    for worker in DOCUMENTED_WORKERS:
        if worker not in run:
            problems.append(f"no Deployment runs `toolfleet worker {worker}`")
    if len(images) != 1:
        problems.append(f"pods run more than one image: {sorted(images)}")
    if not any(
        argv_of(c) == ["init"]
        for j in of_kind(objects, "Job")
        for c in containers(j["spec"]["template"]["spec"])
    ):
        problems.append("no Job runs `toolfleet init` (migrations, topics)")
    return problems


def container_problems(
    objects: Sequence[Obj], where: str, obj: Obj, spec: Obj, container: Obj, argv: list[str]
) -> list[str]:
    problems: list[str] = []
    kind = obj["kind"]
    template = obj.get("spec", {}).get("template", {})
    env = container_env(objects, container)
    problems += env_problems(where, {k: v for k, v in env.items() if isinstance(v, str)})
    required = ["TOOLFLEET_KAFKA_BOOTSTRAP", "TOOLFLEET_REDIS_URL"]
    if workers_of(argv) != ("analytics",):  # every other process opens a Postgres pool
        required.append("TOOLFLEET_DATABASE_URL")
    if needs_grant_key(argv):
        required.append("TOOLFLEET_GRANT_KEY_FILE")
    if workers_of(argv):
        required.append("TOOLFLEET_METRICS_PORT")
    if "policy" in workers_of(argv):
        required.append("TOOLFLEET_POLICY_FILE")
    problems += [f"{where}: {var} is not set" for var in required if not env.get(var)]
    if verifies_tokens(argv) and not any(env.get(v) for v in TOKEN_KEY_VARIABLES):
        problems.append(f"{where}: verifies tokens but has no public key or JWKS")
    for var in SECRET_VARIABLES:
        if isinstance(env.get(var), str):
            problems.append(f"{where}: {var} is a literal; it holds a credential (use a Secret)")
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref.get("key") not in DOCUMENTED_SECRETS.get(ref["name"], ()):
            problems.append(f"{where}: {var['name']} reads an undocumented Secret key {ref}")
    problems += file_problems(objects, where, spec, container, env)
    resources = container.get("resources", {})
    for bound in ("cpu", "memory"):
        request = resources.get("requests", {}).get(bound)
        limit = resources.get("limits", {}).get(bound)
        low, high = quantity(request), quantity(limit)
        if low is None or high is None:
            problems.append(f"{where}: {bound} request or limit missing or not a quantity")
        elif low > high:
            problems.append(f"{where}: {bound} request above its limit")
    if kind == "Deployment":
        problems += probe_problems(where, container, env, argv)
        if workers_of(argv):
            problems += scrape_problems(where, template, container, env)
    return problems


def file_problems(
    objects: Sequence[Obj], where: str, spec: Obj, container: Obj, env: Mapping[str, Any]
) -> list[str]:
    """Every ``*_FILE`` setting names a file a mounted volume provides."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    problems: list[str] = []
    for var, value in env.items():
        if not var.endswith("_FILE") or not isinstance(value, str):
            continue
        provided = False
        for mount in container.get("volumeMounts", []):
            directory = mount["mountPath"].rstrip("/") + "/"
            if not value.startswith(directory):
                continue
            volume = volumes.get(mount["name"], {})
            relative = value[len(directory) :]
            if "secret" in volume:
                secret = volume["secret"]
                items = [i["path"] for i in secret.get("items", [])]
                keys = DOCUMENTED_SECRETS.get(secret["secretName"], frozenset())
                provided = relative in items if items else relative in keys
                provided = provided and all(i["key"] in keys for i in secret.get("items", []))
            elif "configMap" in volume:
                provided = relative in config_data(objects, volume["configMap"]["name"])
        if not provided:
            problems.append(f"{where}: {var}={value} is in no mounted volume that holds it")
    for volume in volumes.values():
        if "secret" in volume and volume["secret"]["secretName"] not in DOCUMENTED_SECRETS:
            problems.append(f"{where}: mounts an undocumented Secret {volume['secret']}")
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in volumes:
            problems.append(f"{where}: mounts a volume {mount['name']} the pod lacks")
    if container.get("securityContext", {}).get("readOnlyRootFilesystem") and not any(
        m["mountPath"] == "/tmp" and "emptyDir" in volumes.get(m["name"], {})
        for m in container.get("volumeMounts", [])
    ):
        problems.append(f"{where}: read-only root and no writable /tmp (tempfile, faust, egress)")
    return problems


#: What each probe of a worker asks its endpoints (toolfleet.observability.health): the
#: liveness probes whether the event loop turns, never readiness (a worker waiting for
#: its group would be restarted).
WORKER_PROBE_PATHS: Mapping[str, str] = {
    "startupProbe": LIVENESS_PATH,
    "livenessProbe": LIVENESS_PATH,
    "readinessProbe": READINESS_PATH,
}


def metrics_port(env: Mapping[str, Any]) -> int | None:
    port = env.get("TOOLFLEET_METRICS_PORT")
    return int(port) if isinstance(port, str) and port.isdigit() and int(port) else None


def metrics_reachable(env: Mapping[str, Any]) -> bool:
    """Whether a worker's endpoints answer on the pod's IP (the kubelet, Prometheus), not
    on loopback only."""
    host = env.get("TOOLFLEET_METRICS_HOST", FleetSettings.model_fields["metrics_host"].default)
    if not isinstance(host, str) or host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: whatever it resolves to in the pod


def probe_problems(
    where: str, container: Obj, env: Mapping[str, Any], argv: Sequence[str]
) -> list[str]:
    """The API's probes get its health routes; a worker's get its /livez and /readyz on
    TOOLFLEET_METRICS_PORT, which must then bind beyond loopback. The analytics app serves
    its metrics on 127.0.0.1 only: only a command inside the pod reaches them."""
    problems: list[str] = []
    ports: dict[object, int] = {}
    for port in container.get("ports", []):
        ports[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    workers = workers_of(argv)
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container.get(kind)
        if probe is None:
            if kind != "startupProbe":
                problems.append(f"{where}: no {kind}")
            continue
        if "exec" in probe:
            if workers != ("analytics",):
                problems.append(f"{where}: {kind} execs a command; get its HTTP endpoint")
                continue
            command = " ".join(probe["exec"]["command"])
            port = metrics_port(env)
            if not port or f"127.0.0.1:{port}/" not in command:
                problems.append(f"{where}: {kind} does not read TOOLFLEET_METRICS_PORT")
        elif "httpGet" in probe:
            get = probe["httpGet"]
            if not workers:
                routes = {getattr(route, "path", None) for route in health_router.routes}
                if get["port"] not in ports:
                    problems.append(f"{where}: {kind} names a port the container lacks")
                if get["path"] not in routes:
                    problems.append(f"{where}: {kind} path {get['path']} is no route")
                continue
            if workers == ("analytics",):
                problems.append(f"{where}: {kind} gets HTTP; analytics listens on loopback only")
                continue
            port = metrics_port(env)
            if port is None or ports.get(get["port"]) != port:
                problems.append(f"{where}: {kind} is not on TOOLFLEET_METRICS_PORT ({port})")
            if get["path"] != WORKER_PROBE_PATHS[kind]:
                problems.append(
                    f"{where}: {kind} gets {get['path']}, not {WORKER_PROBE_PATHS[kind]}"
                )
            if not metrics_reachable(env):
                problems.append(
                    f"{where}: {kind} gets HTTP but TOOLFLEET_METRICS_HOST is loopback: "
                    "the kubelet cannot reach it"
                )
        else:
            problems.append(f"{where}: {kind} neither execs nor gets HTTP")
    return problems


def scrape_problems(where: str, template: Obj, container: Obj, env: Mapping[str, Any]) -> list[str]:
    """A worker whose metrics the pod's IP serves says so to Prometheus (the
    ``prometheus.io/*`` pod annotations of its kubernetes_sd convention), on the metrics
    port and path; the analytics app, on loopback only, does not."""
    annotations = template.get("metadata", {}).get("annotations", {})
    port = metrics_port(env)
    if (
        port is None
        or not metrics_reachable(env)
        or workers_of(argv_of(container)) == ("analytics",)
    ):
        if annotations.get("prometheus.io/scrape") == "true":
            return [f"{where}: asks Prometheus to scrape metrics it cannot reach"]
        return []
    problems: list[str] = []
    if annotations.get("prometheus.io/scrape") != "true":
        problems.append(f"{where}: no prometheus.io/scrape annotation")
    if annotations.get("prometheus.io/port") != str(port):
        problems.append(
            f"{where}: prometheus.io/port {annotations.get('prometheus.io/port')} is not "
            f"TOOLFLEET_METRICS_PORT ({port})"
        )
    if annotations.get("prometheus.io/path", METRICS_PATH) != METRICS_PATH:
        problems.append(f"{where}: prometheus.io/path is not {METRICS_PATH}")
    if not any(
        p.get("name") == "metrics" and p["containerPort"] == port
        for p in container.get("ports", [])
    ):
        problems.append(f"{where}: no container port named metrics on TOOLFLEET_METRICS_PORT")
    return problems


def pod_security_problems(where: str, spec: Obj) -> list[str]:
    """Non-root, no privilege escalation, every capability dropped, a seccomp profile."""
    problems: list[str] = []
    pod = spec.get("securityContext", {})
    if pod.get("runAsNonRoot") is not True or pod.get("runAsUser", 0) == 0:
        problems.append(f"{where}: the pod may run as root")
    if spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{where}: mounts a service account token it does not use")
    for container in containers(spec):
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False or context.get("privileged"):
            problems.append(f"{where}: {container['name']} may escalate privileges")
        if "ALL" not in context.get("capabilities", {}).get("drop", []) or context.get(
            "capabilities", {}
        ).get("add"):
            problems.append(f"{where}: {container['name']} keeps capabilities")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: {container['name']} writes its root filesystem")
        profile = context.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
        if profile is None:
            problems.append(f"{where}: {container['name']} has no seccomp profile")
    return problems


def restricted_problems(objects: Sequence[Obj]) -> list[str]:
    """Where the namespace enforces the `restricted` Pod Security Standard, what its
    admission would refuse beyond :func:`pod_security_problems`."""
    (namespace,) = of_kind(objects, "Namespace")
    if namespace["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") != "restricted":
        return []
    problems: list[str] = []
    for obj in objects:
        for spec in pod_specs(obj):
            pod = spec.get("securityContext", {})
            for container in containers(spec):
                context = container.get("securityContext", {})
                profile = context.get("seccompProfile", pod.get("seccompProfile", {}))
                if profile.get("type") not in ("RuntimeDefault", "Localhost"):
                    problems.append(f"{name_of(obj)}: seccomp {profile} is not `restricted`")
                if context.get("procMount", "Default") != "Default":
                    problems.append(f"{name_of(obj)}: procMount is not `restricted`")
                apparmor = context.get("appArmorProfile", pod.get("appArmorProfile", {}))
                if apparmor.get("type") == "Unconfined":
                    problems.append(f"{name_of(obj)}: AppArmor Unconfined is not `restricted`")
    return problems


def scaling_problems(objects: Sequence[Obj]) -> list[str]:
    """KEDA ScaledObjects against the routing table, the Deployments and the topics."""
    problems: list[str] = []
    shared = fleet_env(objects)
    prefix = shared["TOOLFLEET_TOPIC_PREFIX"]
    partitions = int(shared["TOOLFLEET_TOPIC_PARTITIONS"])
    declared = yaml.safe_load(TOPICS_FILE.read_text())
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    deployed_pools = sorted(
        {
            pool
            for d in deployments.values()
            if "executor" in workers_of(argv_of(the_container(d)))
            for pool in served_pools(
                argv_of(the_container(d)), container_env(objects, the_container(d))
            )
        }
    )
    scaled: dict[str, Obj] = {}
    for obj in of_kind(objects, "ScaledObject"):
        where = name_of(obj)
        spec = obj["spec"]
        target = spec["scaleTargetRef"]
        if target.get("kind", "Deployment") != "Deployment" or target["name"] not in deployments:
            problems.append(f"{where}: scales {target}, no Deployment of these manifests")
            continue
        if target["name"] in scaled:
            problems.append(f"{where}: a second ScaledObject for {target['name']}")
        scaled[target["name"]] = obj
        deployment = deployments[target["name"]]
        if "replicas" in deployment["spec"]:
            problems.append(f"{where}: {target['name']} sets replicas, which KEDA owns")
        low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if low < 1:
            problems.append(f"{where}: scales to zero; calls would wait for KEDA's next poll")
        if low > high:
            problems.append(f"{where}: minReplicaCount above maxReplicaCount")
        container = the_container(deployment)
        env = container_env(objects, container)
        want, allowed = expected_triggers(argv_of(container), env, prefix, deployed_pools)
        have: set[Trigger] = set()
        for trigger in spec["triggers"]:
            problems += trigger_problems(where, trigger, env)
            meta = trigger.get("metadata", {})
            group = meta.get("consumerGroup") or env.get(meta.get("consumerGroupFromEnv", ""))
            topic = meta.get("topic") or env.get(meta.get("topicFromEnv", ""))
            have.add((str(group), str(topic), meta.get("offsetResetPolicy", "latest")))
            topic_partitions = (
                declared["topics"]
                .get(str(topic).removeprefix(prefix), {})
                .get("partitions", partitions)
            )
            if high > min(partitions, topic_partitions):
                problems.append(
                    f"{where}: maxReplicaCount {high} is above the {partitions} "
                    f"partitions of {topic}: the rest would idle"
                )
        for group, topic, reset in sorted(have - allowed):
            problems.append(
                f"{where}: consumer group {group} on {topic} (reset {reset}) is not "
                "one the routing table gives this worker"
            )
        for group, topic, reset in sorted(want - have):
            problems.append(
                f"{where}: no trigger for consumer group {group} on {topic} "
                f"(offsetResetPolicy {reset})"
            )
    for name, deployment in deployments.items():
        container = the_container(deployment)
        env = container_env(objects, container)
        needed, _ = expected_triggers(argv_of(container), env, prefix, deployed_pools)
        if needed and name not in scaled:
            problems.append(f"Deployment/{name}: joins consumer groups but has no ScaledObject")
    return problems


def trigger_problems(where: str, trigger: Obj, env: Mapping[str, Any]) -> list[str]:
    if trigger["type"] != "kafka":
        return [f"{where}: a {trigger['type']} trigger; toolfleet scales on Kafka lag"]
    problems: list[str] = []
    meta = trigger["metadata"]
    for key in meta:
        base = key.removesuffix("FromEnv")
        if base not in KAFKA_TRIGGER_KEYS or (key != base and base not in KAFKA_TRIGGER_FROM_ENV):
            problems.append(f"{where}: the kafka scaler has no metadata {key!r}")
        elif key != base and not isinstance(env.get(meta[key]), str):
            problems.append(f"{where}: {key} names {meta[key]}, not a variable of the target")
    for key in ("bootstrapServers", "consumerGroup", "topic"):
        if key not in meta and f"{key}FromEnv" not in meta:
            problems.append(f"{where}: kafka trigger without {key}")
    if not re.fullmatch(r"[1-9]\d*", str(meta.get("lagThreshold", ""))):
        problems.append(f"{where}: lagThreshold must be a positive integer")
    if meta.get("offsetResetPolicy", "latest") not in ("latest", "earliest"):
        problems.append(f"{where}: offsetResetPolicy is latest or earliest")
    return problems


def disruption_problems(objects: Sequence[Obj]) -> list[str]:
    problems: list[str] = []
    deployments = of_kind(objects, "Deployment")
    covered: set[str] = set()
    for pdb in of_kind(objects, "PodDisruptionBudget"):
        selector = pdb["spec"]["selector"]["matchLabels"]
        matched = [
            d["metadata"]["name"]
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        if len(matched) != 1:
            problems.append(f"{name_of(pdb)}: selects {matched or 'no'} Deployment(s), not one")
        covered.update(matched)
        if pdb["spec"].get("minAvailable") not in (None, 0) and "maxUnavailable" not in pdb["spec"]:
            problems.append(f"{name_of(pdb)}: minAvailable can block every drain; maxUnavailable")
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if deployment["spec"]["selector"]["matchLabels"].items() > labels.items():
            problems.append(f"Deployment/{name}: its selector does not match its pods")
        if name not in covered:
            problems.append(f"Deployment/{name}: no PodDisruptionBudget")
    return problems


def metadata_problems(objects: Sequence[Obj]) -> list[str]:
    problems: list[str] = []
    for obj in objects:
        if obj["kind"] == "Secret":
            problems.append(f"{name_of(obj)}: a Secret in the manifests (create it in the cluster)")
        if obj["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != "toolfleet":
            problems.append(f"{name_of(obj)}: not labelled part-of toolfleet")
        if obj["kind"] != "Namespace" and obj["metadata"].get("namespace") != "toolfleet":
            problems.append(f"{name_of(obj)}: not in the toolfleet namespace")
    for obj in of_kind(objects, "ConfigMap"):
        if obj["metadata"]["name"].startswith("toolfleet-policy"):
            for text in obj["data"].values():
                try:
                    PolicyDocument.model_validate(yaml.safe_load(text) or {})
                except ValueError as exc:
                    problems.append(f"{name_of(obj)}: not a policy document: {exc}")
    return problems


CHECKS: tuple[Callable[[Sequence[Obj]], list[str]], ...] = (
    schema_problems,
    workload_problems,
    restricted_problems,
    scaling_problems,
    disruption_problems,
    metadata_problems,
)


def manifest_problems(objects: Sequence[Obj]) -> list[str]:
    return [problem for check in CHECKS for problem in check(objects)]


# --- tests ------------------------------------------------------------------------------------


@cache
def rendered(directory: Path) -> tuple[Obj, ...]:
    return tuple(render(directory))


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: d.relative_to(K8S).as_posix())
def test_the_manifests_validate_and_agree_with_the_code(directory: Path) -> None:
    assert manifest_problems(copy.deepcopy(list(rendered(directory)))) == []


def test_the_base_holds_every_workload_with_its_budget_and_scaler() -> None:
    objects = rendered(BASE)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for name in (*map(process_name, DEFAULT_LAYOUT), "analytics"):
        for kind in ("Deployment", "PodDisruptionBudget", "ScaledObject"):
            assert (kind, f"toolfleet-{name}") in kinds
    assert ("Deployment", "toolfleet-maintenance") in kinds
    assert ("Deployment", "toolfleet-api") in kinds
    assert ("Service", "toolfleet-api") in kinds
    assert ("Job", "toolfleet-init") in kinds


def test_the_observers_read_each_lifecycle_record_once_in_one_group() -> None:
    objects = rendered(BASE)
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    for worker in DEFAULT_LAYOUT:
        container = the_container(deployments[f"toolfleet-{process_name(worker)}"])
        assert argv_of(container)[:2] == ["worker", worker]
    alone = [
        n
        for n, d in deployments.items()
        if workers_of(argv_of(the_container(d))) in {("audit",), ("status",)}
    ]
    assert alone == [], "audit and status run in one process by default"
    prefix = fleet_env(objects)["TOOLFLEET_TOPIC_PREFIX"]
    (scaler,) = [
        o
        for o in of_kind(objects, "ScaledObject")
        if o["spec"]["scaleTargetRef"]["name"] == "toolfleet-observers"
    ]
    triggers = {
        (t["metadata"]["consumerGroup"], t["metadata"]["topic"]) for t in scaler["spec"]["triggers"]
    }
    assert triggers == {
        (f"{prefix}audit+status", f"{prefix}{name}") for name in routing.AUDIT_CONSUMER.topics
    }


def test_the_split_layout_validates_too(tmp_path: Path) -> None:
    """workers/apart/ runs audit and status apart, as observers.yaml tells operators to."""
    base = tmp_path / "base"
    shutil.copytree(BASE, base)
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    at = resources.index("workers/observers.yaml")
    resources[at : at + 1] = ["workers/apart/audit.yaml", "workers/apart/status.yaml"]
    (base / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    objects = render(base)
    assert manifest_problems(objects) == []
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for worker in ("audit", "status"):
        for kind in ("Deployment", "PodDisruptionBudget", "ScaledObject"):
            assert (kind, f"toolfleet-{worker}") in kinds
    assert ("Deployment", "toolfleet-observers") not in kinds


@pytest.mark.parametrize(
    "worker", ["audit+status", "status+audit", "audit", "status", "validator+audit", "policy"]
)
async def test_the_groups_expected_are_those_the_worker_joins(worker: str, tmp_path: Path) -> None:
    """:func:`joined_consumers` (what the ScaledObjects are checked against) names the
    groups the worker's own build joins, a shared process's included."""
    grant_key = tmp_path / "grant.key"
    ensure_grant_key(grant_key)
    unused = cast(Any, None)  # building these consumers touches no client
    res = Resources(
        settings=FleetSettings(topic_prefix="p.", grant_key_file=grant_key),
        producer=unused,
        redis=unused,
        pool=unused,
        worker_id="w1",
    )
    built = {c.spec.group_id for c in await load_build(worker)(res)}
    assert built == {res.group(c.group) for c in joined_consumers(worker)}


def test_keda_schema_is_the_vendored_crd() -> None:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert crd["metadata"]["name"] == "scaledobjects.keda.sh"
    schema = keda_schema()
    assert schema["properties"]["spec"]["additionalProperties"] is False
    assert "triggers" in schema["properties"]["spec"]["required"]


def _mutate(path: str, value: Any) -> Callable[[list[Obj]], None]:
    """Set ``value`` at ``kind/name:dotted.path`` (list indexes as numbers)."""
    target, _, dotted = path.partition(":")
    kind, name = target.split("/")

    def edit(objects: list[Obj]) -> None:
        (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
        *parents, last = dotted.split(".")
        node: Any = obj
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return edit


def _drop(kind: str, name: str) -> Callable[[list[Obj]], None]:
    def edit(objects: list[Obj]) -> None:
        objects[:] = [o for o in objects if (o["kind"], o["metadata"]["name"]) != (kind, name)]

    return edit


def _annotate(target: str, key: str, value: str | None) -> Callable[[list[Obj]], None]:
    """Set (None: remove) a pod template annotation of ``kind/name``: its key has dots."""
    kind, name = target.split("/")

    def edit(objects: list[Obj]) -> None:
        (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
        annotations = obj["spec"]["template"]["metadata"].setdefault("annotations", {})
        if value is None:
            annotations.pop(key)
        else:
            annotations[key] = value

    return edit


def _set_env(name: str, value: str) -> Callable[[list[Obj]], None]:
    def edit(objects: list[Obj]) -> None:
        for obj in of_kind(objects, "ConfigMap"):
            if obj["metadata"]["name"].startswith("toolfleet-env"):
                obj["data"][name] = value

    return edit


POD = "spec.template.spec"
CONTAINER = f"{POD}.containers.0"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(
            _mutate(f"Deployment/toolfleet-policy:{CONTAINER}.imagePullPolcy", "Always"),
            "Deployment/toolfleet-policy: Kubernetes 1.30 schema",
            id="unknown-field",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-validator:{CONTAINER}.resources.limits.memory", "lots"),
            "memory request or limit missing or not a quantity",
            id="bad-quantity",
        ),
        pytest.param(
            _mutate("ScaledObject/toolfleet-executor:spec.triggers.0.metadata.lagThreshold", 50),
            "KEDA schema: spec.triggers.0.metadata.lagThreshold",
            id="keda-metadata-not-a-string",
        ),
        pytest.param(
            _mutate("ScaledObject/toolfleet-observers:spec.minReplicas", 1),
            "KEDA schema",
            id="keda-unknown-field",
        ),
        pytest.param(
            _mutate(
                "ScaledObject/toolfleet-policy:spec.triggers.0.metadata.consumerGroup",
                "toolfleet.polcy",
            ),
            "consumer group toolfleet.polcy on toolfleet.invoke.requested",
            id="unknown-consumer-group",
        ),
        pytest.param(
            _mutate(
                "ScaledObject/toolfleet-executor:spec.triggers.0.metadata.topic",
                "toolfleet.invoke.requested",
            ),
            "no trigger for consumer group toolfleet.executor on toolfleet.invoke.authorized",
            id="wrong-topic",
        ),
        pytest.param(
            _mutate("ScaledObject/toolfleet-observers:spec.triggers.0.metadata.lagTreshold", "5"),
            "the kafka scaler has no metadata 'lagTreshold'",
            id="unknown-kafka-metadata",
        ),
        pytest.param(
            _mutate(
                "ScaledObject/toolfleet-observers:spec.triggers.0.metadata.bootstrapServersFromEnv",
                "KAFKA",
            ),
            "bootstrapServersFromEnv names KAFKA, not a variable of the target",
            id="bootstrap-from-missing-env",
        ),
        pytest.param(
            _mutate("ScaledObject/toolfleet-validator:spec.maxReplicaCount", 24),
            "maxReplicaCount 24 is above the 12 partitions",
            id="more-replicas-than-partitions",
        ),
        pytest.param(
            _drop("ScaledObject", "toolfleet-executor"),
            "Deployment/toolfleet-executor: joins consumer groups but has no ScaledObject",
            id="no-scaler",
        ),
        pytest.param(
            _mutate(
                "PodDisruptionBudget/toolfleet-observers:spec.selector.matchLabels",
                {"app.kubernetes.io/component": "obsevers"},
            ),
            "PodDisruptionBudget/toolfleet-observers: selects no Deployment(s)",
            id="pdb-selects-nothing",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-observers:{CONTAINER}.args", ["worker", "audit+stauts"]),
            "toolfleet worker audit+stauts",
            id="not-a-worker",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-maintenance:{CONTAINER}.args", ["worker", "--once"]),
            "No such option: --once",
            id="not-an-option",
        ),
        pytest.param(
            _set_env("TOOLFLEET_FETCH_DOORBELL", "true"),
            "sets TOOLFLEET_FETCH_DOORBELL, a dev-broker knob",
            id="dev-broker-knob",
        ),
        pytest.param(
            _mutate(
                f"Deployment/toolfleet-executor:{CONTAINER}.env.0",
                {"name": "TOOLFLEET_DATABASE_URL", "value": "postgresql://u:p@db/toolfleet"},
            ),
            "TOOLFLEET_DATABASE_URL is a literal",
            id="literal-credential",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-validator:{POD}.volumes.0.secret.items.0.key", "grant"),
            "TOOLFLEET_GRANT_KEY_FILE=/run/toolfleet/keys/grant.key is in no mounted volume",
            id="key-not-mounted",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-api:{POD}.securityContext.runAsNonRoot", False),
            "Deployment/toolfleet-api: the pod may run as root",
            id="root",
        ),
        pytest.param(
            _mutate(
                f"Deployment/toolfleet-executor:{CONTAINER}.securityContext.seccompProfile",
                {"type": "Unconfined"},
            ),
            "seccomp {'type': 'Unconfined'} is not `restricted`",
            id="unconfined-under-restricted",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-observers:{CONTAINER}.livenessProbe.httpGet.port", 9200),
            "Deployment/toolfleet-observers: livenessProbe is not on TOOLFLEET_METRICS_PORT (9100)",
            id="probe-on-the-wrong-port",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-validator:{CONTAINER}.ports", []),
            "Deployment/toolfleet-validator: readinessProbe is not on TOOLFLEET_METRICS_PORT",
            id="probe-on-a-port-the-container-lacks",
        ),
        pytest.param(
            _mutate(
                f"Deployment/toolfleet-observers:{CONTAINER}.livenessProbe.httpGet.path", "/readyz"
            ),
            "Deployment/toolfleet-observers: livenessProbe gets /readyz, not /livez",
            id="liveness-on-readiness",
        ),
        pytest.param(
            _mutate(
                f"Deployment/toolfleet-policy:{CONTAINER}.readinessProbe",
                {"exec": {"command": ["python", "-c", "pass"]}},
            ),
            "Deployment/toolfleet-policy: readinessProbe execs a command",
            id="worker-probe-that-only-shows-a-process",
        ),
        pytest.param(
            _set_env("TOOLFLEET_METRICS_HOST", "127.0.0.1"),
            "TOOLFLEET_METRICS_HOST is loopback: the kubelet cannot reach it",
            id="metrics-on-loopback",
        ),
        pytest.param(
            _annotate("Deployment/toolfleet-observers", "prometheus.io/port", "9200"),
            "Deployment/toolfleet-observers: prometheus.io/port 9200 is not TOOLFLEET_METRICS_PORT",
            id="scrape-on-the-wrong-port",
        ),
        pytest.param(
            _annotate("Deployment/toolfleet-executor", "prometheus.io/scrape", None),
            "Deployment/toolfleet-executor: no prometheus.io/scrape annotation",
            id="not-scraped",
        ),
        pytest.param(
            _annotate("Deployment/toolfleet-analytics", "prometheus.io/scrape", "true"),
            "Deployment/toolfleet-analytics: asks Prometheus to scrape metrics it cannot reach",
            id="analytics-scraped-on-loopback",
        ),
        pytest.param(
            _mutate(
                f"Deployment/toolfleet-analytics:{CONTAINER}.livenessProbe.exec.command",
                [
                    "python",
                    "-c",
                    "import urllib.request; urllib.request.urlopen("
                    "'http://127.0.0.1:9200/metrics')",
                ],
            ),
            "Deployment/toolfleet-analytics: livenessProbe does not read TOOLFLEET_METRICS_PORT",
            id="analytics-probe-on-the-wrong-port",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-api:{CONTAINER}.readinessProbe.httpGet.path", "/ready"),
            "readinessProbe path /ready is no route",
            id="probe-on-no-route",
        ),
        pytest.param(
            _mutate(
                "ScaledObject/toolfleet-observers:spec.triggers.0.metadata.consumerGroup",
                "toolfleet.audit",
            ),
            "no trigger for consumer group toolfleet.audit+status on toolfleet.invoke.requested",
            id="observers-scaled-on-audit-alone",
        ),
        pytest.param(
            _mutate(f"Deployment/toolfleet-observers:{CONTAINER}.args", ["worker", "audit"]),
            "no Deployment runs `toolfleet worker status`",
            id="observers-without-status",
        ),
    ],
)
def test_a_planted_error_is_caught(edit: Callable[[list[Obj]], None], expected: str) -> None:
    objects = copy.deepcopy(list(rendered(BASE)))
    edit(objects)
    problems = manifest_problems(objects)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(
            _mutate(
                "ScaledObject/toolfleet-executor-gpu:spec.triggers.0.metadata.consumerGroup",
                "toolfleet.executor",
            ),
            "no trigger for consumer group toolfleet.executor.gpu on "
            "toolfleet.invoke.authorized.gpu",
            id="a-pool-scaled-on-the-default-group",
        ),
        pytest.param(
            _mutate(
                f"Deployment/toolfleet-executor-gpu:{CONTAINER}.args",
                ["worker", "executor", "--pool", "GPU!"],
            ),
            "is not a pool name",
            id="not-a-pool-name",
        ),
    ],
)
def test_a_planted_error_in_a_pool_is_caught(
    edit: Callable[[list[Obj]], None], expected: str
) -> None:
    objects = copy.deepcopy(list(rendered(K8S / "overlays" / "example")))
    edit(objects)
    problems = manifest_problems(objects)
    assert any(expected in problem for problem in problems), problems


def _normalized(objects: Sequence[Obj]) -> list[str]:
    """Objects as sorted JSON lines, generated names' hashes blanked (kustomize versions
    differ in them; that references agree is checked on the objects themselves)."""
    text = json.dumps(sorted(objects, key=lambda o: (o["kind"], o["metadata"]["name"])))
    text = re.sub(r'"(toolfleet-(?:env|policy))-[a-z0-9]{10}"', r'"\1-HASH"', text)
    return [json.dumps(o, sort_keys=True) for o in json.loads(text)]


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: d.relative_to(K8S).as_posix())
def test_the_renderer_agrees_with_kubectl_kustomize(directory: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        # A cross-check for machines that have kubectl (CI here has none, and nothing may
        # download it): every manifest is still rendered and validated by the other tests.
        pytest.skip("no kubectl here; the manifests were checked with the test's renderer")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    theirs = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert _normalized(theirs) == _normalized(rendered(directory))
