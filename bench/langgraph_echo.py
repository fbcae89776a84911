"""The LangGraph comparison: a one-node echo graph checkpointed by LangGraph's SqliteSaver.

Each turn invokes the graph on a thread's conversation with one user message; the node answers
``"echo:" + text`` as an AI message (MessagesState), and the saver commits the checkpoint to a
SQLite file (WAL, SQLite's default synchronous=FULL) before ``invoke`` returns. ``--threads`` OS
threads each drive their own conversation turn after turn until ``--seconds`` pass.

LangGraph is an optional extra (bench/requirements.txt): without it this prints
``{"unavailable": REASON}``. Run as ``python -m bench.langgraph_echo --db PATH --threads N``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

PACKAGES = ("langgraph", "langgraph-checkpoint-sqlite")


def _modules() -> tuple[Any, Any, Any]:
    """langgraph.graph, langgraph.checkpoint.sqlite and langchain_core.messages (typed loosely:
    they are optional, so type checks never depend on them being installed)."""
    graph = importlib.import_module("langgraph.graph")
    saver = importlib.import_module("langgraph.checkpoint.sqlite")
    messages = importlib.import_module("langchain_core.messages")
    return graph, saver, messages


def build(db: str) -> tuple[Any, sqlite3.Connection]:
    graph_mod, saver_mod, messages = _modules()

    def echo(state: dict[str, Any]) -> dict[str, Any]:
        last = state["messages"][-1]
        return {"messages": [messages.AIMessage(content="echo:" + str(last.content))]}

    builder = graph_mod.StateGraph(graph_mod.MessagesState)
    builder.add_node("echo", echo)
    builder.add_edge(graph_mod.START, "echo")
    builder.add_edge("echo", graph_mod.END)
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = saver_mod.SqliteSaver(conn)
    saver.setup()
    return builder.compile(checkpointer=saver), conn


def measure(db: str, threads: int, warmup: int, seconds: float) -> dict[str, Any]:
    graph, conn = build(db)
    _, _, messages = _modules()
    counts = [0] * threads
    failures: list[BaseException] = []

    def one(thread_id: str) -> None:
        out = graph.invoke(
            {"messages": [messages.HumanMessage(content="hi")]},
            {"configurable": {"thread_id": thread_id}},
        )
        if out["messages"][-1].content != "echo:hi":
            raise AssertionError(f"unexpected answer {out['messages'][-1].content!r}")

    for i in range(threads):
        for _ in range(warmup):
            one(f"t{i}")
    deadline = time.perf_counter() + seconds

    def drive(i: int) -> None:
        try:
            while time.perf_counter() < deadline:
                one(f"t{i}")
                counts[i] += 1
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=drive, args=(i,)) for i in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - began
    conn.close()
    if failures:
        raise failures[0]
    done = sum(counts)
    return {"threads": threads, "turns": done, "elapsed_s": elapsed, "turns_per_s": done / elapsed}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.langgraph_echo")
    parser.add_argument("--db", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        _modules()
    except ImportError as exc:
        print(json.dumps({"unavailable": f"{exc} (pip install -r bench/requirements.txt)"}), flush=True)
        return 0
    print(json.dumps(measure(args.db, args.threads, args.warmup, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
