//! Trace host throughput: one Anthropic exchange (a 10 KB request, a 50 KB streamed response)
//! through the HTTP/1.1 assembler, the Messages decoder and redaction, fed in 16 KiB reads.
//! Run: `cargo bench -p ac7-protocol --bench trace`.

use std::hint::black_box;

use ac7_protocol::trace::http::ProxyConnId;
use ac7_protocol::trace::{TraceConfig, TraceOutput, Tracer};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

fn request() -> Vec<u8> {
    let messages: Vec<_> = (0..20)
        .map(|i| {
            json!({"role": if i % 2 == 0 { "user" } else { "assistant" },
                "content": [{"type": "text", "text": format!("message {i}: {}", "lorem ipsum dolor sit amet ".repeat(17))}]})
        })
        .collect();
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages,
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}]})
    .to_string();
    format!(
        "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nx-api-key: sk-ant-api03-benchbenchbenchbenchbench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn response() -> Vec<u8> {
    let mut stream = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[],\"usage\":{\"input_tokens\":2000,\"cache_read_input_tokens\":8000,\"output_tokens\":1}}}\n\n\
         event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    while stream.len() < 50_000 {
        stream.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"some streamed words \"}}\n\n");
    }
    stream.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":900}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    for part in stream.as_bytes().chunks(1000) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn bench(c: &mut Criterion) {
    let request = request();
    let response = response();
    let mut group = c.benchmark_group("trace");
    group.throughput(Throughput::Bytes((request.len() + response.len()) as u64));
    group.bench_function("anthropic_10k_request_50k_stream", |b| {
        b.iter(|| {
            let mut tracer = Tracer::new(TraceConfig::default());
            let conn = ProxyConnId(1);
            tracer.handle_open(conn, "api.anthropic.com:443", 0);
            for part in request.chunks(16 * 1024) {
                tracer.handle_client_bytes(conn, part, 1);
            }
            for part in response.chunks(16 * 1024) {
                tracer.handle_server_bytes(conn, part, 2);
            }
            let mut events = 0;
            while let Some(output) = tracer.poll_output() {
                if let TraceOutput::Event { event, .. } = output {
                    black_box(event);
                    events += 1;
                }
            }
            assert_eq!(events, 1);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
