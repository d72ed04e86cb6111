//! The oracle of the `trace_redact` fuzz target: no corpus secret survives tracing.

use super::{Input, secret_exchange, secret_response, trace_feed, trace_secrets};
use crate::trace::redact::{TRUNCATED_MARK, preview, redact_text};
use crate::trace::{TraceConfig, TraceOutput};

/// `trace_redact`: a secret from the corpus in an exchange with arbitrary text around it.
///
/// Oracles: no corpus secret survives in any event whatever the host, the placement and the
/// chunking; [`redact_text`] is idempotent on arbitrary text and previews respect their cap.
pub fn trace_redact(data: &[u8]) {
    let mut input = Input::new(data);
    let corpus = trace_secrets();
    let (context, secret) = corpus[input.below(corpus.len())];
    let variant = input.byte();
    let host = ["api.anthropic.com", "api.openai.com", "example.com"][input.below(3)];
    let seed = u32::from(input.byte()) | 1;
    let noise = String::from_utf8_lossy(input.bytes(200)).into_owned();
    // Arbitrary text alone: redaction is idempotent and previews are capped.
    let once = redact_text(&noise).into_owned();
    assert_eq!(redact_text(&once), once, "redaction is idempotent");
    let cap = 1 + usize::from(variant % 64);
    assert!(preview(&noise, cap).chars().count() <= cap + TRUNCATED_MARK.chars().count());

    // The secret with noise around it (separated by a space, as text around a key is).
    let noisy = format!(
        "{} {secret} {}",
        noise.replace(['\r', '\n'], " "),
        noise.len()
    );
    let client = secret_exchange(context, secret, variant);
    let server = secret_response(context, secret);
    let client = if context == "text" {
        // Put the noise in the first message too.
        String::from_utf8_lossy(&client)
            .replace(
                "my key is ",
                &format!("{} my key is ", noisy.replace('"', "'").replace('\\', "/")),
            )
            .into_bytes()
    } else {
        client
    };
    let client = fix_content_length(&client);
    let config = TraceConfig::default();
    let mut buffered = 0;
    let (outputs, _) = trace_feed(&config, host, &client, &server, seed, &mut buffered);
    for output in &outputs {
        if let TraceOutput::Event { event, .. } = output {
            let json = serde_json::to_string(event).expect("serializes");
            assert!(!json.contains(secret), "{context} secret survived: {json}");
        }
    }
}

/// Rewrites the `content-length` of a request built by [`secret_exchange`] after an edit.
fn fix_content_length(request: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return request.to_vec();
    };
    let head: Vec<String> = head
        .split("\r\n")
        .map(|l| {
            if l.starts_with("content-length:") {
                format!("content-length: {}", body.len())
            } else {
                l.to_owned()
            }
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
}
