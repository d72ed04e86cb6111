use serde_json::{Value, json};

use super::*;
use crate::message::{Attachment, LogLevel};
use crate::test_support::snapshots;

fn message(to: Option<&str>, from: &str, data: Value) -> Message {
    Message {
        id: "7570cd11-5c15-45b5-9983-822c0b5c993a".into(),
        ts: 1_795_314_350_478,
        to: to.map(str::to_owned),
        from: Some(from.into()),
        title: None,
        body: "DM from director".into(),
        level: LogLevel::Info,
        data: data.as_object().unwrap().clone(),
        attachments: vec![],
    }
}

#[test]
fn timestamps_match_the_capture_format() {
    // From the captures: ts_ms 1795314350478 is "11/22/26 02:25:50 UTC".
    assert_eq!(format_ts(1_795_314_350_478), "11/22/26 02:25:50 UTC");
    assert_eq!(format_ts(0), "01/01/70 00:00:00 UTC");
    assert_eq!(format_ts(951_782_400_000), "02/29/00 00:00:00 UTC");
    assert_eq!(format_ts(-1), "12/31/69 23:59:59 UTC");
    assert_eq!(format_ts(4_102_444_799_000), "12/31/99 23:59:59 UTC");
}

#[test]
fn threads_and_self_echo() {
    assert_eq!(
        thread_of(&message(Some("builder"), "director", json!({}))),
        "dm"
    );
    assert_eq!(thread_of(&message(None, "director", json!({}))), "general");
    assert_eq!(
        thread_of(&message(None, "d", json!({"thread": "chan:general"}))),
        "general"
    );
    assert_eq!(
        thread_of(&message(None, "d", json!({"thread": "chan:b0e8"}))),
        "chan:b0e8"
    );
    assert_eq!(
        thread_of(&message(None, "d", json!({"thread": "obj:obj-1"}))),
        "obj:obj-1"
    );
    // Chat from self is suppressed; objective events are not.
    assert!(suppress_self_echo(
        &message(None, "builder", json!({})),
        "builder"
    ));
    assert!(!suppress_self_echo(
        &message(None, "builder", json!({"kind": "objective"})),
        "builder"
    ));
    assert!(suppress_self_echo(
        &message(None, "builder", json!({"kind": "objective_discuss"})),
        "builder"
    ));
    assert!(!suppress_self_echo(
        &message(None, "director", json!({})),
        "builder"
    ));
}

#[test]
fn meta_is_flat_strings_with_data_keys_sanitised() {
    let mut m = message(
        None,
        "reviewer",
        json!({"thread": "chan:b0e8", "custom-key": "v1", "n": 3, "ok": true, "9lives": "x",
               "from": "spoof", "nested": {"a": 1}, "none": null, "kind": "note"}),
    );
    m.title = Some("ch title".into());
    let meta = meta(&m);
    let keys: Vec<&str> = meta.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "from",
            "thread",
            "level",
            "msg_id",
            "ts",
            "ts_ms",
            "title",
            "custom_key",
            "kind",
            "n",
            "ok"
        ]
    );
    assert_eq!(meta[0].1, "reviewer", "a data key cannot spoof from");
    let params: serde_json::Value = claude_channel_params(&m).parse().unwrap();
    assert!(
        params["meta"]
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_string)
    );
    assert_eq!(params["meta"]["n"], "3");
}

#[test]
fn renderings() {
    let dm = message(Some("builder"), "director", json!({}));
    let mut objective = message(
        None,
        "director",
        json!({"thread": "obj:obj-mwr7t9bz-3", "kind": "objective", "event": "assigned",
               "objective_id": "obj-mwr7t9bz-3", "objective_status": "active", "actor": "director"}),
    );
    objective.body = "[objective assigned] obj-mwr7t9bz-3\ntitle:      Ship feature Y".into();
    let mut with_files = message(None, "alice", json!({}));
    with_files.title = Some("say \"hi\"\\now".into());
    with_files.attachments = vec![Attachment {
        path: "/alice/uploads/report.pdf".into(),
        name: "report.pdf".into(),
        size: 1234,
        mime_type: "application/pdf".into(),
    }];
    let mut out = String::new();
    for m in [&dm, &objective, &with_files] {
        out.push_str(claude_channel_params(m).get());
        out.push('\n');
        out.push_str(&codex_text(m));
        out.push_str("\n\n");
    }
    snapshots(|| insta::assert_snapshot!("channel_renderings", out));
    assert!(codex_text(&with_files).starts_with(
        "<channel from=\"alice\" thread=\"general\" title=\"say \\\"hi\\\"\\\\now\" level=\"info\""
    ));
    assert!(codex_text(&objective).starts_with(
        "<channel kind=\"objective\" from=\"director\" thread=\"obj:obj-mwr7t9bz-3\""
    ));
}
