#!/usr/bin/env python3
"""A scripted stand-in for `claude -p --output-format stream-json --input-format stream-json`,
used by the ash-bridge tests through CLAUDE_PATH. Standard library only.

It reads the stream-json user message from stdin and behaves according to the prompt text:
- `fail`: writes an error on stderr and exits 3 without a result;
- `slow`: prints one assistant message, then sleeps 30 s (until interrupted);
- `stubborn`: like `slow`, but ignores SIGINT (only SIGKILL stops it);
- `pause`: prints one assistant message, sleeps 1 s, then finishes normally;
- `unicode`: answers with multi-byte characters;
- anything else: init, an assistant message echoing the prompt, argv and cwd, and a result.
Every message carries the session id from --session-id / --resume. The process id is written
to `<cwd>/<session>.pid`, so a test can check that the agent was stopped.
"""

import json
import os
import signal
import sys
import time


def emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def main() -> int:
    argv = sys.argv[1:]
    session = ""
    for flag in ("--session-id", "--resume"):
        if flag in argv:
            session = argv[argv.index(flag) + 1]
    if session:
        with open(f"{session}.pid", "w") as f:
            f.write(str(os.getpid()))
    line = sys.stdin.readline()
    message = json.loads(line)
    assert message["type"] == "user", message
    content = message["message"]["content"]
    prompt = content if isinstance(content, str) else json.dumps(content)
    emit({"type": "system", "subtype": "init", "session_id": session})
    if "--include-partial-messages" in argv:
        emit({"type": "stream_event", "event": {"type": "message_start"}, "session_id": session})
    if prompt == "fail":
        sys.stderr.write("boom: the model is unavailable\n")
        return 3
    if prompt == "stubborn":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        prompt = "slow"
    if prompt == "slow":
        emit({"type": "assistant", "message": {"content": [{"type": "text", "text": "working"}]}, "session_id": session})
        time.sleep(30)
        return 0
    if prompt == "pause":
        emit({"type": "assistant", "message": {"content": [{"type": "text", "text": "working"}]}, "session_id": session})
        time.sleep(1)
    text = "héllo 世界 🎉" * 3 if prompt == "unicode" else f"echo: {prompt}"
    emit({
        "type": "assistant",
        "message": {"content": [{"type": "text", "text": text}]},
        "argv": argv,
        "cwd": os.getcwd(),
        "session_id": session,
    })
    emit({"type": "result", "subtype": "success", "result": text, "session_id": session or "generated"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
