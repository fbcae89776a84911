"""``agentsessions.v1.HarnessRegistry``: the admin API naming harness addresses the host dials.

Registrations persist in the journal store. Static harnesses (the host's own ``echo``/``chat``
and ``--harness`` entries) are listed beside registered ones but cannot be changed here.
"""

from __future__ import annotations

import base64
import functools
import re
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import grpc
from grpc import aio

from agentsessions.host.addresses import AddressError, check_harness_address
from agentsessions.host.controller.errors import ControllerError
from agentsessions.host.controller.harnesses import HarnessCatalog, describe
from agentsessions.host.journal import canon, clamp_page_size
from agentsessions.host.service.status import status_of
from agentsessions.v1 import harness_registry_pb2 as hr
from agentsessions.v1 import harness_registry_pb2_grpc

SERVICE_NAME: str = hr.DESCRIPTOR.services_by_name["HarnessRegistry"].full_name
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


async def _abort(context: aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("context.abort returned")


Req = TypeVar("Req")
Resp = TypeVar("Resp")


def _mapped(
    method: Callable[[HarnessRegistryServicer, Req, aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[HarnessRegistryServicer, Req, aio.ServicerContext], Awaitable[Resp]]:
    """A handler whose errors from below (the store, say) answer with their status, never UNKNOWN."""

    @functools.wraps(method)
    async def handler(self: HarnessRegistryServicer, request: Req, context: aio.ServicerContext) -> Resp:
        try:
            return await method(self, request, context)
        except aio.AbortError:
            raise
        except Exception as exc:
            code, message = status_of(exc)
            await _abort(context, code, message)

    return handler


async def _check_name(context: aio.ServicerContext, name: str) -> None:
    """A name to look up: required, and no text a store would refuse (any name that passes and is
    not registered is NOT_FOUND)."""
    if not name:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name: is required")
    if len(name) > 253:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name: must be at most 253 characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name: must not contain control characters")


class HarnessRegistryServicer(harness_registry_pb2_grpc.HarnessRegistryServicer):
    def __init__(self, catalog: HarnessCatalog) -> None:
        self.catalog = catalog
        self.store = catalog.store

    def _static_registration(self, name: str) -> hr.HarnessRegistration:
        reg = hr.HarnessRegistration(state=hr.HARNESS_STATE_ACTIVE, source=hr.HARNESS_SOURCE_STATIC)
        reg.metadata.name = name
        address = self.catalog.static_address(name)
        if address:
            reg.spec.remote.address = address
        reg.spec_digest = canon.spec_digest(reg.spec)
        return reg

    @_mapped
    async def RegisterHarness(
        self, request: hr.RegisterHarnessRequest, context: aio.ServicerContext
    ) -> hr.RegisterHarnessResponse:
        name = request.name
        if len(name) > 63 or not DNS_LABEL.match(name):
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"name: {name!r} is not an RFC 1123 DNS label (a-z, 0-9, '-', at most 63 characters)",
            )
        if self.catalog.is_static(name):
            await _abort(
                context, grpc.StatusCode.ALREADY_EXISTS, f"name: {name!r} is a static harness of this host"
            )
        placement = request.spec.WhichOneof("placement")
        if placement is None:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "spec.placement: remote or substrate is required"
            )
        if placement == "substrate":
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "spec.substrate: this host has no substrate runtime; register a remote address",
            )
        try:
            check_harness_address(request.spec.remote.address)
        except AddressError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"spec.remote.address: {exc}")
        digest = canon.spec_digest(request.spec)
        existing = await self.store.get_harness(name)
        now = time.time_ns()
        if existing is not None:
            if existing.spec_digest != digest:
                await _abort(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"name: {name!r} is registered with a different spec ({existing.spec_digest})",
                )
            if existing.state == hr.HARNESS_STATE_ACTIVE:
                return hr.RegisterHarnessResponse(harness=existing, outcome=hr.REGISTER_OUTCOME_UNCHANGED)
            existing.state = hr.HARNESS_STATE_ACTIVE
            existing.ClearField("retire_time")
            existing.retire_reason = ""
            existing.metadata.update_time.FromNanoseconds(now)
            await self.store.put_harness(existing)
            return hr.RegisterHarnessResponse(harness=existing, outcome=hr.REGISTER_OUTCOME_REACTIVATED)
        reg = hr.HarnessRegistration(
            spec=request.spec,
            spec_digest=digest,
            state=hr.HARNESS_STATE_ACTIVE,
            source=hr.HARNESS_SOURCE_REGISTERED,
        )
        reg.metadata.name = name
        reg.metadata.create_time.FromNanoseconds(now)
        reg.metadata.update_time.FromNanoseconds(now)
        await self.store.put_harness(reg)
        return hr.RegisterHarnessResponse(harness=reg, outcome=hr.REGISTER_OUTCOME_CREATED)

    async def _lookup(self, name: str, context: aio.ServicerContext) -> hr.HarnessRegistration:
        if self.catalog.is_static(name):
            return self._static_registration(name)
        reg = await self.store.get_harness(name)
        if reg is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"harness {name!r} is not registered")
        return reg

    @_mapped
    async def GetHarness(
        self, request: hr.GetHarnessRequest, context: aio.ServicerContext
    ) -> hr.HarnessRegistration:
        await _check_name(context, request.name)
        reg = await self._lookup(request.name, context)
        if request.observe:
            try:
                resolved = await self.catalog.resolve(request.name)
                reg.observed.CopyFrom(await describe(resolved))
            except ControllerError as exc:
                reg.observe_error = str(exc)
        return reg

    @_mapped
    async def ListHarnesses(
        self, request: hr.ListHarnessesRequest, context: aio.ServicerContext
    ) -> hr.ListHarnessesResponse:
        if request.page_size < 0:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size: must not be negative, got {request.page_size}",
            )
        size = clamp_page_size(request.page_size)
        after = ""
        if request.page_token:
            try:
                after = base64.urlsafe_b64decode(
                    request.page_token + "=" * (-len(request.page_token) % 4)
                ).decode()
            except (ValueError, UnicodeDecodeError):
                await _abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, "page_token: is not a token this host issued"
                )
            if not after:
                await _abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, "page_token: is not a token this host issued"
                )
        entries = {name: self._static_registration(name) for name in self.catalog.static_names()}
        for reg in await self.store.list_harnesses():
            entries.setdefault(reg.metadata.name, reg)
        names = [
            n
            for n in sorted(entries)
            if n > after and (request.include_retired or entries[n].state != hr.HARNESS_STATE_RETIRED)
        ]
        page = names[:size]
        token = ""
        if len(names) > size:
            token = base64.urlsafe_b64encode(page[-1].encode()).decode().rstrip("=")
        return hr.ListHarnessesResponse(harnesses=[entries[n] for n in page], next_page_token=token)

    @_mapped
    async def RetireHarness(
        self, request: hr.RetireHarnessRequest, context: aio.ServicerContext
    ) -> hr.HarnessRegistration:
        await _check_name(context, request.name)
        if self.catalog.is_static(request.name):
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"harness {request.name!r} is static and cannot be retired",
            )
        reg = await self._lookup(request.name, context)
        if reg.state == hr.HARNESS_STATE_RETIRED:
            return reg
        reg.state = hr.HARNESS_STATE_RETIRED
        reg.retire_time.GetCurrentTime()
        reg.retire_reason = request.reason
        reg.metadata.update_time.CopyFrom(reg.retire_time)
        await self.store.put_harness(reg)
        return reg
