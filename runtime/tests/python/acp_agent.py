"""A scripted agent that speaks the Agent Client Protocol (JSON-RPC 2.0, one message per line)
on stdin/stdout, for the `ac7 acp` tests. Standard library only.

It starts the MCP servers `session/new` names (the ac7 bridge), initializes them and lists their
tools, and plays a model that reacts to the last text block of each prompt:
- `SEND-HELLO`: a tool call of the ac7 `send` tool (asked for permission first), sending
  "hello from the scripted agent" to director; then it asks for permission to run a shell
  command, and records both answers;
- `FAIL-TURN`: the prompt is answered with an error (-32603);
- `SLOW`: the turn takes a second;
- `HANG`: the turn does not end until `session/cancel` comes, then ends `cancelled`;
- `EXIT-7`: the agent exits with code 7;
- anything else: an `agent_message_chunk` and `end_turn`.

Every prompt (its text blocks) and every permission answer is appended as a JSON line to the
file `ACP_TEST_LOG`. `ACP_TEST_VERSION` is the protocol version `initialize` answers (default 1);
`ACP_TEST_NOISE=1` makes it write a line that is not JSON and an answer to no request first.
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time

LOG = os.environ.get("ACP_TEST_LOG")
inbox = queue.Queue()
next_id = [100]
mcp = {}


def log(entry):
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")


def send(message):
    message["jsonrpc"] = "2.0"
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def reader():
    for line in sys.stdin:
        line = line.strip()
        if line:
            inbox.put(json.loads(line))
    inbox.put(None)


later = []


def wait_for(pred):
    """The next message that `pred` accepts; others wait for the main loop."""
    while True:
        message = inbox.get()
        if message is None:
            sys.exit(0)
        if pred(message):
            return message
        later.append(message)


def ask(method, params):
    next_id[0] += 1
    rid = next_id[0]
    send({"id": rid, "method": method, "params": params})
    return wait_for(lambda m: m.get("id") == rid and "method" not in m)


class Mcp:
    def __init__(self, server):
        env = dict(os.environ)
        for pair in server.get("env", []):
            env[pair["name"]] = pair["value"]
        self.proc = subprocess.Popen(
            [server["command"]] + server.get("args", []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.ids = 0
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "scripted-acp", "version": "0.1.0"}})
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        self.proc.stdin.flush()
        self.tools = [t["name"] for t in self.call("tools/list", {})["result"]["tools"]]

    def call(self, method, params):
        self.ids += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}) + "\n")
        self.proc.stdin.flush()
        while True:
            answer = json.loads(self.proc.stdout.readline())
            if answer.get("id") == self.ids:
                return answer


def update(session, update):
    send({"method": "session/update", "params": {"sessionId": session, "update": update}})


def permission(session, call_id, title):
    answer = ask("session/request_permission", {
        "sessionId": session,
        "toolCall": {"toolCallId": call_id, "title": title},
        "options": [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ],
    })
    outcome = answer["result"]["outcome"]
    log({"permission": title, "outcome": outcome})
    return outcome.get("optionId") in ("allow", "always")


def prompt(message):
    params = message["params"]
    session = params["sessionId"]
    texts = [b.get("text", "") for b in params["prompt"]]
    log({"prompt": texts})
    last = texts[-1] if texts else ""
    if "EXIT-7" in last:
        sys.exit(7)
    if "FAIL-TURN" in last:
        send({"id": message["id"], "error": {"code": -32603, "message": "Internal error",
                                             "data": "the scripted model failed"}})
        return
    if "SLOW" in last:
        time.sleep(1)
    if "HANG" in last:
        wait_for(lambda m: m.get("method") == "session/cancel")
        send({"id": message["id"], "result": {"stopReason": "cancelled"}})
        return
    if "SEND-HELLO" in last:
        update(session, {"sessionUpdate": "tool_call", "toolCallId": "call-1",
                         "title": "mcp__ac7__send", "kind": "other", "status": "pending"})
        if permission(session, "call-1", "mcp__ac7__send"):
            result = mcp["ac7"].call("tools/call", {"name": "send", "arguments": {
                "to": "director", "body": "hello from the scripted agent"}})
            update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "call-1",
                             "status": "completed",
                             "content": [{"type": "content", "content": result["result"]["content"][0]}]})
        permission(session, "call-2", "`rm -rf /tmp/x`")
    update(session, {"sessionUpdate": "agent_message_chunk",
                     "content": {"type": "text", "text": "noted"}})
    send({"id": message["id"], "result": {"stopReason": "end_turn"}})


def main():
    threading.Thread(target=reader, daemon=True).start()
    if os.environ.get("ACP_TEST_NOISE") == "1":
        sys.stdout.write("this is not JSON\n")
        send({"id": 4242, "result": {}})
    while True:
        message = later.pop(0) if later else inbox.get()
        if message is None:
            return
        method = message.get("method")
        if method == "initialize":
            send({"id": message["id"], "result": {
                "protocolVersion": int(os.environ.get("ACP_TEST_VERSION", "1")),
                "agentCapabilities": {"loadSession": False},
                "agentInfo": {"name": "scripted-acp", "version": "0.1.0"},
                "authMethods": []}})
        elif method == "session/new":
            params = message["params"]
            for server in params.get("mcpServers", []):
                mcp[server["name"]] = Mcp(server)
            log({"session_new": {"cwd": params["cwd"],
                                 "tools": {n: len(m.tools) for n, m in mcp.items()}}})
            send({"id": message["id"], "result": {"sessionId": "sess-1"}})
        elif method == "session/prompt":
            prompt(message)
        elif "id" in message and method is not None:
            send({"id": message["id"], "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    main()
