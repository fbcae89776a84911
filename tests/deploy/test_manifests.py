"""What ``deploy/`` and the ``Dockerfile`` ship is valid and says what the host understands.

The Kubernetes manifests are checked offline against the Kubernetes schemas ``kubernetes-validate``
bundles (strict: unknown fields are errors), for the oldest and the newest version we support.
Every container command in the manifests and the compose file is parsed by the real
``agentsessions`` / ``agentsessions-harness`` parsers, and the host's resolves to a ``HostConfig``
(with the example Secrets' values), so a renamed flag or a bad value fails here, not in a cluster.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agentsessions.host.auth.principals import load_principals
from agentsessions.host.cli import build_parser
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.service import sessions
from agentsessions.sdk.cli import build_parser as harness_parser

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
# gRPC probes are GA from 1.27; the oldest version kubernetes-validate still bundles above that.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def deployments() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, d) for p in MANIFESTS for d in documents(p) if d["kind"] == "Deployment"]


def image_env() -> dict[str, str]:
    """The ``ENV`` the Dockerfile sets in the image (every container here runs it)."""
    text = (ROOT / "Dockerfile").read_text()
    block = re.search(r"^ENV ((?:.*\\\n)*.*)$", text, re.M)
    assert block, "no ENV in the Dockerfile"
    return dict(re.findall(r"(\w+)=(\S+)", block.group(1)))


def secret_values() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for doc in documents(KUBERNETES / "secrets.example.yaml"):
        for key, value in doc["stringData"].items():
            found[(doc["metadata"]["name"], key)] = value
    return found


def test_there_are_manifests() -> None:
    assert {p.name for p in MANIFESTS} == {"sqlite.yaml", "postgres.yaml", "secrets.example.yaml"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifests_validate_against_the_kubernetes_schemas(manifest: Path, version: str) -> None:
    for doc in documents(manifest):
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda pod: pod["containers"][0]["readinessProbe"]["grpc"].update(port="grpc-by-name"),
        lambda pod: pod["containers"][0].update(imagePullPolicyy="Always"),
        lambda pod: pod["securityContext"].update(runAsNonRoot="yes"),
    ],
    ids=["grpc-port-must-be-a-number", "unknown-field", "wrong-type"],
)
def test_the_validation_can_fail(break_it: Any) -> None:
    (_, deployment), *_ = deployments()
    broken = copy.deepcopy(deployment)
    break_it(broken["spec"]["template"]["spec"])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def _env(container: dict[str, Any]) -> dict[str, str]:
    secrets = secret_values()
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def _host_config(argv: list[str], env: dict[str, str], tmp_path: Path) -> HostConfig:
    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    if args.auth_tokens:
        # The mounted Secret, written where the test can read it.
        tokens = tmp_path / Path(args.auth_tokens).name
        tokens.write_text(secret_values()[("agentsessions-tokens", tokens.name)])
        args.auth_tokens = str(tokens)
    return HostConfig.from_sources(argparse.Namespace(**vars(args)), env)


@pytest.mark.parametrize(("manifest", "deployment"), deployments(), ids=lambda v: str(v)[:14])
def test_the_pods_commands_are_what_the_host_and_harness_accept(
    manifest: str, deployment: dict[str, Any], tmp_path: Path
) -> None:
    pod = deployment["spec"]["template"]["spec"]
    host, harness = pod["containers"]
    config = _host_config(host["args"], _env(host), tmp_path)
    assert config.listen == "0.0.0.0:50051" and config.auth_tokens is not None
    assert config.journal_kind == ("sqlite" if manifest == "sqlite.yaml" else "postgres")
    assert config.harnesses == [("coding", "127.0.0.1:50061")], "the harness container, on the pod's loopback"
    served = harness_parser().parse_args(harness["args"])
    assert served.command == "serve" and served.listen == "127.0.0.1:50061"
    assert host["readinessProbe"]["grpc"] == {"port": 50051, "service": sessions.SERVICE_NAME}
    assert host["livenessProbe"]["grpc"] == {"port": 50051}
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"]
    if manifest == "sqlite.yaml":
        mounts = {m["name"]: m["mountPath"] for m in host["volumeMounts"]}
        assert Path(config.journal).parent == Path(mounts["journal"])
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"


def test_the_example_token_file_is_one_the_host_loads(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(secret_values()[("agentsessions-tokens", "tokens.json")])
    assert load_principals(str(tokens)) is not None


def test_the_compose_services_commands_are_accepted(tmp_path: Path) -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert set(services) == {"postgres", "harness", "host"}
    host = services["host"]
    # The image's own variables first (it listens on 0.0.0.0), then the service's.
    env = {**image_env(), **{k: str(v) for k, v in host["environment"].items()}}
    config = _host_config(host["command"], env, tmp_path)
    assert config.listen == "0.0.0.0:50051" and config.insecure_allow_unauthenticated
    assert host["ports"] == ["127.0.0.1:50051:50051"], "no authentication: published on loopback only"
    assert config.journal_kind == "postgres"
    assert config.harnesses == [("coding", "harness:50061")]
    served = harness_parser().parse_args(services["harness"]["command"])
    assert served.listen == "0.0.0.0:50061" and services["harness"]["entrypoint"] == ["agentsessions-harness"]
    assert host["depends_on"]["postgres"]["condition"] == "service_healthy"
    password = re.search(r"://[^:]+:([^@]+)@", config.journal)
    assert password and password.group(1) == services["postgres"]["environment"]["POSTGRES_PASSWORD"]


def test_the_image_refuses_to_trust_every_caller_by_itself(tmp_path: Path) -> None:
    """``docker run agentsessions`` serves 0.0.0.0: without tokens it must be told to go unauthenticated."""
    env = image_env()
    assert env["AGENTSESSIONS_LISTEN"] == "0.0.0.0:50051"
    with pytest.raises(ConfigError, match="--insecure-allow-unauthenticated"):
        _host_config(["serve"], env, tmp_path)
    assert (
        _host_config(["serve", "--insecure-allow-unauthenticated"], env, tmp_path).listen == "0.0.0.0:50051"
    )


def test_the_dockerfile_health_check_is_the_health_command() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M)
    assert text.count("FROM ${BASE}") == 2, "multi-stage, both stages on the base argument"
    healthcheck = re.search(r"^HEALTHCHECK .*\\\n\s+CMD (\[.*\])$", text, re.M)
    assert healthcheck, "no HEALTHCHECK"
    argv = json.loads(healthcheck.group(1))
    assert argv[0] == "agentsessions" and build_parser().parse_args(argv[1:]).command == "health"
    assert re.search(r"^USER 10001:10001$", text, re.M)
    volume = re.search(r'^VOLUME \["([^"]+)"\]$', text, re.M)
    journal = re.search(r"AGENTSESSIONS_JOURNAL=(\S+)", text)
    assert volume and journal and Path(journal.group(1)).parent == Path(volume.group(1))
