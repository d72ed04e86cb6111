"""The agent `ac7 run` spawns in the runner tests, built on the official MCP Python SDK.

Like Claude Code, it reads the MCP config the runner wrote in its working directory
(`.mcp.json`), starts the `ac7` server entry exactly as written (command, args, env) and talks MCP
to it. Usage: runner_agent.py <scenario>; AC7_TEST_WORK is a scratch directory shared with the
Rust test (marker files go there); the result is written to AC7_TEST_WORK/result.json. Every wait
is bounded.

Scenarios:
  session   call the tools, then wait for pushes, an objective assignment and tools/list_changed
  messages  wait for the bodies listed in AC7_TEST_EXPECT (comma-separated), in any order
  calls     list the tools, then make the calls in AC7_TEST_CALLS (a JSON list of [tool, args]);
            a "$last_objective" argument value is replaced by the id the last objectives_create made
  early     raw JSON lines, no SDK: write the marker `waiting`, wait for the file `go`, then start
            the bridge and handshake slowly (initialize, 0.3 s, initialized, 0.3 s, tools/list);
            record every line in and out with its time until a channel event arrives
  displace  start a first bridge by hand (raw lines: handshake and tools/list), then an SDK client
            on a second one; record that the first one's stdout closed (it was displaced), then
            wait for the bodies in AC7_TEST_EXPECT on the second
  swap      raw JSON lines, no SDK: a bridge at a time, each closed after AC7_TEST_SWAP_MS
            (default 400) of delivering and replaced by a new one, until every body in
            AC7_TEST_EXPECT arrived; every channel event is recorded, duplicates included
  late      raw JSON lines, no SDK, Claude Code's start-up: write the marker `waiting`, wait for
            the file `go`, then start the bridge as client `claude-code`; for AC7_TEST_LATE_MS
            (default 700) after the answer to its first tools/list it has no handlers (channel
            notifications and tools/list_changed are dropped, as Claude Code drops them), then it
            takes channel notifications and answers tools/list_changed with tools/list, and
            writes the marker `ready`; until every body in AC7_TEST_EXPECT arrived (or the wait
            ran out); records what it took, what it dropped and how often it listed again
  foreign   an SDK client on its own bridge waits for the first body in AC7_TEST_EXPECT, then runs
            a child process (this script, `health-check`) that starts a bridge of its own from
            .mcp.json, lists the tools and exits, as `claude mcp list` run by an agent does; then
            it writes the marker `checked` and waits for the other bodies on its own bridge
  health-check  (the child of `foreign`) raw JSON lines: initialize, initialized, tools/list,
            then close; writes how many tools it got to AC7_TEST_WORK/check.json
  stopped   raw JSON lines, no SDK: start the bridge, handshake, then stop the bridge process
            (SIGSTOP) and list the tools and call roster through it; let it go on (SIGCONT), call
            roster again, then send the bridge SIGTERM; read its stdout to the end and record the
            answers and its exit code (a runner that took the stdio over answers while the
            bridge is stopped, and ends the session when the bridge is told to stop)
  orphan    raw JSON lines, no SDK: start the bridge, handshake and list the tools, write the
            bridge's pid to `bridge.pid` and the marker `ready`, then wait to be killed (with
            the runner)
  exit:N    exit with code N at once (never starts the bridge)
  hang      sleep until killed
"""

import json
import os
import sys
import time
from pathlib import Path

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, NotificationBinding
from pydantic import BaseModel

WORK = Path(os.environ["AC7_TEST_WORK"])
WAIT = 20  # seconds; bound for any single wait


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str]


class ClaudeChannel(ClientExtension):
    identifier = "com.anthropic/claude-channel"

    def __init__(self) -> None:
        self.received: list[ChannelParams] = []
        self.changed = anyio.Event()

    def notifications(self):
        return [NotificationBinding(method="notifications/claude/channel", params_type=ChannelParams, handler=self._on)]

    async def _on(self, params: ChannelParams) -> None:
        self.received.append(params)
        self.changed.set()

    async def wait_for(self, predicate, what: str) -> ChannelParams:
        with anyio.fail_after(WAIT):
            while True:
                for p in self.received:
                    if predicate(p):
                        return p
                self.changed = anyio.Event()
                await self.changed.wait()


def server() -> StdioServerParameters:
    config = json.loads(Path(".mcp.json").read_text())
    entry = config["mcpServers"]["ac7"]
    return StdioServerParameters(command=entry["command"], args=entry["args"], env=entry.get("env", {}))


def text(result) -> str:
    return result.content[0].text


async def call(client, out: dict, name: str, args: dict) -> str:
    result = await client.call_tool(name, args)
    out.setdefault("calls", []).append({"tool": name, "args": args, "isError": bool(result.is_error), "text": text(result)})
    return text(result)


async def scenario_session() -> dict:
    out: dict = {}
    channel = ClaudeChannel()
    list_changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            list_changed.set()

    async with Client(server(), mode="legacy", extensions=[channel], message_handler=on_message, read_timeout_seconds=WAIT) as client:
        tools = await client.list_tools()
        out["tools"] = [t.name for t in tools.tools]
        await call(client, out, "roster", {})
        await call(client, out, "broadcast", {"body": "hello from builder"})
        await call(client, out, "send", {"to": "director", "body": "status: starting"})
        await call(client, out, "channels_list", {})
        await call(client, out, "fs_write", {"path": "/builder/notes.md", "mimeType": "text/markdown", "text": "# notes\n"})
        await call(client, out, "fs_read", {"path": "/builder/notes.md"})
        await call(client, out, "fs_ls", {})
        await call(client, out, "fs_stat", {"path": "/builder/none.txt"})
        await call(client, out, "objectives_list", {})
        await call(client, out, "objectives_view", {"id": "obj-nope"})
        await call(client, out, "send", {"to": "director"})
        await call(client, out, "objectives_create", {"title": "t", "outcome": "o", "assignee": "builder"})

        (WORK / "ready").write_text("ready")
        dm = await channel.wait_for(lambda p: p.meta.get("thread") == "dm", "a DM")
        general = await channel.wait_for(lambda p: p.meta.get("thread") == "general" and p.meta.get("from") == "director", "a broadcast")
        assigned = await channel.wait_for(lambda p: p.meta.get("kind") == "objective" and p.meta.get("event") == "assigned", "an assignment")
        with anyio.fail_after(WAIT):
            await list_changed.wait()
        out["dm"] = dm.model_dump()
        out["general"] = general.model_dump()
        out["assigned"] = assigned.model_dump()
        objective_id = assigned.meta["objective_id"]
        tools = await client.list_tools()
        listing = next(t for t in tools.tools if t.name == "objectives_list")
        out["objectives_list_mentions_it"] = objective_id in (listing.description or "")

        await call(client, out, "recent", {"limit": 5})
        await call(client, out, "objectives_discuss", {"id": objective_id, "body": "on it"})
        await call(client, out, "objectives_complete", {"id": objective_id, "result": "done and tested"})
        # Objective events the agent caused itself still arrive; its own chat does not.
        completed = await channel.wait_for(lambda p: p.meta.get("event") == "completed", "the completion event")
        out["completed_from"] = completed.meta.get("from")
        out["self_echoes"] = [p.content for p in channel.received if p.meta.get("from") == "builder" and p.meta.get("kind") != "objective"]
    return out


async def scenario_messages() -> dict:
    expect = set(os.environ["AC7_TEST_EXPECT"].split(","))
    channel = ClaudeChannel()
    async with Client(server(), mode="legacy", extensions=[channel], read_timeout_seconds=WAIT) as client:
        await client.list_tools()
        (WORK / "ready").write_text("ready")
        with anyio.fail_after(WAIT * 2):
            while not expect.issubset({p.content for p in channel.received}):
                channel.changed = anyio.Event()
                await channel.changed.wait()
                # Progress for the test to poll: one body per line, in arrival order.
                (WORK / "received.txt").write_text("".join(p.content + "\n" for p in channel.received))
    return {"received": sorted(p.content for p in channel.received)}


async def scenario_calls() -> dict:
    out: dict = {}
    async with Client(server(), mode="legacy", read_timeout_seconds=WAIT) as client:
        tools = await client.list_tools()
        out["tools"] = [t.name for t in tools.tools]
        last_objective = None
        for name, args in json.loads(os.environ["AC7_TEST_CALLS"]):
            args = {k: (last_objective if v == "$last_objective" else v) for k, v in args.items()}
            result = await call(client, out, name, args)
            if name == "objectives_create" and result.startswith("created "):
                last_objective = result.split()[1]
    return out


def scenario_early_sync() -> dict:
    import subprocess
    import threading

    (WORK / "waiting").write_text("waiting")
    deadline = time.monotonic() + WAIT
    while not (WORK / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.02)
    entry = server()
    bridge = subprocess.Popen([entry.command, *entry.args], env={**os.environ, **(entry.env or {})},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    log: list[dict] = []
    lock = threading.Condition()

    def reader() -> None:
        for line in bridge.stdout:
            msg = json.loads(line)
            with lock:
                log.append({"dir": "in", "at": time.monotonic(), "msg": msg})
                lock.notify_all()

    threading.Thread(target=reader, daemon=True).start()

    def send(msg: dict) -> None:
        with lock:
            log.append({"dir": "out", "at": time.monotonic(), "msg": msg})
        bridge.stdin.write((json.dumps(msg) + "\n").encode())
        bridge.stdin.flush()

    def wait_in(predicate) -> None:
        with lock:
            if not lock.wait_for(lambda: any(e["dir"] == "in" and predicate(e["msg"]) for e in log), timeout=WAIT):
                raise TimeoutError("bridge did not send what was expected")

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
          "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "early", "version": "0"}}})
    wait_in(lambda m: m.get("id") == 0)
    time.sleep(0.3)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    time.sleep(0.3)
    send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    wait_in(lambda m: m.get("id") == 1)
    wait_in(lambda m: m.get("method") == "notifications/claude/channel")
    bridge.stdin.close()
    bridge.wait(timeout=WAIT)
    with lock:
        return {"log": [{"dir": e["dir"], "at": e["at"], "msg": e["msg"]} for e in log]}


async def scenario_early() -> dict:
    return await anyio.to_thread.run_sync(scenario_early_sync)


def scenario_late_sync() -> dict:
    import select
    import subprocess

    (WORK / "waiting").write_text("waiting")
    deadline = time.monotonic() + WAIT
    while not (WORK / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.02)
    late = int(os.environ.get("AC7_TEST_LATE_MS", "700")) / 1000
    expect = set(os.environ["AC7_TEST_EXPECT"].split(","))
    entry = server()
    bridge = subprocess.Popen([entry.command, *entry.args], env={**os.environ, **(entry.env or {})},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(msg: dict) -> None:
        bridge.stdin.write((json.dumps(msg) + "\n").encode())
        bridge.stdin.flush()

    buf = b""

    def next_line(until: float):
        nonlocal buf
        while b"\n" not in buf:
            ready, _, _ = select.select([bridge.stdout], [], [], max(0.0, until - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(bridge.stdout.fileno(), 65536)
            if not chunk:
                raise EOFError("the bridge closed its stdout")
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        return json.loads(line)

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
          "params": {"protocolVersion": "2025-11-25", "capabilities": {"roots": {}, "elicitation": {}},
                     "clientInfo": {"name": "claude-code", "title": "Claude Code", "version": "2.1.197"}}})
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    received: list[str] = []
    dropped: list[str] = []
    relists = 0
    next_id = 2
    listening_from = None
    end = time.monotonic() + WAIT * 2
    while time.monotonic() < end and not expect.issubset(received):
        until = end if listening_from is None or (WORK / "ready").exists() else min(end, listening_from)
        msg = next_line(until)
        now = time.monotonic()
        if listening_from is not None and now >= listening_from and not (WORK / "ready").exists():
            (WORK / "ready").write_text("ready")
        if msg is None:
            continue
        listening = listening_from is not None and now >= listening_from
        if msg.get("id") == 1 and listening_from is None:
            listening_from = now + late
        elif msg.get("method") == "notifications/claude/channel":
            (received if listening else dropped).append(msg["params"]["content"])
        elif msg.get("method") == "notifications/tools/list_changed" and listening:
            relists += 1
            send({"jsonrpc": "2.0", "id": next_id, "method": "tools/list"})
            next_id += 1
    bridge.stdin.close()
    bridge.wait(timeout=WAIT)
    return {"received": received, "dropped": dropped, "relists": relists}


async def scenario_late() -> dict:
    return await anyio.to_thread.run_sync(scenario_late_sync)


async def scenario_displace() -> dict:
    import subprocess

    entry = server()
    first = subprocess.Popen([entry.command, *entry.args], env={**os.environ, **(entry.env or {})},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for msg in ({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "first", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}):
        first.stdin.write((json.dumps(msg) + "\n").encode())
        first.stdin.flush()
    first_lines = [json.loads(first.stdout.readline()) for _ in range(2)]
    expect = set(os.environ["AC7_TEST_EXPECT"].split(","))
    channel = ClaudeChannel()
    async with Client(server(), mode="legacy", extensions=[channel], read_timeout_seconds=WAIT) as client:
        await client.list_tools()
        # The second bridge displaced the first: the runner shut it down, so its stdout closes.
        rest = await anyio.to_thread.run_sync(first.stdout.read)
        code = await anyio.to_thread.run_sync(lambda: first.wait(timeout=WAIT))
        (WORK / "ready").write_text("ready")
        with anyio.fail_after(WAIT * 2):
            while not expect.issubset({p.content for p in channel.received}):
                channel.changed = anyio.Event()
                await channel.changed.wait()
    return {
        "first_answers": [m.get("id") for m in first_lines],
        "first_rest": rest.decode(),
        "first_exit": code,
        "received": sorted(p.content for p in channel.received),
    }


async def scenario_foreign() -> dict:
    import subprocess

    expect = os.environ["AC7_TEST_EXPECT"].split(",")
    channel = ClaudeChannel()

    async def wait_for(bodies) -> None:
        with anyio.fail_after(WAIT):
            while not set(bodies).issubset({p.content for p in channel.received}):
                channel.changed = anyio.Event()
                await channel.changed.wait()

    async with Client(server(), mode="legacy", extensions=[channel], read_timeout_seconds=WAIT) as client:
        await client.list_tools()
        (WORK / "ready").write_text("ready")
        await wait_for(expect[:1])
        check = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, __file__, "health-check"], timeout=WAIT, capture_output=True, text=True))
        (WORK / "checked").write_text("checked")
        await wait_for(expect)
        # The agent's own bridge still serves its calls.
        roster = text(await client.call_tool("roster", {}))
    return {
        "received": [p.content for p in channel.received],
        "check_exit": check.returncode,
        "check_stderr": check.stderr,
        "roster_ok": "builder" in roster,
    }


def health_check() -> None:
    import subprocess

    entry = server()
    bridge = subprocess.Popen([entry.command, *entry.args], env={**os.environ, **(entry.env or {})},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for msg in ({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "claude-code", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}):
        bridge.stdin.write((json.dumps(msg) + "\n").encode())
        bridge.stdin.flush()
    answers = {}
    while 1 not in answers:
        line = bridge.stdout.readline()
        if not line:
            raise EOFError("the bridge closed before answering tools/list")
        msg = json.loads(line)
        if "id" in msg:
            answers[msg["id"]] = msg
    bridge.stdin.close()
    bridge.wait(timeout=WAIT)
    (WORK / "check.json").write_text(json.dumps({"tools": len(answers[1]["result"]["tools"])}))


def scenario_swap_sync() -> dict:
    import select
    import subprocess

    entry = server()
    expect = os.environ["AC7_TEST_EXPECT"].split(",")
    lifetime = int(os.environ.get("AC7_TEST_SWAP_MS", "400")) / 1000
    received: list[str] = []
    bridges = 0
    deadline = time.monotonic() + WAIT * 3

    def take(line: bytes) -> dict:
        msg = json.loads(line)
        if msg.get("method") == "notifications/claude/channel":
            received.append(msg["params"]["content"])
        return msg

    while time.monotonic() < deadline:
        bridges += 1
        bridge = subprocess.Popen([entry.command, *entry.args], env={**os.environ, **(entry.env or {})},
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for msg in ({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "swap", "version": "0"}}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}):
            bridge.stdin.write((json.dumps(msg) + "\n").encode())
            bridge.stdin.flush()
        if bridges == 1:
            (WORK / "ready").write_text("ready")
        # Deliver for a while, reading whole lines as they come.
        until = time.monotonic() + lifetime
        buf = b""
        while time.monotonic() < until:
            ready, _, _ = select.select([bridge.stdout], [], [], max(0.0, until - time.monotonic()))
            if not ready:
                break
            chunk = os.read(bridge.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    take(line)
        # Close it as an MCP client does, and read what it still writes until it exits.
        bridge.stdin.close()
        rest = buf + bridge.stdout.read()
        bridge.wait(timeout=WAIT)
        for line in rest.split(b"\n"):
            if line.strip():
                take(line)
        if set(expect).issubset(received):
            break
    return {"received": received, "bridges": bridges}


async def scenario_swap() -> dict:
    return await anyio.to_thread.run_sync(scenario_swap_sync)


class RawBridge:
    """The bridge from .mcp.json on raw JSON lines, read with bounded waits."""

    def __init__(self) -> None:
        import subprocess

        entry = server()
        self.proc = subprocess.Popen([entry.command, *entry.args], env={**os.environ, **(entry.env or {})},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.buf = b""
        self.lines: list[dict] = []
        self.eof = False

    def send(self, msg: dict) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def _read(self, deadline: float) -> bool:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if line.strip():
                self.lines.append(json.loads(line))
        return True

    def answer(self, id_: int) -> dict:
        deadline = time.monotonic() + WAIT
        while True:
            for msg in self.lines:
                if msg.get("id") == id_ and ("result" in msg or "error" in msg):
                    return msg
            if self.eof or not self._read(deadline):
                raise TimeoutError(f"no answer to request {id_}")

    def to_eof(self) -> None:
        deadline = time.monotonic() + WAIT
        while not self.eof:
            if not self._read(deadline) and not self.eof:
                raise TimeoutError("the bridge's stdout did not close")

    def handshake(self, client: str) -> dict:
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": client, "version": "0"}}})
        self.answer(0)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        return self.answer(1)


def roster_call(id_: int) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": "roster", "arguments": {}}}


def scenario_stopped_sync() -> dict:
    import signal

    bridge = RawBridge()
    bridge.handshake("stopped")
    os.kill(bridge.proc.pid, signal.SIGSTOP)
    try:
        bridge.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        listed = bridge.answer(2)
        bridge.send(roster_call(3))
        roster = bridge.answer(3)
    finally:
        os.kill(bridge.proc.pid, signal.SIGCONT)
    bridge.send(roster_call(4))
    bridge.answer(4)
    os.kill(bridge.proc.pid, signal.SIGTERM)
    bridge.to_eof()
    code = bridge.proc.wait(timeout=WAIT)
    return {
        "tools_while_stopped": len(listed["result"]["tools"]),
        "roster_while_stopped": roster["result"]["content"][0]["text"],
        "answers": [m["id"] for m in bridge.lines if "id" in m],
        "exit": code,
    }


async def scenario_stopped() -> dict:
    return await anyio.to_thread.run_sync(scenario_stopped_sync)


def scenario_orphan_sync() -> dict:
    bridge = RawBridge()
    bridge.handshake("orphan")
    (WORK / "bridge.pid").write_text(str(bridge.proc.pid))
    (WORK / "ready").write_text("ready")
    time.sleep(3600)
    return {}


async def scenario_orphan() -> dict:
    return await anyio.to_thread.run_sync(scenario_orphan_sync)


def main() -> None:
    scenario = sys.argv[1]
    if scenario.startswith("exit:"):
        sys.exit(int(scenario.split(":", 1)[1]))
    if scenario == "health-check":
        health_check()
        return
    if scenario == "hang":
        (WORK / "ready").write_text("ready")
        time.sleep(3600)
        return
    result = anyio.run({"session": scenario_session, "messages": scenario_messages, "calls": scenario_calls, "early": scenario_early, "displace": scenario_displace, "swap": scenario_swap, "late": scenario_late, "foreign": scenario_foreign, "stopped": scenario_stopped, "orphan": scenario_orphan}[scenario])
    (WORK / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
