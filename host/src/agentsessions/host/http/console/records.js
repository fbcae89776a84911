// What a journal record says, for a person: its kind and one line of detail. Records arrive in
// proto3 JSON with the proto field names (json_names=proto): int64 values are strings, enums
// are names, bytes are base64.

const MEDIATION = {
  MEDIATION_CONTROLLER_MEDIATED: "run by the host",
  MEDIATION_REQUIRES_APPROVAL: "run by the host after approval",
  MEDIATION_IN_HARNESS_REPORTED: "run by the harness",
};

export function kindName(event) {
  return (event.kind || "EVENT_KIND_UNSPECIFIED").replace(/^EVENT_/, "");
}

export function stateName(state) {
  return (state || "EXEC_STATE_UNSPECIFIED").replace(/^EXEC_/, "");
}

export function computeName(state) {
  return (state || "COMPUTE_STATE_UNSPECIFIED").replace(/^COMPUTE_/, "");
}

export function actorName(actor) {
  return (actor && actor.principal) || "an unnamed caller";
}

export function messageText(message) {
  return ((message && message.parts) || [])
    .filter((part) => part.text)
    .map((part) => part.text.text || "")
    .join("");
}

export function compact(value, limit = 200) {
  const text = JSON.stringify(value === undefined ? {} : value);
  return text.length <= limit ? text : `${text.slice(0, limit - 1)}…`;
}

function configText(base64) {
  if (!base64) return "";
  try {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return `${base64.length} base64 characters`;
  }
}

// The tool call named by id among the records seen so far, for results and approvals.
export function toolOf(records, id) {
  for (const record of records) {
    const tool = record.event && record.event.tool;
    if (tool && tool.id === id) return tool;
  }
  return null;
}

export function detail(record, records) {
  const event = record.event || {};
  if (event.execution_start) {
    const start = event.execution_start;
    const inputs = start.input_count || "0";
    const config = configText(start.config);
    return `turn started: harness ${start.harness || "?"} ${start.harness_version || ""}, ${inputs} input(s)${
      config ? `, config ${config}` : ""
    }`;
  }
  if (event.message) {
    const text = messageText(event.message);
    const calls = (event.message.parts || []).filter((part) => part.tool_call).map((part) => part.tool_call.tool);
    const role = event.message.role || (event.kind === "EVENT_INPUT" ? "user" : "assistant");
    return `${role}: ${text}${calls.length ? `  [asks for ${calls.join(", ")}]` : ""}`;
  }
  if (event.model) {
    const model = event.model;
    const params = model.params && Object.keys(model.params).length ? ` params ${compact(model.params)}` : "";
    return `model call to ${model.model || "the host's default model"} (input hash ${(model.input_hash || "").slice(0, 12)}…)${params}`;
  }
  if (event.tool) {
    const tool = event.tool;
    return `${tool.tool}(${compact(tool.args)}) ${MEDIATION[tool.mediation] || ""}`.trim();
  }
  if (event.result) {
    const result = event.result;
    const tool = toolOf(records, result.id);
    const name = tool ? tool.tool : result.id;
    if (result.code === "APPROVAL_DENIED") return `${name}: not run, the approval was denied`;
    if (result.is_error) return `${name} failed: ${result.error || compact(result.output)}`;
    return `${name} returned ${compact(result.output)}`;
  }
  if (event.approval) {
    const tool = toolOf(records, event.approval.tool_call_id);
    const reason = event.approval.reason ? `: ${event.approval.reason}` : "";
    return `approval requested for ${tool ? tool.tool : event.approval.tool_call_id}${reason}`;
  }
  if (event.approval_result) {
    const result = event.approval_result;
    const verdict = result.approved ? "approved" : "denied";
    const reason = result.reason ? `: ${result.reason}` : "";
    return `${verdict} by ${actorName(event.actor)} (request #${result.request_seq})${reason}`;
  }
  if (event.usage) {
    const usage = event.usage;
    return `${usage.model || "?"}: ${usage.input_tokens || 0} input + ${usage.output_tokens || 0} output tokens`;
  }
  if (event.lifecycle) {
    const kind = (event.lifecycle.kind || "").replace(/^LIFECYCLE_/, "").toLowerCase();
    return `${kind} ${event.lifecycle.detail || ""}`.trim();
  }
  if (event.end) {
    const error = event.end.error ? `: ${event.end.error.description || ""}` : "";
    return `turn ended ${event.end.state || ""}${error}`;
  }
  if (event.error) return `error ${event.error.code || ""}: ${event.error.description || ""}`;
  if (event.parked) return `parked on call ${event.parked.tool_call_id} (request #${event.parked.request_seq})`;
  return "";
}

// Usage per model: model calls from MODEL_CALL records, tokens from USAGE records. A call that
// names no model (the host's default) counts for the model its execution's next USAGE names.
export function usageByModel(records) {
  const models = new Map();
  const entry = (name) => {
    if (!models.has(name)) models.set(name, { calls: 0, input: 0, output: 0, reasoning: 0 });
    return models.get(name);
  };
  const unnamed = new Map(); // execution id -> calls waiting for a USAGE to name their model
  const ordered = [...records].sort((a, b) => Number(a.seq) - Number(b.seq));
  for (const record of ordered) {
    const event = record.event || {};
    const execution = event.execution_id || "";
    if (event.model) {
      if (event.model.model) entry(event.model.model).calls += 1;
      else unnamed.set(execution, (unnamed.get(execution) || 0) + 1);
    }
    if (event.usage) {
      const row = entry(event.usage.model || "(host default)");
      if (unnamed.get(execution)) {
        row.calls += 1;
        unnamed.set(execution, unnamed.get(execution) - 1);
      }
      row.input += Number(event.usage.input_tokens || 0);
      row.output += Number(event.usage.output_tokens || 0);
      row.reasoning += Number(event.usage.reasoning_tokens || 0);
    }
  }
  const left = [...unnamed.values()].reduce((sum, n) => sum + n, 0);
  if (left) entry("(host default)").calls += left;
  return models;
}
