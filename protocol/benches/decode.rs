//! Decode throughput over a realistic mix of IPC traffic, against plain `serde_json` parsing of the
//! same lines. Run: `cargo bench -p ac7-protocol --bench decode`.

use std::hint::black_box;

use ac7_protocol::codec::frame::{Decoded, FrameDecoder, MAX_FRAME_BYTES};
use ac7_protocol::domain::message::LogLevel;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

/// A `tools/list` response of 31 tools, about 18 KB, like the runner's.
fn tools_list_response(id: u64) -> String {
    let tools: Vec<_> = (0..31)
        .map(|i| {
            json!({
                "name": format!("tool_{i:02}"),
                "description": format!(
                    "Tool number {i} of the ac7 toolbox. It talks to the broker on behalf of the agent and \
                     returns one text block; arguments are validated before any broker call is made. \
                     Teammates: alice (engineer), bob (reviewer), carol (director)."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The objective id (e.g. obj-xxxxx-y)."},
                        "body": {"type": "string", "description": "The message body."},
                        "level": {"type": "string", "enum": LogLevel::ALL.map(LogLevel::as_str), "description": "Optional severity; defaults to 'info'."}
                    },
                    "required": ["id"]
                }
            })
        })
        .collect();
    json!({"kind": "mcp_response", "id": id, "result": {"tools": tools}}).to_string()
}

fn tools_call_request(id: u64) -> String {
    json!({
        "kind": "mcp_request", "id": id, "method": "tools/call",
        "params": {"name": "send", "arguments": {"to": "alice", "body": "pull latest main and run the smoke tests"}, "_meta": {"progressToken": id}}
    })
    .to_string()
}

fn notification(id: u64) -> String {
    json!({
        "kind": "mcp_notification", "method": "notifications/claude/channel",
        "params": {"content": "pull latest main and run smoke tests", "meta": {
            "msg_id": format!("6b0f0c1e-2f0a-4f4e-9e1e-{id:012}"), "level": "info",
            "ts": "04/15/26 14:23:45 UTC", "ts_ms": "1776263025000", "thread": "dm", "from": "alice"}}
    })
    .to_string()
}

/// 100 lines: 10 `tools/list` responses, 60 `tools/call` requests, 30 notifications.
fn mix() -> Vec<String> {
    (0..100u64)
        .map(|i| match i % 10 {
            0 => tools_list_response(i),
            1..=6 => tools_call_request(i),
            _ => notification(i),
        })
        .collect()
}

fn bench_decode(c: &mut Criterion) {
    let lines = mix();
    let stream: Vec<u8> = lines
        .iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect();
    let mut group = c.benchmark_group("decode_mix");
    group.throughput(Throughput::Bytes(stream.len() as u64));

    group.bench_function("frame_decoder_64k_chunks", |b| {
        b.iter(|| {
            let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
            let mut frames = 0;
            for chunk in stream.chunks(64 * 1024) {
                decoder.push(chunk);
                while let Some(decoded) = decoder.decode() {
                    if let Decoded::Frame(frame) = decoded {
                        black_box(&frame);
                        frames += 1;
                    }
                }
            }
            assert_eq!(frames, 100);
        })
    });

    group.bench_function("serde_json_value_per_line", |b| {
        b.iter(|| {
            for line in &lines {
                let value: serde_json::Value =
                    serde_json::from_slice(line.as_bytes()).expect("valid JSON");
                black_box(value);
            }
        })
    });
    // The floor for any JSON parse: validation only, nothing built.
    group.bench_function("serde_json_ignored_any_per_line", |b| {
        b.iter(|| {
            for line in &lines {
                let value: serde::de::IgnoredAny =
                    serde_json::from_slice(line.as_bytes()).expect("valid JSON");
                black_box(value);
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
