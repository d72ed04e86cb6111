#!/usr/bin/env python3
"""A scripted stand-in for `claude -p --output-format stream-json --input-format stream-json`,
used by the ash-bridge tests through CLAUDE_PATH. Standard library only.

It reads the stream-json user message from stdin and behaves according to the prompt text:
- `fail`: writes an error on stderr and exits 3 without a result;
- `slow`: prints one assistant message, then sleeps 30 s (until interrupted);
- `stubborn`: like `slow`, but ignores SIGINT (only SIGKILL stops it);
- `pause`: prints one assistant message, sleeps 1 s, then finishes normally;
- `unicode`: answers with multi-byte characters;
- `fail_after_result`: prints an error result (`is_error`), then exits 1;
- `rename`: like the default, but its result names another session id;
- anything else: init, an assistant message echoing the prompt, argv and cwd, and a result.
Sessions behave like the real CLI's: `--session-id` must be a UUID that does not exist yet
("already in use" otherwise), `--resume` needs one that exists; a session exists once its init
message is printed (kept as `<cwd>/.fake-claude/<uuid>`). Every message carries the session id.
The process id is written to `<cwd>/<session>.pid`, so a test can check that the agent was
stopped.
"""

import json
import os
import signal
import sys
import time
import uuid


def emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def main() -> int:
    argv = sys.argv[1:]
    session = ""
    store = os.path.join(os.getcwd(), ".fake-claude")
    if "--session-id" in argv:
        session = argv[argv.index("--session-id") + 1]
        try:
            uuid.UUID(session)
        except ValueError:
            sys.stderr.write("Error: Invalid session ID. Must be a valid UUID.\n")
            return 1
        if os.path.exists(os.path.join(store, session)):
            sys.stderr.write(f"Error: Session ID {session} is already in use.\n")
            return 1
    elif "--resume" in argv:
        session = argv[argv.index("--resume") + 1]
        if not os.path.exists(os.path.join(store, session)):
            sys.stderr.write(f"No conversation found with session ID: {session}\n")
            return 1
    else:
        session = str(uuid.uuid4())
    with open(f"{session}.pid", "w") as f:
        f.write(str(os.getpid()))
    line = sys.stdin.readline()
    message = json.loads(line)
    assert message["type"] == "user", message
    content = message["message"]["content"]
    prompt = content if isinstance(content, str) else json.dumps(content)
    os.makedirs(store, exist_ok=True)
    open(os.path.join(store, session), "w").close()
    emit({"type": "system", "subtype": "init", "session_id": session})
    if "--include-partial-messages" in argv:
        emit({"type": "stream_event", "event": {"type": "message_start"}, "session_id": session})
    if prompt == "fail_after_result":
        emit({"type": "result", "subtype": "success", "is_error": True,
              "result": "API Error: 529 overloaded", "session_id": session})
        return 1
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
    reported = "a-session-of-its-own" if prompt == "rename" else session
    emit({"type": "result", "subtype": "success", "result": text, "session_id": reported})
    return 0


if __name__ == "__main__":
    sys.exit(main())
