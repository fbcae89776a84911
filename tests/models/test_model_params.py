"""``ModelCall.params`` reach the provider as typed request fields (the SDK's chat converter, one rule for
every provider and adapter); bad ones fail before sending."""

from __future__ import annotations

import pytest

from agentsessions.host.models.openai import OpenAIModel
from agentsessions.host.models.provider import ModelError
from agentsessions.sdk.harness import text_message
from agentsessions.v1 import common_pb2
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint


def call(**params: str) -> common_pb2.ModelCall:
    return common_pb2.ModelCall(model="", params=params, messages=[text_message("user", "hi")])


async def test_params_are_sent_with_their_types_and_usage_comes_back(endpoint: ScriptedEndpoint) -> None:
    endpoint.script(Reply.completion("ok", usage={"prompt_tokens": 11, "completion_tokens": 4}))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(
            call(
                temperature="0.2",
                max_tokens="64",
                seed="7",
                parallel_tool_calls="false",
                stop='["\\n", "END"]',
                response_format='{"type": "json_object"}',
                num_ctx="4096",
                custom_flag="true",
                note="plain words",
            )
        )
    finally:
        await model.aclose()
    (request,) = endpoint.received
    body = request.body
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64 and body["seed"] == 7
    assert body["parallel_tool_calls"] is False
    assert body["stop"] == ["\n", "END"]
    assert body["response_format"] == {"type": "json_object"}
    assert body["num_ctx"] == 4096 and body["custom_flag"] is True and body["note"] == "plain words"
    assert body["model"] == "gpt-test" and "stream" not in body
    assert result.usage.input_tokens == 11 and result.usage.output_tokens == 4


async def test_a_plain_stop_string_stays_a_string(endpoint: ScriptedEndpoint) -> None:
    endpoint.script(Reply.completion("ok"))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        await model.complete(call(stop="###"))
    finally:
        await model.aclose()
    assert endpoint.received[0].body["stop"] == "###"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": "warm"}, "params.temperature: 'warm' is not a number"),
        ({"temperature": "nan"}, "params.temperature: 'nan' is not a finite number"),
        ({"max_tokens": "1.5"}, "params.max_tokens: '1.5' is not an integer"),
        ({"logprobs": "yes"}, "params.logprobs: 'yes' is not true or false"),
        ({"response_format": "[1]"}, "params.response_format: '[1]' is not a JSON object"),
        ({"stop": "[1, 2]"}, "params.stop: '[1, 2]' is neither a string nor a JSON list of strings"),
        ({"stream": "false"}, "params.stream: stream is part of the request itself, not a param"),
        ({"messages": "[]"}, "params.messages: messages is part of the request itself, not a param"),
    ],
)
async def test_a_bad_param_fails_the_call_before_anything_is_sent(
    endpoint: ScriptedEndpoint, params: dict[str, str], message: str
) -> None:
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        with pytest.raises(ModelError) as failed:
            await model.complete(call(**params))
    finally:
        await model.aclose()
    assert str(failed.value) == message
    assert endpoint.received == []
