//! `ac7 serve` as a child process on a free port: its URL, the tokens it printed when it created
//! the team, and its later stdout lines. Killed and reaped on drop. `--db` may be a SQLite
//! file or a PostgreSQL URL.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Served {
    pub child: Child,
    pub url: String,
    pub tokens: Vec<(String, String)>,
    /// Stdout lines after the "listening" line.
    pub lines: mpsc::Receiver<String>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ac7 serve` on a free port and waits for its "listening" line.
pub fn serve(db: &Path, extra: &[&str]) -> Served {
    let child = Command::new(super::ac7())
        .args(["serve", "--db"])
        .arg(db)
        .args(["--port", "0"])
        .args(extra)
        .env("AC7_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Owned by `Served` at once, so the child is killed and reaped on every path.
    let (tx, rx) = mpsc::channel();
    let mut served = Served {
        child,
        url: String::new(),
        tokens: Vec::new(),
        lines: rx,
    };
    let stdout = served.child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = served
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("ac7 serve did not report listening");
        if let Some(url) = line.strip_prefix("ac7 broker listening on ") {
            served.url = url.to_owned();
            return served;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() == 2 && parts[1].starts_with("ac7_") {
            served
                .tokens
                .push((parts[0].to_owned(), parts[1].to_owned()));
        }
    }
}

pub fn token<'a>(s: &'a Served, who: &str) -> &'a str {
    &s.tokens.iter().find(|(n, _)| n == who).unwrap().1
}
