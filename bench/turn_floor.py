"""The protocol floor: bare gRPC servers exchanging exactly the frames of an echo turn.

Nothing here journals, hashes or validates. ``floor-harness`` answers ``Harness.Connect`` with
one MODEL_CALL event and, after the ModelResult frame, END; ``floor-host`` serves
``Sessions.Exec`` by streaming the six updates of an echo turn (Session, EXECUTION_START, INPUT,
MODEL_CALL, OUTPUT, END records) while it drives a Connect stream to the floor harness (Start,
MODEL_CALL, ModelResult, END). ``pingpong-harness`` is the bare bidi ping-pong: it sends a
MODEL_CALL event, waits for the ModelResult frame, and times each round trip.

Run as ``python -m bench.turn_floor ROLE --listen ADDR [...]``; each role prints
``listening on ADDR`` once bound and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Final, cast

import grpc
from google.protobuf import timestamp_pb2

from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc, session_pb2

EVENT_EXECUTION_START: Final = common_pb2.EVENT_EXECUTION_START
EVENT_INPUT: Final = common_pb2.EVENT_INPUT
EVENT_MODEL_CALL: Final = common_pb2.EVENT_MODEL_CALL
EVENT_OUTPUT: Final = common_pb2.EVENT_OUTPUT
EVENT_END: Final = common_pb2.EVENT_END
# Records carry hashes of the real length so frames weigh what the host's weigh.
FAKE_HASH: Final = "0" * 64


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def _text(message: common_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts)


def _assistant(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


class FloorHarness(harness_pb2_grpc.HarnessServicer):
    """Start -> MODEL_CALL -> (ModelResult) -> END, nothing else."""

    async def Describe(
        self, request: harness_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="floor", version="1")

    async def Connect(
        self, request_iterator: AsyncIterator[harness_pb2.ControllerFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        frames = aiter(request_iterator)
        start = await anext(frames)
        execution_id = start.execution_id
        prompt = start.start.inputs[-1]
        yield common_pb2.Event(
            execution_id=execution_id,
            kind=EVENT_MODEL_CALL,
            model=common_pb2.ModelCall(model="echo", messages=[prompt], id="call-1"),
        )
        await anext(frames)  # the ModelResult
        yield common_pb2.Event(
            execution_id=execution_id, kind=EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")
        )


class FloorHost:
    """Sessions.CreateSession and Sessions.Exec with the frames of an echo turn (nothing else)."""

    def __init__(self, harness_target: str) -> None:
        self._target = harness_target
        self._stub: harness_pb2_grpc.HarnessAsyncStub | None = None
        self._ids = itertools.count(1)
        self._seqs: dict[str, int] = {}

    def _harness(self) -> harness_pb2_grpc.HarnessAsyncStub:
        if self._stub is None:
            channel = grpc.aio.insecure_channel(self._target)
            self._stub = cast("harness_pb2_grpc.HarnessAsyncStub", harness_pb2_grpc.HarnessStub(channel))
        return self._stub

    def handler(self) -> grpc.GenericRpcHandler:
        """The two Sessions methods an echo turn uses, registered without the full servicer."""
        return grpc.method_handlers_generic_handler(
            "agentsessions.v1.Sessions",
            {
                "CreateSession": grpc.unary_unary_rpc_method_handler(
                    self.CreateSession,
                    request_deserializer=session_pb2.CreateSessionRequest.FromString,
                    response_serializer=session_pb2.Session.SerializeToString,
                ),
                "Exec": grpc.unary_stream_rpc_method_handler(
                    self.Exec,
                    request_deserializer=session_pb2.ExecRequest.FromString,
                    response_serializer=session_pb2.ExecUpdate.SerializeToString,
                ),
            },
        )

    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        uid = f"floor-{next(self._ids)}"
        self._seqs[uid] = 0
        return self._session(uid, request.session.harness)

    def _session(self, uid: str, harness: str) -> session_pb2.Session:
        s = session_pb2.Session(harness=harness, last_seq=self._seqs.get(uid, 0))
        s.metadata.uid = uid
        return s

    def _record(self, uid: str, event: common_pb2.Event) -> session_pb2.ExecUpdate:
        seq = self._seqs.get(uid, 0) + 1
        self._seqs[uid] = seq
        event.ts.CopyFrom(_now())
        record = common_pb2.LogRecord(
            seq=seq, prev_hash=FAKE_HASH, content_hash=FAKE_HASH, fence=1, event=event
        )
        return session_pb2.ExecUpdate(record=record)

    async def Exec(
        self, request: session_pb2.ExecRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[session_pb2.ExecUpdate]:
        uid = request.session
        execution_id = f"{next(self._ids):016x}"
        yield session_pb2.ExecUpdate(session=self._session(uid, request.harness))
        yield self._record(
            uid,
            common_pb2.Event(
                execution_id=execution_id,
                kind=EVENT_EXECUTION_START,
                execution_start=common_pb2.ExecutionStart(input_count=len(request.inputs), harness="floor"),
            ),
        )
        for message in request.inputs:
            yield self._record(
                uid, common_pb2.Event(execution_id=execution_id, kind=EVENT_INPUT, message=message)
            )
        call = self._harness().Connect()
        await call.write(
            harness_pb2.ControllerFrame(
                session=uid,
                execution_id=execution_id,
                start=harness_pb2.Start(inputs=request.inputs, config=request.config),
            )
        )
        ask = await call.read()
        assert isinstance(ask, common_pb2.Event) and ask.kind == EVENT_MODEL_CALL
        yield self._record(
            uid,
            common_pb2.Event(
                execution_id=execution_id,
                kind=EVENT_MODEL_CALL,
                model=common_pb2.ModelCall(model=ask.model.model, input_hash=FAKE_HASH, id="m1"),
            ),
        )
        reply = _assistant("echo:" + _text(ask.model.messages[-1]))
        await call.write(
            harness_pb2.ControllerFrame(
                session=uid,
                execution_id=execution_id,
                model=harness_pb2.ModelResult(message=reply, model_call_id=ask.model.id),
            )
        )
        yield self._record(uid, common_pb2.Event(execution_id=execution_id, kind=EVENT_OUTPUT, message=reply))
        end = await call.read()
        assert isinstance(end, common_pb2.Event) and end.kind == EVENT_END
        await call.done_writing()
        yield self._record(uid, common_pb2.Event(execution_id=execution_id, kind=EVENT_END, end=end.end))


class PingPongHarness(harness_pb2_grpc.HarnessServicer):
    """Bare bidi ping-pong of the model round trip's frames, timed on the harness side.

    The Start frame's config is ``{"calls": N, "out": PATH}``: N round trips (MODEL_CALL event out,
    ModelResult frame back), their latencies in seconds written to PATH as JSON."""

    async def Describe(
        self, request: harness_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="pingpong", version="1")

    async def Connect(
        self, request_iterator: AsyncIterator[harness_pb2.ControllerFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        frames = aiter(request_iterator)
        start = await anext(frames)
        plan = json.loads(start.start.config)
        prompt = start.start.inputs[-1]
        latencies: list[float] = []
        for i in range(int(plan["calls"])):
            began = time.perf_counter()
            yield common_pb2.Event(
                execution_id=start.execution_id,
                kind=EVENT_MODEL_CALL,
                model=common_pb2.ModelCall(model="echo", messages=[prompt], id=f"call-{i}"),
            )
            reply = await anext(frames)
            latencies.append(time.perf_counter() - began)
            assert reply.model.model_call_id == f"call-{i}"
        await asyncio.to_thread(Path(plan["out"]).write_text, json.dumps(latencies))
        yield common_pb2.Event(
            execution_id=start.execution_id, kind=EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")
        )


async def pingpong_host(target: str, calls: int, out: str, prompt: str) -> None:
    """The host end of the bare ping-pong: answer every MODEL_CALL with a ModelResult."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = cast("harness_pb2_grpc.HarnessAsyncStub", harness_pb2_grpc.HarnessStub(channel))
        call = stub.Connect()
        text = common_pb2.Part(text=common_pb2.TextPart(text=prompt))
        message = common_pb2.Message(role="user", parts=[text])
        await call.write(
            harness_pb2.ControllerFrame(
                session="pingpong",
                execution_id="pingpong",
                start=harness_pb2.Start(
                    inputs=[message], config=json.dumps({"calls": calls, "out": out}).encode()
                ),
            )
        )
        while True:
            event = await call.read()
            if event is grpc.aio.EOF:
                return
            assert isinstance(event, common_pb2.Event)
            if event.kind == EVENT_END:
                await call.done_writing()
                continue
            reply = _assistant("echo:" + _text(event.model.messages[-1]))
            await call.write(
                harness_pb2.ControllerFrame(
                    session="pingpong",
                    execution_id="pingpong",
                    model=harness_pb2.ModelResult(message=reply, model_call_id=event.model.id),
                )
            )


async def _serve(role: str, listen: str, harness: str) -> None:
    server = grpc.aio.server()
    if role == "floor-harness":
        harness_pb2_grpc.add_HarnessServicer_to_server(FloorHarness(), server)
    elif role == "pingpong-harness":
        harness_pb2_grpc.add_HarnessServicer_to_server(PingPongHarness(), server)
    else:
        server.add_generic_rpc_handlers((FloorHost(harness).handler(),))
    port = server.add_insecure_port(listen)
    await server.start()
    host, _, _ = listen.rpartition(":")
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_floor")
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("floor-harness", "floor-host", "pingpong-harness"):
        p = sub.add_parser(role)
        p.add_argument("--listen", default="127.0.0.1:0")
        p.add_argument("--harness", default="", help="floor-host: the floor harness address")
    pp = sub.add_parser("pingpong-host")
    pp.add_argument("--harness", required=True)
    pp.add_argument("--calls", type=int, required=True)
    pp.add_argument("--out", required=True)
    pp.add_argument("--prompt", default="hi")
    args = parser.parse_args(argv)
    if args.role == "pingpong-host":
        asyncio.run(pingpong_host(args.harness, args.calls, args.out, args.prompt))
        print(json.dumps({"calls": args.calls}), flush=True)
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.role, args.listen, args.harness))
    return 0


if __name__ == "__main__":
    sys.exit(main())
