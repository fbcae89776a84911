"""Attribute and instrument names: OpenTelemetry semantic conventions (RPC, GenAI) and our own."""

from __future__ import annotations

from typing import Final

INSTRUMENTATION: Final = "agentsessions.host"

# RPC (semantic conventions for gRPC servers).
RPC_SYSTEM_NAME: Final = "rpc.system.name"
RPC_METHOD: Final = "rpc.method"
RPC_RESPONSE_STATUS_CODE: Final = "rpc.response.status_code"
RPC_SERVER_CALL_DURATION: Final = "rpc.server.call.duration"

# GenAI.
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
CHAT: Final = "chat"
EXECUTE_TOOL: Final = "execute_tool"
INVOKE_AGENT: Final = "invoke_agent"

ERROR_TYPE: Final = "error.type"

# This host's own.
SESSION: Final = "agentsessions.session"
EXECUTION_ID: Final = "agentsessions.execution_id"
TURN_OUTCOME: Final = "agentsessions.turn.outcome"
REQUEST_ID: Final = "agentsessions.request_id"
JOURNAL_RECORDS: Final = "agentsessions.journal.records"
JOURNAL_LAST_SEQ: Final = "agentsessions.journal.last_seq"
TOOL_IS_ERROR: Final = "agentsessions.tool.is_error"
TURNS: Final = "agentsessions.turns"
JOURNAL_APPEND_DURATION: Final = "agentsessions.journal.append.duration"

# Model request retries (agentsessions.host.models.transport).
MODEL_RETRIES: Final = "agentsessions.model.retries"
MODEL_RETRY_EVENT: Final = "agentsessions.model.retry"
MODEL_RETRY_ATTEMPT: Final = "agentsessions.model.retry.attempt"
MODEL_RETRY_WAIT: Final = "agentsessions.model.retry.wait_s"
MODEL_RETRY_AFTER: Final = "agentsessions.model.retry.retry_after"
