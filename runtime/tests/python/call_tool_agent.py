"""The agent side of the call-tool bridge tests: the official MCP Python SDK spawns the real
`ac7 mcp-bridge --dialect call-tool` and talks MCP to it over stdio; the parent is the Rust
test's `CallToolHost` (see runtime/tests/call_tool.rs).

Usage: call_tool_agent.py <scenario>, with AC7_BIN, AC7_TEST_SCHEMA (the schema file),
AC7_TEST_SOCKET (the parent's socket) and AC7_TEST_WORK (a scratch directory) in the
environment. Each scenario asserts what the agent must see and prints one JSON object as its
last stdout line; any failure exits non-zero with a traceback. Every wait is bounded.
"""

import json
import os
import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

AC7 = os.environ["AC7_BIN"]
SCHEMA = os.environ["AC7_TEST_SCHEMA"]
SOCKET = os.environ["AC7_TEST_SOCKET"]
WORK = Path(os.environ["AC7_TEST_WORK"])
WAIT = 10  # seconds; generous bound for any single step


def bridge() -> StdioServerParameters:
    return StdioServerParameters(
        command=AC7,
        args=["mcp-bridge", "--dialect", "call-tool", "--schema-file", SCHEMA, "--socket", SOCKET],
        env={"AC7_LOG": "debug"},
    )


def text(result) -> str:
    return result.content[0].text


async def scenario_main() -> dict:
    out: dict = {}
    async with Client(bridge(), mode="legacy", read_timeout_seconds=WAIT) as client:
        assert client.server_info is not None and client.server_info.name == "ac7", client.server_info
        tools = await client.list_tools()
        names = sorted(t.name for t in tools.tools)
        out["tools"] = names
        schema = {t.name: t.input_schema for t in tools.tools}
        assert schema["add"]["required"] == ["a", "b"], schema

        r = await client.call_tool("echo", {"text": "hello é"})
        assert not r.is_error and text(r) == "hello é", r
        r = await client.call_tool("add", {"a": 2, "b": 40})
        assert not r.is_error and text(r) == "42", r
        out["add"] = text(r)

        # Validation happens in the bridge: the parent never sees this call.
        r = await client.call_tool("add", {"a": "two", "b": 40})
        assert r.is_error is True, r
        assert text(r).startswith("Input validation error: arguments.a"), text(r)
        out["validation"] = text(r)

        r = await client.call_tool("nope", {})
        assert r.is_error is True, r
        assert text(r) == "Unknown tool: nope (type: ToolNotFoundError)", text(r)
        out["unknown"] = text(r)

        r = await client.call_tool("fail", {})
        assert r.is_error is True and text(r) == "division by zero (type: ZeroDivisionError)", r
        out["fail"] = text(r)

        # The parent's own isError: true survives the bridge.
        r = await client.call_tool("flagged", {})
        assert r.is_error is True and text(r) == "flagged by the tool", r
        out["flagged_is_error"] = r.is_error

        answers: dict[int, str] = {}

        async def slow(i: int) -> None:
            r = await client.call_tool("slow", {"i": i})
            assert not r.is_error, r
            answers[i] = text(r)

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(slow, i)
        assert answers == {i: f"slow {i}" for i in range(8)}, answers
        out["concurrent"] = len(answers)
    return out


async def scenario_restart() -> dict:
    out: dict = {}
    async with Client(bridge(), mode="legacy", read_timeout_seconds=WAIT) as client:
        r = await client.call_tool("echo", {"text": "before"})
        assert text(r) == "before", r
        with anyio.fail_after(WAIT):
            # A tool failure is a result with isError (MCP), not a JSON-RPC error.
            r = await client.call_tool("hang", {})
            assert r.is_error is True, r
            out["in_flight_error"] = text(r)
        with anyio.fail_after(WAIT):
            while not (WORK / "restarted").exists():
                await anyio.sleep(0.01)
        r = await client.call_tool("echo", {"text": "after"})
        assert not r.is_error and text(r) == "after", r
        out["after_restart"] = text(r)
    return out


async def scenario_absent() -> dict:
    """No parent listens on SOCKET: each call is an isError result, and the bridge keeps trying."""
    out: dict = {"texts": []}
    async with Client(bridge(), mode="legacy", read_timeout_seconds=WAIT) as client:
        for _ in range(2):
            r = await client.call_tool("echo", {"text": "x"})
            assert r.is_error is True, r
            out["texts"].append(text(r))
    return out


async def scenario_broken() -> dict:
    """A parent (the Rust test's fake) that answers each tool named in BROKEN wrongly; after
    each, `echo` must work again."""
    out: dict = {}
    async with Client(bridge(), mode="legacy", read_timeout_seconds=WAIT) as client:
        for name in os.environ["AC7_TEST_BROKEN"].split(","):
            with anyio.fail_after(WAIT):
                r = await client.call_tool(name, {})
            assert r.is_error is True, (name, r)
            assert len(r.content) == 1 and r.content[0].type == "text", (name, r)
            out[name] = text(r)
            with anyio.fail_after(WAIT):
                r = await client.call_tool("echo", {"text": name})
            assert not r.is_error and text(r) == f"ok {name}", (name, r)
    return out


SCENARIOS = {
    "main": scenario_main,
    "restart": scenario_restart,
    "absent": scenario_absent,
    "broken": scenario_broken,
}


def main() -> None:
    result = anyio.run(SCENARIOS[sys.argv[1]])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
