"""The agent side of the bridge tests: the official MCP Python SDK spawns the real
`ac7 mcp-bridge` and talks MCP to it over stdio.

Usage: agent.py <scenario>, with AC7_BIN (the ac7 binary), AC7_TEST_SOCKET (the runner's
socket) and AC7_TEST_WORK (a scratch directory) in the environment. The runner side is the
Rust test's scripted server (see runtime/tests/common/mod.rs). Each scenario asserts what the
agent must see and prints one JSON object as its last stdout line; any failure exits non-zero
with a traceback. Every wait is bounded.

The bridge is started through `sh -c '"$0" mcp-bridge; echo $? > <file>'` so the scenario can
check the bridge's own exit code (the SDK does not expose it).
"""

import json
import os
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

AC7 = os.environ["AC7_BIN"]
SOCKET = os.environ["AC7_TEST_SOCKET"]
WORK = Path(os.environ["AC7_TEST_WORK"])
WAIT = 10  # seconds; generous bound for any single step


def bridge(name: str) -> tuple[StdioServerParameters, Path]:
    """Parameters that start the bridge and record its exit code in WORK/<name>.exit."""
    exit_file = WORK / f"{name}.exit"
    params = StdioServerParameters(
        command="/bin/sh",
        args=["-c", '"$0" mcp-bridge; echo $? > "$1"', AC7, str(exit_file)],
        env={"AC7_RUNNER_SOCKET": SOCKET, "AC7_LOG": "debug"},
    )
    return params, exit_file


async def exit_code(exit_file: Path) -> int:
    """The bridge's exit code, once it has exited (bounded wait)."""
    with anyio.fail_after(WAIT):
        while not (exit_file.exists() and exit_file.read_text().strip()):
            await anyio.sleep(0.01)
    return int(exit_file.read_text().strip())


class ChannelParams(BaseModel):
    """`notifications/claude/channel` params: clients drop a push whose meta is not all strings."""

    content: str
    meta: dict[str, str]


class ClaudeChannel(ClientExtension):
    """Registers the custom `notifications/claude/channel` the way SDK 2.x requires: a
    NotificationBinding contributed by a ClientExtension (methods outside the core protocol
    reach only bindings)."""

    identifier = "com.anthropic/claude-channel"

    def __init__(self) -> None:
        self.received: list[ChannelParams] = []
        self.arrived = anyio.Event()

    def notifications(self):
        return [
            NotificationBinding(
                method="notifications/claude/channel",
                params_type=ChannelParams,
                handler=self._on_channel,
            )
        ]

    async def _on_channel(self, params: ChannelParams) -> None:
        self.received.append(params)
        self.arrived.set()


async def scenario_main() -> dict:
    channel = ClaudeChannel()
    list_changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            list_changed.set()

    params, exit_file = bridge("main")
    out: dict = {}
    # mode="auto" (the SDK default) probes server/discover first; the runner answers -32601
    # through the bridge and the client falls back to the initialize handshake.
    async with Client(
        params,
        mode="auto",
        extensions=[channel],
        message_handler=on_message,
        read_timeout_seconds=WAIT,
    ) as client:
        assert client.server_info is not None and client.server_info.name == "ac7", client.server_info
        caps = client.server_capabilities
        assert caps.tools is not None and caps.tools.list_changed is True, caps
        assert caps.experimental is not None and "claude/channel" in caps.experimental, caps
        out["protocol_version"] = client.protocol_version

        tools = await client.list_tools()
        out["tools"] = len(tools.tools)
        assert len(tools.tools) == 31, len(tools.tools)

        result = await client.call_tool("echo", {"x": 1}, meta={"progressToken": "tok-1"})
        assert not result.is_error, result
        echoed = json.loads(result.content[0].text)
        assert echoed["arguments"] == {"x": 1}, echoed
        assert echoed["_meta"]["progressToken"] == "tok-1", echoed
        out["echo_meta"] = echoed["_meta"]

        result = await client.call_tool("fail", {})
        assert result.is_error is True, result
        assert result.content[0].text == "fail: this tool always fails", result
        out["fail_is_error"] = True

        try:
            await client.list_resources()
            raise AssertionError("resources/list should fail")
        except MCPError as e:
            assert e.code == -32601, (e.code, e.message)
            out["unknown_method_code"] = e.code

        # 32 concurrent calls; the runner answers them in reverse order.
        answers: dict[int, str] = {}

        async def slow(i: int) -> None:
            r = await client.call_tool("slow", {"i": i, "n": 32})
            answers[i] = r.content[0].text

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for i in range(32):
                    tg.start_soon(slow, i)
        assert answers == {i: f"slow {i}" for i in range(32)}, answers
        out["concurrent"] = len(answers)

        result = await client.call_tool("notify", {})
        assert result.content[0].text == "sent", result
        with anyio.fail_after(WAIT):
            await channel.arrived.wait()
            await list_changed.wait()
        push = channel.received[0]
        assert push.content == "hello from the team", push
        assert push.meta == {"from": "alice", "thread": "dm", "level": "info", "ts_ms": "1776263025000"}, push
        out["channel"] = push.model_dump()
        out["list_changed"] = True

    # Leaving the client closed the bridge's stdin.
    out["exit_code"] = await exit_code(exit_file)
    assert out["exit_code"] == 0, out
    return out


async def scenario_displace() -> dict:
    out: dict = {}
    params_a, exit_a = bridge("a")
    params_b, exit_b = bridge("b")
    async with Client(params_a, mode="legacy", read_timeout_seconds=WAIT) as a:
        r = await a.call_tool("echo", {"who": "a"})
        assert json.loads(r.content[0].text)["arguments"] == {"who": "a"}
        async with Client(params_b, mode="legacy", read_timeout_seconds=WAIT) as b:
            # b's bridge connected: the runner displaced a's bridge, which exits 0.
            out["a_exit_code"] = await exit_code(exit_a)
            assert out["a_exit_code"] == 0, out
            r = await b.call_tool("echo", {"who": "b"})
            assert json.loads(r.content[0].text)["arguments"] == {"who": "b"}
            # a's server is gone: a call fails (the connection is closed), it does not hang.
            with anyio.fail_after(WAIT):
                try:
                    await a.call_tool("echo", {"who": "a again"})
                    raise AssertionError("a call through a displaced bridge should fail")
                except MCPError as e:
                    out["a_after_displace"] = {"code": e.code, "message": e.message}
        out["b_exit_code"] = await exit_code(exit_b)
        assert out["b_exit_code"] == 0, out
    return out


async def scenario_runner_death() -> dict:
    out: dict = {}
    params, exit_file = bridge("death")
    async with Client(params, mode="legacy", read_timeout_seconds=WAIT) as client:
        await client.call_tool("echo", {})
        with anyio.fail_after(WAIT):
            try:
                await client.call_tool("die", {})
                raise AssertionError("the call should fail when the runner dies")
            except MCPError as e:
                out["pending_call_error"] = {"code": e.code, "message": e.message}
        out["exit_code"] = await exit_code(exit_file)
        assert out["exit_code"] == 0, out
    return out


SCENARIOS = {
    "main": scenario_main,
    "displace": scenario_displace,
    "runner_death": scenario_runner_death,
}


def main() -> None:
    scenario = SCENARIOS[sys.argv[1]]
    result = anyio.run(scenario)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
