"""The host loads what it serves with and nothing else: packages that only some flags use (the
OpenAI-compatible provider's HTTP stack, PostgreSQL, OpenTelemetry, API included, which loads once a
provider is installed, progress bars, the HTTP listener's aiohttp, JSON Schema for turns bound to a
result schema) are imported when those flags or requests are, and so are the built-in harnesses
with the SDK's harness side (its server and native API), so a plain ``agentsessions serve`` starts
fast (bench/startup.py)."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = ("httpx", "tenacity", "asyncpg", "rich", "opentelemetry", "aiohttp", "jsonschema")

PROBE = """
import json, sys
from agentsessions.host import cli
cli.build_parser()
from agentsessions.host import app, server
loaded = sorted({m for m in sys.modules for p in PREFIXES if m == p or m.startswith(p + ".")})
print(json.dumps(loaded))
"""


# Loaded by the first session on a built-in harness (controller.harnesses.BuiltinHarness).
HARNESS_SIDE = (
    "agentsessions.harnesses",
    "agentsessions.sdk.execution",
    "agentsessions.sdk.native",
    "agentsessions.sdk.servicer",
    "agentsessions.sdk.serving",
)
# The SDK's native types and their converters (~11 ms of frozen dataclasses): the host relays the
# contract's messages and loads these only to rebuild a conversation (a compaction, a built-in
# harness) or to talk to an OpenAI-compatible provider.
NATIVE_TYPES = ("agentsessions.sdk.types", "agentsessions.sdk.convert", "agentsessions.sdk.chat")


def loaded_after(code: str, prefixes: tuple[str, ...] = OPTIONAL) -> list[str]:
    program = f"PREFIXES = {prefixes!r}\n{code}"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    result: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_serving_imports_no_optional_package() -> None:
    assert loaded_after(PROBE) == []


def test_the_model_provider_loads_its_http_stack_when_built() -> None:
    code = PROBE.replace(
        "loaded =",
        "from agentsessions.host.models.openai import OpenAIModel\nOpenAIModel('m')\nloaded =",
    )
    loaded = loaded_after(code)
    assert "httpx" in loaded and "tenacity" in loaded
    assert not any(m.startswith(("asyncpg", "opentelemetry.sdk")) for m in loaded)


def test_the_http_listener_loads_aiohttp_when_served() -> None:
    code = PROBE.replace("loaded =", "from agentsessions.host.http import HttpListener\nloaded =")
    loaded = loaded_after(code)
    assert "aiohttp" in loaded
    assert "jsonschema" not in loaded


def test_a_result_schema_loads_json_schema_when_checked() -> None:
    code = PROBE.replace(
        "loaded =",
        "from agentsessions.host.controller import results\n"
        "results.check_schema({'type': 'object'})\n"
        "loaded =",
    )
    loaded = loaded_after(code)
    assert "jsonschema" in loaded
    assert "aiohttp" not in loaded


def test_serving_loads_no_built_in_harness_until_one_is_used() -> None:
    assert loaded_after(PROBE, HARNESS_SIDE) == []
    code = PROBE.replace(
        "loaded =",
        "import asyncio\n"
        "from agentsessions.host.controller.harnesses import BuiltinHarness\n"
        "echo = BuiltinHarness('agentsessions.harnesses.echo:EchoHarness')\n"
        "assert not any(m.startswith('agentsessions.harnesses.') for m in sys.modules)\n"
        "assert asyncio.run(echo.describe()).id\n"
        "loaded =",
    )
    loaded = loaded_after(code, HARNESS_SIDE)
    assert "agentsessions.harnesses.echo" in loaded
    assert "agentsessions.harnesses.chat" not in loaded


def test_serving_loads_the_sdk_native_types_only_when_a_conversation_or_provider_needs_them() -> None:
    assert loaded_after(PROBE, NATIVE_TYPES) == []
    code = PROBE.replace(
        "loaded =",
        "from agentsessions.sdk.harness import conversation\n"
        "from agentsessions.v1 import common_pb2\n"
        "assert conversation([], [common_pb2.Message(role='user')])[0].role == 'user'\n"
        "loaded =",
    )
    assert loaded_after(code, NATIVE_TYPES) == ["agentsessions.sdk.convert", "agentsessions.sdk.types"]
    code = PROBE.replace(
        "loaded =",
        "from agentsessions.host.models.openai import build_request\n"
        "from agentsessions.v1 import common_pb2\n"
        "assert build_request(common_pb2.ModelCall(model='m'), 'm', stream=False)['model'] == 'm'\n"
        "loaded =",
    )
    assert loaded_after(code, NATIVE_TYPES) == sorted(NATIVE_TYPES)


def test_serving_loads_no_tool_executor_until_a_tool_is_configured() -> None:
    executors = ("agentsessions.host.tools.python_callable", "agentsessions.host.tools.subprocess_executor")
    assert loaded_after(PROBE, executors) == []
    code = PROBE.replace(
        "loaded =",
        "from agentsessions.host import tools\n"
        "assert tools.PythonCallableExecutor.__name__ == 'PythonCallableExecutor'\n"
        "loaded =",
    )
    assert loaded_after(code, executors) == ["agentsessions.host.tools.python_callable"]
