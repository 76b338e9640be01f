//! The config in force, swapped whole by a reload: what every request reads its tenants and
//! limits from.

use crate::config::ValidConfig;
use crate::tenant::TenantDirectory;
use std::sync::{Arc, PoisonError, RwLock};

/// The config in force and the tenant directory built from it, replaced whole by a reload.
#[derive(Debug)]
pub struct Snapshot {
    /// The config in force (tenants, backends' sizing; its other settings are the ones the
    /// gateway started with).
    pub config: Arc<ValidConfig>,
    /// API keys -> tenants.
    pub tenants: TenantDirectory,
}

impl Snapshot {
    fn of(config: Arc<ValidConfig>) -> Self {
        let tenants = TenantDirectory::from_config(&config);
        Self { config, tenants }
    }

    /// The snapshot a reload to `config` makes: tenants kept keep their requests in flight.
    pub(super) fn succeeding(&self, config: Arc<ValidConfig>) -> Self {
        let tenants = TenantDirectory::succeeding(&config, &self.tenants);
        Self { config, tenants }
    }
}

/// The gateway's swappable [`Snapshot`], and the lock that runs one reload at a time.
#[derive(Debug)]
pub struct LiveConfig {
    current: RwLock<Arc<Snapshot>>,
    /// Held by the reload in progress: one at a time.
    pub(super) reloading: tokio::sync::Mutex<()>,
}

impl LiveConfig {
    /// The snapshot of the config the gateway starts with.
    pub fn new(config: Arc<ValidConfig>) -> Self {
        Self {
            current: RwLock::new(Arc::new(Snapshot::of(config))),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// The snapshot in force now (a request keeps the one it started with).
    pub fn current(&self) -> Arc<Snapshot> {
        // The lock only guards an `Arc` swap, which cannot be left half done.
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn replace(&self, snapshot: Snapshot) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
    }
}
