//! `[listeners.NAME] http3 = true` and the QUIC limits.

use std::sync::Arc;

use super::dur;
use crate::config::error::{ConfigError, Source};
use crate::config::file::FileConfig;
use crate::config::{Http3Spec, ListenerSpec, Settings};

/// Compiles the HTTP/3 settings of every listener that has `http3 = true`.
pub(super) fn compile_http3(
    src: &Source,
    file: &FileConfig,
    settings: &Settings,
    listeners: &mut [ListenerSpec],
) -> Result<(), ConfigError> {
    for l in listeners.iter_mut() {
        let Some(section) = file.listeners.get(&l.name).map(|s| s.get_ref()) else {
            continue;
        };
        let key = format!("listeners.{}", l.name);
        let Some(on) = section.http3.as_ref().filter(|h| *h.get_ref()) else {
            continue;
        };
        let Some(tls) = &l.tls else {
            return Err(src.error(
                on.span(),
                format!("{key}.http3"),
                "HTTP/3 needs TLS: add [listeners.NAME.tls] (QUIC is always encrypted)",
            ));
        };
        let zero_rtt = section.quic_0rtt.as_ref().is_some_and(|z| *z.get_ref());
        let max_streams = section
            .h3_max_concurrent_streams
            .as_ref()
            .map_or(l.h2_max_concurrent_streams, |s| *s.get_ref());
        let idle_timeout = dur(&section.quic_idle_timeout, settings.keepalive_timeout);
        let quic = crate::tls::quic_server_config(tls, max_streams, idle_timeout, zero_rtt)
            .map_err(|e| src.error(on.span(), format!("{key}.http3"), e))?;
        l.http3 = Some(Arc::new(Http3Spec {
            quic,
            max_streams,
            idle_timeout,
            zero_rtt,
            max_connections: section.quic_max_connections.as_ref().map_or(
                if l.max_connections > 0 {
                    l.max_connections
                } else {
                    DEFAULT_MAX_CONNECTIONS
                },
                |m| *m.get_ref(),
            ),
        }));
    }
    Ok(())
}

/// `quic_max_connections` when neither it nor the listener's `max_connections` is set: QUIC
/// connections per worker. Finite, so that handshakes (which cost state before the client has
/// proved anything but its address) cannot grow without bound; `0` written out is unlimited.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
