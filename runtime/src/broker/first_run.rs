//! What to do next, printed once when a team is created (`ac7 serve`'s first start and
//! `ac7 quickstart`): the commands that join an agent and talk to it, with the broker's real URL
//! and the new tokens filled in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ac7_protocol::domain::permission::Permission;

use super::bootstrap::IssuedToken;
use super::db::{Store, StoreError};
use super::team;

/// A member created at start-up, with its one-time token.
#[derive(Debug, Clone)]
pub struct Credential {
    /// Member name.
    pub name: String,
    /// Bearer token.
    pub token: String,
    /// Whether the member administers members (the operator, not the agent).
    pub admin: bool,
}

/// Pairs the tokens `bootstrap` issued with whether each member is an admin.
pub fn credentials(store: &Store, issued: &[IssuedToken]) -> Result<Vec<Credential>, StoreError> {
    let members = store.view(team::members_list)?;
    Ok(issued
        .iter()
        .map(|i| Credential {
            name: i.name.clone(),
            token: i.token.clone(),
            admin: members
                .iter()
                .any(|m| m.name == i.name && m.permissions.contains(Permission::MembersManage)),
        })
        .collect())
}

/// The URL clients use for a broker listening on `addr` (a wildcard address becomes loopback).
pub fn client_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The operator (the first admin, else the first member) and the agent (the first member who
/// is not an admin, else the operator).
pub fn cast(creds: &[Credential]) -> Option<(&Credential, &Credential)> {
    let operator = creds.iter().find(|c| c.admin).or_else(|| creds.first())?;
    let agent = creds
        .iter()
        .find(|c| !c.admin && c.name != operator.name)
        .unwrap_or(operator);
    Some((operator, agent))
}

/// The commands that talk to `agent` as `operator` through the broker at `url`.
pub fn talk_commands(url: &str, operator: &Credential, agent: &str) -> String {
    let env = format!("AC7_URL={url} AC7_TOKEN={}", operator.token);
    format!("  {env} ac7 push --to {agent} --body \"hello\"\n  {env} ac7 history --with {agent}\n")
}

/// The full "next steps" text after `ac7 serve` created a team.
pub fn next_steps(url: &str, creds: &[Credential]) -> String {
    let Some((operator, agent)) = cast(creds) else {
        return String::new();
    };
    let env = format!("AC7_URL={url} AC7_TOKEN={}", agent.token);
    format!(
        "next steps, each in a terminal of its own (`ac7` on PATH: cargo install --locked --path runtime):\n\
         run an agent as {agent}: Claude Code, or any MCP-speaking program under `ac7 run`\n  \
         {env} ac7 claude-code\n  \
         {env} ac7 run -- <agent command>\n\
         talk to it as {operator}:\n{talk}",
        agent = agent.name,
        operator = operator.name,
        talk = talk_commands(url, operator, &agent.name),
    )
}

/// The one-time first-admin setup URL, printed while no member can sign in to the web app.
pub fn setup_text(url: &str, code: &str) -> String {
    format!(
        "sign-in setup: nobody can sign in to the web app yet. Open this one-time URL in a browser\n\
         to enroll the first admin's authenticator (TOTP); it works once, for this run only:\n  \
         {url}/setup?code={code}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(name: &str, admin: bool) -> Credential {
        Credential {
            name: name.into(),
            token: format!("ac7_{name}"),
            admin,
        }
    }

    #[test]
    fn next_steps_name_the_agent_and_the_operator() {
        let text = next_steps(
            "http://127.0.0.1:8717",
            &[cred("director", true), cred("builder", false)],
        );
        assert!(
            text.contains("AC7_URL=http://127.0.0.1:8717 AC7_TOKEN=ac7_builder ac7 claude-code"),
            "{text}"
        );
        assert!(
            text.contains(
                "AC7_URL=http://127.0.0.1:8717 AC7_TOKEN=ac7_director ac7 push --to builder"
            ),
            "{text}"
        );
        // One member: it talks to itself.
        let (op, agent) = cast(&[cred("solo", false)])
            .map(|(o, a)| (o.name.clone(), a.name.clone()))
            .unwrap_or_default();
        assert_eq!((op.as_str(), agent.as_str()), ("solo", "solo"));
    }

    #[test]
    fn wildcard_addresses_become_loopback() {
        assert_eq!(
            client_url("0.0.0.0:8717".parse().unwrap_or_else(|_| unreachable!())),
            "http://127.0.0.1:8717"
        );
        assert_eq!(
            client_url("[::]:9".parse().unwrap_or_else(|_| unreachable!())),
            "http://[::1]:9"
        );
    }
}
