//! The objective context reminder (unlike the TypeScript broker's, small side requests do not
//! trigger it): after an
//! activity upload, the broker checks whether the member's agent still has its open objectives in
//! its model context, and sends it one DM listing those it lost.
//!
//! - Only the **last** `llm_exchange` of an upload is looked at ([`reminder_context`]), and only
//!   when it is a main-loop request: it defines tools and carries at least
//!   [`MIN_MESSAGES`] messages. Small side requests (titles, summaries, quota checks) carry no
//!   tools or a single message and would otherwise trigger false reminders.
//! - The context is the system prompt (string or blocks) plus every text of the request's
//!   messages ([`LlmRequest::context_text`](super::activity::LlmRequest::context_text)).
//! - An objective (active or blocked, assigned to the member) is missing when its id is not in
//!   that text and its `<member>:<id>` key has not fired within [`COOLDOWN_MS`] (5 min).
//!   All missing objectives go in one message; their keys fire at once.
//! - Keys older than the cooldown are pruned at every check, so the map holds at most the
//!   objectives reminded in the last 5 minutes.

use std::collections::BTreeMap;

use super::activity::ActivityEvent;
use crate::domain::objective::Objective;

/// How long a member+objective key stays quiet after it fired.
pub const COOLDOWN_MS: i64 = 5 * 60 * 1000;

/// Fewest messages a request needs to be checked (a main-loop request past its first turn).
pub const MIN_MESSAGES: usize = 2;

/// The reminder's title.
pub const TITLE: &str = "objective context reminder";

/// The context text of the batch's last `llm_exchange`, when it is one the check looks at.
pub fn reminder_context(events: &[ActivityEvent]) -> Option<String> {
    let request = events.iter().rev().find_map(|e| match e {
        ActivityEvent::LlmExchange { entry, .. } => Some(&entry.request),
        _ => None,
    })?;
    let has_tools = request.tools.as_ref().is_some_and(|t| !t.is_empty());
    (has_tools && request.messages.len() >= MIN_MESSAGES).then(|| request.context_text())
}

/// The reminder body for `missing`, word for word as the TypeScript broker sends it.
pub fn reminder_body(missing: &[&Objective]) -> String {
    let mut body = format!(
        "You have {} active objective(s) that are no longer in your context. Here they are — call `objectives_view` for full details:",
        missing.len()
    );
    for o in missing {
        body.push_str(&format!(
            "\n  {}: {}\n    outcome: {}",
            o.id, o.title, o.outcome
        ));
    }
    body
}

/// The cooldowns of every member's reminders.
#[derive(Debug, Clone, Default)]
pub struct Reminders {
    fired: BTreeMap<String, i64>,
}

impl Reminders {
    /// The reminder body for `member` whose context is `context`, given its open objectives
    /// (`open`), or `None`; marks the reminded keys as fired at `now` (epoch ms).
    pub fn check(
        &mut self,
        member: &str,
        context: &str,
        open: &[Objective],
        now: i64,
    ) -> Option<String> {
        self.fired.retain(|_, at| now - *at <= COOLDOWN_MS);
        let missing: Vec<&Objective> = open
            .iter()
            .filter(|o| o.assignee == member && !context.contains(o.id.as_str()))
            .filter(|o| !self.fired.contains_key(&format!("{member}:{}", o.id)))
            .collect();
        if missing.is_empty() {
            return None;
        }
        for o in &missing {
            self.fired.insert(format!("{member}:{}", o.id), now);
        }
        Some(reminder_body(&missing))
    }

    /// Every key cooling down and when it fired (epoch ms), to keep outside the process.
    pub fn fired(&self) -> impl Iterator<Item = (&str, i64)> {
        self.fired.iter().map(|(k, at)| (k.as_str(), *at))
    }

    /// Puts back a key that fired at `at` (epoch ms), kept outside the process.
    pub fn restore(&mut self, key: String, at: i64) {
        self.fired.insert(key, at);
    }

    /// Keys currently cooling down.
    pub fn len(&self) -> usize {
        self.fired.len()
    }

    /// No key cooling down.
    pub fn is_empty(&self) -> bool {
        self.fired.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::activity::ActivityUpload;

    fn obj(id: &str, title: &str) -> Objective {
        serde_json::from_value(serde_json::json!({
            "id": id, "title": title, "body": "", "outcome": "it works", "status": "active",
            "assignee": "builder", "originator": "director", "watchers": [],
            "createdAt": 1, "updatedAt": 1, "completedAt": null, "result": null,
            "blockReason": null, "attachments": []
        }))
        .unwrap()
    }

    fn exchange(messages: usize, tools: bool, text: &str) -> serde_json::Value {
        let msgs: Vec<_> = (0..messages)
            .map(|i| {
                serde_json::json!({"role": if i % 2 == 0 {"user"} else {"assistant"},
                "content": [{"type": "text", "text": text}]})
            })
            .collect();
        serde_json::json!({"kind": "llm_exchange", "ts": 1, "duration": 1, "entry": {
            "kind": "anthropic_messages", "startedAt": 1, "endedAt": 2,
            "request": {"model": "m", "maxTokens": 1, "temperature": null,
                "system": [{"type": "text", "text": "You are builder."}],
                "messages": msgs,
                "tools": if tools { serde_json::json!([{"name": "t", "description": null, "inputSchema": {}}]) } else { serde_json::Value::Null }},
            "response": null}})
    }

    fn events(list: Vec<serde_json::Value>) -> Vec<ActivityEvent> {
        ActivityUpload::parse(&serde_json::to_vec(&serde_json::json!({"events": list})).unwrap())
            .unwrap()
            .events
    }

    #[test]
    fn only_the_last_main_loop_exchange_counts() {
        let last_small = events(vec![exchange(3, true, "a"), exchange(1, false, "title")]);
        assert_eq!(
            reminder_context(&last_small),
            None,
            "last one is a side request"
        );
        assert_eq!(
            reminder_context(&events(vec![exchange(5, false, "x")])),
            None
        );
        assert_eq!(
            reminder_context(&events(vec![exchange(1, true, "x")])),
            None
        );
        let text = reminder_context(&events(vec![
            exchange(1, true, "x"),
            exchange(2, true, "obj-1"),
        ]));
        assert_eq!(text.as_deref(), Some("You are builder. obj-1 obj-1"));
    }

    #[test]
    fn missing_objectives_fire_once_per_cooldown() {
        let open = [obj("obj-1", "first"), obj("obj-2", "second")];
        let mut r = Reminders::default();
        let body = r.check("builder", "working on obj-1", &open, 1000).unwrap();
        assert_eq!(
            body,
            "You have 1 active objective(s) that are no longer in your context. Here they are — call `objectives_view` for full details:\n  obj-2: second\n    outcome: it works"
        );
        let body = r.check("builder", "nothing", &open, 2000).unwrap();
        assert!(
            body.contains("obj-1: first") && !body.contains("obj-2"),
            "obj-2 cools down"
        );
        assert_eq!(
            r.check("builder", "nothing", &open, 1000 + COOLDOWN_MS),
            None
        );
        let body = r
            .check("builder", "nothing", &open, 1001 + COOLDOWN_MS)
            .unwrap();
        assert!(body.contains("obj-2") && !body.contains("obj-1"));
        assert_eq!(
            r.check("reviewer", "nothing", &open, 1001 + COOLDOWN_MS),
            None,
            "not theirs"
        );
        // Old keys are pruned.
        assert_eq!(
            r.check("builder", "obj-1 obj-2", &open, 10 * COOLDOWN_MS),
            None
        );
        assert!(r.is_empty());
    }
}
