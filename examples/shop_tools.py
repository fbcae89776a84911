"""The shop's host-run tools: the functions ``agentsessions serve --tools-config examples/tools.toml``
runs for the example agents (``lookup_order`` for any call, ``refund`` once a person approved it).

Host tool functions take the call's arguments and a context (session, call id, idempotency key).
The host runs each call at most once per idempotency key and journals the result, so a replay or
a Resume never runs them again. ``SHOP_LEDGER`` names a file each refund is appended to.
"""

from __future__ import annotations

import json
import os
from typing import Any

ORDERS: dict[str, dict[str, Any]] = {
    "A-1001": {"status": "delivered", "item": "kettle", "paid_cents": 4599},
    "A-1002": {"status": "shipped", "item": "teapot", "paid_cents": 2899},
}


def lookup_order(args: dict[str, Any], context: Any) -> dict[str, Any]:
    """Look up an order by its id: its status, item and amount paid."""
    order = ORDERS.get(str(args.get("order_id", "")))
    if order is None:
        raise ValueError(f"no order {args.get('order_id')!r}")
    return {"order_id": args["order_id"], **order}


def refund(args: dict[str, Any], context: Any) -> dict[str, Any]:
    """Refund part or all of an order (run only after a person approved the call)."""
    order_id = str(args.get("order_id", ""))
    amount = int(args.get("amount_cents", 0))
    order = ORDERS.get(order_id)
    if order is None or not 0 < amount <= order["paid_cents"]:
        raise ValueError(f"cannot refund {amount} cents of order {order_id!r}")
    ledger = os.environ.get("SHOP_LEDGER")
    if ledger:
        with open(ledger, "a", encoding="utf-8") as file:
            file.write(json.dumps({"order_id": order_id, "amount_cents": amount}) + "\n")
    return {"order_id": order_id, "refunded_cents": amount}
