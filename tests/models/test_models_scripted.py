"""The scripted model: canned completions served in order, streamed, and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentsessions.host.models.provider import ModelError
from agentsessions.host.models.scripted import (
    ScriptedModel,
    assistant_text,
    assistant_tool_calls,
    tool_call_part,
)
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.v1 import common_pb2


def call(text: str, call_id: str = "m1") -> common_pb2.ModelCall:
    return common_pb2.ModelCall(model="scripted", id=call_id, messages=[text_message("user", text)])


async def test_completions_come_back_in_order_then_the_script_runs_out() -> None:
    model = ScriptedModel(
        [
            assistant_tool_calls(tool_call_part("c1", "read_file", {"path": "a.txt"}), text="let me look"),
            "done",
        ]
    )
    first = await model.complete(call("hi", "m1"))
    assert first.model_call_id == "m1"
    assert first.message.role == "assistant"
    assert message_text(first.message) == "let me look"
    (tool_part,) = [p for p in first.message.parts if p.WhichOneof("part") == "tool_call"]
    assert (tool_part.tool_call.id, tool_part.tool_call.tool) == ("c1", "read_file")
    assert dict(tool_part.tool_call.args) == {"path": "a.txt"}
    second = await model.complete(call("again", "m2"))
    assert second.message == assistant_text("done")
    assert model.remaining == 0
    with pytest.raises(ModelError, match="exhausted: call 3 but the script has 2"):
        await model.complete(call("more"))
    assert [message_text(c.messages[0]) for c in model.calls] == ["hi", "again", "more"]


async def test_text_streams_in_chunks_and_the_result_is_whole() -> None:
    chunks: list[str] = []

    async def on_delta(chunk: str) -> None:
        chunks.append(chunk)

    model = ScriptedModel(["abcdefghij"], chunk_size=4)
    result = await model.complete(call("x"), on_delta)
    assert chunks == ["abcd", "efgh", "ij"]
    assert message_text(result.message) == "abcdefghij"


async def test_returned_messages_do_not_alias_the_script() -> None:
    model = ScriptedModel(["one", "one"])
    first = await model.complete(call("x"))
    first.message.parts[0].text.text = "changed"
    second = await model.complete(call("y"))
    assert message_text(second.message) == "one"


async def test_script_files_hold_strings_and_proto_json_messages(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            [
                {
                    "role": "assistant",
                    "parts": [{"toolCall": {"id": "c1", "tool": "list_dir", "args": {"path": "."}}}],
                },
                "finished",
            ]
        ),
        encoding="utf-8",
    )
    model = ScriptedModel.from_file(path)
    first = await model.complete(call("go"))
    assert first.message.parts[0].tool_call.tool == "list_dir"
    assert message_text((await model.complete(call("go"))).message) == "finished"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"not": "a list"}, "a script is a JSON list"),
        ([3], r"\[0\]: expected a string or a Message object"),
        (["ok", {"role": "assistant", "bogus": 1}], r"\[1\]: not an agentsessions.v1.Message"),
    ],
)
def test_bad_script_files_name_the_item(tmp_path: Path, document: object, message: str) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        ScriptedModel.from_file(path)
