//! DNS-01 (`challenge = "dns-01"`): the TXT record `_acme-challenge.NAME` set and cleared
//! through the configured provider, and the wait until it is answered.
//!
//! Two providers: a command, run as `COMMAND set|clear FQDN VALUE` (FQDN without the trailing
//! dot, VALUE the record's text) with [`HOOK_TIMEOUT`], so any DNS provider's CLI (or
//! `nsupdate`) can be wired in; or RFC 2136 updates signed with TSIG ([`super::rfc2136`]).
//! Propagation: the record is asked every half second, with no cache, until one answer
//! carries the value or `propagation_timeout` passes; only then is the CA told to look. The
//! command's record is asked of `[server] resolvers` (the system's when none), the RFC 2136
//! one of the zone's primary that was updated (`server`).

use std::net::SocketAddr;
use std::time::Duration;

use super::order::OrderError;
use super::rfc2136::Rfc2136Settings;

/// How the TXT records are set and cleared (`dns = { command }` or `dns = { rfc2136 }`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DnsProvider {
    /// Not DNS-01.
    #[default]
    None,
    /// The command and its arguments.
    Command(Vec<String>),
    /// RFC 2136 updates to the zone's primary, signed with TSIG.
    Rfc2136(Box<Rfc2136Settings>),
}

impl DnsProvider {
    /// `set`s or `clear`s the TXT `value` at `fqdn`.
    pub(crate) async fn run(
        &self,
        action: &str,
        fqdn: &str,
        value: &str,
    ) -> Result<(), OrderError> {
        match self {
            DnsProvider::None => Err(OrderError::Other("dns-01: no dns provider".into())),
            DnsProvider::Command(c) => hook(c, action, fqdn, value).await,
            DnsProvider::Rfc2136(r) => Ok(r.update(fqdn, value, action == "set").await?),
        }
    }

    /// The servers asked whether the record is answered.
    pub(crate) fn witnesses(&self, resolvers: &[SocketAddr]) -> Vec<SocketAddr> {
        match self {
            DnsProvider::Rfc2136(r) => vec![r.server],
            _ => resolvers.to_vec(),
        }
    }
}

/// The longest a provider command may run.
const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// The TXT record's name for `name` (a wildcard's is its base name's).
pub(crate) fn record_name(name: &str) -> String {
    format!(
        "_acme-challenge.{}",
        name.strip_prefix("*.").unwrap_or(name)
    )
}

/// Runs the provider command: `set` or `clear` the TXT `value` at `fqdn`.
async fn hook(command: &[String], action: &str, fqdn: &str, value: &str) -> Result<(), OrderError> {
    let Some((program, args)) = command.split_first() else {
        return Err(OrderError::Other("dns-01: no dns command".into()));
    };
    let run = tokio::process::Command::new(program)
        .args(args)
        .args([action, fqdn, value])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(HOOK_TIMEOUT, run)
        .await
        .map_err(|_| {
            OrderError::Other(format!(
                "dns-01: {program} {action} {fqdn}: no answer within {HOOK_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| OrderError::Other(format!("dns-01: cannot run {program}: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(OrderError::Other(format!(
            "dns-01: {program} {action} {fqdn} failed ({}): {}",
            out.status,
            err.trim()
        )));
    }
    Ok(())
}

/// Waits until `fqdn` answers a TXT record `value` (asked of `resolvers`), at most `limit`.
pub(crate) async fn wait_until_answered(
    resolvers: &[SocketAddr],
    fqdn: &str,
    value: &str,
    limit: Duration,
) -> Result<(), OrderError> {
    let resolver = crate::upstream::discovery::build_resolver(resolvers)
        .map_err(|e| OrderError::Other(format!("dns-01: no resolver: {e}")))?;
    let query = format!("{fqdn}.");
    let found = async {
        loop {
            if let Ok(answer) = resolver.txt_lookup(query.as_str()).await {
                let hit = answer.answers().iter().any(|r| match &r.data {
                    hickory_resolver::proto::rr::RData::TXT(txt) => {
                        let text: String = txt
                            .txt_data
                            .iter()
                            .map(|d| String::from_utf8_lossy(d))
                            .collect();
                        text == value
                    }
                    _ => false,
                });
                if hit {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(limit, found).await.map_err(|_| {
        OrderError::Other(format!(
            "dns-01: the TXT record {fqdn} was not answered within {limit:?} (propagation_timeout)"
        ))
    })
}
