"""The model provider's HTTP transport: timeouts, and retries of a request that did not get through.

A completion request is retried (with tenacity) when its answer is 429 or any 5xx, or when no answer
arrived at all (a connection refused or reset, a connect or read timeout before the response head).
The wait before retry ``n`` is exponential with jitter, ``min(initial * 2**(n-1) + U(0, jitter),
max_backoff)``, unless the answer carried ``Retry-After`` (seconds or an HTTP date), which is waited
exactly. Retries stop after ``max_attempts`` requests, or before a wait that would end past the
completion's total budget. Once a response head is 200 nothing is retried: its deltas may already
have reached a client.

Retries happen inside one model call, so the journal holds one MODEL_CALL record however many
requests it took. Each retry is a warning log line (``model call retry``: model, attempt, status or
error type, wait) and, with telemetry on, an ``agentsessions.model.retry`` event on the model call's
``chat`` span and one count on the ``agentsessions.model.retries`` counter.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import httpx
import tenacity
from opentelemetry import metrics, trace

from agentsessions.host.logs import fields
from agentsessions.host.models.policy import RetryPolicy, Timeouts
from agentsessions.host.models.provider import ModelError
from agentsessions.host.telemetry import names, switch

__all__ = ["ChatTransport", "RetryPolicy", "Timeouts"]

log = logging.getLogger("agentsessions.models")
_retries = metrics.get_meter(names.INSTRUMENTATION).create_counter(
    names.MODEL_RETRIES, unit="{retry}", description="Model requests retried, by status or error type."
)

# Bytes of an error body kept for the message (the rest is dropped unread).
_ERROR_BODY_LIMIT = 64 * 1024
_DETAIL_LIMIT = 200


class _Retryable(Exception):
    """An answer worth another request: 429 or 5xx."""

    def __init__(self, status: int, retry_after: float | None, detail: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after
        self.detail = detail


def _worth_retrying(exc: BaseException) -> bool:
    # TransportError: no answer at all (refused, reset, connect/read timeout before the head).
    return isinstance(exc, _Retryable | httpx.TransportError)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, moment.timestamp() - current)


def error_detail(raw: bytes) -> str:
    """The provider's error message from an error body (JSON ``error.message``, else the text)."""
    try:
        decoded = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        message = decoded["error"].get("message")
        if isinstance(message, str) and message:
            return message
    text = raw.decode("utf-8", "replace").strip()
    return text if len(text) <= _DETAIL_LIMIT else text[:_DETAIL_LIMIT] + "..."


class _Wait(tenacity.wait.wait_base):
    """Retry-After when the answer had one, else exponential backoff with jitter."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._backoff = tenacity.wait_exponential_jitter(
            multiplier=policy.initial_backoff, max=policy.max_backoff, jitter=policy.jitter
        )

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            return exc.retry_after
        return float(self._backoff(retry_state))


class ChatTransport:
    """POSTs a completion request, retrying as :class:`RetryPolicy` says, and yields the 200 answer.

    ``sleep`` waits between attempts (``asyncio.sleep``); it is cancellable, so a cancelled turn
    stops waiting at once.
    """

    def __init__(
        self,
        *,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.timeouts = timeouts or Timeouts()
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._client: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @asynccontextmanager
    async def post(
        self, url: str, payload: bytes, headers: Mapping[str, str], *, model: str
    ) -> AsyncIterator[httpx.Response]:
        """The answer to the request, streamed: 200, or a status that is not worth retrying (for the
        caller to report). Raises ModelError when retries run out."""
        response = await self._send(url, payload, headers, model)
        try:
            yield response
        finally:
            await response.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(self.timeouts.read, connect=self.timeouts.connect)
            self._client = httpx.AsyncClient(timeout=timeout)
        return self._client

    async def _send(self, url: str, payload: bytes, headers: Mapping[str, str], model: str) -> httpx.Response:
        started = time.monotonic()
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retry.max_attempts)
            | tenacity.stop_before_delay(self.timeouts.total),
            wait=_Wait(self.retry),
            retry=tenacity.retry_if_exception(_worth_retrying),
            before_sleep=lambda state: _report_retry(state, model),
            sleep=self._sleep,
            reraise=True,
        )
        attempts = 0
        response: httpx.Response | None = None
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    response = await self._attempt(url, payload, headers)
        except _Retryable as exc:
            why = _gave_up(attempts, self.retry, started, self.timeouts.total)
            detail = f": {exc.detail}" if exc.detail else ""
            raise ModelError(f"model {model}: HTTP {exc.status}{why}{detail}") from None
        except httpx.TransportError as exc:
            why = _gave_up(attempts, self.retry, started, self.timeouts.total)
            raise ModelError(
                f"model {model}: request to {url} failed{why}: {type(exc).__name__}: {exc}"
            ) from exc
        assert response is not None  # tenacity returns only after an attempt that did not raise
        return response

    async def _attempt(self, url: str, payload: bytes, headers: Mapping[str, str]) -> httpx.Response:
        client = self._http()
        response = await client.send(
            client.build_request("POST", url, content=payload, headers=headers), stream=True
        )
        status = response.status_code
        if status != 429 and status < 500:
            return response
        try:
            raw = await _read_capped(response, _ERROR_BODY_LIMIT)
        finally:
            await response.aclose()
        raise _Retryable(status, retry_after_seconds(response.headers.get("retry-after")), error_detail(raw))


def _gave_up(attempts: int, policy: RetryPolicy, started: float, budget: float) -> str:
    """Why the retries stopped, for the failure message."""
    if policy.max_attempts == 1:
        return ""
    elapsed = time.monotonic() - started
    tried = f" after {attempts} attempt{'s' if attempts > 1 else ''} in {elapsed:.1f} s"
    if attempts >= policy.max_attempts:
        return tried
    return f"{tried} (the next wait would pass the {budget:g} s budget)"


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk[: max(0, limit - size)])
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)


def _report_retry(state: tenacity.RetryCallState, model: str) -> None:
    """Log and count one retry (tenacity calls this before it sleeps)."""
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    wait = state.upcoming_sleep
    cause = f"HTTP {exc.status}" if isinstance(exc, _Retryable) else type(exc).__name__
    honoured = isinstance(exc, _Retryable) and exc.retry_after is not None
    log.warning(
        "model call retry",
        extra=fields(
            model=model,
            attempt=state.attempt_number,
            cause=cause,
            retry_in_s=round(wait, 3),
            retry_after=honoured,
        ),
    )
    if not switch.enabled():
        return
    attributes: dict[str, str | int | float | bool] = {
        names.GEN_AI_REQUEST_MODEL: model,
        names.MODEL_RETRY_ATTEMPT: state.attempt_number,
        names.MODEL_RETRY_WAIT: wait,
        names.MODEL_RETRY_AFTER: honoured,
        names.ERROR_TYPE: str(exc.status) if isinstance(exc, _Retryable) else type(exc).__name__,
    }
    trace.get_current_span().add_event(names.MODEL_RETRY_EVENT, attributes)
    _retries.add(1, {names.GEN_AI_REQUEST_MODEL: model, names.ERROR_TYPE: attributes[names.ERROR_TYPE]})
