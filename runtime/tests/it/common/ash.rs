//! Starting `ac7 ash-bridge` for the Ash tests.

use std::process::Stdio;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// Spawns `ac7 ash-bridge` (stdout piped for the `R`, stderr inherited, killed on drop, no
/// permission mode from the environment), with whatever `configure` adds, and waits (bounded)
/// for its `R`.
pub async fn spawn_ash_bridge(configure: impl FnOnce(&mut Command)) -> Child {
    let mut command = Command::new(super::ac7());
    command
        .arg("ash-bridge")
        .env_remove("ASH_PERMISSION_MODE")
        .env_remove("IS_SANDBOX")
        .env("AC7_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    configure(&mut command);
    let mut child = command.spawn().expect("spawn ac7 ash-bridge");
    let mut r = [0u8; 1];
    let stdout = child.stdout.as_mut().unwrap();
    super::within(10, "the bridge's R", stdout.read_exact(&mut r))
        .await
        .unwrap();
    assert_eq!(&r, b"R");
    child
}
