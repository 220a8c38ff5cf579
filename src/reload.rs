//! Reload: a new configuration put in force while serving (SIGHUP, through [`Reloader`]).
//!
//! What a reload decides is the application's, not a transport's: what it rebuilds (the
//! tokenizer, always; the upstream client, only when the upstream settings changed), which
//! changed settings only a restart applies (the warning, `RESTART_ONLY`), and the label
//! policies and objective targets it swaps into the running metric families. The hyper
//! transport only puts the result in force ([`Proxy::swap`]): a request sees the old
//! configuration or the new one, never a mix, and in-flight requests finish under the one
//! they began with.
//!
//! [`load_tokenizer`] is here because a reload is one of its three callers: the start
//! (`Server::bind`) and `tokentap check-config` load what a configuration names the same
//! way.

use std::sync::Arc;

use crate::config::{Config, ConfigError};
use crate::exchange::Active;
use crate::proxy::upstream::{ClientError, UpstreamClient};
use crate::proxy::Proxy;
use crate::wire::Tokenizer;

/// Settings a reload cannot change in a running process (they shape listeners, the
/// in-flight semaphore, already registered metric families, or the OTLP exporters and
/// live view started with the server).
const RESTART_ONLY: &str = "listen, admin, tls, limits, metrics.buckets, \
     metrics.native_histograms, metrics.names, labels.tenant.families, otlp and ui changes \
     take effect after a restart";

/// Why a reload was rejected (the running configuration keeps serving).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A setting that validated but could not be built (a tokenizer file that cannot be
    /// loaded); names its key and line like a validation error.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Applies a new configuration to a running server (SIGHUP).
#[derive(Clone)]
pub struct Reloader {
    proxy: Arc<Proxy>,
    /// The configuration the process started with: what the settings a reload cannot
    /// change still run as.
    started: Arc<Config>,
}

impl Reloader {
    /// A reloader of `proxy`, which started with `started`.
    pub(crate) fn new(proxy: Arc<Proxy>, started: Arc<Config>) -> Reloader {
        Reloader { proxy, started }
    }

    /// Load what `config` names (its tokenizer) and swap it in atomically. In-flight
    /// requests finish under the old one. The upstream client (and its connection pool) is
    /// kept when the upstream settings did not change. Returns a warning when settings
    /// that need a restart differ from those the process started with (so every reload
    /// says so until a restart, and going back to the running values silences it).
    pub fn reload(&self, config: Config) -> Result<Option<&'static str>, ReloadError> {
        let tokenizer = load_tokenizer(&config)?;
        let old = self.proxy.active();
        let upstream = if old.config.upstream == config.upstream {
            old.upstream.clone()
        } else {
            UpstreamClient::new(&config.upstream)?
        };
        let restart_needed = needs_restart(&self.started, &config);
        let metrics = self.proxy.metrics();
        metrics.set_label_policies(&config.labels);
        metrics.set_objective_targets(crate::summary::objectives::targets(
            config.objectives.as_ref(),
        ));
        self.proxy.swap(Active {
            config: Arc::new(config),
            tokenizer,
            upstream,
        });
        Ok(restart_needed.then_some(RESTART_ONLY))
    }
}

/// Whether `config` changes a setting of [`RESTART_ONLY`] from `started`.
fn needs_restart(started: &Config, config: &Config) -> bool {
    started.listen != config.listen
        || started.admin != config.admin
        || started.tls != config.tls
        || started.limits != config.limits
        || started.metrics.buckets != config.metrics.buckets
        || started.metrics.native_histograms != config.metrics.native_histograms
        || started.metrics.names != config.metrics.names
        || started.labels.tenant_families != config.labels.tenant_families
        || started.otlp != config.otlp
        || started.ui != config.ui
        || started.ui_listen != config.ui_listen
}

/// Load the tokenizer a validated configuration names (`observe.tokenizer`), if any.
/// Validation reads no file; this runs after it, at startup, on reload and in
/// `tokentap check-config`, and a failure names the key and its line.
pub fn load_tokenizer(config: &Config) -> Result<Option<Tokenizer>, ConfigError> {
    config
        .observe
        .tokenizer
        .as_ref()
        .map(|setting| Tokenizer::load(&setting.source).map_err(|err| setting.load_failed(&err)))
        .transpose()
}
