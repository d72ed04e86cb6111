//! What the runner does once per message an agent gets: the `notifications/claude/channel`
//! params and the Codex `<channel>` text of a message as the broker sends it (a DM, and a
//! channel post with data keys). Run: `cargo bench -p ac7-protocol --bench channel`.

use std::hint::black_box;

use ac7_protocol::domain::channel::{claude_channel_params, codex_text};
use ac7_protocol::domain::message::Message;
use criterion::{Criterion, criterion_group, criterion_main};

fn messages() -> [(&'static str, Message); 2] {
    let dm: Message = serde_json::from_str(
        r#"{"id":"5c0c168f-bfbb-4e5c-b8df-e2423a1b0c11","ts":1764571200123,"to":"builder",
            "from":"director","title":null,"body":"please rebase onto main and run the tests again",
            "level":"info","data":{},"attachments":[]}"#,
    )
    .expect("a message");
    let post: Message = serde_json::from_str(
        r#"{"id":"a2b717ee-74d6-4f30-b6da-90d7c0ffee00","ts":1764571200456,"to":null,
            "from":"reviewer","title":"review","body":"two comments on the parser change",
            "level":"info","data":{"thread":"chan:b0e8","kind":"review","pr":412,"urgent":true,
            "file-path":"protocol/src/codec/sse.rs"},"attachments":[]}"#,
    )
    .expect("a message");
    [("dm", dm), ("channel_post", post)]
}

fn bench_channel(c: &mut Criterion) {
    let mut group = c.benchmark_group("channel");
    for (name, message) in messages() {
        group.bench_function(format!("claude_params_{name}"), |b| {
            b.iter(|| black_box(claude_channel_params(black_box(&message))))
        });
        group.bench_function(format!("codex_text_{name}"), |b| {
            b.iter(|| black_box(codex_text(black_box(&message))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_channel);
criterion_main!(benches);
