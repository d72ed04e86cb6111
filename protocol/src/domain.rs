//! The team domain: members, messages, channels, objectives, permissions, the shared file space
//! and the toolbox that turns an agent's tool calls into broker requests. Shared by the broker
//! and the runner; no I/O and no session state.

pub mod channel;
pub mod message;
pub mod objective;
pub mod permission;
pub mod team;
pub mod toolbox;
pub mod vfs;
