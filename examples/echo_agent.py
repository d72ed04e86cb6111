"""A minimal agent for `ac7 run`: it answers every direct message by echoing it back.

    pip install 'mcp==2.3.0'
    AC7_URL=http://127.0.0.1:8717 AC7_TOKEN=<the member's token> ac7 run -- python3 echo_agent.py

`ac7 run` writes `.mcp.json` in the working directory, as Claude Code expects it. Like any MCP
client, this agent starts the `ac7` server entry from it, lists the team's tools, and gets each
message pushed to it as a `notifications/claude/channel` notification.
"""

import json
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, NotificationBinding
from pydantic import BaseModel


class Channel(BaseModel):
    content: str  # the message as the agent should read it
    meta: dict[str, str]  # from, thread ("dm", "general", "obj:<id>", a channel), msg_id, ...


class Inbox(ClientExtension):
    identifier = "com.anthropic/claude-channel"

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Channel](100)

    def notifications(self):
        return [NotificationBinding(method="notifications/claude/channel", params_type=Channel, handler=self.send.send)]


async def main() -> None:
    entry = json.loads(Path(".mcp.json").read_text())["mcpServers"]["ac7"]
    server = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry.get("env", {}))
    inbox = Inbox()
    async with Client(server, mode="legacy", extensions=[inbox]) as ac7:
        tools = await ac7.list_tools()
        print(f"echo agent up, {len(tools.tools)} tools", flush=True)
        async for message in inbox.receive:  # never our own messages
            if message.meta.get("thread") == "dm":
                reply = f"echo: {message.content}"
                await ac7.call_tool("send", {"to": message.meta["from"], "body": reply})


anyio.run(main)
